"""`python -m zfbench.figures`: rebuild every paper figure into paper_figures/ (`make figures`).

Covers: figures 1-9, 16, 17 (its step times) and 18 from simulations (regenerated when their
CSVs under `<out>/data/` are missing or were made with other settings; `--regenerate`
forces it), figures 10-15 from measured files (`--measured DIR`; layout in
`analysis/plot_measured.py`), run small on this machine when missing
(`zfbench.figures.measure`; `--no-measure` skips that), `--quick` (small models and
sweeps, for tests), `--only`, and `<out>/README.md`: per figure the question, the
command and data, and one sentence whose numbers are read from the data.
Scenario: `make figures` on a fresh clone simulates about 105 small runs on the paper's
class of hardware, writes figNN_name.png and .pdf and the index; a second run re-plots
from the CSVs in seconds.

A missing measured file is reported in the README (and on stdout) with the command that
makes it; the figure is not drawn, never from made-up data. A file that breaks the layout
is reported the same way and makes the command exit 1. docs/commands.md ("Figures")
lists the simulated and measured files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from zfbench.core.progress import progress

from zfbench.analysis import plot_measured as pm
from zfbench.analysis import plot_sweeps as ps
from zfbench.analysis.plot_index import FIGURES, FigureData, draw_one, merge_outcomes, render_readme
from zfbench.sims.costs import SimSettings
from zfbench.sims.simulator import default_skip_steps
from zfbench.predict import inputs as predict_inputs
from zfbench.validate import published as validate_published
from zfbench.core import hardware
from zfbench.core.strategies import SIM_STRATEGIES as STRATEGIES
from zfbench.core.strategies import (ENGINE_STRATEGIES, OFFLOAD_STRATEGIES, SIMULATED_ONLY,
                                     STRATEGY, ZERO_STAGE_STRATEGIES, delayed)
from zfbench.figures.data import TIMELINE_STRATEGIES, Dataset, generate, is_fresh
from zfbench.figures.measure import measure_jobs, run_missing
from zfbench.simulation import summary_row
from zfbench.core.trace import SPAN_COLUMNS, STEP_COLUMNS

NODES = ("a100-4x-gen4", "h100-4x-gen5")
SCALING_NODES = ("a100-8x-gen4", "h100-8x-gen5")
TIMELINE_NODE = "a100-4x-gen4"
# Figure 8 beyond one node: nodes of the same preset joined by the NIC their DGX
# datasheets list, one per GPU (hardware.json ib-hdr-200 / ib-ndr-400, with sources).
SCALING_INTER_NET = {"a100-8x-gen4": "ib-hdr-200", "h100-8x-gen5": "ib-ndr-400"}
# Multi-node points of figure 8 run at most this many steps (runtime: a 64-rank run costs
# 8 x an 8-rank one per step); still above steps_needed (warm-up, 2 skipped windows + 1).
MULTI_NODE_STEPS = 16
# Figure 17: the strategies of bench/convergence.py, whose committed results it reads
# (the topic task from convergence/, the LM task's three seeds from pretrained weights from
# convergence_lm/), and the llama2-7b step time each is simulated at for time-to-quality.
CONVERGENCE_STRATEGIES = ENGINE_STRATEGIES
CONVERGENCE_RESULTS = Path(__file__).resolve().parents[2] / "bench/results/convergence"
CONVERGENCE_LM_RESULTS = CONVERGENCE_RESULTS.with_name("convergence_lm")
# Figure 5's bars: the two baselines ZenFlow's claims name (DeepSpeed's ZenFlow blog: "up
# to 5x over ZeRO-Offload and 6.3x over ZeRO-Infinity") and ZenFlow.
BREAKDOWN_STRATEGIES = SIMULATED_ONLY + tuple(s for s in OFFLOAD_STRATEGIES if not delayed(s))
# Figure 18: a model whose 16-bit parameters and gradients do not fit one GPU on ZeRO-2
# (llama2-70b: 276 GB of them), on 8 x H100 (issue 48).
ZERO3_NODE, ZERO3_MODEL = "h100-8x-gen5", "llama2-70b"


@dataclass(frozen=True)
class Plan:
    """How big the simulated runs are: `FULL` for the paper, `QUICK` for tests."""
    name: str
    models: tuple[str, ...]
    layers: int | None
    steps: int
    timeline_steps: int
    update_intervals: tuple[int, ...]
    topk_ratios: tuple[float, ...]
    gpus: tuple[int, ...]
    window_s: float = 30.0
    util_bin_s: float = 0.25
    model: str = "llama2-7b"  # timelines, sweeps and scaling
    png_dpi: float | None = None  # None: the style's savefig.dpi
    published_ids: tuple[str, ...] = ()  # figure 16's rows of the bundled file (): all


FULL = Plan("full", ("qwen2.5-1.5b", "qwen2.5-3b", "llama2-7b", "llama2-13b"), None, 32, 40,
            (1, 2, 4, 8, 16), (0.01, 0.05, 0.1, 0.2, 0.5), (1, 2, 4, 8, 16, 32, 64))
QUICK = Plan("quick", ("qwen2.5-1.5b", "llama2-7b"), 2, 12, 20, (1, 2, 4), (0.1, 0.5),
             (1, 2, 16),
             util_bin_s=0.02, png_dpi=72,
             published_ids=("zo-fig9-2b-zo", "zo-fig9-2b-dpu", "zo-fig14-b1-pt",
                            "zo-fig14-b1-zo", "cb-qwen1.5b-zero2", "cb-qwen1.5b-zo-bound"))


def node_settings(node: str, plan: Plan, model: str | None = None, **knobs) -> SimSettings:
    n = hardware.get_node(node)
    drives = {"nvme": n.nvme.name, "nvme_drives": n.nvme_drives} if n.nvme else {}
    base = SimSettings.from_knobs(model=model or plan.model, layers=plan.layers, gpus=n.gpus,
                                  gpu=n.gpu.name, pcie=n.link.name, host=n.host.name,
                                  net=n.net.name, gpus_per_switch=n.gpus_per_switch,
                                  steps=plan.steps, **drives)
    return base.with_(**knobs)


def scaling_settings(node: str, plan: Plan, gpus: int) -> SimSettings:
    """Figure 8's run of `gpus` GPUs: one node of the preset up to its GPU count, beyond
    it whole nodes of it (gpus a multiple of the node's) over SCALING_INTER_NET."""
    n = hardware.get_node(node)
    per_node = min(gpus, n.gpus)
    knobs = {"gpus": gpus, "gpus_per_switch": min(per_node, n.gpus_per_switch)}
    if gpus > n.gpus:
        if gpus % n.gpus:
            raise ValueError(f"figure 8: {gpus} GPUs is not whole nodes of {n.gpus}")
        knobs.update(nodes=gpus // n.gpus, gpus_per_node=n.gpus,
                     inter_net=SCALING_INTER_NET[node], steps=min(plan.steps, MULTI_NODE_STEPS))
    return node_settings(node, plan, **knobs)


def node_label(node: str) -> str:
    n = hardware.get_node(node)
    return f"{n.gpus}x {n.gpu.name}, PCIe {n.link.name}"


def scaling_label(node: str) -> str:
    n = hardware.get_node(node)
    return f"{n.gpu.name}, PCIe {n.link.name}, {n.host.name}"


def steps_for_interval(plan: Plan, u: int) -> int:
    """Whole update windows after the default skip (2U): a multiple of U, at least 4U."""
    return u * math.ceil(max(plan.steps, 4 * u) / u)


# -- datasets: jobs -> CSV files under <out>/data, reused while their spec matches -----
def _summary_rows(file: str):
    def rows(labels: dict, result) -> dict:
        row = {**labels, **summary_row(result)}
        s = result.settings
        row["tokens_per_s"] = (s.machine.ranks * s.scenario.micro_batch * s.scenario.grad_accum
                               * s.scenario.seq / row["step_time_s"])
        row["model_bytes"] = result.costs.model_bytes
        return {file: pd.DataFrame([row])}
    return rows


def _timeline_rows(labels: dict, result) -> dict:
    tl, st = result.timeline, result.strategy
    spans, steps = tl.spans_frame(), tl.steps_frame()
    return {f"timeline_{st}.spans.csv": spans[spans["rank"] == 0][SPAN_COLUMNS],
            f"timeline_{st}.steps.csv": steps[steps["rank"] == 0][STEP_COLUMNS]}


def datasets(plan: Plan) -> dict[str, Dataset]:
    d = {}
    tl = node_settings(TIMELINE_NODE, plan, steps=plan.timeline_steps)
    d["timeline"] = Dataset("timeline", [({}, tl, s) for s in TIMELINE_STRATEGIES], _timeline_rows)
    d["breakdown"] = Dataset("breakdown", [
        ({"node": node_label(n), "model": m}, node_settings(n, plan, m), s)
        for n in NODES for m in plan.models for s in BREAKDOWN_STRATEGIES],
        _summary_rows("breakdown.csv"))
    for knob, values in (("update_interval", plan.update_intervals),
                         ("topk_ratio", plan.topk_ratios)):
        base = node_settings(NODES[0], plan)
        jobs = [({"series": "zero-offload", knob: None}, base, "zero-offload"),
                ({"series": "device", knob: None}, base, "device")]
        for v in values:
            steps = steps_for_interval(
                plan, v if knob == "update_interval" else base.zenflow.update_interval)
            for mode in ("design", "shipped"):
                jobs.append(({"series": f"zenflow-{mode}", knob: v}, node_settings(
                    NODES[0], plan, transfers=mode, steps=steps, **{knob: v}), "zenflow"))
        d[f"sweep_{knob}"] = Dataset(f"sweep_{knob}", jobs, _summary_rows(f"sweep_{knob}.csv"))
    d["scaling"] = Dataset("scaling", [
        ({"node": scaling_label(n), "gpus": g}, scaling_settings(n, plan, g), s)
        for n in SCALING_NODES for g in plan.gpus for s in STRATEGIES],
        _summary_rows("scaling.csv"))
    d["paper_predict"] = Dataset("paper_predict", [], None, lambda: _paper_view(plan),
                                 {"models": list(plan.models), "steps": plan.steps,
                                  "bars": predict_inputs.paper_bars()["bars"]})
    d["published"] = Dataset("published", [], None, lambda: _published_view(plan),
                             {"file": validate_published.BUNDLED,
                              "sha256": _bundled_digest(), "ids": list(plan.published_ids)})
    d["convergence_steps"] = Dataset("convergence_steps", [
        ({}, node_settings(TIMELINE_NODE, plan), s) for s in CONVERGENCE_STRATEGIES],
        _summary_rows("convergence_steps.csv"))
    d["zero3"] = Dataset("zero3", zero3_jobs(plan), _summary_rows("zero3.csv"))
    gpus = hardware.get_node(NODES[0]).gpus
    d["selection_traffic"] = Dataset(
        "selection_traffic", [], None,
        lambda: {"selection_traffic.csv": ps.selection_traffic(list(FULL.models), gpus)},
        {"models": list(FULL.models), "gpus": gpus})
    return d


def zero3_jobs(plan: Plan) -> list[tuple[dict, SimSettings, str]]:
    """Figure 18's runs on ZERO3_NODE: ZenFlow on ZeRO-2 (simulated though it does not
    fit, to show what it would need), ZenFlow on ZeRO-3, ZeRO-Infinity (parameters on
    the host); `key`, `series` and `where` label them."""
    n = hardware.get_node(ZERO3_NODE)
    model = ZERO3_MODEL + (f"[{plan.layers}L]" if plan.layers else "")
    where = f"{model} on {n.gpus}x {n.gpu.name}, PCIe {n.link.name}"
    base = node_settings(ZERO3_NODE, plan, ZERO3_MODEL)
    zenflow, infinity = ZERO_STAGE_STRATEGIES[0], SIMULATED_ONLY[0]
    return [({"key": f"{zenflow}-zero{stage}", "series": f"{STRATEGY[zenflow].label}\n"
              f"ZeRO-{stage}", "where": where}, base.with_(zero_stage=stage), zenflow)
            for stage in (2, 3)] + [
        ({"key": "infinity", "series": STRATEGY[infinity].label, "where": where}, base,
         infinity)]


def _bundled_digest() -> str:
    return hashlib.sha256(validate_published.bundled_path().read_bytes()).hexdigest()


def _published_view(plan: Plan) -> dict:
    """The bundled published rows (plan.published_ids of them, or all) simulated as
    `python -m zfbench.validate --published` does; its published.csv."""
    columns, rows = validate_published.read_rows(validate_published.bundled_path())
    if plan.published_ids:
        rows = [r for r in rows if r["id"] in plan.published_ids]
    done = validate_published.validate_rows(rows, quiet=True)
    return {"published.csv": pd.DataFrame(done)[[*columns, *validate_published.OUTPUT_COLUMNS]]}


def _paper_view(plan: Plan) -> dict:
    """ZenFlow predicted from each of the paper's ZeRO-Offload bars (zfbench.predict)."""
    from zfbench.predict.command import paper

    with tempfile.TemporaryDirectory() as tmp:
        rows, _ = paper({"steps": plan.steps}, Path(tmp), True, plan.models)
    frame = pd.DataFrame(rows)
    frame["node"] = frame["node"].map(node_label)
    return {"paper_predict.csv": frame}




# -- the command ----------------------------------------------------------------------
def simulate_command(settings: SimSettings, extra: str = "") -> str:
    """The `python -m zfbench.simulate` line with the same non-default knobs."""
    default = SimSettings().as_dict()
    always = ("model", "gpu", "pcie", "steps")
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in settings.as_dict().items()
             if v != default[k] or k in always]
    return " ".join(["python -m zfbench.simulate", *flags, extra]).strip()


