"""DeepSpeed's ZenFlow on its CPU accelerator (issue 44): the embedding tables' gradients
across ZenFlow's column-major layout in backward and the selective optimizer's step, priced
from bench/zenflow_cpu_ops.py's probe (the link's `thread_*` fields) by
zfbench.sims.cpu_accelerator, only where the run is on that accelerator."""

import json

import pytest

from bench_helpers import bench_module
from zfbench.core.hardware import get_link
from zfbench.predict.fit import on_hardware_file
from zfbench.sims import cpu_accelerator as ca
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.simulator import simulate

ops = bench_module("zenflow_cpu_ops")
pdd = bench_module("predict_deepspeed")
SMALL = dict(model="gpt2:layers=2,hidden=512,heads=8", micro_batch=1, seq=128,
             precision="fp32", gpus=1, gpus_per_switch=1, transfers="shipped",
             update_interval=4, full_warm_up_rounds=0, overlap_comm=False)
THREAD = 2.5e10  # the training thread's pass rate (bytes/s)
PROBED = {"thread_layout_copy_elems_per_s": 2e8, "thread_layout_add_extra_elems_per_s": 4e8,
          "thread_selective_step_op_s": 1e-4, "thread_selective_step_elems_per_s": 1.5e8,
          "thread_selective_boundary_op_s": 2e-4,
          "thread_selective_boundary_elems_per_s": 1e8}
# SMALL by hand: tied token table 50257 x 512, positions 1024 x 512; 2 layers of four
# 512 x 512, fc1 2048 x 512, fc2 512 x 2048; 22 vectors of 14336 elements in all
TOKENS, POSITIONS = 50257 * 512, 1024 * 512
SELECTED = 50257 * 51 + 1024 * 51 + 2 * (4 * 512 * 51 + 2048 * 51 + 512 * 204) + 14336
TENSORS = 14 + 22


def _settings(tmp_path, thread: float | None, probed: dict | None, **knobs) -> SimSettings:
    path = tmp_path / f"hw_{len(list(tmp_path.iterdir()))}.json"  # one file a setting
    k = on_hardware_file({**SMALL, **knobs}, path)
    node = json.loads(path.read_text())
    fields = dict(probed or {})
    if thread is not None:
        fields["training_thread_bytes_per_s"] = thread
    for link in node["host_links"].values():
        link.update({f: {"value": v, "source": "test"} for f, v in fields.items()})
    path.write_text(json.dumps(node))
    return SimSettings.from_knobs(**k, steps=12)


def test_layout_term_is_the_tables_over_the_probed_rates(tmp_path):
    """Tied: the token table at the cross-layout sum's extra, the position table copied;
    untied (Llama: no position table): the token table copied; a link without the rates
    (a real one) adds nothing."""
    tied = CostModel(_settings(tmp_path, THREAD, PROBED))
    assert ca.layout_s(tied) == pytest.approx(TOKENS / 4e8 + POSITIONS / 2e8, rel=1e-12)
    untied = CostModel(_settings(tmp_path, THREAD, PROBED,
                                 model="llama:layers=1,hidden=256,heads=4"))
    assert not untied.shape.tied_embeddings  # its token table copied, its head a matmul
    assert ca.layout_s(untied) == pytest.approx(32000 * 256 / 2e8, rel=1e-12)
    assert ca.layout_s(CostModel(_settings(tmp_path, THREAD, None))) == 0.0


def test_selective_term_counts_every_parameter(tmp_path):
    """Each matrix's rows x int(0.1 cols) and each vector whole, plus one op_s a tensor;
    the boundary at its own fit; None without a probe."""
    c = CostModel(_settings(tmp_path, THREAD, PROBED))
    assert ca.selective_s(c, False) == pytest.approx(TENSORS * 1e-4 + SELECTED / 1.5e8,
                                                     rel=1e-12)
    assert ca.selective_s(c, True) == pytest.approx(TENSORS * 2e-4 + SELECTED / 1e8,
                                                    rel=1e-12)
    assert ca.selective_s(CostModel(_settings(tmp_path, THREAD, None)), False) is None
    # a fit through the origin (op_s 0) is a valid hardware file
    origin = CostModel(_settings(tmp_path, THREAD, {**PROBED, "thread_selective_step_op_s": 0}))
    assert ca.selective_s(origin, False) == pytest.approx(SELECTED / 1.5e8, rel=1e-12)


def test_counts_follow_deepspeeds_code():
    """Per matrix inside a window: a row gather, two copies, a column gather, AdamW, a
    column put; the boundary adds `temp_copy_param`'s gather and clone and the step's
    copy-in. A vector: two copies and AdamW; at the boundary two more copies."""
    assert sum(ca.STEP_OPS["matrix"].values()) == 6
    assert {op: ca.BOUNDARY_OPS["matrix"][op] - n for op, n in ca.STEP_OPS["matrix"].items()
            } == {"gather_rows": 0, "copy": 2, "gather_cols": 1, "adamw": 0,
                  "scatter_cols": 0}
    assert ca.STEP_OPS["vector"] == {"copy": 2, "adamw": 1}
    assert ca.BOUNDARY_OPS["vector"] == {"copy": 4, "adamw": 1}
    assert ca.selected_elems(50272, 512, 0.1) == 50272 * 51


