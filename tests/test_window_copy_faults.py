"""The fresh temporary's page faults at DeepSpeed's ZenFlow window end (issues 44/45):
zfbench.sims.window_copy `fresh_page_s` against a hand computation, off without a
measured rate (presets, profiles before it), monotone in size and rate, fp32 and the other
data paths untouched (negative controls); the probe's arithmetic (zfbench.real.rate_probe),
the profile carrying it, bench/window_copy_faults.py's rows and bench/predict_deepspeed.py's
what-if option."""

import json

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench_helpers import bench_module
from test_profile_device import GPU, _fake_profile
from zfbench.core import hardware
from zfbench.predict.fit import on_hardware_file
from zfbench.real import rate_probe
from zfbench.real.profile_record import with_rates
from zfbench.sims import window_copy
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.simulator import simulate

pdd = bench_module("predict_deepspeed")
faults = bench_module("window_copy_faults")
SHAPE = "gpt2:layers=4,hidden=1024,heads=16"
BASE = dict(model=SHAPE, gpus=1, precision="bf16", transfers="shipped", overlap_step=True,
            update_interval=2, steps=8, full_warm_up_rounds=0)


def _settings(tmp_path, gbps=None, **knobs) -> SimSettings:
    """BASE (and `knobs`) on the presets copied into a hardware file, its host's fresh-page
    rate `gbps` GB/s where given (as bench/predict_deepspeed.py's what-if writes it)."""
    s = SimSettings.from_knobs(**on_hardware_file({**BASE, **knobs}, tmp_path / "p.json"))
    return s if gbps is None else pdd.with_fresh_pages(s, gbps, tmp_path / f"f{gbps}.json")


def _end_s(s: SimSettings, strategy: str = "zenflow") -> float:
    return max(x.t_end_s for x in simulate(s, strategy).timeline.spans)


def test_fault_term_by_hand(tmp_path):
    """One GPU: the partition is the whole model, 2 B an element of bf16 output at 2.5
    GB/s; the conversion part grows by exactly that, the upload not at all, and each of
    the three window ends that copy (boundaries 3, 5, 7) lengthens the run by it."""
    plain, faulted = _settings(tmp_path), _settings(tmp_path, 2.5)
    c0, c1 = CostModel(plain, "zenflow"), CostModel(faulted, "zenflow")
    assert c1.node.host.fresh_page_bytes_per_s == 2.5e9
    by_hand = c1.params * 2 / 2.5e9
    assert window_copy.fresh_page_s(c1) == pytest.approx(by_hand, rel=1e-12)
    (conv0, up0), (conv1, up1) = window_copy.parts_s(c0), window_copy.parts_s(c1)
    assert conv1 - conv0 == pytest.approx(by_hand, rel=1e-9) and up1 == up0
    spans = [x for x in simulate(faulted, "zenflow").timeline.spans if x.op == "host_convert"]
    assert [x.step for x in spans] == [3, 5, 7]
    assert all(x.duration_s == pytest.approx(conv1, rel=1e-9) for x in spans)
    assert _end_s(faulted) - _end_s(plain) == pytest.approx(3 * by_hand, rel=1e-9)


def test_no_rate_no_term(tmp_path):
    """Presets and hardware files without the field (every one written before it): no
    fault term, the window end as before."""
    for s in (SimSettings.from_knobs(**BASE), _settings(tmp_path)):
        c = CostModel(s, "zenflow")
        assert c.node.host.fresh_page_bytes_per_s is None
        assert window_copy.fresh_page_s(c) == 0.0


@settings(max_examples=10, deadline=None)
@given(layers=st.integers(1, 4), more=st.integers(1, 3),
       gbps=st.sampled_from([0.5, 2.0, 8.0]), faster=st.sampled_from([1.5, 4.0]))
def test_monotone_in_size_and_rate(tmp_path_factory, layers, more, gbps, faster):
    """More parameters never shorten the fault term or the run; a faster fresh-page rate
    never lengthens either."""
    tmp = tmp_path_factory.mktemp("m")
    model = f"gpt2:layers={layers},hidden=512,heads=8"
    bigger = f"gpt2:layers={layers + more},hidden=512,heads=8"
    small, large = _settings(tmp, gbps, model=model), _settings(tmp, gbps, model=bigger)
    fast = _settings(tmp, gbps * faster, model=model)
    term = {k: window_copy.fresh_page_s(CostModel(s, "zenflow"))
            for k, s in (("small", small), ("large", large), ("fast", fast))}
    assert term["large"] > term["small"] > term["fast"] > 0
    assert _end_s(large) >= _end_s(small) - 1e-12
    assert _end_s(fast) <= _end_s(small) + 1e-12


