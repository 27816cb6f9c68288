"""What `python -m zfbench.run` adds to the shared report (`zfbench.report`: the columns,
the table, summary.csv/json and steps.csv): the header, a measured run's summary row, and
its files.

Owns the effective-config header (one line per strategy: batch arithmetic, precision,
optimizer, ZeRO stage, offload, ZenFlow knobs, lanes, then the config's notes), the
too-short check (a run must hold the skipped warm-up windows plus one measured window),
the measured summary row (`zfbench.report.SUMMARY_COLUMNS`, the simulator's columns, plus
`MEASURED_ONLY`): `mfu` against the datasheet peak of the hardware preset matching the
GPU's name (`peak_flops`; empty on the CPU lane, which has no datasheet peak, with the
reason in summary.json), memory per rank and `fits` from the engine's own estimate
(`zfbench.real.memory`, `memory_columns`), and the output directory: summary.csv/json
(the rows, the run's settings, every strategy's effective config, where the numbers came
from, and what mfu and fits were measured against), steps.csv (the per-step breakdown),
per-strategy JSONL, spans and trace.json, all through a staging directory and renames;
then the files of an earlier run it did not write again are removed (`RUN_FILES`).

Part of the command `python -m zfbench.run` (its concept: the run's report, apart from
running it): like the command, it imports real/, sims/ or analysis/ (docs/design.md's
arrows).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from zfbench.analysis.breakdown import step_breakdown, summarize
from zfbench.core.config import EngineConfig
from zfbench.core.strategies import device_adamw, has_windows, zero_offload
from zfbench.core.schedule import assumed_window_steps
from zfbench.core.schedule import measurement_window as steps_left_out
from zfbench.core.trace import merge_chrome_traces, write_json_atomic
from zfbench.run.host_target import host_target_columns, uploads_on_host_worker
from zfbench.run.defaults import PLAN_FILE
from zfbench.report import (TIMELINE_FILES, Owned, add_speedups, complete_row, json_ready,
                            land, staging_dir, steps_rows, write_steps, write_summary)


def measurement_window(cfg: EngineConfig) -> tuple[int, int]:
    """(steps left out at the start, steps the whole run needs) for one strategy's config,
    by zfbench.core.schedule.measurement_window: with a ZenFlow section its warm-up and
    two update windows (an "auto" window assumed, `assumed_window_steps`), else the
    fixed rule."""
    zf = cfg.zenflow
    if zf is None:
        return steps_left_out(False, 0, ())
    window = assumed_window_steps(zf.update_interval)
    return steps_left_out(True, zf.full_warm_up_rounds, (window,))


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


@dataclass(frozen=True)
class StepWork:
    """What one optimizer step of one rank does, known before it runs, and the device's
    peak to measure it against (None where there is no datasheet peak)."""

    model_bytes: float
    params: int
    flops_per_step: float  # model FLOPs (forward + backward) of one rank's step
    tokens_per_step: int  # one rank's
    peak_flops_per_s: float | None = None


def host_share_note(rows: list[dict], on_cuda: bool, rank_cores: int) -> str | None:
    """On a GPU zero-offload's and its delayed update's host lane runs on all the rank's
    cores, as DeepSpeed's CPU-Adam does (its ZenFlow optimizer process alone takes the
    unreserved share; real/distributed.py `lane_threads`); where `--host-threads` gave
    them fewer, the line that says so beside the table, else None."""
    if not on_cuda:
        return None
    short = [r for r in rows if zero_offload(r["strategy"])
             and r.get("host_threads") and r["host_threads"] < rank_cores]
    if not short:
        return None
    names = " and ".join(r["strategy"] for r in short)
    threads = short[0]["host_threads"]
    return (f"note: {names} ran the host AdamW on {threads} of the rank's {rank_cores} "
            f"cores (--host-threads); DeepSpeed's ZeRO-Offload uses all "
            f"{rank_cores}, so its host step would be faster than here and ZenFlow's "
            f"speedup over it smaller (leave --host-threads out to give them all)")


def gpu_preset(device_name: str) -> str | None:
    """The hardware preset (zfbench/data/hardware.json) whose datasheet describes the GPU
    torch names `device_name`, or None: NVL and Grace-Hopper parts, and any other GPU,
    have no preset of their own."""
    name = device_name.upper().replace("-", " ")
    if "NVL" in name or "GH200" in name:
        return None
    if "H200" in name:
        return "h200"
    if "H100" in name:
        return "h100-pcie" if "PCIE" in name else "h100-sxm"
    if "A100" in name:
        return "a100-80g" if "80GB" in name else "a100-40g" if "40GB" in name else None
    return None


def peak_flops(use_cuda: bool, precision: str, device_name: str | None = None
               ) -> tuple[float | None, str]:
    """(the device's dense peak FLOP/s for `precision`, or None; the note summary.json
    keeps on what mfu was measured against)."""
    if not use_cuda:
        return None, ("empty: the accelerator is emulated on the CPU, which has no "
                      "datasheet peak FLOP/s (achieved_flops_per_s is measured)")
    if device_name is None:
        import torch

        device_name = torch.cuda.get_device_name(0)
    preset = gpu_preset(device_name)
    if preset is None:
        return None, (f"empty: no hardware preset matches the GPU {device_name!r} "
                      f"(zfbench/data/hardware.json)")
    if precision not in ("bf16", "fp16"):
        return None, (f"empty: {preset}'s datasheet peaks are bf16/fp16 tensor-core rates "
                      f"and this run computes in {precision}")
    from zfbench.core.hardware import get_gpu

    peak = get_gpu(preset).peak_flops_per_s(precision)
    return peak, (f"model FLOPs per step (forward + backward, zfbench.core.models) / "
                  f"(step_time_s x {peak / 1e12:.0f} TFLOP/s, the dense {precision} peak "
                  f"of preset {preset}, matched to {device_name!r})")


def memory_room(use_cuda: bool) -> dict:
    """What the machine offers a run, measured once before the first strategy: the GPU's
    free bytes (None on the CPU lane) and the host's MemAvailable."""
    from zfbench.real.memory import available_device_bytes, available_host_bytes

    return {"device": available_device_bytes(use_cuda, 1), "host": available_host_bytes()}


