"""bench/upload_contention.py (issues 44 item 2, 45 item 2): the probes' factors and the
cross-check's span errors against a computation by hand from the committed files, the
verdict rule on made-up rows, and the verdicts on the committed data."""

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from bench_helpers import bench_module

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results" / "gpu"
H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200/2026-11-27"


@pytest.fixture(scope="module")
def tables():
    mod = bench_module("upload_contention")
    factors = pd.DataFrame([r for n in mod.MACHINES for r in mod.probe_factors(RESULTS, n)])
    runs = pd.DataFrame([r for n in mod.MACHINES for r in mod.in_run(RESULTS, n)])
    return mod, factors, runs, pd.DataFrame(mod.crosscheck_rows(factors, runs))


def _json(rel: str) -> dict:
    return json.loads((RESULTS / rel).read_text())


def _row(folder: str, strategy: str, key: str) -> float:
    with open(RESULTS / folder / "run_qwen2.5-1.5b" / "summary.csv") as f:
        return next(float(r[key]) for r in csv.DictReader(f) if r["strategy"] == strategy)


def _h2d_beside_adam(folder: str, probes: tuple[str, ...]) -> list[float]:
    """Every beside / alone factor of the uploads while AdamW repeats, by hand."""
    out = []
    for rel in probes:
        p = _json(f"{folder}/{rel}")
        for rnd in ("round0", "round1"):
            r = p[rnd]
            out += [r["h2d_whole_beside_adam_GBps"] / r["h2d_whole_alone_GBps"],
                    r["h2d_chunks_beside_adam_GBps"] / r["h2d_chunks_alone_GBps"]]
    cal = _json(f"{folder}/profile/profile.json")["calibration"]
    if "h2d_factor_when_host_busy" in cal:
        out.append(cal["h2d_factor_when_host_busy"])
    return out


def test_factors_and_span_errors_match_a_computation_by_hand(tables):
    mod, factors, runs, cross = tables
    by_hand = {"H100-VM": _h2d_beside_adam(H100, mod.MACHINES["H100-VM"][1]),
               "H200-VM": _h2d_beside_adam(H200, mod.MACHINES["H200-VM"][1])}
    assert len(by_hand["H100-VM"]) == 4 and len(by_hand["H200-VM"]) == 9
    mech = cross[cross["mechanism"] == "h2d beside host AdamW (probe mean)"]
    for (src, dst), folder in {("H100-VM", "H200-VM"): H200, ("H200-VM", "H100-VM"): H100,
                               ("H100-VM", "H100-VM"): H100}.items():
        f = sum(by_hand[src]) / len(by_hand[src])
        alone = _json(f"{folder}/profile/profile.json")["calibration"]["h2d_bytes_per_s"] / 1e9
        measured = _row(folder, "zenflow", "h2d_gb_per_s")
        row = mech[(mech["derived_on"] == src) & (mech["applied_on"] == dst)].iloc[0]
        assert row["factor"] == pytest.approx(f, rel=1e-12)
        # predicted span (bytes / (alone x f)) over measured (bytes / measured), less 1
        assert row["span_error"] == pytest.approx(measured / (alone * f) - 1, rel=1e-12)
    r = runs.set_index(["machine", "strategy", "link"]).loc[("H200-VM", "zenflow", "h2d")]
    assert r["extra_s_per_copy"] == pytest.approx(
        (8 << 20) / (r["in_run_GBps"] * 1e9) - (8 << 20) / (r["alone_GBps"] * 1e9))


def _rows(errors, host_busy=True, carried=("A", "B")):
    return pd.DataFrame([{"derived_on": src, "applied_on": dst, "span_error": e,
                          "host_busy_cost": host_busy}
                         for (src, dst), e in zip([(c, "A" if c == "B" else "B")
                                                   for c in carried] + [("A", "A")], errors)])


def test_the_verdict_rule(tables, monkeypatch):
    mod = tables[0]
    monkeypatch.setattr(mod, "MACHINES", {"A": None, "B": None})
    assert mod.verdict(_rows([0.10, -0.15, 0.0])) == "kept"
    assert mod.verdict(_rows([0.10, -0.16, 0.0])) == "rejected"
    assert mod.verdict(_rows([0.10, -0.16, 0.0], host_busy=False)) == "does not carry"
    assert mod.verdict(_rows([0.10, 0.0], carried=("A",))).startswith("within, one way")


def test_on_the_committed_runs_no_host_busy_upload_cost_survives(tables):
    _, factors, runs, cross = tables
    verdicts = cross.groupby("mechanism")["verdict"].first()
    assert "kept" not in set(verdicts)
    assert verdicts["h2d beside host AdamW (probe mean)"] == "rejected"
    assert verdicts["h2d beside host AdamW (probe's slowest)"] == "rejected"
    # the slowest probe factor on either machine leaves > 30% of the in-run span unexplained
    h2d = cross[cross["mechanism"].str.startswith("h2d beside")]
    assert (h2d["span_error"] < -0.30).all()
    # d2h: the runs' rows keep within 4% of the copies alone
    d2h = runs[runs["link"] == "d2h"]
    assert ((d2h["ratio"] - 1).abs() < 0.04).all()
