"""The measured ZeRO-Offload baselines `python -m zfbench.predict` reads, as `Breakdown`s.

- `parse_breakdown("compute=S,io=S,stall=S")` (or `d2h=S,h2d=S` in place of `io`);
- `read_deepspeed_log(path)`: the timer lines DeepSpeed prints with
  `"wall_clock_breakdown": true` (`[Rank 0] time (ms) | fwd: ... | bwd_inner: ... |
  bwd_allreduce: ... | step: ...` and `optimizer_step` on the line before), averaged over
  the steady steps. Under ZeRO-Offload, forward + `bwd_inner` is GPU compute,
  `bwd_allreduce` holds the gradient reduction and its copy to the host (d2h),
  `optimizer_step` is the host AdamW (the stall), and the rest of `step` is the parameter
  copy back (h2d);
- `deepspeed_pass_rate(path, elements)`: on DeepSpeed's CPU accelerator, the training
  thread's rate of one in-place memory pass, from the same log's `optimizer_gradients`;
- `read_run(dir)`: a `python -m zfbench.run --out DIR` with a zero-offload row (its
  timeline gives the exposed transfer per direction), and that run's shape;
- `measured_link(...)`: that row's link rates per direction, bytes / busy seconds of its
  own copies (`d2h_grad`, `h2d_param` spans; else the row's recorded GB/s);
- `paper_bars()`: the ZenFlow paper's eight ZeRO-Offload bars (zfbench/data, with source).
Every reader refuses bad input in one line that names the problem and the fix.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from importlib import resources
from pathlib import Path

from zfbench.predict.fit import Breakdown

BREAKDOWN_KEYS = ("compute", "io", "stall", "d2h", "h2d", "step")
# a stated step may differ from the sum of its parts by this much (values read off a figure)
STEP_TOLERANCE = 0.02
DEEPSPEED_NEEDED = ("fwd", "bwd_inner", "bwd_allreduce", "step", "optimizer_step")
_TIMER_LINE = re.compile(r"(?:\[Rank (\d+)\])?\s*time \(ms\)\s*\|(.*)$")


def parse_breakdown(text: str) -> Breakdown:
    """`compute=0.66,io=0.53,stall=5.61` (seconds per step); `d2h=..,h2d=..` may stand for
    `io` when the transfer is measured per direction; `step=S`, if given, must be the sum
    of the parts (within 2 %)."""
    parts: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in BREAKDOWN_KEYS:
            raise ValueError(f"--from-breakdown: cannot read {item!r}; write "
                             f"compute=S,io=S,stall=S (seconds per step)")
        if key in parts:
            raise ValueError(f"--from-breakdown: {key} given twice")
        try:
            parts[key] = float(value)
        except ValueError:
            raise ValueError(f"--from-breakdown: {key}={value!r} is not a number of "
                             f"seconds") from None
    if "io" not in parts and "d2h" in parts and "h2d" in parts:
        parts["io"] = parts["d2h"] + parts["h2d"]
    missing = [k for k in ("compute", "io", "stall") if k not in parts]
    if missing:
        raise ValueError(f"--from-breakdown: missing {', '.join(missing)}; write "
                         f"compute=S,io=S,stall=S (seconds per step of a ZeRO-Offload run)")
    try:
        out = Breakdown(parts["compute"], parts["io"], parts["stall"], parts.get("d2h"),
                        parts.get("h2d"), source=f"breakdown {text}")
    except ValueError as err:
        raise ValueError(f"--from-breakdown: {err}") from None
    step = parts.get("step")
    if step is not None and not abs(out.step_s - step) <= STEP_TOLERANCE * step:
        raise ValueError(f"--from-breakdown: the parts add up to {out.step_s:.4g} s but step "
                         f"is {step:.4g} s; compute + io + stall must make the step (count "
                         f"the rest of the step as stall)")
    return out


def deepspeed_steps(text: str) -> list[dict[str, float]]:
    """One dict of timers (ms) per optimizer step per rank, in log order. A step's line is
    the one with `step` (not `step_microstep`); `optimizer_*` timers printed just before
    it belong to it."""
    pending: dict[tuple, dict] = {}
    steps = []
    for line in text.splitlines():
        match = _TIMER_LINE.search(line)
        if not match:
            continue
        rank = match.group(1) or "0"
        timers = {}
        for field in match.group(2).split("|"):
            name, sep, value = field.partition(":")
            if not sep:
                continue
            try:
                timers[name.strip()] = float(value)
            except ValueError:
                raise ValueError(f"DeepSpeed log: cannot read timer {field.strip()!r} in "
                                 f"{line.strip()!r}") from None
        mine = pending.setdefault(rank, {})
        mine.update({k: v for k, v in timers.items() if not k.endswith("_microstep")})
        if "step" in timers:
            steps.append({"rank": int(rank), **mine})
            pending[rank] = {}
    return steps


def read_deepspeed_log(path: str | Path, skip: int = 1,
                       compute_over_forward: float | None = None) -> Breakdown:
    """The mean ZeRO-Offload breakdown of the log's steps after the first `skip` (per
    rank; averaged over ranks). `compute_over_forward`: for a run whose gradient buffers
    are pageable (`offload_optimizer.pin_memory` false on a GPU), the simulated step's
    compute over its forward (`_deepspeed_parts`)."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise ValueError(f"--deepspeed-log {path}: {err.strerror or err}") from None
    steps = deepspeed_steps(text)
    if not steps:
        raise ValueError(f"--deepspeed-log {path}: no DeepSpeed timer lines ('time (ms) | "
                         f"fwd: ...'); run DeepSpeed with \"wall_clock_breakdown\": true and "
                         f"\"steps_per_print\": 1 and keep its INFO log")
    ranks = sorted({s["rank"] for s in steps})
    kept = []
    for rank in ranks:
        mine = [s for s in steps if s["rank"] == rank]
        if len(mine) <= skip:
            raise ValueError(f"--deepspeed-log {path}: rank {rank} has {len(mine)} step(s), "
                             f"all left out as warm-up (--skip-steps {skip}); log more steps")
        kept.extend(mine[skip:])
    missing = sorted({k for s in kept for k in DEEPSPEED_NEEDED if k not in s})
    if missing:
        raise ValueError(f"--deepspeed-log {path}: timers {', '.join(missing)} are missing; "
                         f"this needs a ZeRO-Offload run (offload_optimizer cpu) with "
                         f"wall_clock_breakdown true")
    per_step = [_deepspeed_parts(s, compute_over_forward) for s in kept]
    mean = {k: sum(p[k] for p in per_step) / len(per_step) for k in per_step[0]}
    spread = {k: statistics.stdev(p[k] for p in per_step) if len(per_step) > 1 else 0.0
              for k in mean}
    return Breakdown(**mean, spread_s=spread, steps=len(per_step),
                     source=f"DeepSpeed log {path.name} ({len(kept)} steps of "
                            f"{len(ranks)} rank(s) after {skip} left out)")


