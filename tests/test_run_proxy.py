"""`zfbench.run` measures a proxy when the named model cannot fit, and projects the whole
model onto the GPU node (zfbench/run/proxy.py)."""
from __future__ import annotations

import json

import pytest

from zfbench.core.models import get_model
from zfbench.run.proxy import choose_proxy, project_to_node, what_bounds


def test_the_widest_width_whose_slice_fits_memory_and_time_is_chosen_at_its_greatest_depth():
    shape = get_model("llama2-7b")
    layer = shape.with_width(0.25).with_layers(2).total_params - \
        shape.with_width(0.25).with_layers(1).total_params
    one = shape.with_width(0.25).with_layers(1).total_params
    # memory: anything; time: the quarter width up to 3 layers
    proxy, bound = choose_proxy(shape, lambda s: True, budget_params=one + 2.5 * layer)
    assert (proxy.width_ratio, proxy.layers, bound) == (0.25, 3, "time")
    # memory binds first: nothing wider than 1/8 fits, and only 5 layers of it
    limit = shape.with_width(0.125).with_layers(5).total_params
    proxy, bound = choose_proxy(shape, lambda s: s.total_params <= limit, 1e12)
    assert (proxy.width_ratio, proxy.layers, bound) == (0.125, 5, "memory")
    # full width when a depth slice fits both
    proxy, bound = choose_proxy(shape, lambda s: s.layers <= 6, 1e12)
    assert (proxy.width_ratio, proxy.layers) == (1, 6)


def test_past_the_time_budget_the_smallest_fitting_slice_is_measured_and_nothing_fitting_is_an_error():
    shape = get_model("llama2-7b")
    proxy, bound = choose_proxy(shape, lambda s: True, budget_params=1)
    assert proxy.layers == 1 and proxy.heads == 1 and bound == "memory"
    with pytest.raises(ValueError, match="not even one layer of one attention head"):
        choose_proxy(shape, lambda s: False, 1e12)


def test_the_projection_simulates_the_named_model_with_the_measured_accumulation_rate():
    from zfbench.core.config import load_config
    from zfbench.core.config_build import build_config
    from zfbench.sims.costs import CostModel, SimSettings

    cfg = load_config(build_config(None), strategy="zenflow", topk_ratio=0.2,
                      update_interval=2)
    record = {"model": "llama2-7b", "host_accum_elems_per_s": 3e9, "threads": 2}
    rows, node = project_to_node(record, {"zenflow": cfg}, ["zero-offload", "zenflow"], 4)
    assert [r["strategy"] for r in rows] == ["zero-offload", "zenflow"]
    assert all(r["projected"] and r["model"] == "llama2-7b" for r in rows)
    assert node["host_accum_per_core"] == 1.5e9
    assert node["gpus"] == 4 and node["gpu"] == "a100-80g"
    settings = SimSettings.from_knobs(host_accum_per_core=1.5e9)  # the node's NUMA factor applies
    cost = CostModel(settings)
    assert cost.accum_units_per_core_s == pytest.approx(1.5e9 * cost.numa_factor)
    assert node["preset_host_accum_per_core"] == \
        CostModel(SimSettings()).accum_units_per_core_s
    # a slower accumulation can only lengthen zenflow's simulated step
    slow, _ = project_to_node({**record, "host_accum_elems_per_s": 1e7}, {"zenflow": cfg},
                              ["zenflow"], 4)
    assert slow[0]["step_time_s"] >= rows[1]["step_time_s"]


def test_what_bounds_the_gain_reads_from_the_stall_parts():
    here = {"stall_fraction": 0.8, "step_time_s": 1.0, "exposed_io_s": 0.7,
            "host_wait_s": 0.1}
    there = {"stall_fraction": 0.83, "step_time_s": 2.167, "exposed_io_s": 0.317,
             "host_wait_s": 1.489}
    line = what_bounds(here, there)
    assert "0.7 s exposed transfers" in line and "1.49 s waiting for the host" in line
    assert "bounded by transfers and collectives" in line and "does not hide" in line
    assert "mostly the host's wait, which ZenFlow hides" in line
    line = what_bounds(there, here)
    assert "bounded by the host's wait" in line and "mostly the exposed transfers" in line


@pytest.mark.slow
def test_a_model_that_cannot_fit_runs_a_proxy_and_projects_the_whole_model(
        tmp_path, capsys, monkeypatch):
    """llama2-7b on one rank of this machine needs ~100 GiB: the run measures a slice
    within a tiny time budget (so the test is quick) and projects llama2-7b whole."""
    import zfbench.run.proxy as run_proxy
    from zfbench.run.command import main

    monkeypatch.setattr(run_proxy, "PROXY_HOST_ADAM_S", 1e-4)
    out = tmp_path / "run"
    assert main(["--model", "llama2-7b", "--precision", "fp32", "--device", "cpu",
                 "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    proxy = summary["proxy"]
    shape = get_model(proxy["measured"])
    assert shape.base.name == "llama2-7b" and shape.total_params == proxy["params"]
    assert proxy["params"] < get_model("llama2-7b").total_params
    assert "llama2-7b cannot be measured whole here: " in printed.err
    assert f"measuring the proxy {proxy['measured']}: " in printed.err
    rows = summary["rows"]
    measured = [r for r in rows if not r.get("projected")]
    projected = [r for r in rows if r.get("projected")]
    assert len(measured) == len(projected) == 4
    assert {r["model"] for r in projected} == {"llama2-7b"}
    assert summary["settings"]["steps"] == proxy["steps"] == 16
    assert proxy["tokens_per_rank_step"] == summary["settings"]["micro_batch"] * \
        summary["settings"]["seq"]
    assert proxy["cores"] >= 1 and proxy["ranks"] == 1 and proxy["why"]
    assert proxy["projection"]["host_accum_per_core"] == \
        proxy["host_accum_elems_per_s"] / proxy["threads"]
    assert "PROJECTED (simulated, not measured): llama2-7b whole" in printed.out
    assert "what bounds ZenFlow's gain: here" in printed.out