def _compute(result) -> dict:
    spans = result.timeline.spans_frame()
    spans = spans[spans.lane == "compute"].assign(d=spans.t_end_s - spans.t_start_s)
    return {k: list(g.d) for k, g in spans.groupby(["op", "step"])}


def test_simulated_step_holds_both_terms(tmp_path):
    """On the CPU accelerator each ZenFlow step's compute lane has one more backward span
    (the layout) and its device update is the selective term (boundary every 4th step);
    without the probe (negative control) neither, and the presets' device AdamW stands."""
    probed = _settings(tmp_path, THREAD, PROBED)
    c = CostModel(probed)
    with_terms, without = (_compute(simulate(s, "zenflow"))
                           for s in (probed, _settings(tmp_path, THREAD, None)))
    for t in range(4, 12):
        boundary = t % 4 == 3
        assert with_terms[("device_optim", t)] == pytest.approx(
            [ca.selective_s(c, boundary)], rel=1e-9)
        assert without[("device_optim", t)] == pytest.approx(
            [c.device_optim_s(c.selected_params)], rel=1e-9)
        extra = with_terms[("backward", t)][len(without[("backward", t)]):]
        assert extra == pytest.approx([ca.layout_s(c)], rel=1e-9)


def test_off_the_cpu_accelerator_the_fields_change_nothing(tmp_path):
    """A real link (no training-thread rate) carrying the probe's fields simulates ZenFlow
    exactly as without them; so does ZeRO-Offload on the CPU accelerator."""
    for strategy, thread in (("zenflow", None), ("zero-offload", THREAD)):
        a = simulate(_settings(tmp_path, thread, PROBED), strategy)
        b = simulate(_settings(tmp_path, thread, None), strategy)
        assert a.timeline.spans_frame().equals(b.timeline.spans_frame())
    assert get_link(SimSettings().machine.pcie).thread_selective_step_op_s is None


def test_overlaps_halved_thread_budget_scales_the_probed_ops(tmp_path):
    """`bandwidth_scale` 0.5 halves the rates and doubles the per-op seconds, so both
    terms double."""
    full = CostModel(_settings(tmp_path, THREAD, PROBED))
    half = CostModel(_settings(tmp_path, THREAD, PROBED).with_(bandwidth_scale=0.5))
    assert ca.layout_s(half) == pytest.approx(2 * ca.layout_s(full), rel=1e-12)
    for boundary in (False, True):
        assert ca.selective_s(half, boundary) == pytest.approx(
            2 * ca.selective_s(full, boundary), rel=1e-12)


def test_fit_keeps_the_probes_total_and_refuses_negative_intercepts():
    """With an intercept the fit's total over the points is theirs; exact points come
    back exactly; a negative intercept falls back through the origin."""
    points = [(1e5, 2e-4), (4e5, 3e-3), (2.5e6, 1.6e-2), (1e3, 1.2e-4), (1e3, 6e-5)]
    f = ops.fit(points)
    assert sum(f["op_s"] + e / f["elems_per_s"] for e, _ in points) == pytest.approx(
        sum(t for _, t in points), rel=1e-9)
    exact = ops.fit([(1e5, 1e-4 + 1e5 / 2e8), (1e6, 1e-4 + 1e6 / 2e8)])
    assert (exact["op_s"], exact["elems_per_s"]) == pytest.approx((1e-4, 2e8), rel=1e-9)
    origin = ops.fit([(1e5, 1e-3), (1e6, 2e-3)])  # line crosses at +0.9e-3: kept
    assert origin["op_s"] > 0
    through = ops.fit([(1e5, 1e-4), (1e6, 5e-3)])  # intercept would be < 0
    assert through["op_s"] == 0.0
    assert through["elems_per_s"] == pytest.approx((1e10 + 1e12) / (1e5 * 1e-4 + 1e6 * 5e-3))


