"""The default scenario is sized on the machine at hand: the first candidate shape whose
measured host AdamW / forward+backward reaches the target, else the best, said aloud."""
import pytest

import zfbench.real.scenario_probe as sp
from zfbench.core.models import get_model
from zfbench.run.probe import describe_scenario, is_default_scenario

SHAPE = get_model("tiny").with_layers(1)
CANDIDATES = [(SHAPE, 1, 4), (SHAPE, 1, 1)]


@pytest.fixture
def fake_rates(monkeypatch, tmp_path):
    monkeypatch.setenv("ZFBENCH_CACHE_DIR", str(tmp_path))
    calls = {"adam": 0, "probe": []}

    def setup(fwd_bwd_by_seq: dict, adam_params_per_s: float):
        def rate(params, threads, repeats=3):
            calls["adam"] += 1
            return adam_params_per_s

        def probe(shape, batch, seq, threads, use_cache=True):
            calls["probe"].append(seq)
            s = fwd_bwd_by_seq[seq]
            return {"precision": "bf16", "bf16_forward_backward_s": s,
                    "fp32_forward_backward_s": 2 * s}
        monkeypatch.setattr(sp, "host_adam_params_per_s", rate)
        monkeypatch.setattr(sp, "choose_precision", probe)
        return calls
    return setup


def test_first_candidate_in_the_regime_is_chosen(fake_rates):
    adam_s = 2.0
    calls = fake_rates({4: adam_s / 1.5, 1: adam_s / 3}, SHAPE.total_params / adam_s)
    r = sp.size_scenario(CANDIDATES, 1, 1)
    assert (r["seq"], r["in_regime"]) == (4, True)
    assert r["ratio"] == pytest.approx(1.5)
    assert calls["probe"] == [4]  # the second candidate is never measured
    again = sp.size_scenario(CANDIDATES, 1, 1)
    assert again["cached"] and again["seq"] == 4 and calls["adam"] == 1


def test_a_later_candidate_when_the_first_is_short_and_the_best_when_none_is(fake_rates):
    adam_s = 1.0
    fake_rates({4: adam_s / 1.1, 1: adam_s / 1.4}, SHAPE.total_params / adam_s)
    r = sp.size_scenario(CANDIDATES, 1, 1, use_cache=False)
    assert (r["seq"], r["in_regime"]) == (1, True)
    assert [c["seq"] for c in r["candidates"]] == [4, 1]


def test_none_in_the_regime_gives_the_best_and_says_so(fake_rates):
    adam_s = 1.0
    fake_rates({4: adam_s / 1.2, 1: adam_s / 1.1}, SHAPE.total_params / adam_s)
    r = sp.size_scenario(CANDIDATES, 1, 1, use_cache=False)
    assert (r["seq"], r["in_regime"]) == (4, False)
    assert "1.20x (wanted >= 1.3" in describe_scenario(r)


def test_host_adam_rate_is_measured_for_real():
    rate = sp.host_adam_params_per_s(1 << 16, threads=1, repeats=1)
    assert 1e5 < rate < 1e12


@pytest.mark.parametrize("argv, cuda, world, want", [
    ([], False, 1, True), (["--steps", "5", "--out", "x"], False, 1, True),
    (["--model", "tiny"], False, 1, False), (["--seq=8"], False, 1, False),
    (["--precision", "fp32"], False, 1, True), (["--config", "c.json"], False, 1, False), ([], True, 1, False), ([], False, 2, False)])
def test_only_a_run_with_no_shape_flags_is_sized(argv, cuda, world, want):
    from zfbench.run.command import build_parser
    assert is_default_scenario(build_parser().parse_args(argv), cuda, world) is want


def test_the_header_names_the_ratio_the_simulator_gives_on_the_gpu_node():
    from zfbench.run.proxy import node_regime

    ratio = node_regime()
    r = {"shape": "s", "batch": 1, "seq": 4, "precision": "bf16", "host_adam_s": 0.25,
         "forward_backward_s": 0.15, "ratio": 0.25 / 0.15, "target_ratio": 1.3,
         "node_ratio": ratio}
    text = describe_scenario(r)
    assert f"host AdamW at {ratio:.2f}x forward+backward (simulated)" in text
    assert ratio > 1.3  # the node is in ZenFlow's regime, which the machine is sized toward