def sources(plan: Plan) -> dict[str, str]:
    """One line per dataset for the README: files, what was simulated, the CLI twin."""
    base = node_settings(NODES[0], plan)
    tl = node_settings(TIMELINE_NODE, plan, steps=plan.timeline_steps)
    models = ", ".join(plan.models)
    u_vals = ",".join(map(str, plan.update_intervals))
    k_vals = ",".join(f"{v:g}" for v in plan.topk_ratios)
    return {
        "timeline": "`data/timeline_<strategy>.spans.csv` and `.steps.csv` (rank 0 of "
                    f"{', '.join(TIMELINE_STRATEGIES)}; like `{simulate_command(tl)} --out DIR`)",
        "breakdown": f"`data/breakdown.csv` (zero-infinity with parameters on cpu, "
                     f"zero-offload and zenflow, {models} on "
                     f"{' and '.join(node_label(n) for n in NODES)} nodes, {plan.steps} steps "
                     f"each; like `{simulate_command(base)}` with each node's --gpu/--pcie/"
                     f"--host/--net)",
        "sweep_update_interval": f"`data/sweep_update_interval.csv` (zenflow with "
                                 f"--transfers design and shipped, U={u_vals}, steps a multiple "
                                 f"of U and at least 4U; zero-offload and device references; "
                                 f"like `{simulate_command(base)} --strategy zenflow --sweep "
                                 f"update_interval={u_vals}`)",
        "sweep_topk_ratio": f"`data/sweep_topk_ratio.csv` (the same for top-k {k_vals}; like "
                            f"`{simulate_command(base)} --strategy zenflow --sweep "
                            f"topk_ratio={k_vals}`)",
        "scaling": f"`data/scaling.csv` (every strategy, {', '.join(STRATEGIES)}, on "
                   f"{' and '.join(scaling_label(n) for n in SCALING_NODES)}, gpus="
                   f"{','.join(map(str, plan.gpus))}; beyond one node, nodes of 8 over "
                   f"{' / '.join(SCALING_INTER_NET.values())} (one NIC per GPU), at most "
                   f"{MULTI_NODE_STEPS} steps; like `{simulate_command(base)} --nodes N "
                   f"--gpus-per-node 8 --inter-net ib-hdr-200`)",
        "paper_predict": f"`data/paper_predict.csv` (the ZenFlow paper's ZeRO-Offload bars "
                         f"of {models}, zfbench/data/paper_zero_offload_bars.json, each fitted "
                         f"on its node and ZenFlow simulated there; like `python -m "
                         f"zfbench.predict --paper --steps {plan.steps}`)",
        "published": "`data/published.csv` ("
                     + (f"rows {', '.join(plan.published_ids)} of " if plan.published_ids
                        else "every row of ")
                     + f"{validate_published.BUNDLED}, each simulated; like `python -m "
                     f"zfbench.validate --published --out DIR`, docs/published.md)",
        "convergence_steps": f"`data/convergence_steps.csv` (the step time of "
                             f"{', '.join(CONVERGENCE_STRATEGIES)} for {plan.model} on "
                             f"{node_label(TIMELINE_NODE)}, {plan.steps} steps; like "
                             f"`{simulate_command(base)}`) and the committed measurements "
                             f"of `python bench/convergence.py`: the topic task of "
                             f"bench/results/convergence/ ((a), (c); runs.csv, curves.csv) "
                             f"and the LM task of bench/results/convergence_lm/ ((b): device "
                             f"and zenflow, 3 seeds each from pretrained SmolLM2; runs.csv, "
                             f"summary.json; the one-seed LM runs of convergence/, which "
                             f"started from the wrong weights, are not drawn)",
        "zero3": f"`data/zero3.csv` (zenflow with --zero-stage 2 and 3, and zero-infinity "
                 f"with parameters on cpu, {ZERO3_MODEL}"
                 + (f"[{plan.layers}L]" if plan.layers else "") + f" on {ZERO3_NODE}, "
                 f"{plan.steps} steps; like `python -m zfbench.simulate --model {ZERO3_MODEL} "
                 f"--node {ZERO3_NODE} --steps {plan.steps} --sweep zero_stage=2,3`)",
        "selection_traffic": f"`data/selection_traffic.csv` (computed from the shapes in "
                             f"zfbench/core/models.py of {', '.join(FULL.models)}, "
                             f"{hardware.get_node(NODES[0]).gpus} GPUs; no simulation)",
    }