def _deepspeed_parts(timers: dict[str, float],
                     compute_over_forward: float | None = None) -> dict[str, float]:
    """One step's parts (seconds) from its timers (ms): forward + `bwd_inner` compute,
    `bwd_allreduce` the gradients down, `optimizer_step` the stall, and the rest of
    `step` the parameters up.

    That last part is an approximation the timers cannot correct: in DeepSpeed v0.19.5
    (stage_1_and_2.py `step`, lines 2295-2317) the rest of `step` is mostly
    `optimizer_gradients` (a host pass unscaling the gradient partition) plus the norm and
    `optimizer_allgather`, while the parameter copy up is issued inside `optimizer_step`,
    after the host AdamW, and (CUDA event timers, deepspeed/utils/timer.py) ends it. No
    timer holds the upload alone, so no reading of this log splits AdamW from it; the
    stall and the "upload" here add up to the step's optimizer time either way.

    With pageable gradient buffers (`compute_over_forward` given) DeepSpeed's copy of each
    gradient into host memory runs inside backward's hooks and holds the thread that
    launches backward's kernels (DeepSpeed v0.19.5 stage_1_and_2.py `reduce_ipg_grads` ->
    `copy_grads_in_partition` -> `async_inplace_copy_grad_to_fp32_buffer_from_gpu`, a
    `copy_(non_blocking=True)` into a buffer pinned only with `pin_memory`, lines 816-823
    and 1563-1578; zfbench.sims.pageable), so `bwd_inner` holds the copies: the compute is
    the forward timer (no copies) times the simulated step's compute over its forward,
    and the rest of forward + `bwd_inner` is the gradients going down."""
    h2d = max(timers["step"] - timers["optimizer_step"], 0.0) / 1e3
    d2h = timers["bwd_allreduce"] / 1e3
    compute = (timers["fwd"] + timers["bwd_inner"]) / 1e3
    if compute_over_forward is not None:
        pure = min(compute, timers["fwd"] / 1e3 * compute_over_forward)
        d2h, compute = d2h + (compute - pure), pure
    return {"compute_s": compute, "io_s": d2h + h2d,
            "stall_s": timers["optimizer_step"] / 1e3, "d2h_s": d2h, "h2d_s": h2d}