MEMORY_NOTE = ("device_bytes_per_rank and host_bytes (the machine's, every rank's shard) "
               "are zfbench.real.memory's estimate of the engine's buffers and activations "
               "(with its headroom); the capacities are the GPU's free memory and the "
               "host's MemAvailable before the run; on the CPU lane device and host share "
               "RAM (device_capacity_bytes empty) and fits compares device x ranks + host "
               "with it")


def memory_columns(shape, config: EngineConfig, seq: int, ranks: int, room: dict) -> dict:
    """Memory per rank and `fits` of one strategy as its engine config runs it (batch,
    precision, gradient buckets, ZenFlow's top-k: `zfbench.real.memory.MemoryCheck.
    of_configs`), as the check before the run decides it, against `room`."""
    from zfbench.real.memory import MemoryCheck, process_baseline_bytes

    check = MemoryCheck.of_configs(
        {config.strategy: config}, seq, room["device"] is not None,
        host_bytes=room["host"], device_bytes=room["device"],
        baseline=process_baseline_bytes() if ranks > 1 else 0.0)
    need = check.need(shape, config.strategy)
    return {"device_bytes_per_rank": need.device_bytes,
            "device_capacity_bytes": float("nan") if room["device"] is None
            else room["device"], "host_bytes": need.host_bytes,
            "host_capacity_bytes": room["host"], "fits": check.fits(shape)}


