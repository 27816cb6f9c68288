"""A plain-PyTorch training step beside the engine's `device` strategy, same model, batch,
precision and accelerator, with a profile of each.

Covers: issue 45 item 3 (the device step near plain PyTorch's) and the device-step rows of
issue 44. Scenario: one decoder model (default qwen2.5-1.5b, full depth), synthetic
tokens, seq 1024, micro-batch 1 and 4, bf16 weights (fp32 on a CPU). Four ways to train it,
each on a freshly built model, one after another:

    forward_backward   the model's forward and backward, no optimizer (the floor)
    plain_adamw        forward, backward, the gradients copied into fp32 masters,
                       torch.optim.AdamW (fused, on CUDA and on a CPU), the masters
                       copied back into the 16-bit weights: the math of the engine's
                       `device` strategy written as a PyTorch user would
    engine_device      zfbench.real.initialize with the `device` strategy
    engine_device_plain_grads  the same with zfbench.inplace_grads off (autograd's own
                       weight gradients, copied into the flat buffer)

and, named with --modes only, `forward` (the forward alone: its kernels apart from the
backward's). Model slices (`qwen2.5-1.5b[1L]`, `[2L]`) give the kernels of one layer as
the difference of two runs.

Each step is timed between device synchronisations (median over --steps after --warmup;
also the process's CPU seconds over it, the steadier measure on a shared CPU), then one
step of each is profiled with torch.profiler: the kernels launched, their busy time, and
the 25 costliest ops (ops_<mode>_mb<k>.csv); with --traces a Chrome trace of that step
for plain_adamw and engine_device at the smallest micro-batch (trace_<mode>_mb<k>.json.gz,
kept small: one step each). On a CPU every mode runs on the same torch threads
(--threads; by default the engine's device lane's share of the cores, which the engine's
step runs on: plain PyTorch on all cores would compare two devices).

    python bench/reference_step.py [--model qwen2.5-1.5b] [--micro-batches 1,4]
        [--seq 1024] [--steps 10] [--warmup 3] [--threads lane] [--traces] [--out DIR]

Writes DIR/reference_step.csv (a row per mode and micro-batch: step seconds, CPU seconds,
kernels per step, kernel busy seconds per step, the ratios to plain_adamw) and
reference_step.json (the rows and the machine).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.config_build import build_config  # noqa: E402
from zfbench.core.models import get_model  # noqa: E402
from zfbench.core.provenance import provenance  # noqa: E402
from zfbench.core.trace import write_csv_atomic, write_json_atomic  # noqa: E402
from zfbench.real.distributed import lane_threads  # noqa: E402
from zfbench.real.engine import initialize  # noqa: E402
from zfbench.real.model import INIT_STD, build_model  # noqa: E402

MODES = ("forward_backward", "plain_adamw", "engine_device", "engine_device_plain_grads")
COUNT_MODES = ("forward",)  # not run by default: the forward alone, for its kernel count
LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.999), 1e-8, 0.01  # zfbench.run's defaults


class PlainAdamW:
    """The `device` strategy's math in plain PyTorch: fp32 masters of the 16-bit weights,
    torch's AdamW on them, the result rounded back into the weights."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.low = self.params[0].dtype != torch.float32
        self.masters = ([p.detach().float() for p in self.params] if self.low
                        else self.params)
        # torch's fused AdamW (CUDA, and CPU since torch 2.4), as the engine's device
        # strategy runs it: the foreach one makes a pass per op on a CPU (its aten::sqrt
        # alone took 0.48 s a step of tinyllama-1.1b[1L] on Xeon-AMX, 2026-11-28)
        self.opt = torch.optim.AdamW(self.masters, lr=LR, betas=BETAS, eps=EPS,
                                     weight_decay=WEIGHT_DECAY, fused=True)

    @torch.no_grad()
    def step(self) -> None:
        if self.low:
            for m, p in zip(self.masters, self.params):
                m.grad = p.grad.float()
        self.opt.step()
        if self.low:
            torch._foreach_copy_(self.params, self.masters)
        for p in self.params:
            p.grad = None


def build_model_fast(model_name: str, dtype: torch.dtype, device: torch.device,
                     seed: int) -> torch.nn.Module:
    """The model, initialised on its device where that is a GPU (zfbench's seeded CPU
    draw takes seconds per billion parameters; the values do not change a step's time):
    matrices N(0, INIT_STD), biases 0, norm weights 1, as real/model.py draws them."""
    if device.type != "cuda":
        return build_model(get_model(model_name), dtype=dtype, device=device, seed=seed)
    model = build_model(get_model(model_name), dtype=dtype, device="meta")
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, INIT_STD, generator=gen)
            else:
                p.fill_(0.0 if name.endswith(".bias") else 1.0)
    return model