# bytes one in-place pass over an fp32 element moves: read it, write it back
PASS_BYTES_PER_ELEM = 8


def deepspeed_pass_rate(path: str | Path, elements: float, skip: int = 1) -> dict:
    """{bytes_per_s, source}: the rate of one memory pass of the training thread, from a
    ZeRO-Offload log of a run on DeepSpeed's CPU accelerator (fp32, no loss scale). Its
    `optimizer_gradients` timer holds `unscale_and_clip_grads`, which multiplies the fp32
    gradient partition (`elements`) in place, one read and one write an element, on the
    training thread (DeepSpeed v0.19.5 stage_1_and_2.py `step`, lines 2300-2306, and
    `unscale_and_clip_grads`, lines 2408-2423); steady steps after `skip`, averaged."""
    path = Path(path)
    try:
        steps = deepspeed_steps(path.read_text(errors="replace"))[skip:]
    except OSError as err:
        raise ValueError(f"--deepspeed-log {path}: {err.strerror or err}") from None
    times = [s["optimizer_gradients"] / 1e3 for s in steps if "optimizer_gradients" in s]
    if not times or not sum(times) > 0 or not elements > 0:
        raise ValueError(f"--deepspeed-log {path}: no optimizer_gradients timer after "
                         f"{skip} steps; this needs a ZeRO-Offload run with "
                         f"wall_clock_breakdown true")
    mean = sum(times) / len(times)
    return {"bytes_per_s": elements * PASS_BYTES_PER_ELEM / mean,
            "source": f"measured: DeepSpeed log {path.name}, optimizer_gradients "
                      f"{1e3 * mean:.4g} ms over {len(times)} steps, one in-place pass "
                      f"over {elements:.6g} fp32 gradient elements (8 B each)"}


def read_run(path: str | Path) -> tuple[Breakdown, dict, dict | None]:
    """(the zero-offload breakdown, the run's settings plus `emulated`: whether its
    accelerator was the CPU lane, and `gradient_clipping`: its zero-offload config's, None
    where not recorded; its measured zenflow row or None) of a
    `python -m zfbench.run --out DIR`. Where the run's timeline files are there, the
    breakdown also carries the exposed transfer per direction, each part's step-to-step
    spread, and the fixed cost per copy when the run's copies differ enough in size to
    show one (`copy_latency`)."""
    from zfbench.analysis.breakdown import step_breakdown, summarize
    from zfbench.core.trace import Timeline

    path = Path(path)
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--from-run {path}: no readable summary.json ({err}); give the "
                         f"--out directory of python -m zfbench.run") from None
    rows = {r.get("strategy"): r for r in summary.get("rows", [])}
    base = rows.get("zero-offload")
    if base is None or "settings" not in summary:
        raise ValueError(f"--from-run {path}: no zero-offload row; run python -m zfbench.run "
                         f"with --strategy zero-offload (or all)")
    parts, spread, spans, counted = {}, {}, None, None
    skip = int(base.get("steps_left_out", 0))
    try:
        tl = Timeline.read_csv(path, prefix="zero-offload.")
        spans, steps = tl.spans_frame(), tl.steps_frame()
        table = step_breakdown(spans, steps)
        table = table[table["step"] >= skip]
        counted = len(table) or None
        for part, column in (("compute_s", "compute_s"), ("io_s", "exposed_io_s"),
                             ("stall_s", "host_wait_s")):
            spread[part] = _spread(table[column])
        for lane in ("d2h", "h2d"):
            mine = spans[spans["lane"].isin(["compute", lane])]
            parts[lane] = summarize(mine, steps, skip)["exposed_io_s"]
            lane_table = step_breakdown(mine, steps)
            spread[f"{lane}_s"] = _spread(lane_table[lane_table["step"] >= skip]["exposed_io_s"])
    except (OSError, ValueError, KeyError):
        # no timeline files: the exposed transfer stays one number
        parts, spread, counted = {}, {}, None
    io = float(base["exposed_io_s"])
    split = parts and math.isclose(parts["d2h"] + parts["h2d"], io, rel_tol=1e-6,
                                   abs_tol=1e-9)
    if not split:
        spread = {k: v for k, v in spread.items() if k not in ("d2h_s", "h2d_s")}
    breakdown = Breakdown(float(base["compute_s"]), io, float(base["host_wait_s"]),
                          parts["d2h"] if split else None, parts["h2d"] if split else None,
                          source=f"zfbench run {path.name} (zero-offload)",
                          spread_s=spread or None, steps=counted if spread else None,
                          copy_latency_s=copy_latency(path),
                          link_Bps=measured_link(spans, skip, base, path.name))
    machine = summary.get("machine") or {}
    emulated = summary["settings"].get("device") == "cpu" or not machine.get("cuda_device")
    config = (summary.get("configs") or {}).get("zero-offload") or {}
    return breakdown, {**summary["settings"], "emulated": emulated,
                       "run_host_threads": base.get("host_threads"),
                       "run_cpu_count": machine.get("cpu_count"),
                       "gradient_clipping": config.get("gradient_clipping")}, rows.get("zenflow")