def summary_row(result, work: StepWork, skip: int, needed: int,
                memory: dict | None = None, calibration: dict | None = None) -> dict:
    """`zfbench.report.SUMMARY_COLUMNS` and `MEASURED_ONLY` of one measured strategy;
    `calibration`: the profile measured around it, for the host lane's ratios
    (zfbench.run.host_target; NaN without one)."""
    tl = result.timeline
    skip = min(skip, max(0, len(result.losses) - 2))  # leave the first windows out
    strategy = result.strategy
    cfg = result.engine.config
    per_step_params = 0.0 if device_adamw(strategy) else work.params / cfg.world_size
    zf = cfg.zenflow
    if has_windows(strategy) and zf is not None and zf.update_interval != "auto":
        per_step_params /= int(zf.update_interval)
    row = {"strategy": strategy}
    row.update(summarize(tl.spans_frame(), tl.steps_frame(), skip, work.model_bytes,
                         per_step_params, work.flops_per_step, work.peak_flops_per_s))
    row["achieved_flops_per_s"] = work.flops_per_step / row["step_time_s"]
    row["tokens_per_s"] = work.tokens_per_step * row["ranks"] / row["step_time_s"]
    row.update(memory or {})
    row["loss_first"] = result.losses[0]
    row["loss_last"] = result.losses[-1]
    row["skipped_steps"] = sum(r["skipped"] for r in result.engine.step_log)
    row["steps_left_out"] = skip
    row["steps_needed"] = needed
    row["too_short"] = len(result.losses) < needed
    row.update(host_target_columns(row, tl.spans_frame(), skip, calibration,
                                   uploads_on_host_worker(result.engine.backend),
                                   has_windows(strategy), per_step_params))
    return complete_row(row)


# Each strategy's profile measured around it (zfbench.run.expect), beside profile.json.
PROFILE_FILES = Owned(per_strategy=("profiles/{}.json",))
# Every file name a run writes into its directory (plan.json and the profiles before the
# report, the rest through `write_outputs`): those of an earlier run it did not write
# again are removed when it lands (zfbench.report.land).
RUN_FILES = Owned(names=("summary.csv", "summary.json", "steps.csv", "trace.json",
                         PLAN_FILE, "profile.json"),
                  per_strategy=(*TIMELINE_FILES, "{}.steps.jsonl",
                                *PROFILE_FILES.per_strategy))


def write_outputs(out: Path, rows: list[dict], results: dict, meta: dict,
                  kept=()) -> None:
    """Every file into a staging directory, then renamed into `out`, and the files of
    `RUN_FILES` this run did not write removed (`kept`: those it wrote into `out`
    itself, relative paths: plan.json, the profiles); `meta` (settings, configs,
    provenance, column notes) goes into summary.json before the rows."""
    with staging_dir(out) as staging:
        write_summary(staging, meta, rows)
        tables = []
        for strategy, result in results.items():
            tl = result.timeline
            tables.append(steps_rows(step_breakdown(tl.spans_frame(), tl.steps_frame()),
                                     strategy))
            tl.write_csv(staging, prefix=f"{strategy}.")
            with open(staging / f"{strategy}.steps.jsonl", "w") as handle:
                for record, loss in zip(result.engine.step_log, result.losses):
                    handle.write(json.dumps(json_ready({**record, "loss": loss})) + "\n")
        write_steps(staging, tables)
        write_json_atomic(staging / "trace.json", merge_chrome_traces(
            {s: r.timeline for s, r in results.items()}))
        land(staging, out, RUN_FILES, kept)


def project(spec, shape, strategies: list[str], profile_path: Path,
            config=None) -> list[dict]:
    """Simulate the full-depth model with the slice's profile: one row per strategy, the
    simulator's summary columns (zfbench.simulation.summary_row); `config`: the zenflow
    strategy's engine config where the caller has resolved it."""
    from zfbench.sims.settings import for_engine_run
    from zfbench.sims.simulator import simulate, steps_needed
    from zfbench.simulation import summary_row as simulated_row

    full = shape.name.split("[")[0]
    settings = for_engine_run(config or spec.engine_config("zenflow"), model=full, layers=None,
                              gpus=1, micro_batch=spec.micro_batch, seq=spec.seq,
                              profile=str(profile_path), steps=max(spec.steps, 24))
    need = steps_needed(settings)
    rows = [{**simulated_row(simulate(settings, strategy)), "model": full,
             "steps_needed": need, "too_short": settings.measurement.steps < need}
            for strategy in strategies]
    add_speedups(rows)
    return rows
