"""The default precision is measured: bf16 only where this CPU runs it about as fast as
fp32; the answer is cached per machine and shape, printed, and kept in summary.json."""
import json

import pytest

import zfbench.real.precision_probe as probe
from zfbench.core.models import get_model
from zfbench.run.command import main

TINY = get_model("tiny").with_layers(1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZFBENCH_CACHE_DIR", str(tmp_path))
    return tmp_path / "precision.json"


@pytest.mark.parametrize("bf16_s, want", [(0.10, "bf16"), (0.109, "bf16"),
                                          (0.12, "fp32"), (0.80, "fp32")])
def test_bf16_only_when_about_as_fast_as_fp32(cache, monkeypatch, bf16_s, want):
    calls = []

    def fake(shape, dtype, batch, seq, repeats=3, budget_s=None):
        calls.append((str(dtype), budget_s))
        return 0.1 if "float32" in str(dtype) else bf16_s
    monkeypatch.setattr(probe, "time_forward_backward", fake)
    got = probe.choose_precision(TINY, 1, 4, threads=1)
    assert got["precision"] == want and not got["cached"]
    assert (got["fp32_forward_backward_s"], got["bf16_forward_backward_s"]) == (0.1, bf16_s)
    # the bf16 pass gets a budget, so a slow machine pays for one pass only
    assert calls[1][1] == pytest.approx(3 * probe.TOLERANCE * 0.1)
    again = probe.choose_precision(TINY, 1, 4, threads=1)
    assert again["cached"] and again["precision"] == want and len(calls) == 2
    assert json.loads(cache.read_text())  # the cache is a JSON file a person can read


def test_the_probe_measures_both_precisions_for_real(cache):
    got = probe.choose_precision(TINY, 1, 4, threads=1, use_cache=False)
    assert got["fp32_forward_backward_s"] > 0 and got["bf16_forward_backward_s"] > 0
    assert not cache.exists()


@pytest.mark.slow
def test_a_default_run_records_the_probe_and_a_flag_skips_it(cache, tmp_path, capsys):
    out = tmp_path / "o"
    base = ["--model", "tiny", "--layers", "1", "--strategy", "device", "--steps", "2",
            "--device", "cpu", "--device-threads", "1", "--host-threads", "1"]
    assert main(base + ["--out", str(out)]) == 0
    settings = json.loads((out / "summary.json").read_text())["settings"]
    p = settings["precision_probe"]
    assert settings["precision"] == p["precision"] in ("bf16", "fp32")
    assert p["fp32_forward_backward_s"] > 0
    assert "forward+backward measured" in capsys.readouterr().err
    assert main(base + ["--precision", "fp32", "--out", str(out)]) == 0
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["precision"] == "fp32" and settings["precision_probe"] is None
