"""`python -m zfbench.predict`: predict ZenFlow from a ZeRO-Offload run you already have.

This module owns the command: its flags, reading the baseline, and the printed and written
prediction. A measured ZeRO-Offload step (GPU compute, exposed PCIe transfer, stall) pins
the GPU's MFU, the effective PCIe rates and the host's AdamW rate on the named node
(zfbench.predict.fit scales each until the simulated parts equal the measured ones); every
strategy, ZenFlow included, is then simulated on the fitted node, with the range the data
leaves open (how the exposed transfer splits between the directions). A run on a GPU
also gives its host lane (`run_host_knobs`) and, through the fitted AdamW, the rate of
ZenFlow's host accumulation (`with_lane_accumulation`).

Baselines (one of):
  --from-breakdown compute=S,io=S,stall=S   seconds per ZeRO-Offload step
  --deepspeed-log FILE   DeepSpeed's "wall_clock_breakdown": true timer lines
  --from-run DIR         a python -m zfbench.run --out DIR with a zero-offload row
  --paper                the ZenFlow paper's eight ZeRO-Offload bars (4 GPUs)

--out gets summary.csv/json, range.csv, inferred.json, inferred_hardware.json (replayable
with python -m zfbench.simulate --hardware), steps.csv, spans and trace.json (an earlier
prediction's files of those names it did not write removed); with --paper also paper.csv
and paper.json. The method, its limits and the files: docs/commands.md,
"predict".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from zfbench.sims.costs import STRATEGIES, SimSettings, SimSettingsError
from zfbench.sims.settings import on_node
from zfbench.predict.fit import MEASURED_LINK, Breakdown, Fit, infer, on_hardware_file
from zfbench.sims import host_traffic
from zfbench.sims.simulator import steps_needed
from zfbench.core.config_zenflow import split_cores
from zfbench.core.strategies import BASELINE, has_windows
from zfbench.predict import inputs as predict_inputs
from zfbench.cli_checks import (ZENFLOW_KNOBS, CliError, OneLineParser, check_out_dir,
                                fail, zenflow_flags)
from zfbench.report import Owned, fits_cell, json_ready, render, times
from zfbench.simulation import SIMULATED_FILES, KNOBS, parse_value, run, write_outputs
from zfbench.core.trace import write_csv_atomic, write_json_atomic
from zfbench.validate.calibrated import calibrated_on

PROG = "python -m zfbench.predict"
INFERRED = ("mfu", "bandwidth_scale", "profile", "hardware")  # found, not given
# What a prediction writes beside a simulated run's files (one inferred hardware file per
# fit that reached its target): an earlier prediction's it did not write are removed.
PREDICTED_FILES = Owned(names=(*SIMULATED_FILES.names, "range.csv", "inferred.json",
                               "inferred_hardware.json", "inferred_hardware.*.json"),
                        per_strategy=SIMULATED_FILES.per_strategy, labelled=True)


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-breakdown", metavar="compute=S,io=S,stall=S")
    src.add_argument("--deepspeed-log", type=Path, metavar="FILE")
    src.add_argument("--from-run", type=Path, metavar="DIR")
    src.add_argument("--paper", action="store_true")
    p.add_argument("--skip-steps", type=int, default=1,
                   help="steps of a DeepSpeed log left out as warm-up (default 1)")
    defaults = SimSettings().as_dict()
    for name in KNOBS:
        if name not in INFERRED:
            # the ZenFlow knobs as every command spells them, the older spelling an alias
            flags = (zenflow_flags(name) if name in ZENFLOW_KNOBS
                     else ("--" + name.replace("_", "-"),))
            p.add_argument(*flags, dest=name, default=None,
                           metavar="V", help=f"default: {defaults[name]}")
    p.add_argument("--batch", dest="micro_batch", help="alias of --micro-batch")
    p.add_argument("--node", metavar="NAME",
                   help="a node preset the measurement ran on (python -m zfbench.simulate "
                        "--help lists them): its GPU, link, host, networks and drives, each "
                        "flag given overriding its part; --gpus is then the run's total")
    p.add_argument("--link-rates", choices=("measured", "fit"), default=None,
                   help="with --from-run: the link rates the run's own copies measured "
                        "(bytes / busy seconds, per direction; the fit where it has none), "
                        "or fitted to its exposed transfer (default: measured)")
    p.add_argument("--out", type=Path, help="directory for the files")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def given_knobs(args) -> dict:
    return {k: parse_value(k, getattr(args, k)) for k in KNOBS
            if k not in INFERRED and getattr(args, k) is not None}


def run_knobs(settings: dict) -> dict:
    """A zfbench run's shape as simulator knobs (one rank per GPU; the engine's data
    path moves the whole gradient and the whole parameters; the engine's host job, with
    its clipping passes where the run clipped: `host_job`, zfbench.sims.sections)."""
    clip = settings.get("gradient_clipping") or 0.0
    out = {"model": settings["model"], "micro_batch": int(settings["micro_batch"]),
           "seq": int(settings["seq"]), "gpus": int(settings.get("ranks") or 1),
           "gpus_per_switch": 1, "transfers": "full",
           "host_job": "engine-clip" if clip > 0 else "engine"}
    if settings.get("layers"):
        out["layers"] = int(settings["layers"])
    if settings.get("precision"):
        out["precision"] = settings["precision"]
    return out


def run_host_knobs(settings: dict, zenflow_row: dict | None, given: dict) -> dict:
    """The host facts a zfbench run on a GPU recorded, as knobs the flags did not give:
    `host_cores`, the zero-offload row's host-lane threads (the preset's cores stand for
    a node the run did not have), and `pt_reserved_cores_perc`, the share of them ZenFlow's
    row left to the device lane (its host_threads fewer than zero-offload's, the engine's
    `pt_reserved_cores_perc` split: zfbench.core.config_zenflow.split_cores). None of
    these is fitted: the run says them. Empty for a CPU-emulated run or an old summary."""
    threads = settings.get("run_host_threads")
    if settings.get("emulated") or not threads:
        return {}
    out = {} if "host_cores" in given else {"host_cores": int(threads)}
    cores = int(given.get("host_cores", threads))
    zf = (zenflow_row or {}).get("host_threads")
    if "pt_reserved_cores_perc" not in given and zf and int(zf) < cores:
        reserve = 1.0 - int(zf) / cores
        if split_cores(cores, reserve)[1] == int(zf):
            out["pt_reserved_cores_perc"] = reserve
    return out


def with_lane_accumulation(f: Fit) -> None:
    """Cost the fitted host's accumulation from its bytes at the streaming rate its
    fitted AdamW reaches (zfbench.sims.host_traffic), in place of the preset's per-core
    judgment: for a zero-offload row measured on zfbench's engine, whose accumulation
    the ratio was measured on."""
    host = f.settings.machine.parts()[2]
    f.settings = f.settings.with_(
        host_accum_per_core=host_traffic.accum_elems_per_s(host.adam_params_per_s_per_core))


def predict(base: SimSettings, measured: Breakdown, workdir: Path, quiet: bool = True,
            strategies: tuple[str, ...] = STRATEGIES, lane_accumulation: bool = False):
    """(fits, nominal rows with their ranges, nominal results, every case's rows).
    `lane_accumulation`: the host accumulation costed from the fitted AdamW's streaming
    rate (`with_lane_accumulation`; a zfbench run's row, no --host-accum-per-core).

    The first case (nominal, or split) is predicted whether its fit reached the
    measurement or not: its step range is widened by the seconds the fit stays off the
    measured ZeRO-Offload step (`Fit.unreached_s`). The other cases are the hypotheses one
    io time leaves open; one whose fit cannot reach the measurement is refuted by it and
    left out. Each row's range spans the cases kept."""
    fit_base = base.with_(steps=min(base.measurement.steps, max(steps_needed(base), 12)))
    fits = infer(fit_base, measured, workdir)
    for f in fits if lane_accumulation else ():
        with_lane_accumulation(f)
    cases = [({}, fits[0])] + [({"case": f.case}, f) for f in fits[1:] if f.reached]
    rows = []
    for labels, f in cases:
        case_rows, case_results = run([(labels, f.settings.with_(steps=base.measurement.steps))],
                                      list(strategies), quiet)
        for r in case_rows:
            r["case"] = labels.get("case", fits[0].case)
            r["unreached_s"] = f.unreached_s
            r["calibrated_on"] = " ".join(calibrated_on(f.settings, r["strategy"]))
        rows.extend(case_rows)
        if not labels:
            nominal, nominal_results = case_rows, case_results
    for r in nominal:
        same = [x for x in rows if x["strategy"] == r["strategy"]]
        low = [max(x["step_time_s"] - x["unreached_s"], 1e-12) for x in same]
        high = [x["step_time_s"] + x["unreached_s"] for x in same]
        r["step_time_low_s"], r["step_time_high_s"] = min(low), max(high)
        # over the same case's simulated ZeRO-Offload step, at each end of the step range
        baseline = [x["speedup_vs_zero_offload"] * x["step_time_s"] for x in same]
        r["speedup_low"] = min(b / h for b, h in zip(baseline, high))
        r["speedup_high"] = max(b / lo for b, lo in zip(baseline, low))
    return fits, nominal, nominal_results, rows


def describe_fit(f: Fit, base: SimSettings, measured: Breakdown) -> list[str]:
    gpu, link, host, _ = f.settings.machine.parts()
    b_gpu, b_link, b_host, _ = base.machine.parts()
    cores = f.settings.machine.host_cores or host.cores  # --host-cores, else the preset's
    s = f.scales
    return [
        f"  compute: MFU {100 * s.mfu:.3g}% of {b_gpu.name}'s "
        f"{'fp16' if base.scenario.precision == 'fp16' else 'bf16'} peak (measured compute "
        f"{measured.compute_s:.4g} s per step)",
        f"  PCIe: d2h {link.d2h_bytes_per_s / 1e9:.2f} GB/s (x{s.d2h:.3g} of {b_link.name}), "
        f"h2d {link.h2d_bytes_per_s / 1e9:.2f} GB/s (x{s.h2d:.3g}), fixed cost per copy "
        f"{1e6 * link.setup_latency_s:.3g} us ({copy_cost_origin(f, measured, b_link)})",
        f"  link rates from: {link_rates_from(f)}",
        f"  host AdamW: {host.adam_params_per_s(cores) / 1e9:.3f} G params/s on "
        f"{cores} cores (x{s.host:.3g} of {b_host.name}; measured stall "
        f"{measured.stall_s:.4g} s per step)"]


def link_rates_from(f: Fit) -> str:
    """Where the link rates come from: the run's copies (bytes / busy seconds, which hold
    whatever slowed them in the run, e.g. uploads at ~0.5 of the idle probe's rate) or
    the fit to the exposed transfer."""
    if f.case == MEASURED_LINK:
        return ("the run's own copies, each direction's bytes / busy seconds (what slowed "
                "them in the run, such as uploads at ~0.5 of an idle probe, is in the rate); "
                "--link-rates fit fits them to the exposed transfer instead")
    return (f"fitted to the measured exposed transfer ({f.case}): the run recorded no copy "
            f"rates, or --link-rates fit")


def copy_cost_origin(f: Fit, measured: Breakdown, preset) -> str:
    """Where the fitted link's fixed cost per copy comes from, in a few words."""
    if f.case == MEASURED_LINK:
        return "none on top: the measured rates hold each copy's fixed cost"
    origin = ("measured: the intercept of the run's copy times against their bytes"
              if measured.copy_latency_s is not None else f"{preset.name}'s preset")
    if f.scales.latency != 1.0:
        origin += (f", x{f.scales.latency:.3g}: the measured transfer is shorter than the "
                   f"simulated copies' fixed costs allow")
    return origin


def format_rows(rows: list[dict], ranged: bool) -> str:
    head = ["strategy", "step_s"] + (["range_s"] if ranged else []) + [
        "speedup"] + (["range"] if ranged else []) + [
        "compute_s", "exp_io_s", "stall_s", "stall%", "fits"]
    lines = []
    for r in rows:
        cells = [r["strategy"], f"{r['step_time_s']:.4g}"]
        if ranged:
            cells.append(f"{r['step_time_low_s']:.4g}-{r['step_time_high_s']:.4g}")
        cells.append(times(r["speedup_vs_zero_offload"]))
        if ranged:
            cells.append(f"{r['speedup_low']:.2f}-{r['speedup_high']:.2f}x")
        cells += [f"{r['compute_s']:.4g}", f"{r['exposed_io_s']:.4g}",
                  f"{r['host_wait_s']:.4g}", f"{100 * r['stall_fraction']:.1f}",
                  fits_cell(r)]
        lines.append(cells)
    return render(head, lines)


def fit_record(f: Fit, measured: Breakdown) -> dict:
    return {"case": f.case, "reached": f.reached, "iterations": f.iterations,
            "note": f.note, "misses_s": f.misses_s, "unreached_s": f.unreached_s,
            "scales": vars(f.scales), "simulated_zero_offload": f.simulated,
            "residuals": f.residuals(measured), "hardware": f.entries}


def report(base: SimSettings, measured: Breakdown, fits: list[Fit], rows: list[dict]) -> str:
    lines = [f"measured ZeRO-Offload ({measured.source}): compute {measured.compute_s:.4g} s"
             f", io {measured.io_s:.4g} s"
             + (f" (d2h {measured.d2h_s:.4g} + h2d {measured.h2d_s:.4g})" if measured.split
                else "") + f", stall {measured.stall_s:.4g} s, step {measured.step_s:.4g} s",
             f"inferred on {base.machine.gpus} x {base.machine.gpu}, PCIe {base.machine.pcie}, "
             f"host {base.machine.host} "
             f"({fits[0].case}, {fits[0].iterations} rounds):"]
    lines += describe_fit(fits[0], base, measured)
    if fits[0].case == MEASURED_LINK:
        io = fits[0].simulated["io_s"]
        lines.append(f"  exposed transfer, a check (the link is not fitted to it): simulated "
                     f"{io:.4g} s vs measured {measured.io_s:.4g} s "
                     f"({100 * (io / measured.io_s - 1) if measured.io_s else 0:+.1f}%)")
    if len(fits) > 1:
        ends = ", ".join(f"{f.case}" + ("" if f.reached else f" (left out: {f.note})")
                         for f in fits[1:])
        lines.append(f"not separable from one io time: how it divides between d2h and h2d;"
                     f" predicted also with {ends} (range columns)")
    if not fits[0].reached:
        lines.append(f"{fits[0].case} fit: {fits[0].note}; predicted all the same, the range "
                     f"widened by {fits[0].unreached_s:.4g} s per step")
    ranged = len([f for f in fits if f.reached]) > 1 or not fits[0].reached
    lines.append(format_rows(rows, ranged=ranged))
    return "\n".join(lines)


def paper(given: dict, workdir: Path, quiet: bool, models: tuple[str, ...] | None = None
          ) -> tuple[list[dict], list[dict]]:
    """Predict ZenFlow's bar for each of the paper's ZeRO-Offload bars (of `models`)."""
    data = predict_inputs.paper_bars()
    out, records = [], []
    for bar in data["bars"]:
        if models is not None and bar["model"] not in models:
            continue
        node = data["nodes"][bar["gpu"]]
        # overlap_comm off: the ZenFlow examples' config (DeepSpeedExamples
        # training/DeepSpeed-ZenFlow/finetuning/zf_config.json) leaves it unset, and
        # DeepSpeed's default for ZeRO stage 2 is off (docs/published.md)
        knobs = {"model": bar["model"], "gpus": data["gpus"], "overlap_comm": False,
                 **{k: node[k] for k in ("gpu", "pcie", "host", "net")}, **given}
        base = SimSettings.from_knobs(**knobs)
        measured = Breakdown(bar["compute_s"], bar["io_s"], bar["stall_s"],
                             source="paper Figure 1")
        sub = workdir / f"{bar['gpu']}-{bar['model']}"
        sub.mkdir()
        fits, rows, _, _ = predict(base, measured, sub, quiet, ("zero-offload", "zenflow"))
        zf = next(r for r in rows if has_windows(r["strategy"]))
        zo = next(r for r in rows if r["strategy"] == BASELINE)
        out.append({"gpu": bar["gpu"], "node": node["node"], "model": bar["model"],
                    "zero_offload_compute_s": bar["compute_s"], "zero_offload_io_s":
                    bar["io_s"], "zero_offload_stall_s": bar["stall_s"],
                    "zero_offload_step_s": bar["step_s"],
                    "zero_offload_simulated_step_s": zo["step_time_s"],
                    "zenflow_compute_s": zf["compute_s"], "zenflow_io_s": zf["exposed_io_s"],
                    "zenflow_stall_s": zf["host_wait_s"], "zenflow_step_s": zf["step_time_s"],
                    "zenflow_step_low_s": zf["step_time_low_s"],
                    "zenflow_step_high_s": zf["step_time_high_s"],
                    "speedup": bar["step_s"] / zf["step_time_s"],
                    "speedup_low": bar["step_s"] / zf["step_time_high_s"],
                    "speedup_high": bar["step_s"] / zf["step_time_low_s"]})
        records.append({"bar": bar, "settings": base.as_dict(),
                        "fits": [fit_record(f, measured) for f in fits]})
    return out, records


def format_paper(rows: list[dict]) -> str:
    head = ["gpu", "model", "ZeRO-Offload_s (c/io/stall)", "ZenFlow_s (c/io/stall)",
            "range_s", "speedup"]
    lines = [[r["gpu"], r["model"],
              f"{r['zero_offload_step_s']:.2f} ({r['zero_offload_compute_s']:.2f}/"
              f"{r['zero_offload_io_s']:.2f}/{r['zero_offload_stall_s']:.2f})",
              f"{r['zenflow_step_s']:.2f} ({r['zenflow_compute_s']:.2f}/"
              f"{r['zenflow_io_s']:.2f}/{r['zenflow_stall_s']:.2f})",
              f"{r['zenflow_step_low_s']:.2f}-{r['zenflow_step_high_s']:.2f}",
              f"{r['speedup']:.2f}x ({r['speedup_low']:.2f}-{r['speedup_high']:.2f})"]
             for r in rows]
    return render(head, lines)


def main(argv: list[str] | None = None) -> int:
    workdir = tempfile.TemporaryDirectory()
    try:
        return _main(argv, workdir)
    finally:
        workdir.cleanup()


def _main(argv: list[str] | None, workdir: tempfile.TemporaryDirectory) -> int:
    from zfbench.core.provenance import provenance

    try:
        args = build_parser().parse_args(argv)
        check_out_dir(args.out)
        if args.skip_steps < 0:
            raise CliError("--skip-steps must be >= 0")
        given = given_knobs(args)
        if args.link_rates is not None and args.from_run is None:
            raise CliError("--link-rates: only --from-run has a run's copies to measure the "
                           "link from; leave --link-rates out")
        measured_zenflow, from_host, lane_accumulation = None, {}, False
        if args.paper:
            if args.node:
                raise CliError("--node: --paper simulates each bar on the node of the "
                               "paper's figure; leave --node out")
            SimSettings.from_knobs(**given)  # the flags' values checked before any work
        else:
            if args.from_run is not None:
                measured, settings, measured_zenflow = predict_inputs.read_run(args.from_run)
                if args.link_rates == "fit":
                    measured = dataclasses.replace(measured, link_Bps=None)
                from_host = run_host_knobs(settings, measured_zenflow, given)
                knobs = {**run_knobs(settings), **from_host, **given}
                lane_accumulation = bool(settings.get("run_host_threads")) and not \
                    settings["emulated"] and "host_accum_per_core" not in given
            else:
                measured = (predict_inputs.parse_breakdown(args.from_breakdown)
                            if args.from_breakdown is not None else
                            predict_inputs.read_deepspeed_log(args.deepspeed_log,
                                                              args.skip_steps))
                knobs = given
            if args.node:
                knobs = on_node(args.node, knobs)
            if knobs.get("precision") == "fp32":  # the fit finds compute: no peak needed
                knobs = on_hardware_file(knobs, Path(workdir.name) / "presets.json")
            base = SimSettings.from_knobs(**knobs)
    except (CliError, SimSettingsError, ValueError) as err:
        return fail(err)
    head = {"provenance": provenance(argv, PROG)}
    tmp = workdir.name
    try:
        if args.paper:
            rows, records = paper(given, Path(tmp), args.quiet)
            print(format_paper(rows))
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                write_csv_atomic(pd.DataFrame(rows), args.out / "paper.csv")
                write_json_atomic(args.out / "paper.json", json_ready(
                    {**head, "source": predict_inputs.paper_bars()["source"],
                     "rows": rows, "bars": records}))
                print(f"wrote {args.out}/paper.csv, paper.json")
            return 0
        fits, rows, results, all_rows = predict(base, measured, Path(tmp), args.quiet,
                                                lane_accumulation=lane_accumulation)
    except SimSettingsError as err:
        return fail(err)
    print(report(base, measured, fits, rows))
    base_note = calibration_note(base)
    if base_note is not None:
        print(base_note)
        head["calibration_note"] = base_note
    if args.from_run is not None and settings["emulated"]:
        print("note: that run's accelerator was the CPU-emulated lane, whose compute and host "
              "share cores; the prediction treats them as a GPU and a host that do not "
              "(python -m zfbench.validate checks the emulated engine against the simulator)")
    host_note = run_host_note(settings, base, from_host, fits[0] if lane_accumulation
                              else None) if args.from_run is not None else None
    if host_note is not None:
        print(host_note)
        head["host_note"] = host_note
    if measured_zenflow is not None:
        zf = next(r for r in rows if has_windows(r["strategy"]))
        error = zf["step_time_s"] / measured_zenflow["step_time_s"] - 1
        print(f"measured zenflow in that run: {measured_zenflow['step_time_s']:.4g} s per "
              f"step; predicted {zf['step_time_s']:.4g} s ({100 * error:+.1f}%)")
        head["measured_zenflow_step_s"] = measured_zenflow["step_time_s"]
    if args.out:
        head.update({"settings": base.as_dict(), "measured": measured.as_dict(),
                     "link_rates_from": {d: fits[0].entries["host_links"]["inferred-link"][
                         f"{d}_bytes_per_s"]["source"] for d in ("d2h", "h2d")},
                     "fits": [fit_record(f, measured) for f in fits]})
        extras = {"range.csv": pd.DataFrame(all_rows).to_csv(index=False),
                  "inferred.json": json.dumps(json_ready(head), indent=1)}
        for f in fits:
            if f.reached or f is fits[0]:
                name = "inferred_hardware.json" if f is fits[0] else \
                    f"inferred_hardware.{f.case}.json"
                extras[name] = Path(f.settings.machine.hardware).read_text()
        try:
            write_outputs(args.out, json_ready(head), rows, results, extras,
                          owned=PREDICTED_FILES)
        except OSError as err:
            return fail(f"writing {args.out}: {err}")
        print(f"wrote {args.out}/summary.csv, summary.json, range.csv, inferred.json, "
              f"inferred_hardware.json, steps.csv, spans, trace.json")
    return 0


def calibration_note(base: SimSettings) -> str | None:
    """Where the ZeRO-Offload baseline is the very setting a preset constant was
    calibrated on (zfbench.validate.calibrated): which row, and that the fit replaced it.
    Every predicted number runs on the inferred hardware, fitted to this measurement, so
    no row of the table is calibrated on a published row (their `calibrated_on`, in
    summary.json, is empty)."""
    ids = calibrated_on(base, "zero-offload")
    if not ids:
        return None
    return (f"calibrated on this case: {', '.join(ids)} (a published row of this very "
            f"setting set the --gpu/--host preset's constant; the fit replaced it with "
            f"this measurement's, so no predicted number is calibrated on it)")


def run_host_note(settings: dict, base: SimSettings, from_host: dict,
                  fit: Fit | None) -> str | None:
    """For a run on a real GPU: what the prediction took from the run's host
    (`run_host_knobs`: its host-lane threads, ZenFlow's share of them) and how it costs
    the host accumulation (`fit` given: from the fitted AdamW's streaming rate,
    zfbench.sims.host_traffic); or, where the flags kept a larger preset host, that a
    ZeRO-Offload row cannot measure its memory streaming (before these defaults, the
    preset's 128 cores put ZenFlow 71-73% too fast on the lent H200 and H100 machines,
    docs/results.md)."""
    threads = settings.get("run_host_threads")
    if settings.get("emulated") or not threads:
        return None
    host = base.machine.parts()[2]
    cores = base.machine.host_cores or host.cores
    machine = (f" of {settings['run_cpu_count']} cores" if settings.get("run_cpu_count")
               else "")
    took = []
    if "host_cores" in from_host:
        took.append(f"{from_host['host_cores']} host cores (its zero-offload row's host "
                    f"lane{machine})")
    if "pt_reserved_cores_perc" in from_host:
        took.append(f"pt_reserved_cores_perc {from_host['pt_reserved_cores_perc']:.3g} "
                    f"(its zenflow row's host lane had fewer threads)")
    lines = []
    if base.runtime.host_job != "deepspeed":
        lines.append(f"note: host job: the engine's one job (host_job {base.runtime.host_job}"
                     f", zfbench.core.engine_host_bytes), its bytes at the fitted AdamW's "
                     f"streaming rate; --host-job deepspeed fits DeepSpeed's passes instead")
    if took:
        lines.append(f"note: from that run's host: {', '.join(took)}; the --host preset "
                     f"{host.name} gives the rest (--host-cores, --pt-reserved-cores-perc "
                     f"override)")
    if fit is not None:
        f_host = fit.settings.machine.parts()[2]
        lines.append(
            f"note: host accumulation {fit.settings.machine.host_accum_per_core / 1e6:.4g} M "
            f"elements/s per core: its bytes at {host_traffic.ACCUM_OVER_ADAM_STREAM} of "
            f"the streaming rate the fitted AdamW reaches ("
            f"{f_host.adam_params_per_s_per_core / 1e6:.4g} M params/s per core x "
            f"28 B; zfbench.sims.host_traffic); --host-accum-per-core overrides")
    if threads < cores:
        lines.append(
            f"note: that run's host lane had {threads} threads{machine}; the prediction's "
            f"host has {cores} cores, whose memory streaming a ZeRO-Offload row cannot "
            f"measure; for that run's own host rates: python -m zfbench.run --profile "
            f"--out DIR, then python -m zfbench.simulate --profile DIR/profile.json")
    return "\n".join(lines) or None


if __name__ == "__main__":
    sys.exit(main())