class Trainer:
    """One mode's training step on a fresh model: `step(ids, labels)` returns the loss."""

    def __init__(self, mode: str, model_name: str, batch: int, device: torch.device,
                 dtype: torch.dtype, seed: int = 0, threads: int | None = None) -> None:
        if mode not in MODES + COUNT_MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of: "
                             f"{', '.join(MODES + COUNT_MODES)}")
        self.mode, self.device = mode, device
        model = build_model_fast(model_name, dtype, device, seed)
        self.model, self.engine, self.optim = model, None, None
        if mode.startswith("engine"):
            cfg = build_config("device", micro_batch=batch, lr=LR, weight_decay=WEIGHT_DECAY)
            if dtype == torch.bfloat16:
                cfg["bf16"] = {"enabled": True}
            if mode == "engine_device_plain_grads":
                cfg["zfbench"]["inplace_grads"] = False
            # the emulated device lane's threads on the CPU lanes (None: the engine's split)
            self.engine = initialize(model, cfg, device=device.type, device_threads=threads)
        elif mode == "plain_adamw":
            self.optim = PlainAdamW(model, device)

    def step(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One training step, its phases named for the profiler (`phase:*` rows: their
        self time is what no torch op inside them accounts for, e.g. the engine's C++
        kernels and its Python)."""
        from torch.profiler import record_function

        if self.engine is not None:
            with record_function("phase:forward"):
                loss = self.engine(ids, labels)
            with record_function("phase:backward"):
                self.engine.backward(loss)
            with record_function("phase:optimizer"):
                self.engine.step()
            return loss
        with record_function("phase:forward"):
            loss = self.model(ids, labels)
        if self.mode == "forward":
            return loss.detach()
        with record_function("phase:backward"):
            loss.backward()
        with record_function("phase:optimizer"):
            if self.optim is not None:
                self.optim.step()
            else:
                for p in self.model.parameters():
                    p.grad = None
        return loss

    def parameters(self) -> list[torch.Tensor]:
        return [p.detach() for p in self.model.parameters()]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def synthetic_tokens(vocab: int, batch: int, seq: int, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(trainer: Trainer, ids, labels, warmup: int,
                steps: int) -> tuple[list[float], list[float]]:
    """Each step's wall seconds and the process's CPU seconds (user + system, all its
    threads) over it: on a shared CPU the CPU seconds of a one-thread step are the
    steadier measure, since a step waiting for a core is not charged for the wait."""
    for _ in range(warmup):
        trainer.step(ids, labels)
    sync(trainer.device)
    times, cpu = [], []
    for _ in range(steps):
        c0, t0 = time.process_time(), time.perf_counter()
        trainer.step(ids, labels)
        sync(trainer.device)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return times, cpu


def device_time_us(event) -> float:
    """An op's own time on the device (torch renamed cuda_* to device_* in 2.4)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def profiled_step(trainer: Trainer, ids, labels, trace: Path | None) -> tuple[dict, pd.DataFrame]:
    """One step under torch.profiler: kernels launched, their busy seconds, top ops."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if trainer.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        trainer.step(ids, labels)
        sync(trainer.device)
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    busy_s = sum(e.device_time_total for e in kernels) / 1e6
    table = pd.DataFrame([{"op": e.key[:OP_NAME_CHARS], "calls": e.count,
                           "cpu_self_s": e.self_cpu_time_total / 1e6,
                           "device_self_s": device_time_us(e) / 1e6}
                          for e in prof.key_averages()])
    table = table.sort_values(["device_self_s", "cpu_self_s"], ascending=False).head(25)
    if trace is not None:
        raw = trace.with_suffix("")  # name.json
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(trace, "wb") as dst:
            dst.write(src.read())
        raw.unlink()
    return {"kernels_per_step": len(kernels), "kernel_busy_s_per_step": busy_s,
            "cpu_ops_per_step": sum(int(e.count) for e in prof.key_averages())}, table


TRACED_MODES = ("plain_adamw", "engine_device")
OP_NAME_CHARS = 120  # kernel names run to 1,000 characters of template arguments


def cpu_threads(flag: str, device: torch.device) -> int | None:
    """The torch threads every mode runs on a CPU (`--threads`): `lane` is the engine's
    device lane's share of the cores (real/distributed.py `lane_threads`: half of them for
    the `device` strategy), so plain PyTorch gets the cores the engine's step gets; on CUDA
    None (the engine sets no thread count there)."""
    if device.type == "cuda":
        return None
    if flag == "lane":
        return lane_threads(None, cuda=False)[0]
    if not flag.isdigit() or int(flag) < 1:
        raise ValueError(f"--threads must be 'lane' or a positive integer, not {flag!r}")
    return int(flag)


def measure(mode: str, model: str, batch: int, seq: int, device, dtype, steps: int,
            warmup: int, trace: Path | None = None,
            threads: int | None = None) -> tuple[dict, pd.DataFrame]:
    """One mode at one micro-batch on a fresh model, on `threads` torch threads when
    given (restored after: the engine sets the process-wide count, which used to leak
    into the modes run after it): its timed steps, then one profiled step (a Chrome
    trace of it at `trace`)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _measure(mode, model, batch, seq, device, dtype, steps, warmup, trace, threads)
    finally:
        torch.set_num_threads(before)


