"""What `python -m zfbench.run` reports: the header, the table, the files.

Owns the effective-config header (one line per strategy: batch arithmetic, precision,
optimizer, ZeRO stage, offload, ZenFlow knobs, lanes, then the config's notes), the
too-short check (a run must hold the skipped warm-up windows plus one measured window),
the summary rows and table, and the output directory: `summary.json` holds the rows, the
run's settings, every strategy's effective config, and where the numbers came from
(`zfbench.core.provenance`); every file lands through a staging directory and a rename.

Part of the command `python -m zfbench.run` (split out of its main module for size):
like the command, it imports real/, sims/ or analysis/ (docs/design.md's arrows).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from zfbench.analysis.breakdown import summarize
from zfbench.core.config import EngineConfig
from zfbench.core.trace import merge_chrome_traces, write_json_atomic

# assumed window of update_interval "auto" when counting the steps a run needs
AUTO_WINDOW_GUESS = 4


def measurement_window(cfg: EngineConfig) -> tuple[int, int]:
    """(steps left out at the start, steps the whole run needs) for one strategy: zenflow
    leaves out its warm-up and two update windows and needs one more to measure; the
    others leave out 2 steps (the delayed update's first lag) and need 2 more."""
    zf = cfg.zenflow
    if zf is None:
        return 2, 4
    window = AUTO_WINDOW_GUESS if zf.update_interval == "auto" else int(zf.update_interval)
    skip = zf.full_warm_up_rounds + 2 * window
    return skip, skip + window


def describe_config(cfg: EngineConfig, threads: tuple[int, int] | None = None,
                    use_cuda: bool = True) -> str:
    """One line with everything that decides what a strategy runs (`use_cuda` False:
    pin_memory is shown as not applicable, there is nothing to pin)."""
    o = cfg.optimizer
    parts = [f"{cfg.strategy}: batch {cfg.micro_batch} x accum {cfg.grad_accum} x "
             f"{cfg.world_size} rank(s) = {cfg.train_batch_size}",
             cfg.precision, f"{o.type} lr {o.lr:g} betas {o.betas[0]:g}/{o.betas[1]:g} "
             f"eps {o.eps:g} wd {o.weight_decay:g}",
             f"clip {cfg.gradient_clipping:g}", f"ZeRO {cfg.zero_stage}",
             f"offload {cfg.offload_device}" + (
                 "" if not (cfg.pin_memory and cfg.offload_device == "cpu") else
                 " pinned" if use_cuda else " (pin_memory: no CUDA, nothing to pin)")]
    if cfg.precision == "fp16":
        ls = cfg.loss_scale
        parts.append(f"loss scale {ls.loss_scale:g}" if ls.loss_scale else
                     f"dynamic loss scale 2^{ls.initial_scale_power}")
    zf = cfg.zenflow
    if zf is not None:
        parts.append(f"zenflow topk {zf.topk_ratio:g} U {zf.update_interval} select "
                     f"{zf.select_strategy}/{zf.select_interval} overlap "
                     f"{'on' if zf.overlap_step else 'off'} warm-up {zf.full_warm_up_rounds}"
                     f" reserved cores {zf.pt_reserved_cores_perc:g}")
    if threads is not None:
        parts.append(f"threads {threads[0]} device + {threads[1]} host")
    return ", ".join(parts)


def summary_row(result, model_bytes: float, params: int, flops_per_step: float,
                skip: int, needed: int) -> dict:
    tl = result.timeline
    skip = min(skip, max(0, len(result.losses) - 2))  # leave the first windows out
    strategy = result.strategy
    per_step_params = 0.0 if strategy == "device" else float(params)
    zf = result.engine.config.zenflow
    if strategy == "zenflow" and zf is not None and zf.update_interval != "auto":
        per_step_params = params / int(zf.update_interval)
    row = {"strategy": strategy}
    row.update(summarize(tl.spans_frame(), tl.steps_frame(), skip, model_bytes,
                         per_step_params))
    row["achieved_flops_per_s"] = flops_per_step / row["step_time_s"]
    row["loss_first"] = result.losses[0]
    row["loss_last"] = result.losses[-1]
    row["skipped_steps"] = sum(r["skipped"] for r in result.engine.step_log)
    row["steps_left_out"] = skip
    row["steps_needed"] = needed
    row["too_short"] = len(result.losses) < needed
    return row


def times(ratio: float) -> str:
    """A speedup, or "-" when there is no zero-offload row to compare with."""
    return "-" if ratio != ratio else f"{ratio:.2f}x"


def add_speedups(rows: list[dict]) -> None:
    base = next((r for r in rows if r["strategy"] == "zero-offload"), None)
    for r in rows:
        r["speedup_vs_zero_offload"] = base["step_time_s"] / r["step_time_s"] if base \
            else float("nan")


def format_table(rows: list[dict]) -> str:
    head = ["strategy", "step_s", "speedup", "stall%", "exp_io_s", "host_wait_s",
            "d2h_GB/s", "h2d_GB/s", "hostAdam_Mp/s", "GFLOP/s", "util%", "loss"]
    lines = []
    for r in rows:
        lines.append([r["strategy"] + (" (too short)" if r.get("too_short") else ""),
                      f"{r['step_time_s']:.3f}",
                      times(r['speedup_vs_zero_offload']),
                      f"{100 * r['stall_fraction']:.1f}", f"{r['exposed_io_s']:.3f}",
                      f"{r['host_wait_s']:.3f}", f"{r['d2h_gb_per_s']:.2f}",
                      f"{r['h2d_gb_per_s']:.2f}",
                      f"{r.get('host_adam_params_per_s', 0) / 1e6:.0f}",
                      f"{r['achieved_flops_per_s'] / 1e9:.1f}",
                      f"{100 * r['compute_utilization']:.0f}",
                      f"{r['loss_first']:.3f}->{r['loss_last']:.3f}"])
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*x) for x in lines])


