"""Where DeepSpeed's training thread spends its step on the CPU accelerator (issue 44).

    /work/dsvenv/bin/python bench/ds_trace.py      # -> bench/results/predict_deepspeed_trace/

Owns one measurement: per engine (bench/ds_wallclock.py's `zero_offload`, `zenflow_seq`,
`zenflow_overlap`, built and configured as there), after its warm-up windows, one steady
update window (U steps) of DeepSpeed 0.19.5 on its CPU accelerator, traced two ways:
- each ZeRO/ZenFlow optimizer method that backward's hooks, `bwd_allreduce` and `step`
  call (`TRACED`, wrapped on the engine's optimizer instance: DeepSpeed's code runs
  unchanged) gets its calls, inclusive wall seconds and thread CPU seconds per step;
- torch.profiler (record_shapes) over the same window: each top-level aten op's CPU
  time, attributed to the innermost traced method around it and to the phase (forward,
  backward, step) it ran in, with its input shapes.
DeepSpeed's own timers (`wall_clock_breakdown`) are read from its printed lines of the
traced window, per step. Files per engine:
`<shape>__<engine>.methods.csv`, `.ops.csv`, `.log`; `summary.json` with the machine,
load and each engine's timers per step.

`--no-profile --windows N`: the methods alone over N windows, without torch.profiler
(`<shape>__<engine>.unprofiled.methods.csv`, `.unprofiled.log`,
`summary_unprofiled.json`). The profiler slows some ops more in one engine than the other
(ZenFlow's copies into the reduction bucket at 2.2-2.8x ZeRO-Offload's traced, equal
without it: bench/ds_bucket_copy.py), so sizes are read from this mode.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
for p in (str(ROOT), str(BENCH)):
    if p not in sys.path:
        sys.path.insert(0, p)

# DeepSpeed 0.19.5 methods (runtime/zero/stage_1_and_2.py, runtime/zenflow/
# zenflow_stage_1_and_2.py) on the training thread's path through a step
TRACED = ("process_gradients", "reduce_independent_p_g_buckets_and_remove_grads",
          "independent_gradient_partition_epilogue", "reduce_ipg_grads", "average_tensor",
          "gradient_reduction_w_predivide", "allreduce_no_retain", "copy_grads_in_partition",
          "async_accumulate_grad_in_cpu_via_gpu", "set_norm_for_param_grad_in_gpu",
          "update_offload_overflow_tracker_for_param_grad",
          "async_inplace_copy_grad_to_fp32_buffer_from_gpu", "update_selected_channels",
          "_process_selected_fp32_groups_grad", "_release_ipg_buffers",
          "_clear_param_grad_only", "step", "scaled_global_norm",
          "complete_grad_norm_calculation_for_cpu_offload", "unscale_and_clip_grads",
          "_optimizer_step", "zenflow_cpu_optimizer_step", "wait_last_update_and_copy",
          "sync_fp32_param_from_gpu", "backward_prologue", "_update_model_bit16_weights",
          "reset_cpu_buffers", "selective_optimizer_step", "check_overflow", "has_overflow")
SELECTIVE = ("group_step", "temp_copy_param", "step", "clear_selected_mv")


class Tracer:
    """Calls, inclusive wall and thread-CPU seconds of each wrapped method."""

    def __init__(self):
        self.on = False
        self.stats = collections.defaultdict(lambda: [0, 0.0, 0.0])

    def wrap(self, obj, name: str, label: str) -> None:
        import torch

        fn = getattr(obj, name, None)
        if fn is None or not callable(fn):
            return

        @functools.wraps(fn)
        def traced(*a, **k):
            if not self.on:
                return fn(*a, **k)
            w0, c0 = time.perf_counter(), time.thread_time()
            with torch.profiler.record_function(f"ds::{label}"):
                out = fn(*a, **k)
            s = self.stats[label]
            s[0] += 1
            s[1] += time.perf_counter() - w0
            s[2] += time.thread_time() - c0
            return out
        setattr(obj, name, traced)


def attribute(prof, steps: int) -> list[dict]:
    """Top-level aten ops (no aten parent), their CPU ms per step by (phase, innermost
    traced method, op, input shapes)."""
    out = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        parent, ds, phase, top = e.cpu_parent, "", "", True
        while parent is not None:
            if parent.name.startswith("aten::"):
                top = False
                break
            if parent.name.startswith("ds::") and not ds:
                ds = parent.name[4:]
            if parent.name.startswith("phase::"):
                phase = parent.name[7:]
            parent = parent.cpu_parent
        if not top:
            continue
        if not phase:  # autograd's own thread-local ranges: backward
            phase = "backward"
        key = (phase, ds or "-", e.name, str(e.input_shapes)[:120])
        out[key][0] += 1
        out[key][1] += e.cpu_time_total / 1e3
    return [{"phase": k[0], "method": k[1], "op": k[2], "shapes": k[3],
             "calls_per_step": v[0] / steps, "cpu_ms_per_step": v[1] / steps}
            for k, v in sorted(out.items(), key=lambda kv: -kv[1][1])]


def run_engine(ds, args, spec, engine: str, data: list) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from ds_engines import make_ds, release_ds
    from ds_wallclock import engine_config
    from ds_wallclock_observe import TIMER_LINE, capture_deepspeed
    from zfbench.core.models import get_model
    from zfbench.real.model import build_model

    name, batch, seq = spec
    U, overlap = args.update_interval, engine == "zenflow_overlap"
    cores = len(os.sched_getaffinity(0))
    full_aff, omp = os.sched_getaffinity(0), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(max(1, cores // 2) if overlap else cores)
    cfg = engine_config(args, batch, engine)
    model = build_model(get_model(name), dtype=torch.float32, seed=0)
    dse = make_ds(ds, model, cfg)
    tracer = Tracer()
    opt = dse.optimizer
    for m in TRACED:
        tracer.wrap(opt, m, m)
    sel = getattr(opt, "selective_optimizer", None)
    for m in SELECTIVE if sel is not None else ():
        tracer.wrap(sel, m, f"selective.{m}")
    tracer.wrap(opt.optimizer, "step", "host_adam.step")
    tag = f"{name.replace('[', '-').replace(']', '')}_b{batch}_s{seq}__{engine}"
    if args.no_profile:
        tag += ".unprofiled"
    warm, steps = args.warmup_windows * U, args.windows * U
    walls = []
    try:
        with capture_deepspeed(args.out / f"{tag}.log", False) as cap:
            for t, b in enumerate(data[:warm]):
                loss = dse(b["input_ids"], b["labels"])
                dse.backward(loss)
                dse.step()
            cap.take()
            tracer.on = True
            load = os.getloadavg()
            window = (contextlib.nullcontext() if args.no_profile else
                      profile(activities=[ProfilerActivity.CPU], record_shapes=True))
            with window as prof:
                for b in data[warm:warm + steps]:
                    t0 = time.perf_counter()
                    with record_function("phase::forward"):
                        loss = dse(b["input_ids"], b["labels"])
                    with record_function("phase::backward"):
                        dse.backward(loss)
                    with record_function("phase::step"):
                        dse.step()
                    walls.append(time.perf_counter() - t0)
            tracer.on = False
            lines = cap.take()
    finally:
        release_ds(dse, full_aff, omp, cores)
    per_step = collections.defaultdict(float)
    for line in lines:  # ZeRO-Offload prints every step, ZenFlow its window's sums
        match = TIMER_LINE.search(line)
        for name_, sep, value in (f.partition(":") for f in
                                  (match.group(1).split("|") if match else ())):
            if sep and not name_.strip().endswith("_microstep"):
                per_step[name_.strip()] += float(value) / steps
    methods = [{"method": k, "calls_per_step": v[0] / steps,
                "wall_ms_per_step": 1e3 * v[1] / steps,
                "thread_cpu_ms_per_step": 1e3 * v[2] / steps}
               for k, v in sorted(tracer.stats.items(), key=lambda kv: -kv[1][1])]
    files = [("methods", methods)] + ([] if args.no_profile else [("ops", attribute(prof, U))])
    import csv
    for suffix, rows in files:
        with open(args.out / f"{tag}.{suffix}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return {"shape": name, "batch": batch, "seq": seq, "engine": engine,
            "step_s_traced_mean": sum(walls) / len(walls), "loadavg_before": list(load),
            "deepspeed_timers_ms_per_step": dict(per_step),
            "n_params": sum(p.numel() for p in model.parameters()),
            "steps": steps, "profiled": not args.no_profile,
            "files": [f"{tag}.{suffix}.csv" for suffix, _ in files] + [f"{tag}.log"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--shape", default="opt-350m[2L]:1:128", help="NAME:BATCH:SEQ")
    ap.add_argument("--engines", default="zero_offload,zenflow_seq,zenflow_overlap")
    ap.add_argument("--warmup-windows", type=int, default=2)
    ap.add_argument("--windows", type=int, default=1, help="windows timed (U steps each)")
    ap.add_argument("--no-profile", action="store_true",
                    help="time the methods only, without torch.profiler")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "predict_deepspeed_trace")
    args = ap.parse_args(argv)
    from ds_engines import import_deepspeed, seeded_batches
    from ds_wallclock import ENGINES, default_engine_args, parse_shapes
    from ds_wallclock_observe import machine
    from zfbench.core.models import get_model

    engines = [e for e in args.engines.split(",") if e]
    if set(engines) - set(ENGINES):
        ap.error(f"--engines {args.engines!r}: choose from {', '.join(ENGINES)}")
    # bench/ds_wallclock.py's defaults for what engine_config reads
    vars(args).update(vars(default_engine_args()))
    spec = parse_shapes(args.shape)[0]
    ds = import_deepspeed(False, "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.windows < 1 or (args.windows > 1 and not args.no_profile):
        ap.error(f"--windows {args.windows}: at least 1, and more only with --no-profile")
    data = seeded_batches(get_model(spec[0]).vocab, spec[1], spec[2],
                          (args.warmup_windows + args.windows) * args.update_interval, 0)
    summary = "summary_unprofiled.json" if args.no_profile else "summary.json"
    result = {"benchmark": "ds_trace", "machine": machine(), "deepspeed": ds.__version__,
              "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "runs": []}
    for engine in engines:
        result["runs"].append(run_engine(ds, args, spec, engine, data))
        print(f"{engine}: {result['runs'][-1]['step_s_traced_mean']:.3f} s/step "
              f"{'timed' if args.no_profile else 'traced'}",
              flush=True)
        (args.out / summary).write_text(json.dumps(result, indent=1) + "\n")
    result["loadavg_end"] = list(os.getloadavg())
    (args.out / summary).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