def _measure(mode, model, batch, seq, device, dtype, steps, warmup, trace, threads):
    trainer = Trainer(mode, model, batch, device, dtype, threads=threads)
    ids, labels = synthetic_tokens(get_model(model).vocab, batch, seq, device)
    times, cpu = timed_steps(trainer, ids, labels, warmup, steps)
    prof, table = profiled_step(trainer, ids, labels, trace)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    trainer.close()
    del trainer
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    row = {"mode": mode, "model": model, "micro_batch": batch, "seq": seq,
           "dtype": str(dtype).replace("torch.", ""), "steps": len(times),
           "step_s_median": statistics.median(times), "step_s_min": min(times),
           "step_s_max": max(times), "step_cpu_s_median": statistics.median(cpu),
           "peak_device_bytes": peak,
           "cpu_threads": torch.get_num_threads() if device.type != "cuda" else None, **prof}
    return row, table


def device_and_dtype(device_flag: str, dtype_flag: str = "auto") -> tuple:
    """(device, weights' dtype) of `--device` and `--dtype`: auto is CUDA where there is
    one; bf16 on CUDA, fp32 on a CPU."""
    device = torch.device("cuda" if device_flag == "auto" and torch.cuda.is_available()
                          else ("cpu" if device_flag == "auto" else device_flag))
    bf16 = dtype_flag == "bf16" or (dtype_flag == "auto" and device.type == "cuda")
    return device, torch.bfloat16 if bf16 else torch.float32


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--micro-batches", default="1,4")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--traces", action="store_true", help="a Chrome trace of each profiled step")
    ap.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto",
                    help="the weights' dtype (auto: bf16 on CUDA, fp32 on a CPU)")
    ap.add_argument("--threads", default="lane",
                    help="torch threads of every mode on a CPU: 'lane' (the engine's device "
                         "lane's, half the cores) or a number; ignored on CUDA")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "reference_step")
    args = ap.parse_args(argv)
    device, dtype = device_and_dtype(args.device, args.dtype)
    try:
        threads = cpu_threads(args.threads, device)
    except ValueError as err:
        ap.error(str(err))
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.micro_batches.split(",")]
    rows = []
    for batch in batches:
        for mode in [m for m in args.modes.split(",") if m]:
            traced = args.traces and mode in TRACED_MODES and batch == min(batches)
            trace = args.out / f"trace_{mode}_mb{batch}.json.gz" if traced else None
            row, table = measure(mode, args.model, batch, args.seq, device, dtype,
                                 args.steps, args.warmup, trace, threads)
            write_csv_atomic(table, args.out / f"ops_{mode}_mb{batch}.csv")
            rows.append(row)
            print(f"reference_step: {mode} mb{batch}: {row['step_s_median']:.4f} s/step, "
                  f"{row['kernels_per_step']} kernels, busy {row['kernel_busy_s_per_step']:.4f} s",
                  flush=True)
    frame = pd.DataFrame(rows)
    plain = frame[frame["mode"] == "plain_adamw"].set_index("micro_batch")["step_s_median"]
    plain_cpu = frame[frame["mode"] == "plain_adamw"].set_index("micro_batch")[
        "step_cpu_s_median"]
    frame["over_plain_adamw"] = [r.step_s_median / plain[r.micro_batch]
                                 if r.micro_batch in plain.index else float("nan")
                                 for r in frame.itertuples()]
    frame["cpu_over_plain_adamw"] = [r.step_cpu_s_median / plain_cpu[r.micro_batch]
                                     if r.micro_batch in plain_cpu.index else float("nan")
                                     for r in frame.itertuples()]
    write_csv_atomic(frame, args.out / "reference_step.csv")
    write_json_atomic(args.out / "reference_step.json",
                      {"rows": frame.to_dict("records"),
                       "provenance": provenance(argv, "bench/reference_step.py")})
    print(frame[["mode", "micro_batch", "step_s_median", "step_cpu_s_median",
                 "over_plain_adamw", "cpu_over_plain_adamw", "kernels_per_step",
                 "kernel_busy_s_per_step"]].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