def write_outputs(out: Path, rows: list[dict], results: dict, meta: dict) -> None:
    """Every file into a staging directory, then renamed into `out`; `meta` (settings,
    configs, provenance) goes into summary.json beside the rows."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        pd.DataFrame(rows).to_csv(staging / "summary.csv", index=False)
        write_json_atomic(staging / "summary.json", {**meta, "rows": rows})
        for strategy, result in results.items():
            result.timeline.write_csv(staging, prefix=f"{strategy}.")
            with open(staging / f"{strategy}.steps.jsonl", "w") as handle:
                for record, loss in zip(result.engine.step_log, result.losses):
                    handle.write(json.dumps({**record, "loss": loss}) + "\n")
        write_json_atomic(staging / "trace.json", merge_chrome_traces(
            {s: r.timeline for s, r in results.items()}))
        for path in staging.iterdir():
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def project(spec, shape, strategies: list[str], profile_path: Path) -> list[dict]:
    """Simulate the full-depth model with the slice's profile, one row per strategy."""
    from zfbench.sims.costs import SimSettings
    from zfbench.sims.simulator import simulate

    full = shape.name.split("[")[0]
    config = spec.engine_config("zenflow")
    zf = config.zenflow
    settings = SimSettings(model=full, layers=None, gpus=1, micro_batch=spec.batch,
                           seq=spec.seq, precision=config.precision, transfers="full",
                           profile=str(profile_path), steps=max(spec.steps, 24),
                           topk_ratio=zf.topk_ratio, update_interval=zf.update_interval,
                           overlap_step=zf.overlap_step, select_interval=0)
    rows = []
    for strategy in strategies:
        result = simulate(settings, strategy)
        tl = result.timeline
        row = summarize(tl.spans_frame(), tl.steps_frame(), result.skip_steps)
        rows.append({"model": full, "strategy": strategy, **row})
    add_speedups(rows)
    return rows


def format_projection(rows: list[dict]) -> str:
    head = f"{'strategy':>16}  {'step_s':>8}  {'speedup':>8}  {'stall%':>6}  " \
           f"{'exp_io_s':>8}  {'host_wait_s':>11}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['strategy']:>16}  {r['step_time_s']:8.3f}  "
                     f"{times(r['speedup_vs_zero_offload']):>8}  "
                     f"{100 * r['stall_fraction']:6.1f}  "
                     f"{r['exposed_io_s']:8.3f}  {r['host_wait_s']:11.3f}")
    return "\n".join(lines)
