"""bench/host_accum_rules.py (issue 44, item 2): each accumulation rule's rate on the
committed engine-job fits, checked by hand, and the verdicts on the committed data."""

from pathlib import Path

import pandas as pd
import pytest

from bench_helpers import bench_module

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results" / "gpu"


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    mod = bench_module("host_accum_rules")
    rows, machines = mod.rule_rows(RESULTS, tmp_path_factory.mktemp("fits"))
    return mod, pd.DataFrame(rows), machines


def test_the_lane_rate_is_cores_times_numa_times_the_per_core_rate(rules):
    mod, _, m = rules
    for name, v in m.items():
        c = mod.CostModel(v["settings"].with_(host_accum_per_core=1e8), "zenflow")
        assert mod.lane_accum_eps(v["settings"], 1e8) == pytest.approx(
            min(c.cores_per_rank * 1e8 * c.numa_factor,
                c.node.host.dram_bytes_per_s / mod.ACCUM_BYTES_PER_ELEMENT))


def test_the_oracle_reproduces_and_the_thread_rule_carries_the_other_machine(rules):
    _, table, m = rules
    oracle = table[table["rule"].str.contains("oracle")]
    assert oracle["accum_error"].abs().max() < 1e-9
    thread = table[table["rule"].str.startswith("per host-lane thread")].set_index("applied_on")
    for dst, src in (("H100-VM", "H200-VM"), ("H200-VM", "H100-VM")):
        expected = m[src]["measured"] / m[src]["threads"] * m[dst]["threads"]
        assert thread.loc[dst, "accum_simulated_G_per_s"] * 1e9 == pytest.approx(expected)
        assert thread.loc[dst, "derived_on"] == src
    verdicts = table.groupby("rule")["verdict"].first()
    assert verdicts[thread["rule"].iloc[0]] == "kept"
    assert verdicts["ratio 0.5 of the fitted AdamW stream (predict's rule)"] == "rejected"
    committed = pd.read_csv(RESULTS.parent / "host_accum_rules" / "accum_rules.csv")
    assert list(committed["verdict"]) == list(table["verdict"])