def test_probe_sums_its_medians_with_deepspeeds_counts():
    """A tiny model's probe (one round; no timing asserted): each parameter's step and
    boundary seconds are its ops' medians times the counts, the layout rates elements
    over seconds, and the link fields carry them."""
    r = ops.probe("gpt2:layers=1,hidden=64,heads=2", None, 0.1, 1)
    med = {(m["what"], m["rows"], m["cols"], m["op"]): m["median_s"] for m in r["medians"]}
    for p in r["per_parameter"]:
        for name, counts in (("step", ca.STEP_OPS), ("boundary", ca.BOUNDARY_OPS)):
            assert p[f"{name}_s"] == pytest.approx(sum(
                n * med[(p["what"], p["rows"], p["cols"], op)]
                for op, n in counts[p["what"]].items()), rel=1e-12)
    assert r["selective_total"]["step_s"] == pytest.approx(
        sum(p["count"] * p["step_s"] for p in r["per_parameter"]), rel=1e-12)
    lay, fields = r["layout"], ops.link_fields(r)
    assert lay["copied_elems"] == 1024 * 64 and lay["summed_elems"] == 50257 * 64
    # each table's extra is its column-major backward over its row-major one
    assert lay["copy_s"] == pytest.approx(med[("table", 1024, 64, "table_col")]
                                          - med[("table", 1024, 64, "table_row")])
    assert lay["sum_extra_s"] == pytest.approx(med[("table", 50257, 64, "tied_col")]
                                               - med[("table", 50257, 64, "tied_row")])
    for field, elems, sec in (("thread_layout_copy_elems_per_s", "copied_elems", "copy_s"),
                              ("thread_layout_add_extra_elems_per_s", "summed_elems",
                               "sum_extra_s")):
        if lay[sec] > 0:  # a tiny table's extra may come out <= 0: then no rate
            assert fields[field]["value"] == pytest.approx(lay[elems] / lay[sec])
        else:
            assert field not in fields
    assert fields["thread_selective_step_op_s"]["value"] == r["fits"]["step"]["op_s"]
    assert r["tokens"] == 32
    assert r["torch_threads"] >= 1 and len(r["loadavg_before"]) == 3


def test_predict_probes_only_on_a_cpu_accelerator(tmp_path):
    """bench/predict_deepspeed.py leaves a GPU run's node alone; on the CPU accelerator it
    writes the probe's fields into every link and probes a shape once."""
    presets = tmp_path / "presets.json"
    on_hardware_file(dict(SMALL), presets)
    before = presets.read_text()
    knobs = {"model": "gpt2:layers=1,hidden=64,heads=2"}
    probes: dict = {}
    assert pdd.cpu_accelerator_ops({"device": "cuda"}, knobs, 0.1, presets, 1, probes) is None
    assert presets.read_text() == before and not probes
    result = pdd.cpu_accelerator_ops({}, knobs, 0.1, presets, 1, probes)
    link = next(iter(json.loads(presets.read_text())["host_links"].values()))
    assert link["thread_selective_step_elems_per_s"]["value"] == pytest.approx(
        result["fits"]["step"]["elems_per_s"])
    assert pdd.cpu_accelerator_ops({}, knobs, 0.1, presets, 1, probes) is result


def test_overlap_slowdown_is_the_probes_median_ratios():
    """The overlap's slowdowns probed on this host (one tiny shape, three rounds; no timing
    asserted): each is its op's median at half the cores over its median at all of them,
    the shape is probed once, torch's thread count is given back, and a GPU run gets
    none."""
    import torch

    zo = {"shape": "gpt2:layers=1,hidden=64,heads=2", "batch": 1, "seq": 16,
          "update_interval": 4, "threads": {"cores": 2}}
    probes: dict = {}
    threads = torch.get_num_threads()
    assert pdd.overlap_slowdown({**zo, "device": "cuda"}, 3, probes) is None and not probes
    r = pdd.overlap_slowdown(zo, 3, probes)
    assert torch.get_num_threads() == threads
    assert r["threads"] == {"all": 2, "overlap": 1}
    med = r["median_s"]
    assert r["compute_slowdown"] == pytest.approx(med["compute overlap"] / med["compute all"])
    assert r["copy_slowdown"] == pytest.approx(med["copy overlap"] / med["copy all"])
    from zfbench.core.models import get_model
    from zfbench.real.model import build_model
    assert r["gradient_elems"] == sum(
        p.numel() for p in build_model(get_model(zo["shape"])).parameters())
    assert pdd.overlap_slowdown(zo, 3, probes) is r


def test_table_backward_ops_differ_only_in_the_weights_layout():
    """The probe's two table backwards give the same gradient values (the layout is all
    that differs), the column-major one in the weight's column-major strides; tied, the
    head's contribution is in it."""
    import torch

    for tied in (False, True):
        torch.manual_seed(0)
        fns = ops.layout_ops(40, 8, tokens=5, tied=tied)
        kind = "tied" if tied else "table"
        row, col = fns[f"{kind}_row"], fns[f"{kind}_col"]
        row()
        col()
        w_row, w_col = row.weight, col.weight
        assert w_col.stride() == (1, 40) and w_row.stride() == (8, 1)
        assert w_col.grad.stride() == (1, 40) and w_row.grad.stride() == (8, 1)
        torch.testing.assert_close(w_row.grad, w_col.grad.contiguous(), rtol=1e-6, atol=1e-6)
        looked_up = int((w_row.grad.abs().sum(1) > 0).sum())
        assert looked_up <= 5 if not tied else looked_up == 40  # the head touches every row


def test_selective_adamw_takes_deepspeeds_transposed_gradient():
    """The probe's AdamW runs on the gathered [rows, k] weights with the gradient laid out
    as DeepSpeed passes it (its flat [k, rows] buffer viewed transposed), not like the
    weights: the strides cross, which is what makes DeepSpeed's selective step slow."""
    t = ops.selective_ops(64, 40, 4)["adamw"].tensors
    assert t["param"].shape == t["grad"].shape == (64, 4)
    assert t["grad"].stride() == (1, 64) and t["param"].stride() == (4, 1)
