"""Every refusal the memory check prints suggests a command that runs (issue 25): the
slice it names fits the same budget when checked again. At 3071cfc llama2-7b on 4 ranks
of a 24 GiB machine was refused with "not even one layer fits" and advice that was
refused again (--seq 16 --batch 1: 798 GiB; llama2-7b[1L]: 56 GiB)."""

import re

import pytest

from zfbench.core.models import MODELS, get_model
from zfbench.core.strategies import ENGINE_STRATEGIES
from zfbench.real.memory import InsufficientMemoryError, check_fits

GIB = 1 << 30
BUDGET = 24 * GIB  # the project's machines: 24 GiB, no GPU


def check(shape, ranks: int, elem: int) -> None:
    check_fits(shape, list(ENGINE_STRATEGIES), 1, 8, elem, False, host_bytes=BUDGET,
               ranks=ranks, baseline=0.4 * GIB)


def suggested(message: str, shape):
    """The shape a refusal's advice names: `--layers N` of the same model at the same
    width, or `--model 'NAME'`; None when it suggests no command."""
    layers = re.search(r"--layers (\d+) would fit", message)
    if layers:
        return shape.with_layers(int(layers.group(1)))
    named = re.search(r"--model '([^']+)' would", message)
    return get_model(named.group(1)) if named else None


@pytest.mark.parametrize("elem", [2, 4])
@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_suggestion_fits_the_same_budget(model, ranks, elem):
    shape = get_model(model)
    try:
        check(shape, ranks, elem)
        return  # fits as it is: nothing suggested
    except InsufficientMemoryError as err:
        message = str(err)
    proposal = suggested(message, shape)
    assert proposal is not None, message  # every built-in model has a slice that fits
    assert proposal.base == shape.base
    check(proposal, ranks, elem)  # not refused again


def test_llama2_7b_on_four_ranks_is_offered_a_width_slice():
    with pytest.raises(InsufficientMemoryError) as err:
        check(get_model("llama2-7b"), 4, 2)
    proposal = suggested(str(err.value), get_model("llama2-7b"))
    assert "not even one layer fits at full width" in str(err.value)
    assert proposal.width_ratio < 1 and proposal.layers >= 1
    assert "of its parameters" in str(err.value)


@pytest.mark.slow
def test_the_suggestion_for_a_chosen_slice_of_llama2_7b_on_four_ranks_runs(tmp_path):
    """A slice the user chose (one full-width layer: 56 GiB on 4 ranks) is refused, and
    the width slice the refusal names runs on 4 gloo ranks (2 steps of one strategy)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "zfbench.run", "--model", "llama2-7b", "--layers", "1",
           "--gpus", "4", "--quiet"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if first.returncode == 0:
        pytest.skip("one layer of llama2-7b fits on 4 ranks of this machine as it is")
    named = re.search(r"--model '([^']+)' would", first.stderr)
    assert first.returncode == 2 and named, first.stderr
    again = subprocess.run([sys.executable, "-m", "zfbench.run", "--model", named.group(1),
                            "--gpus", "4", "--quiet", "--steps", "2", "--strategy",
                            "zero-offload", "--out", str(tmp_path / "run")],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "run" / "summary.csv").exists()


@pytest.mark.slow
def test_the_first_command_measures_a_proxy_on_four_ranks_and_projects_the_node(tmp_path):
    """`python -m zfbench.run --model llama2-7b --gpus 4` (3 steps, to keep it short),
    its output piped: a proxy that fits, every strategy on 4 gloo ranks, the projection
    of llama2-7b whole, and a log without carriage returns."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "zfbench.run", "--model", "llama2-7b",
                           "--gpus", "4", "--steps", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "\r" not in done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    proxy = summary["proxy"]
    assert proxy["model"] == "llama2-7b" and proxy["ranks"] == 4
    assert get_model(proxy["measured"]).base == get_model("llama2-7b")
    measured = [r for r in summary["rows"] if not r.get("projected")]
    projected = [r for r in summary["rows"] if r.get("projected")]
    assert {r["ranks"] for r in measured} == {4} and len(measured) == 4
    assert {r["model"] for r in projected} == {"llama2-7b"} and len(projected) == 4
    assert "regime_measured" in proxy and "regime_projected" in proxy
    assert f"measuring the proxy {proxy['measured']}" in done.stderr