def meta(plan: Plan) -> dict:
    tl = node_settings(TIMELINE_NODE, plan, steps=plan.timeline_steps)
    model = tl.scenario.model + (f"[{plan.layers}L]" if plan.layers else "")
    return {"first_step": default_skip_steps(tl),
            "where": f"{model} on {node_label(TIMELINE_NODE)}",
            "update_interval": tl.zenflow.update_interval, "topk_ratio": tl.zenflow.topk_ratio,
            "timeline_steps": tl.measurement.steps, "window_s": plan.window_s,
            "util_bin_s": plan.util_bin_s,
            "gpus": list(plan.gpus), "model": model,
            "convergence_dir": CONVERGENCE_RESULTS,
            "convergence_lm_dir": CONVERGENCE_LM_RESULTS}


def header(plan: Plan, measured: str) -> str:
    figs = {k: ", ".join(str(s.number) for s in FIGURES if k in s.inputs)
            for k in pm.LAYOUT}
    layout = "\n".join(f"| {figs[k]} | `{measured}/{path}` | {pm.LAYOUT_COLUMNS[k]} |"
                       for k, path in pm.LAYOUT.items())
    quick = " --quick" if plan.name == "quick" else ""
    runs = "\n".join(f"- figures {', '.join(map(str, job.figures))}: "
                     f"`{job.command(Path(measured))}`"
                     + (" (needs `make real-model-setup`)" if job.real_model else "")
                     for job in measure_jobs(plan.name == "quick"))
    return f"""# Paper figures

Generated by `make figures` (`python -m zfbench.figures`{quick}); do not edit by hand.
Every number below is read from the data files named with each figure. Figures 1-9 are
simulated (SimPy model in `sims/`, hardware presets from `zfbench/data/hardware.json`,
averages over steady-state steps after the default skip of warm-up and two update
windows), and so is figure 16 (the bundled published GPU measurements, each row
simulated as docs/published.md says) and figure 18 (ZenFlow on ZeRO-3); their CSVs are under `data/` with a `.spec.json` each holding the exact
settings, and are re-simulated only when missing, made with other settings, or with
`--regenerate`. Figures 10-15 come from measured files (`--measured DIR`, default
`{measured}`), laid out as below (documented in `analysis/plot_measured.py`):

| figures | file | columns |
|---|---|---|
{layout}

A `.csv` may be replaced by a `.parquet` of the same name. When files are missing,
`make figures` first measures them on this machine, small (`--no-measure` skips this):

{runs}

A file still missing is reported below with the command that makes it; no figure is
drawn from made-up data."""


