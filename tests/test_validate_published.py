"""`python -m zfbench.validate --published`: the fixture tests/data/published_small.csv end
to end, the file checks, and the anchor and metric rules against hand computations."""

import csv
import json
from pathlib import Path

import pytest

from zfbench.validate import published as vp
from zfbench.core import hardware
from zfbench.core.models import get_model
from zfbench.sims import compute_efficiency as ce
from zfbench.sims.costs import ADAM_BYTES_PER_PARAM
from zfbench.sims.device_step import BESIDE_ADAM_BYTES_PER_ELEM
from zfbench.validate.command import main as validate_main
from zfbench.validate.metrics import STEP_PARTS

FIXTURE = Path(__file__).parent / "data" / "published_small.csv"
V100 = hardware.get_gpu("v100-sxm3-32g")
HOST = hardware.get_host("xeon-8168")
SMALL = "gpt2:layers=4,hidden=512,heads=8"


def read(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("published")
    assert validate_main(["--published", str(FIXTURE), "--out", str(out), "--quiet"]) == 0
    return {r["id"]: r for r in read(out / "published.csv")}, out


def counted(model: str, batch: int, seq: int, accum: int = 1) -> float:
    """The counting rule by hand: 4 x forward FLOPs (checkpointing) per token."""
    return 4 * get_model(model).forward_flops_per_token(seq) * batch * seq * accum


def test_end_to_end_columns_statuses_and_signed_errors(run):
    rows, out = run
    with open(FIXTURE, newline="") as handle:
        columns = next(csv.reader(handle))
    with open(out / "published.csv", newline="") as handle:
        header = next(csv.reader(handle))
    assert header[:len(columns)] == columns
    assert header[len(columns):len(columns) + 3] == ["simulated", "error_pct", "status"]
    assert [r["status"] for r in rows.values()][:5] == ["ok"] * 5
    assert rows["bf16"]["status"].startswith("unsupported: ")
    assert "no bf16 tensor cores" in rows["bf16"]["status"]
    for r in rows.values():
        if r["status"] == "ok":
            sim, pub = float(r["simulated"]), float(r["value"])
            assert float(r["error_pct"]) == pytest.approx(100 * (sim - pub) / pub, rel=1e-4)
    assert (out / "published_summary.json").exists()


def compute_by_hand(model: str, batch: int, seq: int) -> float:
    """Forward and backward of one micro-batch on a V100 by shape: the counted FLOPs at the
    V100's GEMM efficiency, then every decoder layer's elementwise bytes (forward,
    recomputed forward and backward: zfbench.sims.compute_efficiency's census) and the
    loss's at its HBM bandwidth."""
    shape = get_model(model)
    reference, ref_batch, ref_seq = ce.parse_reference(V100.mfu_reference)
    e = ce.gemm_efficiency(V100.default_mfu, (get_model(reference), ref_seq, ref_batch, True),
                           V100.fp16_flops_per_s, V100.hbm_bytes_per_s)
    fwd, bwd = ce.layer_bytes_per_token(shape, seq)
    loss = (38 + 14) * shape.vocab  # the fp32 loss over the vocabulary, per token
    moved = (shape.layers * (2 * fwd + bwd) + loss) * batch * seq
    return counted(model, batch, seq) / (V100.fp16_flops_per_s * e) + moved / V100.hbm_bytes_per_s


def test_device_row_by_hand(run):
    """One V100, no offload: step = compute by shape + device step (the fused Adam and
    DeepSpeed's passes beside it, zfbench.sims.device_step)."""
    rows, _ = run
    params = get_model(SMALL).total_params
    compute = compute_by_hand(SMALL, 4, 512)
    adam = params * (ADAM_BYTES_PER_PARAM + BESIDE_ADAM_BYTES_PER_ELEM) / (
        V100.hbm_bytes_per_s * 0.8)
    assert float(rows["pt"]["simulated"]) == pytest.approx(compute + adam, rel=1e-6)


def test_anchor_mfu_by_hand(run):
    """The anchor's measured step P = C(m) + Adam with C(m) = F / (peak m), so
    m = F / (peak (P - Adam)); the anchored row runs at that m."""
    rows, _ = run
    params = get_model(SMALL).total_params
    adam = params * (ADAM_BYTES_PER_PARAM + BESIDE_ADAM_BYTES_PER_ELEM) / (
        V100.hbm_bytes_per_s * 0.8)
    mfu = counted(SMALL, 4, 512) / (V100.fp16_flops_per_s * (0.05 - adam))
    assert float(rows["zo"]["mfu"]) == pytest.approx(mfu, rel=1e-6)
    # the unanchored row runs by shape, at its own whole-model MFU
    pt_mfu = counted(SMALL, 4, 512) / (V100.fp16_flops_per_s * compute_by_hand(SMALL, 4, 512))
    assert float(rows["pt"]["mfu"]) == pytest.approx(pt_mfu, rel=1e-9)
    assert pt_mfu < V100.default_mfu  # hidden 512 is far below the reference's 4096
    # anchors ignored, the row runs at the default MFU: a different number
    assert float(rows["zo"]["simulated_no_anchor"]) != pytest.approx(
        float(rows["zo"]["simulated"]), rel=1e-3)
    row = dict(zip(vp.COLUMNS, [""] * len(vp.COLUMNS)))
    row.update({k: v for k, v in rows["zo"].items() if k in vp.COLUMNS})
    settings = vp.row_settings(row).with_(mfu=mfu)
    again = vp.measure(vp.simulate(settings, "zero-offload"), "tflops_per_gpu", vp.SKIP_STEPS)
    assert float(rows["zo"]["simulated"]) == pytest.approx(again, rel=1e-5)


def test_host_adam_row_by_hand(run):
    """One GPU's whole partition on the 48 cores of the DGX-2 host at the preset rate,
    its threads unbound over the 2 sockets: half its traffic remote, at 0.6 of local
    (zfbench.sims.host_step), so 0.75 of the local rate."""
    rows, _ = run
    params = get_model(SMALL).total_params
    rate = HOST.cores * HOST.adam_params_per_s_per_core / (0.5 + 0.5 / 0.6)
    assert float(rows["adam"]["simulated"]) == pytest.approx(params / rate, rel=1e-6)


def test_accumulation_counts_every_micro_step(run):
    """Eight micro-steps: the counted FLOPs are 8x one micro-step's, over the longer step."""
    rows, _ = run
    one, eight = float(rows["zo"]["simulated_no_anchor"]), float(rows["zo-accum"]["simulated"])
    assert eight > one  # the host update is paid once per eight micro-steps
    assert eight < V100.fp16_flops_per_s * V100.default_mfu / 1e12


def test_summary_is_mean_absolute_error_per_source(run):
    rows, _ = run
    ok = [r for r in rows.values() if r["status"] == "ok"]
    done = [{**r, "error_pct": float(r["error_pct"]),
             "error_pct_no_anchor": float(r["error_pct_no_anchor"]),
             "error_pct_loso": float(r["error_pct_loso"])} for r in rows.values()
            if r["status"] == "ok"]
    head = vp.summary(done)
    assert head["mae_pct"] == pytest.approx(sum(abs(float(r["error_pct"])) for r in ok) / len(ok))
    # no row of the fixture calibrates a constant: leave-one-source-out changes nothing
    assert head["mae_loso_pct"] == pytest.approx(head["mae_pct"])
    assert all(r["loso_judged"] == "" for r in ok)
    per = {s["source"]: s for s in head["per_source"]}
    a = [abs(float(r["error_pct"])) for r in ok if r["source"] == "test fixture A"]
    assert per["test fixture A"]["mae_pct"] == pytest.approx(sum(a) / len(a))
    assert per["test fixture A"]["rows"] == 3


def test_table_is_printed_with_the_error_lines(capsys, tmp_path):
    assert validate_main(["--published", str(FIXTURE), "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "mean absolute error" in out and "anchors ignored" in out
    assert "test fixture B" in out and "zi-32" in out


def test_unknown_column_is_an_error_naming_it(tmp_path, capsys):
    text = FIXTURE.read_text().splitlines()
    text = [text[0] + ",batch"] + [line + ",4" for line in text[1:]]
    path = tmp_path / "extra.csv"
    path.write_text("\n".join(text) + "\n")
    assert validate_main(["--published", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "unknown column 'batch'" in err
    assert not (tmp_path / "o").exists()


def test_missing_column_and_repeated_id(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("id,source,metric,value\nx,s,step_time_s,1\n")
    assert validate_main(["--published", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "missing column 'strategy'" in capsys.readouterr().err
    lines = FIXTURE.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[1]]) + "\n")
    assert validate_main(["--published", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "id 'pt' is given twice" in capsys.readouterr().err


def test_bad_anchor_and_metric_are_unsupported_rows():
    _, rows = vp.read_rows(FIXTURE)
    by_id = {r["id"]: r for r in rows}
    row = {**by_id["zo"], "anchor": "nothere"}
    assert vp.simulate_row(row, by_id, {})["status"] == \
        "unsupported: anchor 'nothere' names no row of the file"
    row = {**by_id["zo"], "anchor": "adam"}  # a host-Adam row cannot fix the GPU's MFU
    assert "an anchor gives a step time or a throughput (step_time_s, tflops_per_gpu" in \
        vp.simulate_row(row, by_id, {})["status"]
    row = {**by_id["pt"], "metric": "joules"}
    assert vp.simulate_row(row, by_id, {})["status"].startswith("unsupported: metric 'joules'")
    # a strategy the simulator does not have is named before any of its settings
    row = {**by_id["zo"], "strategy": "l2l", "overlap_comm": "false"}
    assert vp.simulate_row(row, by_id, {})["status"].startswith(
        "unsupported: strategy 'l2l' is not simulated; choose one of device, ")


def test_bundled_dataset_is_complete():
    columns, rows = vp.read_rows(vp.bundled_path())
    assert columns == list(vp.COLUMNS) and len(rows) == 42
    ids = {r["id"] for r in rows}
    assert all(r["anchor"] in ids for r in rows if r["anchor"])
    # the papers' rows state per-GPU throughput and times (the whole-run throughputs are
    # for rows a user adds: docs/published.md)
    assert {r["metric"] for r in rows} == set(vp.METRICS) - {"pflops_total", "samples_per_s",
                                                             "tokens_per_s"}
    for r in rows:  # every row is expressible
        vp.row_settings(r)


@pytest.mark.slow
def test_bundled_dataset_runs_with_no_row_unsupported(tmp_path):
    assert validate_main(["--published", "--out", str(tmp_path), "--quiet"]) == 0
    rows = read(tmp_path / "published.csv")
    assert len(rows) == 42 and all(r["status"] == "ok" for r in rows)
    calib = [r["id"] for r in rows if r["calibration"]]
    assert calib == ["zo-table4-cpuadam-10b", "zf-blog-fig3-llama7b-adam"]
    head = json.loads((tmp_path / "published_summary.json").read_text())
    assert head["ok"] == 40 and head["calibration"] == calib
    # zo-fig8-10b set the V100's MFU until the census (issue 44): now a check, scored
    check = next(r for r in rows if r["id"] == "zo-fig8-10b")
    assert check["calibration"] == "" and float(check["error_pct"]) == pytest.approx(
        100 * (float(check["simulated"]) - 40.95) / 40.95, rel=1e-3)


def test_figure_facts_from_a_published_table():
    import pandas as pd

    from zfbench.analysis.plot_published import published_facts, short_source

    df = pd.DataFrame({
        "id": ["a", "b", "c", "d"], "source": ["P, arXiv 1, Figure 1"] * 2 + ["Q, arXiv 2, Table 3"] * 2,
        "metric": ["tflops_per_gpu"] * 4, "strategy": ["device"] * 4, "value": [10, 10, 10, 10],
        "simulated": [11, 9.5, 14, ""], "error_pct": [10.0, -5.0, 40.0, ""],
        "status": ["ok", "ok", "ok", "unsupported: x"]})
    f = published_facts(df)
    assert f["rows"] == 3 and f["unsupported"] == 1
    assert f["mae_pct"] == pytest.approx(55 / 3)
    assert f["within_15_pct"] == pytest.approx(200 / 3) and f["worst_id"] == "c"
    assert (f["best_source"], f["best_source_pct"]) == ("P Figure 1", pytest.approx(7.5))
    assert short_source("Q, arXiv 2, Table 3") == "Q Table 3"
    # a calibration row reproduces itself: left out of every number, as validate does
    df["calibration"] = ["", "", "", ""]
    calibrated = pd.concat([df, pd.DataFrame({
        "id": ["e"], "source": ["R, arXiv 3, Table 4"], "metric": ["host_adam_time_s"],
        "strategy": ["zero-offload"], "value": [2.0], "simulated": [2.0], "error_pct": [0.0],
        "status": ["ok"], "calibration": ["host adam_params_per_s_per_core"]})])
    g = published_facts(calibrated)
    assert (g["rows"], g["calibration"]) == (3, 1) and g["mae_pct"] == f["mae_pct"]
    assert g["best_source"] == "P Figure 1"


def test_backward_time_by_hand():
    """One GPU: device's backward is the backward compute alone (its blocks' backward:
    by shape, the recomputed forward and the backward); zero-offload's also waits for the last gradient to land on the host, so
    it is longer by at least the last bucket's copy and at most every copy (fp32
    gradients: 4 B per element)."""
    _, rows = vp.read_rows(FIXTURE)
    row = {**{r["id"]: r for r in rows}["pt"], "metric": "backward_time_s"}
    settings = vp.row_settings(row)
    device = vp.simulate(settings, "device")
    bwd = sum(b.backward_s for b in device.costs.buckets)
    fwd = sum(b.forward_s for b in device.costs.buckets)
    assert bwd + fwd == pytest.approx(compute_by_hand(SMALL, 4, 512), rel=1e-9)
    assert vp.measure(device, "backward_time_s", vp.SKIP_STEPS) == pytest.approx(bwd, rel=1e-9)
    offload = vp.measure(vp.simulate(settings, "zero-offload"), "backward_time_s", vp.SKIP_STEPS)
    c = device.costs
    first_bucket = c.buckets[0].numel * 4 / 12e9
    assert bwd + first_bucket <= offload <= bwd + c.params * 4 / 12e9 + 1e-3


def _row(by_id: dict, name: str, **changes) -> dict:
    row = dict(zip(vp.COLUMNS, [""] * len(vp.COLUMNS)))
    row.update({k: v for k, v in by_id[name].items() if k in vp.COLUMNS})
    row.update({k: str(v) for k, v in changes.items()})
    return row


def test_throughput_metrics_are_one_step_time_in_other_units():
    """Two GPUs, eight micro-steps of 4 x 512: every throughput metric of one simulated
    run is what a step does in its units over the same step time."""
    _, rows = vp.read_rows(FIXTURE)
    row = _row({r["id"]: r for r in rows}, "zo-accum", gpus=2)
    result = vp.simulate(vp.row_settings(row), "zero-offload")
    step = vp.measure(result, "step_time_s", vp.SKIP_STEPS)
    flops = counted(SMALL, 4, 512, 8)  # per GPU per step
    assert vp.measure(result, "tflops_per_gpu", vp.SKIP_STEPS) == \
        pytest.approx(flops / step / 1e12, rel=1e-12)
    assert vp.measure(result, "pflops_total", vp.SKIP_STEPS) == \
        pytest.approx(2 * flops / step / 1e15, rel=1e-12)
    assert vp.measure(result, "samples_per_s", vp.SKIP_STEPS) == \
        pytest.approx(2 * 4 * 8 / step, rel=1e-12)
    assert vp.measure(result, "tokens_per_s", vp.SKIP_STEPS) == \
        pytest.approx(2 * 4 * 8 * 512 / step, rel=1e-12)


@pytest.mark.parametrize("metric, value", [
    ("samples_per_s", 4 / 0.05), ("tokens_per_s", 4 * 512 / 0.05),
    ("tflops_per_gpu", None), ("pflops_total", None)])
def test_an_anchor_in_any_throughput_gives_the_step_time_anchors_mfu(metric, value):
    """The fixture's anchor measures a 0.05 s step; the same measurement stated as a
    throughput fixes the same MFU."""
    _, rows = vp.read_rows(FIXTURE)
    by_id = {r["id"]: r for r in rows}
    if value is None:
        value = counted(SMALL, 4, 512) / 0.05 / (1e12 if metric == "tflops_per_gpu" else 1e15)
    stated = _row(by_id, "pt", metric=metric, value=repr(value))
    assert vp.anchor_mfu(stated) == pytest.approx(vp.anchor_mfu(_row(by_id, "pt")), rel=1e-9)


def test_figure_draws_one_panel_per_kind_of_quantity():
    import pandas as pd

    from zfbench.analysis.plot_published import plot_published

    base = {"source": "P, arXiv 1, Figure 1", "strategy": "device", "value": 10.0,
            "simulated": 11.0, "error_pct": 10.0, "status": "ok", "calibration": ""}
    per_gpu = pd.DataFrame([{**base, "id": "a", "metric": "tflops_per_gpu"}])
    both = pd.concat([per_gpu, pd.DataFrame([{**base, "id": "b", "metric": "tokens_per_s"},
                                             {**base, "id": "c", "metric": "step_time_s"}])])
    assert len(plot_published(per_gpu).axes) == 1
    assert len(plot_published(both).axes) == 3


def test_offload_activations_column():
    _, rows = vp.read_rows(vp.bundled_path())
    row = {**next(r for r in rows if r["id"] == "zi-fig6c-4gpu-zi"), "model": SMALL,
           "micro_batch": "2", "metric": "step_time_s", "anchor": ""}
    plain = vp.simulate_row(row, {}, {})
    offloaded = vp.simulate_row({**row, "offload_activations": "true"}, {}, {})
    assert plain["status"] == offloaded["status"] == "ok"
    assert float(offloaded["simulated"]) > float(plain["simulated"])
    assert vp.row_settings({**row, "offload_activations": "true"}).infinity.offload_activations
    zo = next(r for r in rows if r["id"] == "zo-fig9-2b-zo")
    assert vp.simulate_row({**zo, "offload_activations": "true"}, {}, {})["status"] == \
        ("unsupported: offload_activations is a zero-infinity setting (DeepSpeed's "
         "cpu_checkpointing); leave it empty")


def test_each_row_says_where_its_simulated_step_goes(run):
    rows, _ = run
    for r in rows.values():
        if r["status"] != "ok":
            assert r["sim_step_time_s"] == ""
            continue
        step, compute, io, wait = (float(r[k]) for k in STEP_PARTS)
        assert step > 0 and min(compute, io, wait) >= 0
        assert compute + io + wait == pytest.approx(step, rel=1e-6)  # the parts add up
        if r["metric"] == "step_time_s" and not r["anchor"]:
            assert step == pytest.approx(float(r["simulated"]), rel=1e-9)


def test_an_anchored_row_says_what_its_measurement_leaves_beside_compute(run):
    rows, _ = run
    zo = rows["zo"]  # tflops_per_gpu (one micro-step a step), anchored to the PyTorch row
    implied = counted(zo["model"], int(zo["micro_batch"]), int(zo["seq"])) / \
        (float(zo["value"]) * 1e12)
    assert float(zo["pub_non_compute_s"]) == pytest.approx(
        implied - float(zo["sim_compute_s"]), rel=1e-9)
    assert all(r["pub_non_compute_s"] == "" for r in rows.values() if not r["anchor"])


def _published_consistency():
    """bench/published_consistency.py as a module (bench/ is not a package)."""
    import sys
    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    try:
        import published_consistency
    finally:
        sys.path.remove(str(bench))
    return published_consistency


def test_dpu_pair_bound_by_hand(tmp_path):
    """bench/published_consistency.py: the host step a ZeRO-Offload/DPU pair allows is the
    difference of their step times (counted FLOPs over each throughput), widened by the
    read-off band; Table 4's Adam scales with the partition's parameters."""
    pc = _published_consistency()
    _, rows = vp.read_rows(vp.bundled_path())
    by_id = {r["id"]: r for r in rows}
    zo, dpu = dict(by_id["zo-fig14-b2-zo"]), dict(by_id["zo-fig14-b2-dpu"])
    zo.update(value="10", anchor="")
    dpu.update(value="20", anchor="")
    table4 = by_id[pc.TABLE4_ID]
    table = pc.pairs([zo, dpu, table4])
    assert len(table) == 1
    row = table.iloc[0]
    settings = vp.row_settings(zo)
    from zfbench.sims.costs import CostModel
    from zfbench.validate.metrics import counted_flops
    costs = CostModel(settings)
    tflop = counted_flops(settings, costs) / 1e12
    assert row.host_step_bound_s == pytest.approx(tflop / 10 - tflop / 20)
    assert row.host_step_bound_max_s == pytest.approx(tflop / 9.5 - tflop / 20.5)
    t4 = vp.row_settings(table4)
    assert row.table4_adam_s == pytest.approx(
        2.57 * costs.params / CostModel(t4).params)
    # the device's floor: the counted FLOPs at the V100's fp16 peak
    peak = hardware.get_gpu(settings.machine.gpu).peak_flops_per_s("fp16")
    assert row.compute_floor_s == pytest.approx(tflop * 1e12 / peak)
    assert bool(row.bound_holds) == (row.compute_floor_s > row.host_step_bound_max_s)


def test_depth_pairs_by_hand():
    """bench/published_consistency.py: two throughput rows alike but for depth give the
    published ratio, its read-off band, and the simulator's ratio of the same two rows."""
    pc = _published_consistency()
    _, rows = vp.read_rows(vp.bundled_path())
    by_id = {r["id"]: r for r in rows}
    shallow = dict(by_id["zo-fig9-2b-dpu"], id="shallow", value="30",
                   model="gpt2:layers=20,hidden=2048,heads=16")
    deep = dict(by_id["zo-fig9-2b-dpu"], id="deep", value="40")
    other = dict(by_id["zo-fig9-2b-zo"], id="other-strategy", value="5",
                 model="gpt2:layers=30,hidden=2048,heads=16")
    table = pc.depth_pairs([shallow, deep, other])
    assert len(table) == 1  # the ZeRO-Offload row pairs with nothing
    row = table.iloc[0]
    assert (row.shallow_id, row.deep_id) == ("shallow", "deep")
    assert row.published_ratio == pytest.approx(0.75)
    assert row.published_ratio_low == pytest.approx(29.5 / 40.5)
    assert row.published_ratio_high == pytest.approx(30.5 / 39.5)
    sims = {r["id"]: vp.simulate_row(r, {}, {})["simulated_no_anchor"] for r in (shallow, deep)}
    assert row.simulated_ratio == pytest.approx(sims["shallow"] / sims["deep"])
    nearest = min(max(row.simulated_ratio, row.published_ratio_low), row.published_ratio_high)
    assert row.gap_at_nearest_pct == pytest.approx(100 * (nearest / row.simulated_ratio - 1))


def test_no_offload_rates_by_hand():
    """bench/published_consistency.py: a one-GPU row without offload gives the step its
    number stands for, counted FLOPs over that step and over the simulated one as
    fractions of the GPU's peak, and the simulated step over the published one; rows with
    offload or on several GPUs are not in the table."""
    pc = _published_consistency()
    _, rows = vp.read_rows(vp.bundled_path())
    by_id = {r["id"]: r for r in rows}
    device = dict(by_id["zo-fig14-b4-pt"], id="mine", metric="step_time_s", value="2.0")
    offload = by_id["zo-fig14-b4-zo"]
    several = dict(by_id["zo-fig14-b4-pt"], id="several", gpus="2")
    table = pc.no_offload_rates([device, offload, several])
    assert list(table.id) == ["mine"]
    row = table.iloc[0]
    settings = vp.row_settings(device)
    from zfbench.sims.costs import CostModel
    from zfbench.validate.metrics import counted_flops
    flops = counted_flops(settings, CostModel(settings))
    peak = hardware.get_gpu(settings.machine.gpu).peak_flops_per_s("fp16")
    simulated = float(vp.simulate_row(device, {}, {})["sim_step_time_s"])
    assert row.published_step_s == 2.0
    assert row.simulated_step_s == pytest.approx(simulated)
    assert row.published_fraction_of_peak == pytest.approx(flops / (2.0 * peak))
    assert row.simulated_fraction_of_peak == pytest.approx(flops / (simulated * peak))
    assert row.measured_speed_over_simulated == pytest.approx(simulated / 2.0)


def test_the_held_out_rows_run_and_stay_out_of_the_bundled_error():
    """The held-out file (Megatron-LM's single-V100 baselines) is in the published format,
    every row simulates, and none of its ids is in the bundled dataset."""
    path = vp.bundled_path().with_name("held_out_no_offload_v100.csv")
    _, held = vp.read_rows(path)
    _, bundled = vp.read_rows(vp.bundled_path())
    assert {r["id"] for r in held}.isdisjoint(r["id"] for r in bundled)
    for row in held:
        out = vp.simulate_row(row, {}, {})
        assert out["status"] == "ok", (row["id"], out["status"])
        assert 0 < float(out["simulated"]) < float("inf")


def test_the_papers_other_settings_simulate_with_no_row_unsupported():
    """Rows in the published format beyond the bundled ones (other GPU counts, shapes,
    placements, strategies and nodes, as the same papers' other figures use them): every
    one simulates to a finite positive value, none unsupported."""
    base = {c: "" for c in vp.COLUMNS}
    base.update(source="other settings", value="1", hardware="dgx2-v100", seq="1024",
                precision="fp16", activation_checkpointing="true")
    gpt2 = "gpt2:layers={},hidden={},heads={}".format
    settings = [
        dict(strategy="zero-offload", gpus="64", model=gpt2(50, 4096, 32), micro_batch="8"),
        dict(strategy="zero-offload-dpu", gpus="128", model=gpt2(20, 2048, 16),
             micro_batch="2", grad_accum="4"),
        dict(strategy="device", gpus="16", model=gpt2(50, 4096, 32), micro_batch="4"),
        dict(strategy="zero-infinity", gpus="512", model=gpt2(128, 25600, 160),
             micro_batch="1", offload_params="nvme", offload_activations="true"),
        dict(strategy="zero-infinity", gpus="16", model=gpt2(10, 8192, 16), micro_batch="8",
             offload_params="cpu", offload_optimizer="nvme", metric="backward_time_s"),
        dict(strategy="zenflow", hardware="h100-4x-gen5", gpus="4", model="llama2-7b",
             micro_batch="1", precision="bf16", metric="step_time_s"),
        dict(strategy="zero-offload", hardware="a100-8x-gen4", gpus="8", model="llama2-13b",
             micro_batch="2", seq="2048", precision="bf16", bind_cores="true",
             metric="step_time_s"),
        dict(strategy="zero-offload", gpus="4", model=gpt2(20, 2048, 16), micro_batch="4",
             metric="host_adam_time_s"),
    ]
    rows = [{**base, "metric": "tflops_per_gpu", "id": f"other-{k}", **knobs}
            for k, knobs in enumerate(settings)]
    out = vp.validate_rows(rows, quiet=True)
    assert [r["status"] for r in out] == ["ok"] * len(rows)
    assert all(0 < float(r["simulated"]) < float("inf") for r in out)
