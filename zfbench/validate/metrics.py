"""The published metrics a simulation is held against, each read off its timeline.

This module owns the metrics of `python -m zfbench.validate --published`: what each
means, how its value is read from a simulated run, the step a published value stands for,
and where a simulated step's time goes. Each is read from steady-state steps of rank 0
(from the row's first measured step on: zfbench.validate.published `skip_of`):

- `step_time_s`: the step's wall time (a step is all of its `grad_accum` micro-steps);
- `tflops_per_gpu`: counted FLOPs per GPU per step over the step time, in 10^12/s; the
  count is the same for every row: forward FLOPs (`ModelShape.forward_flops_per_token`:
  every matmul at 2 FLOPs a multiply-add, attention over the full seq x seq scores, the
  vocabulary projection) x 3 for forward + backward, x 4 with activation checkpointing
  (as the ZeRO papers count it), x the tokens of a step (micro_batch x seq x grad_accum);
- `pflops_total`: the same FLOPs of every GPU together, in 10^15/s (ZeRO-Infinity's
  aggregate "petaflops"); `samples_per_s`, `tokens_per_s`: sequences (micro_batch x
  grad_accum per GPU) and tokens of all GPUs per step over the step time;
- `backward_time_s`: from the start of the step's last backward to the end of the last
  span of its gradients (compute, `allreduce` / `reduce_scatter`, `d2h_grad`): until
  DeepSpeed's `engine.backward()` would return with the gradients on the host;
- `host_adam_time_s`: the step's first to last `host_optim` span;
- `host_step_time_s`: the host's whole optimizer step, its first to last `host_clip`,
  `host_optim` or `host_convert` span (zfbench/sims/host_step.py).
"""

from __future__ import annotations

from zfbench.analysis.breakdown import summarize
from zfbench.sims.costs import CostModel, SimSettings

# Rates of a whole step (each a function of the step time; module docstring).
THROUGHPUT_METRICS = ("tflops_per_gpu", "pflops_total", "samples_per_s", "tokens_per_s")
METRICS = ("step_time_s", *THROUGHPUT_METRICS, "backward_time_s", "host_adam_time_s",
           "host_step_time_s")
HOST_STEP_OPS = ("host_clip", "host_optim", "host_convert")
GRAD_OPS = ("backward", "allreduce", "reduce_scatter", "d2h_grad")
# The simulated step's parts (zfbench.analysis.breakdown), output column -> summary key.
STEP_PARTS = {"sim_step_time_s": "step_time_s", "sim_compute_s": "compute_s",
              "sim_exposed_io_s": "exposed_io_s", "sim_host_wait_s": "host_wait_s"}


class Unsupported(ValueError):
    """A row the simulator cannot express; the message is the reason."""


def counted_flops(settings: SimSettings, costs: CostModel) -> float:
    """FLOPs per GPU per step by the counting rule (module docstring)."""
    s = settings
    factor = 4.0 if s.runtime.activation_checkpointing else 3.0
    return (factor * costs.shape.forward_flops_per_token(s.scenario.seq)
            * s.scenario.micro_batch * s.scenario.seq * s.scenario.grad_accum)


def work_per_step(settings: SimSettings, costs: CostModel, metric: str) -> float:
    """What one step does in the units of a throughput metric (THROUGHPUT_METRICS), so
    that the metric is this over the step time."""
    s = settings
    if metric == "tflops_per_gpu":
        return counted_flops(s, costs) / 1e12
    if metric == "pflops_total":
        return counted_flops(s, costs) * s.machine.ranks / 1e15
    samples = s.machine.ranks * s.scenario.micro_batch * s.scenario.grad_accum
    return samples * (s.scenario.seq if metric == "tokens_per_s" else 1)


def implied_step_s(settings: SimSettings, costs: CostModel, metric: str,
                   value: float) -> float:
    """The step time a published `step_time_s` or throughput `value` stands for."""
    if metric == "step_time_s":
        return value
    return work_per_step(settings, costs, metric) / value


def steady_frames(result, skip: int):
    """Rank 0's spans and steps from step `skip` on."""
    spans = result.timeline.spans_frame()
    steps = result.timeline.steps_frame()
    return spans[(spans["rank"] == 0) & (spans["step"] >= skip)], \
        steps[(steps["rank"] == 0) & (steps["step"] >= skip)]


def measure(result, metric: str, skip: int) -> float:
    """`metric` (METRICS) of a simulated run, averaged over its steps from `skip` on."""
    spans, steps = steady_frames(result, skip)
    step_s = float(steps["wall_s"].mean())
    if metric == "step_time_s":
        return step_s
    if metric in THROUGHPUT_METRICS:
        return work_per_step(result.settings, result.costs, metric) / step_s
    values = []
    for _, group in spans.groupby("step"):
        if metric in ("host_adam_time_s", "host_step_time_s"):
            ops = ("host_optim",) if metric == "host_adam_time_s" else HOST_STEP_OPS
            host = group[group["op"].isin(ops)]
            if host.empty:
                raise Unsupported(f"{result.strategy} runs no host Adam")
            values.append(host["t_end_s"].max() - host["t_start_s"].min())
        else:  # backward_time_s
            last_fwd = group[group["op"] == "forward"]["t_end_s"].max()
            grads = group[group["op"].isin(GRAD_OPS) & (group["t_start_s"] >= last_fwd)]
            start = grads[grads["op"] == "backward"]["t_start_s"].min()
            values.append(grads["t_end_s"].max() - start)
    return float(sum(values) / len(values))


def fwd_bwd_and_step_s(result, skip: int) -> tuple[float, float]:
    """Per steady step: the forward+backward compute seconds and the wall time."""
    spans, steps = steady_frames(result, skip)
    fb = spans[spans["op"].isin(("forward", "backward"))]
    per_step = fb.groupby("step")["duration_s"].sum()
    return float(per_step.mean()), float(steps["wall_s"].mean())


def step_parts(result, skip: int) -> dict:
    """The simulated step's mean wall time, compute, exposed I/O and host wait (rank 0's,
    steps from `skip` on): where a row's simulated time goes."""
    spans, steps = steady_frames(result, skip)
    summary = summarize(spans, steps)
    return {column: summary[key] for column, key in STEP_PARTS.items()}