def write_index(out: Path, plan: Plan, outcomes: list, measured: str) -> None:
    """README.md from this run's outcomes merged with those an earlier run recorded in
    `data/index.json` (same plan only), so `--only` keeps every figure's entry."""
    record = out / "data" / "index.json"
    previous = []
    if record.exists():
        saved = json.loads(record.read_text())
        previous = saved["outcomes"] if saved.get("plan") == plan.name else []
    merged = merge_outcomes(previous, outcomes)
    for path, text in ((record, json.dumps({"plan": plan.name, "outcomes": [
            o.as_dict() for o in merged]}, indent=1)),
                       (out / "README.md", render_readme(merged, sources(plan), header(
                           plan, measured), measured) + "\n")):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zfbench.figures", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="figures, README.md and data/ (default "
                   "paper_figures, or runs/figures-quick with --quick)")
    p.add_argument("--measured", type=Path, help="measured inputs (default <out>/data/measured)")
    p.add_argument("--regenerate", action="store_true", help="re-simulate even if cached")
    p.add_argument("--quick", action="store_true", help="small models and sweeps (tests)")
    p.add_argument("--only", help="comma-separated figure numbers; the README keeps the "
                   "other figures' entries from the last run")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--budget-min", type=float, default=20.0,
                   help="the whole command's time budget: measurements missing files get "
                        "what is left of it after simulating, less a minute for drawing, "
                        "and what does not fit is left out with a note (default 20; 0: no "
                        "limit)")
    p.add_argument("--no-measure", action="store_true",
                   help="do not run the measurements of figures 10-15 whose files are "
                        "missing (by default they run, small, on this machine)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plan = QUICK if args.quick else FULL
    out = args.out or Path("runs/figures-quick" if args.quick else "paper_figures")
    data_dir = out / "data"
    measured = args.measured or data_dir / "measured"
    try:
        only = {int(x) for x in args.only.split(",")} if args.only else set()
    except ValueError:
        print(f"error: --only wants figure numbers like 1,5,9 (got {args.only!r})",
              file=sys.stderr)
        return 2
    unknown = only - {s.number for s in FIGURES}
    if unknown:
        print(f"error: no figure {sorted(unknown)}; figures are 1-{len(FIGURES)}", file=sys.stderr)
        return 2
    specs = [s for s in FIGURES if not only or s.number in only]
    started = time.perf_counter()
    all_sets = datasets(plan)
    needed = [all_sets[k] for k in dict.fromkeys(k for s in specs if not s.measured
                                                 for k in s.inputs)]
    stale = needed if args.regenerate else [d for d in needed if not is_fresh(data_dir, d)]
    if not args.quiet and needed:
        print(f"data: {len(needed) - len(stale)} of {len(needed)} datasets reused from "
              f"{data_dir}{' (--regenerate)' if args.regenerate else ''}, simulating "
              f"{sum(len(d.jobs) for d in stale)} runs", file=sys.stderr)
    generate(data_dir, stale, args.quiet)
    wanted = {s.number for s in specs if s.measured}
    if wanted and not args.no_measure:
        budget = None if args.budget_min <= 0 else \
            max(0.0, args.budget_min * 60 - (time.perf_counter() - started) - 60)
        for note in run_missing(measured, wanted, args.quick, args.quiet,
                                budget_s=budget):
            print(note, file=sys.stderr)
    data = FigureData(data_dir, measured, meta(plan))
    outcomes = [draw_one(spec, data, out, plan.png_dpi) for spec in progress(
        specs, desc="drawing", unit="fig", quiet=args.quiet)]
    write_index(out, plan, outcomes, str(measured))
    for o in outcomes:
        status = {"drawn": ", ".join(o.files), "missing": "MISSING DATA: " + o.text,
                  "bad": "BAD INPUT: " + o.text}[o.status]
        print(f"figure {o.spec.number:2d} {o.spec.name}: {status}")
    print(f"{sum(o.status == 'drawn' for o in outcomes)} of {len(outcomes)} figures in {out}"
          f", index in {out / 'README.md'} "
          f"({time.perf_counter() - started:.0f} s)")
    return 1 if any(o.status == "bad" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