def test_negative_controls(tmp_path):
    """With a rate: fp32 weights convert nothing (no temporary, no term), and the paths
    without DeepSpeed's window-end copy (design, full, shipped without overlap) and the
    other strategies run exactly as without it."""
    c = CostModel(_settings(tmp_path, 2.5, precision="fp32", transfers="shipped",
                            mfu=0.4), "zenflow")
    assert c.node.host.fresh_page_bytes_per_s == 2.5e9 and window_copy.fresh_page_s(c) == 0.0
    for knobs in ({"transfers": "design"}, {"transfers": "full"}, {"overlap_step": False}):
        assert _end_s(_settings(tmp_path, 2.5, **knobs)) == _end_s(_settings(tmp_path, **knobs))
    assert _end_s(_settings(tmp_path, 2.5), "zero-offload") == \
        _end_s(_settings(tmp_path), "zero-offload")


def test_probe_arithmetic_and_absence():
    """`fresh_page_bytes_per_s` is the output's bytes over the extra seconds; None where
    the fresh conversion is not slower."""
    assert rate_probe.fresh_page_bytes_per_s(3e9, 1.5, 0.3) == pytest.approx(2.5e9)
    assert rate_probe.fresh_page_bytes_per_s(3e9, 0.3, 0.3) is None
    assert rate_probe.fresh_page_bytes_per_s(3e9, 0.2, 0.3) is None


def test_probe_converts_as_deepspeeds_copy_and_keys_the_rate(monkeypatch):
    """The probe's two conversions write the same bf16 values as `copy_` from fp32 does;
    `fresh_page_rates` gives FRESH_PAGE_KEY = 2 B an element over the extra seconds with
    16-bit weights, nothing with fp32 ones."""
    src = torch.randn(5000)
    into = torch.empty(5000, dtype=torch.bfloat16)
    fresh_s, reused_s = rate_probe.fresh_page_seconds(src, into, 2)
    assert fresh_s > 0 and reused_s > 0 and torch.equal(into, src.to(torch.bfloat16))
    monkeypatch.setattr(rate_probe, "fresh_page_seconds", lambda *_a: (0.5, 0.1))
    probe = rate_probe.RateProbe(1 << 12, torch.bfloat16, 1)
    assert probe.fresh_page_rates() == {
        rate_probe.FRESH_PAGE_KEY: pytest.approx(2 * (1 << 12) / 0.4)}
    probe.close()
    plain = rate_probe.RateProbe(1 << 12, torch.float32, 1)
    assert plain.fresh_page_rates() == {}
    plain.close()


def test_the_profile_carries_the_rate_and_old_ones_load_without_it(tmp_path):
    """A profile with the probe's key writes the host's `fresh_page_bytes_per_s` (kept by
    `with_rates`) and the simulator's host reads it; one without (every profile before
    session 28) loads with none."""
    old = _fake_profile(GPU)
    new = with_rates(old, {rate_probe.FRESH_PAGE_KEY: 2.5e9})
    assert new["hosts"]["measured-host"]["fresh_page_bytes_per_s"]["value"] == 2.5e9
    assert "fresh_page_bytes_per_s" not in old["hosts"]["measured-host"]
    again = with_rates(new, {"d2h_bytes_per_s": 3e10})
    assert again["hosts"]["measured-host"]["fresh_page_bytes_per_s"]["value"] == 2.5e9
    for prof, want in ((new, 2.5e9), (old, None)):
        path = tmp_path / f"{want}.json"
        path.write_text(json.dumps(prof))
        host = hardware.load_profile(path)["hosts"]["measured-host"]
        assert host.fresh_page_bytes_per_s == want


def test_the_bench_writes_a_row_per_case_size_and_thread_count(tmp_path):
    """bench/window_copy_faults.py: both kinds at each size and thread count, the fault
    cost consistent with its own seconds; bad input refused."""
    assert faults.main(["--sizes-mb", "0.5", "1", "--threads", "1", "--repeats", "1",
                        "--out", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "window_copy_faults.csv")
    assert sorted(zip(frame["kind"], frame["size_MB"])) == [
        ("convert", 0.5), ("convert", 1.0), ("touch", 0.5), ("touch", 1.0)]
    assert frame["fault_s_per_GB"].to_numpy() == pytest.approx(
        ((frame["fresh_s"] - frame["reused_s"]) / (frame["size_MB"] / 1e3)).to_numpy())
    assert (frame["minor_faults_fresh"] >= 0).all()
    payload = json.loads((tmp_path / "window_copy_faults.json").read_text())
    assert len(payload["rows"]) == 4 and "loadavg_before" in payload
    for argv in (["--repeats", "0"], ["--threads", "0"], ["--sizes-mb", "-1"]):
        with pytest.raises(SystemExit):
            faults.main([*argv, "--out", str(tmp_path)])


def test_predict_deepspeed_refuses_a_rate_that_is_not_positive(tmp_path):
    for bad in ("0", "-1"):
        with pytest.raises(SystemExit):
            pdd.main(["--fresh-page-GBps", bad, "--out", str(tmp_path)])