# the zero-offload row's copies whose bytes / busy seconds give each link rate
LINK_OPS = {"d2h": "d2h_grad", "h2d": "h2d_param"}


def measured_link(spans, skip: int, row: dict, run: str) -> dict[str, dict]:
    """{direction: {bytes_per_s, source}} of a zero-offload row's copies, each direction on
    its own: the bytes of its `LINK_OPS` spans in the measured steps (>= `skip`) over
    their summed durations, where the run's spans file is there; else the row's own
    `d2h_gb_per_s` / `h2d_gb_per_s` (the run's bytes over busy seconds of that lane,
    zfbench.analysis.breakdown.summarize). Empty unless both directions have one (the
    fit then finds both rates from the exposed transfer)."""
    out = {}
    for lane, op in LINK_OPS.items():
        if spans is not None:
            mine = spans[(spans["op"] == op) & (spans["step"] >= skip)]
            busy = float((mine["t_end_s"] - mine["t_start_s"]).sum())
            if busy > 0 and mine["bytes"].sum() > 0:
                out[lane] = {"bytes_per_s": float(mine["bytes"].sum()) / busy, "source": (
                    f"measured: {run} zero-offload.spans.csv, {op} bytes / busy seconds "
                    f"over {len(mine)} copies of steps >= {skip}")}
                continue
        rate = row.get(f"{lane}_gb_per_s")
        if isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0:
            out[lane] = {"bytes_per_s": float(rate) * 1e9, "source": (
                f"measured: {run} summary.json zero-offload row {lane}_gb_per_s (its "
                f"{lane} copies' bytes / busy seconds)")}
    return out if len(out) == 2 else {}


def _spread(values) -> float:
    """The step-to-step standard deviation of one part (0 with fewer than two steps)."""
    return float(values.std(ddof=1)) if len(values) > 1 else 0.0


# copies of at least this many sizes, the largest this many times the smallest, in one
# direction: fewer, and a fixed cost per copy cannot be told from a slower rate
COPY_SIZES_NEEDED, COPY_SIZE_RATIO_NEEDED = 2, 2.0


def copy_latency(path: Path) -> float | None:
    """The fixed cost per copy that a run's copies show, or None where they cannot: the
    intercept of a least-squares line through each size's median copy time against its
    bytes, one slope per direction (d2h, h2d) and one intercept for both, over every
    strategy's timeline in `path`. It needs, in at least one direction, copies of
    `COPY_SIZES_NEEDED` sizes spread by `COPY_SIZE_RATIO_NEEDED`; a negative intercept
    (below what the clock resolves) counts as 0."""
    import numpy as np
    import pandas as pd

    frames = []
    for file in sorted(path.glob("*.spans.csv")):
        try:
            spans = pd.read_csv(file, usecols=["lane", "bytes", "t_start_s", "t_end_s"])
        except (OSError, ValueError):
            continue
        frames.append(spans[spans["lane"].isin(["d2h", "h2d"]) & (spans["bytes"] > 0)])
    if not frames:
        return None
    copies = pd.concat(frames)
    copies = copies.assign(t=copies["t_end_s"] - copies["t_start_s"])
    medians = copies.groupby(["lane", "bytes"])["t"].median().reset_index()
    shows = any(len(g) >= COPY_SIZES_NEEDED and
                g["bytes"].max() >= COPY_SIZE_RATIO_NEEDED * g["bytes"].min()
                for _, g in medians.groupby("lane"))
    if not shows:
        return None
    design = np.column_stack([np.ones(len(medians))] + [
        np.where(medians["lane"] == lane, medians["bytes"], 0.0) for lane in ("d2h", "h2d")])
    coef, *_ = np.linalg.lstsq(design, medians["t"].to_numpy(float), rcond=None)
    return max(float(coef[0]), 0.0)


def paper_bars() -> dict:
    """The paper's ZeRO-Offload bars with their source (zfbench/data)."""
    text = resources.files("zfbench").joinpath("data/paper_zero_offload_bars.json")
    return json.loads(text.read_text("utf-8"))
