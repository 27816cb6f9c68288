"""The figure index: each paper figure drawn from files, with the sentence that says what
it shows (numbers read from the same data), and the README that lists them all.

Covers: `FigureData` (where the simulated CSVs and the measured files are, plus the few
settings the sentences quote), `FIGURES` (number, file stem, title, question, inputs and
drawing function of figures 1-18) and `render_readme`. No simulation happens here:
`zfbench.figures` makes the simulated CSVs and calls these functions; the measured
layouts are in `zfbench.analysis.plot_measured`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from zfbench.analysis import plot_measured as pm, plot_sweeps as ps, plot_training as pt, plots as pl
from zfbench.analysis import plot_run as pr
from zfbench.analysis import plot_published as pp
from zfbench.analysis import plot_convergence as pc
from zfbench.analysis import plot_zero3 as pz

MEASURED_COMMANDS = {
    "validate": "`python -m zfbench.validate --out <measured>`",
    "heatmap": "`python -m zfbench.gradients --out <measured>`",
    "column_norms": "`python -m zfbench.gradients --out <measured>`",
    "accuracy": "`python -m zfbench.accuracy --out <measured>`, or `python -m zfbench.run "
                "--out <measured>/accuracy` for training-loss curves alone",
    "quality": "`python -m zfbench.accuracy --out <measured>`; optional: without it the "
               "final training loss is shown",
    "windows": "`python -m zfbench.accuracy --out <measured>`, from its zenflow run with "
               "`update_interval: \"auto\"`",
    "run": "`python -m zfbench.run --model llama2-7b --gpus 4 --out <measured>/run`",
}


@dataclass
class FigureData:
    """Where a figure's files are, and the settings its sentence quotes.

    `meta` keys: first_step (first steady-state step of the timelines), where (model and
    node of the timelines), update_interval, topk_ratio (the defaults), timeline_steps,
    window_s and util_bin_s (figure 1), gpus (figure 8's counts), convergence_dir and
    convergence_lm_dir (figure 17's committed topic and LM results)."""
    data_dir: Path
    measured: Path
    meta: dict
    _cache: dict = field(default_factory=dict, repr=False)

    def table(self, file: str) -> pd.DataFrame:
        if file not in self._cache:
            self._cache[file] = pd.read_csv(self.data_dir / file)
        return self._cache[file]

    def timeline(self, strategy: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        return (self.table(f"timeline_{strategy}.spans.csv"),
                self.table(f"timeline_{strategy}.steps.csv"))

    def path(self, key: str) -> Path:
        return self.measured / pm.LAYOUT[key]

    @property
    def first(self) -> int:
        return int(self.meta["first_step"])

    @property
    def where(self) -> str:
        return self.meta["where"]


def eng_bytes(nbytes: float) -> str:
    return EngFormatter("B", places=1)(nbytes)


def fig_utilization(c: FigureData):
    runs = {s: c.timeline(s) for s in ("zero-offload", "zenflow")}
    window = min(c.meta["window_s"], *(float(st["t_end_s"].max()) for _, st in runs.values()))
    util = pd.concat([pl.busy_fraction_bins(sp, bin_s=c.meta["util_bin_s"], t_end_s=window)
                      .assign(strategy=s) for s, (sp, _) in runs.items()], ignore_index=True)
    f = pl.utilization_facts(util)
    fig = pl.plot_gpu_utilization(util, f"GPU utilization over {window:.0f} s, {c.where} "
                                  f"(simulated, rank 0)")
    return fig, (f"Over the first {window:.0f} s of training {c.where}, the GPU computes "
                 f"{f['zero-offload_util_pct']:.0f}% of the time under ZeRO-Offload and "
                 f"{f['zenflow_util_pct']:.0f}% under ZenFlow "
                 f"({f['zenflow_util_pct'] / f['zero-offload_util_pct']:.1f}x).")


def fig_offload_step(c: FigureData):
    spans, steps = c.timeline("zero-offload")
    f = pl.step_facts(spans, steps, c.first)
    fig = pl.plot_offload_step(spans, steps, c.first, f"One ZeRO-Offload step, {c.where} "
                               f"(simulated, step {c.first})")
    return fig, (f"A steady ZeRO-Offload step lasts {f['wall_s']:.2f} s of which the GPU "
                 f"computes {f['compute_s']:.2f} s, so it idles {f['stall_pct']:.0f}% of the "
                 f"step: {f['host_wait_s']:.2f} s waiting for the host Adam "
                 f"({f['host_optim_s']:.2f} s in all) and {f['exposed_io_s']:.2f} s on "
                 f"transfers.")


def fig_overlap_limit(c: FigureData):
    spans, steps = c.timeline("zero-offload-dpu")
    f = pl.overlap_limit_facts(spans, steps, c.first, 3)
    zo = pl.overlap_limit_facts(*c.timeline("zero-offload"), c.first, 3)
    fig = pl.plot_overlap_limit(spans, steps, c.first, 3)
    return fig, (f"With DPU the host Adam of one step takes {f['host_optim_s']:.2f} s, "
                 f"{f['host_over_fwd_bwd']:.1f}x the {f['fwd_bwd_s']:.2f} s of "
                 f"forward+backward it can hide behind, so at least "
                 f"{f['exposed_host_s']:.2f} s stay exposed: the step takes "
                 f"{f['wall_s']:.2f} s (ZeRO-Offload {zo['wall_s']:.2f} s) and the GPU still "
                 f"stalls {f['stall_pct']:.0f}% of it.")


def fig_pipeline(c: FigureData):
    spans, steps = c.timeline("zenflow")
    u = c.meta["update_interval"]
    count = min(3 * u, c.meta["timeline_steps"] - c.first)
    f = pl.pipeline_facts(spans, steps, c.first, count)
    fig = pl.plot_zenflow_pipeline(spans, steps, c.first, count)
    return fig, (f"With U={f['update_interval']}, the host Adam of a window "
                 f"({f['host_optim_per_window_s']:.2f} s) runs behind the next window's "
                 f"{f['window_compute_s']:.2f} s of GPU compute, beside "
                 f"{f['host_accum_per_step_s']:.2f} s of host accumulation per step; the host "
                 f"is busy {f['host_busy_pct']:.0f}% of the time and a step averages "
                 f"{f['wall_s']:.2f} s with {f['stall_pct']:.0f}% GPU stall.")


def fig_breakdown(c: FigureData):
    df, paper = c.table("breakdown.csv"), c.table("paper_predict.csv")
    f, p = ps.breakdown_facts(df), ps.paper_facts(paper)
    zi = "" if f["zi_speedup_min"] != f["zi_speedup_min"] else (  # NaN: no such rows
        f" ({f['zi_speedup_min']:.2f}-{f['zi_speedup_max']:.2f}x faster than ZeRO-Infinity "
        f"with parameters on cpu)")
    return ps.plot_step_breakdown(df, paper=paper), (
                 f"Across {df['model'].nunique()} models and {df['node'].nunique()} nodes "
                 f"ZenFlow's step is {f['speedup_min']:.2f}x ({f['speedup_min_case']}) to "
                 f"{f['speedup_max']:.2f}x ({f['speedup_max_case']}) faster than "
                 f"ZeRO-Offload{zi} and its stall {f['stall_reduction_min_pct']:.0f}-"
                 f"{f['stall_reduction_max_pct']:.0f}% shorter; ZeRO-Offload stalls "
                 f"{f['zo_stall_min_pct']:.0f}-{f['zo_stall_max_pct']:.0f}% of each step. "
                 f"Predicted from the paper's {p['bars']} ZeRO-Offload bars (each fitted on "
                 f"its node, then ZenFlow simulated there), ZenFlow is {p['speedup_min']:.2f}-"
                 f"{p['speedup_max']:.2f}x faster ({p['range_min']:.2f}-{p['range_max']:.2f}x "
                 f"over how the I/O divides between directions); the paper reports up to 5x.")


def fig_pcie(c: FigureData):
    u_df, k_df = c.table("sweep_update_interval.csv"), c.table("sweep_topk_ratio.csv")
    f = ps.pcie_facts(u_df, k_df, c.meta["update_interval"], c.meta["topk_ratio"])
    fig = ps.plot_pcie_traffic(u_df, k_df, f"PCIe bytes per step, {c.where} (simulated)")
    return fig, (f"At U={f['default_u']} and top-k {f['default_k_pct']:g}% ZenFlow's design "
                 f"moves {f['design']:.2f}x the model's bytes over PCIe per step, DeepSpeed's "
                 f"shipped path {f['shipped']:.2f}x and ZeRO-Offload {f['zero_offload']:.2f}x; "
                 f"the design's traffic spans {f['design_u_min']:.2f}-{f['design_u_max']:.2f}x "
                 f"over U={f['u_min']}-{f['u_max']} and {f['design_k_min']:.2f}-"
                 f"{f['design_k_max']:.2f}x over top-k {f['k_min_pct']:g}-{f['k_max_pct']:g}%.")


def fig_selection(c: FigureData):
    df = c.table("selection_traffic.csv")
    f = ps.selection_facts(df)
    fig = ps.plot_selection_traffic(df)
    return fig, (f"On {f['gpus']} GPUs, exchanging per-column scores moves "
                 f"{f['ratio_min']:,.0f}x ({f['ratio_min_model']}) to {f['ratio_max']:,.0f}x "
                 f"({f['ratio_max_model']}) fewer bytes per rank than all-gathering the full "
                 f"gradient (at most {eng_bytes(f['scores_max_bytes'])} against "
                 f"{eng_bytes(f['allgather_max_bytes'])} per selection).")


def fig_scaling(c: FigureData):
    df = c.table("scaling.csv")
    f = ps.scaling_facts(df)
    fig = ps.plot_scaling(df, f"Scaling from {min(c.meta['gpus'])} to {max(c.meta['gpus'])} "
                          f"GPUs, {c.meta['model']} (simulated)")
    parts = [f"on {n['node']} ZenFlow reaches {n['zf_tokens_per_s']:,.0f} tokens/s at "
             f"{n['gpus_max']} GPUs, {n['zf_over_zo']:.2f}x ZeRO-Offload"
             + (f" and {n['zf_over_zi']:.2f}x ZeRO-Infinity" if n["zf_over_zi"] ==
                n["zf_over_zi"] else "") + ", and going from "
             f"{n['gpus_min']} to {n['gpus_max']} GPUs multiplies its throughput by "
             f"{n['zf_scaling']:.1f}x (ZeRO-Offload {n['zo_scaling']:.1f}x)" for n in f["nodes"]]
    return fig, "; ".join(p if i else p[0].upper() + p[1:] for i, p in enumerate(parts)) + "."


def fig_sensitivity(c: FigureData):
    u_df, k_df = c.table("sweep_update_interval.csv"), c.table("sweep_topk_ratio.csv")
    f = ps.sensitivity_facts(u_df, k_df)
    fig = ps.plot_sensitivity(u_df, k_df, f"Step-time sensitivity of ZenFlow, {c.where} "
                              f"(simulated)")
    return fig, (f"ZenFlow's step takes {f['k_first_s']:.2f} s at top-k {100 * f['k_first']:g}% "
                 f"and {f['k_last_s']:.2f} s at {100 * f['k_last']:g}%, and "
                 f"{f['u_first_s']:.2f} s at U={f['u_first']:g} against {f['u_last_s']:.2f} s "
                 f"at U={f['u_last']:g} (best {f['u_best_s']:.2f} s at U={f['u_best']:g}); "
                 f"ZeRO-Offload takes {f['zero_offload_s']:.2f} s and the device-only run "
                 f"{f['device_s']:.2f} s.")


def fig_validation(c: FigureData):
    df = pm.load_validate(c.path("validate"), MEASURED_COMMANDS["validate"])
    f = pm.validate_facts(df)
    return pm.plot_validation(df), (
        f"Over {f['rows']} measured cells ({f['cases']} case(s)) the simulated step time "
        f"misses the measured one by {f['step_mape_pct']:.0f}% on average (worst "
        f"{f['step_delta_abs_max_pct']:.0f}%, {f['step_delta_worst']}) and the stall by "
        f"{f['stall_mae_pp']:.1f} percentage points (worst "
        f"{f['stall_delta_abs_max_pp']:.1f}).")


def fig_concentration(c: FigureData):
    heat = pm.read_table(c.path("heatmap"), ["weight", "row", "col", "abs_grad"],
                         MEASURED_COMMANDS["heatmap"])
    norms = pm.read_table(c.path("column_norms"), ["weight", "step", "col", "sq_norm"],
                          MEASURED_COMMANDS["column_norms"])
    k = c.meta["topk_ratio"]
    f = pm.concentration_facts(norms, k)
    return pm.plot_gradient_concentration(heat, norms, k), (
        f"The top {f['topk_pct']:g}% of columns hold {f['share_mean_pct']:.0f}% of the "
        f"gradient's squared norm on average ({f['share_min_pct']:.0f}-"
        f"{f['share_max_pct']:.0f}% over {f['weights']} weights and {f['steps']} steps).")


def fig_locality(c: FigureData):
    norms = pm.read_table(c.path("column_norms"), ["weight", "step", "col", "sq_norm"],
                          MEASURED_COMMANDS["column_norms"])
    k = c.meta["topk_ratio"]
    ov = pm.topk_overlap(norms, k)
    f = pm.locality_facts(ov)
    return pm.plot_temporal_locality(ov, k), (
        f"Top-{100 * k:g}% column sets of steps {f['gap_first']} apart share "
        f"{f['overlap_first_pct']:.0f}% of their columns and sets {f['gap_last']} steps "
        f"apart {f['overlap_last_pct']:.0f}%, against {f['random_pct']:.0f}% for random sets.")


def fig_loss(c: FigureData):
    losses = pt.load_losses(c.path("accuracy"), MEASURED_COMMANDS["accuracy"])
    quality = None
    if pm._find(c.path("quality")) is not None:
        quality = pm.read_table(c.path("quality"), ["strategy", "metric", "value"], "")
    f = pt.quality_facts(losses, quality)
    values = ", ".join(f"{pl.STRATEGY_STYLE.get(s, {'label': s})['label']} {v:.3f}"
                       for s, v in f["values"].items())
    ref = f" (before fine-tuning {f['reference']:.3f})" if f["reference"] is not None else ""
    tail = (f"; ZenFlow minus device: {f['zenflow_minus_device']:+.3f}"
            if "zenflow_minus_device" in f else "")
    return pt.plot_loss_curves(losses, quality), (
        f"After {f['steps']} steps the {f['metric']} is {values}{ref}{tail}.")


def fig_first_command(c: FigureData):
    measured, there, proxy = pr.load_run(c.path("run"), MEASURED_COMMANDS["run"])
    f = pr.run_facts(measured, there, proxy)
    here = (f"on this machine ZenFlow's step is {f['here']:.2f}x ZeRO-Offload's "
            f"({f['measured']}, {f['ranks']} rank(s))" if f["here"] is not None else
            f"{f['measured']} was measured without both ZenFlow and ZeRO-Offload")
    there_text = (f"; projected for {f['model'] or 'the model'} whole on the GPU node it is "
                  f"{f['there']:.2f}x (simulated)" if f["there"] is not None else "")
    return pr.plot_run(measured, there, proxy), here[0].upper() + here[1:] + there_text + "."


def fig_auto_interval(c: FigureData):
    df = pt.load_windows(c.path("windows"), MEASURED_COMMANDS["windows"])
    f = pt.window_facts(df)
    return pt.plot_auto_interval(df), (
        f"The adaptive mode closed {f['windows']} windows of {f['min']}-{f['max']} steps "
        f"(mean {f['mean']:.1f}) over {f['steps']} steps, the first of {f['first']} steps "
        f"and the last of {f['last']}.")


def fig_published(c: FigureData):
    df = c.table("published.csv")
    return pp.plot_published(df), pp.published_sentence(pp.published_facts(df))


def fig_convergence(c: FigureData):
    topics_dir, lm_dir = Path(c.meta["convergence_dir"]), Path(c.meta["convergence_lm_dir"])
    runs, curves = pc.load_study(topics_dir, lm_dir)
    steps = c.table("convergence_steps.csv")
    step_s = dict(zip(steps["strategy"], steps["step_time_s"]))
    f = pc.facts(runs, curves, step_s, pc.start_scores(topics_dir, lm_dir))
    return pc.plot(runs, curves, f, c.where), pc.sentence(f)


def fig_zero3(c: FigureData):
    df = c.table("zero3.csv")
    return pz.plot_zero3(df), pz.zero3_sentence(df)


# -- the registry and the README ------------------------------------------------------
@dataclass(frozen=True)
class FigureSpec:
    number: int
    name: str
    title: str
    question: str
    draw: Callable[[FigureData], tuple[Figure, str]]
    inputs: tuple[str, ...]  # dataset names (simulated) or LAYOUT keys (measured)
    measured: bool = False

    @property
    def stem(self) -> str:
        return f"fig{self.number:02d}_{self.name}"


FIGURES = (
    FigureSpec(1, "gpu_utilization", "GPU utilization over time",
               "How busy does the GPU stay during offloaded training, with ZeRO-Offload and "
               "with ZenFlow?", fig_utilization, ("timeline",)),
    FigureSpec(2, "zero_offload_step", "One ZeRO-Offload step",
               "Where does a ZeRO-Offload step spend its time, lane by lane?",
               fig_offload_step, ("timeline",)),
    FigureSpec(3, "overlap_limit", "Why layer-wise overlap cannot hide the host update",
               "Can overlapping the host update with the next step's compute (DPU) hide a "
               "host update longer than forward+backward?", fig_overlap_limit, ("timeline",)),
    FigureSpec(4, "zenflow_pipeline", "ZenFlow's pipeline over update windows",
               "How does ZenFlow schedule device updates, host accumulation and the "
               "asynchronous host Adam across several update windows?", fig_pipeline,
               ("timeline",)),
    FigureSpec(5, "step_breakdown", "Step-time breakdown across models and nodes",
               "How much of a step is compute, exposed I/O and host wait, for four models on "
               "A100 (gen4) and H100 (gen5) nodes, under ZeRO-Infinity, ZeRO-Offload and "
               "ZenFlow, and how much does ZenFlow remove?",
               fig_breakdown, ("breakdown", "paper_predict")),
    FigureSpec(6, "pcie_traffic", "PCIe bytes per step",
               "How many bytes cross PCIe per step, as a multiple of the model size, against "
               "the update interval and the top-k ratio, for the design and the shipped data "
               "path?", fig_pcie, ("sweep_update_interval", "sweep_topk_ratio")),
    FigureSpec(7, "selection_traffic", "Selection traffic",
               "How much does exchanging per-column scores save over all-gathering the full "
               "gradient to select columns?", fig_selection, ("selection_traffic",)),
    FigureSpec(8, "scaling", "Multi-GPU scaling",
               "How does training throughput scale from 1 GPU to 8 nodes of 8 per strategy?",
               fig_scaling, ("scaling",)),
    FigureSpec(9, "sensitivity", "Sensitivity to top-k ratio and update interval",
               "How does ZenFlow's step time respond to the top-k ratio and the update "
               "interval?", fig_sensitivity, ("sweep_update_interval", "sweep_topk_ratio")),
    FigureSpec(10, "measured_vs_simulated", "Measured vs simulated",
               "Does the simulator predict the step time and stall measured on this machine?",
               fig_validation, ("validate",), True),
    FigureSpec(11, "gradient_concentration", "Gradient concentration",
               "Is the gradient's norm concentrated in a few columns of each weight?",
               fig_concentration, ("heatmap", "column_norms"), True),
    FigureSpec(12, "temporal_locality", "Temporal locality of important columns",
               "Do the top-k columns stay the same from step to step?", fig_locality,
               ("column_norms",), True),
    FigureSpec(13, "loss_curves", "Loss curves and final quality",
               "Does ZenFlow train as well as device AdamW and ZeRO-Offload with DPU?",
               fig_loss, ("accuracy", "quality"), True),
    FigureSpec(14, "auto_update_interval", "Adaptive update interval",
               "Which update interval does the adaptive mode choose over training?",
               fig_auto_interval, ("windows",), True),
    FigureSpec(15, "first_command", "The first command: measured here, projected on the node",
               "What does `python -m zfbench.run --model llama2-7b --gpus 4` measure on this "
               "machine, and what does the simulator project for the whole model on the GPU "
               "node?", fig_first_command, ("run",), True),
    FigureSpec(16, "published_vs_simulated", "Published vs simulated",
               "How close does the simulator come to what the ZeRO-Offload and ZeRO-Infinity "
               "papers and DeepSpeed's core-binding blog measured on real GPUs?",
               fig_published, ("published",)),
    FigureSpec(17, "convergence", "Accuracy at convergence and time-to-quality",
               "Trained until the held-out loss plateaus, does ZenFlow reach the accuracy of "
               "device AdamW and ZeRO-Offload (with and without DPU), and how long does each "
               "need on the GPU node to reach a given loss?", fig_convergence,
               ("convergence_steps",)),
    FigureSpec(18, "zenflow_zero3", "ZenFlow on ZeRO-3",
               "For a model whose 16-bit parameters do not fit one GPU (llama2-70b on 8 x "
               "H100), what does ZenFlow on ZeRO-3 need and take per step, against ZenFlow "
               "on ZeRO-2 and ZeRO-Infinity?", fig_zero3, ("zero3",)),
)


@dataclass
class Outcome:
    """What happened to one figure: drawn (sentence), missing input, or bad input."""
    spec: FigureSpec
    status: str  # "drawn" | "missing" | "bad" | "pending" (not built by any run yet)
    text: str
    files: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"number": self.spec.number, "status": self.status, "text": self.text,
                "files": list(self.files)}


def merge_outcomes(previous: list[dict], new: list[Outcome]) -> list[Outcome]:
    """Every figure's latest outcome: this run's, else the one recorded by an earlier run
    (so `--only` keeps the index whole), else "pending"."""
    by_number = {d["number"]: d for d in previous}
    fresh = {o.spec.number: o for o in new}
    merged = []
    for spec in FIGURES:
        if spec.number in fresh:
            merged.append(fresh[spec.number])
        elif spec.number in by_number:
            d = by_number[spec.number]
            merged.append(Outcome(spec, d["status"], d["text"], tuple(d["files"])))
        else:
            merged.append(Outcome(spec, "pending", "run `python -m zfbench.figures` to "
                                  "build it."))
    return merged


def draw_one(spec: FigureSpec, data: FigureData, out_dir: Path,
             png_dpi: float | None = None) -> Outcome:
    """Draw and save one figure; a missing or malformed measured input becomes an
    Outcome that says so (nothing is written for that figure)."""
    try:
        fig, sentence = spec.draw(data)
    except pm.MissingData as err:
        return Outcome(spec, "missing", f"`{err.path}` is missing. Make it with "
                       f"{err.command.replace('<measured>', str(data.measured))}.")
    except (pm.BadData, KeyError, ValueError) as err:
        if not spec.measured:
            raise
        return Outcome(spec, "bad", f"the input does not follow the layout: {err}")
    paths = pl.save_figure(fig, out_dir, spec.stem, png_dpi)
    return Outcome(spec, "drawn", sentence, tuple(p.name for p in paths))


def render_readme(outcomes: list[Outcome], sources: dict[str, str], header: str,
                  measured_dir: str) -> str:
    """The index: per figure its question, how it was made, and what it shows."""
    lines = [header, ""]
    for o in outcomes:
        s = o.spec
        lines += [f"## Figure {s.number}: {s.title}", ""]
        if o.status == "drawn":
            lines += [f"![Figure {s.number}]({s.stem}.png)", "",
                      f"Files: [{s.stem}.png]({s.stem}.png), [{s.stem}.pdf]({s.stem}.pdf)", ""]
        lines += [f"- **Question.** {s.question}"]
        if s.measured:
            inputs = "; ".join(f"`{measured_dir}/{pm.LAYOUT[k]}` (from "
                               f"{MEASURED_COMMANDS[k].replace('<measured>', measured_dir)})"
                               for k in s.inputs)
            lines += [f"- **Made by.** `python -m zfbench.figures` (alone: `--only "
                      f"{s.number}`) from measured files: {inputs}."]
        else:
            lines += [f"- **Made by.** `python -m zfbench.figures` (alone: `--only "
                      f"{s.number}`) from " + "; ".join(sources[k] for k in s.inputs) + "."]
        if o.status == "drawn":
            lines += [f"- **Shows.** {o.text}"]
        elif o.status == "pending":
            lines += [f"- **Not built yet.** {o.text}"]
        elif o.status == "missing":
            lines += [f"- **Not drawn: data missing.** {o.text}"]
        else:
            lines += [f"- **Not drawn: bad input.** {o.text}"]
        lines.append("")
    return "\n".join(lines)
