"""bench/host_adam_rates.py: the DRAM-roofline CPU-Adam rate against a hand computation
from the presets' sourced fields, and its simulated rows against validate's own (the
calibrated presets, the LOSO judgments) and against each other (a faster rate never
gives a slower row)."""

import sys
import tempfile
from pathlib import Path

import pytest

from zfbench.core import hardware as hw
from zfbench.validate import calibrated as cal
from zfbench.validate.published import read_rows, simulate_row
from zfbench.validate.rows import bundled_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import host_adam_rates as har  # noqa: E402

ROWS = {r["id"]: r for r in read_rows(bundled_path())[1]}


def test_dram_roofline_rate_is_triad_bandwidth_over_bytes_per_parameter_per_core():
    # hand: sockets x theoretical per socket x triad fraction / 28 B / cores (hardware.json)
    assert har.dram_roofline_rate(hw.lookup("hosts", "xeon-8168")) == pytest.approx(
        2 * 127.968e9 * 0.75 / 28 / 48, rel=1e-12)
    assert har.dram_roofline_rate(hw.lookup("hosts", "epyc-7763-milan")) == pytest.approx(
        2 * 204.8e9 * 0.75 / 28 / 128, rel=1e-12)
    for name in hw.host_names():  # where the cores' bound and DRAM's meet, on all cores
        host = hw.lookup("hosts", name)
        rate = har.dram_roofline_rate(host)
        assert host.cores * rate == pytest.approx(host.dram_bytes_per_s / host.adam_bytes_per_param)


def test_candidates_reproduce_validate_and_order_by_rate():
    ids = ("zo-table4-cpuadam-10b", "zf-blog-fig3-llama7b-adam", "cb-qwen3b-zo-bound")
    frame = har.simulate_candidates(ids)
    assert set(frame["status"]) == {"ok"}
    got = {(r.id, r.candidate): r for r in frame.itertuples()}
    for rid in ids:  # the presets: validate --published's in-sample value
        assert got[(rid, "calibrated")].simulated == pytest.approx(
            simulate_row(ROWS[rid], ROWS, {})["simulated"], rel=1e-12)
    with tempfile.TemporaryDirectory() as tmp:  # the judgments: validate's LOSO file
        path = cal.write_judged_hardware(cal.CALIBRATIONS, Path(tmp) / "judged.json")
        for rid in ids:
            assert got[(rid, "pr735_judgment")].simulated == pytest.approx(
                simulate_row(ROWS[rid], ROWS, {}, path)["simulated"], rel=1e-12)
    assert got[("zo-table4-cpuadam-10b", "calibrated")].error_pct == pytest.approx(0, abs=1e-9)
    for rid in ids:  # a faster CPU-Adam never makes a host row slower
        lines = sorted((got[(rid, c)] for c in har.CANDIDATES), key=lambda r: r.rate_per_core)
        sims = [r.simulated for r in lines]
        assert sims == sorted(sims, reverse=True)
