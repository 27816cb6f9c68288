"""What `python -m zfbench.run` measures before it runs: precision and the default shape.

Numbers measured on one CPU do not carry to another (bf16 backward ran 8x slower than
fp32 on an AVX2-only AMD EPYC and faster on an Intel Xeon with AMX), so the run decides
on the machine at hand:
- `decide_precision`: the device lane's precision when neither --precision nor a
  --config says (zfbench.real.precision_probe);
- `size_default`: with no shape flags at all, the default scenario's shape and precision,
  chosen so host AdamW alone outlasts forward+backward (zfbench.real.scenario_probe), with the
  measured ratio printed in the header (`describe_scenario`) beside the ratio the
  simulator gives for llama2-7b's ZeRO-Offload step on 4 x A100-80GB
  (zfbench.run.proxy.node_regime), both kept in summary.json.

Part of the command `python -m zfbench.run` (its concept: deciding what to measure,
before anything runs): like the command, it imports real/, sims/ or analysis/
(docs/design.md's arrows).
"""
from __future__ import annotations

import sys

from zfbench.run.defaults import DEFAULT_PRECISION, DEFAULT_SEQ

# the flags that fix the shape (argparse dests; None when not given)
SHAPE_FLAGS = ("model", "layers", "seq", "batch", "config", "grad_accum")


def shape_given(args) -> bool:
    """Whether any flag that fixes the shape was given (as argparse parsed it)."""
    return any(getattr(args, name) is not None for name in SHAPE_FLAGS)


def is_default_scenario(args, use_cuda: bool, world: int) -> bool:
    """No flag that fixes the shape, one rank, the emulated accelerator (--precision may
    be given: the shape is then sized in that precision)."""
    return not use_cuda and world == 1 and not shape_given(args)


# The regime this sizing aims at, as measured on an Intel Xeon with AMX (2 cores, 1 + 1
# threads, bf16, tinyllama-1.1b[1L] batch 1 x seq 4, bench/engine_overlap.py, 2026-11-23):
# forward+backward 0.13-0.14 s, host AdamW alone (its uploads left out) 0.19 s
# (1.36-1.37x); ZeRO-Offload stalled 64% of each step and ZenFlow 23-24% (stall seconds
# cut 75-76%); ZenFlow's step was 0.66-0.68x ZeRO-Offload's (docs/results.md).
def size_default(spec, quiet: bool = False) -> dict:
    """The default shape at seq DEFAULT_SEQ, else seq 1, whichever first puts host AdamW
    at least 1.3x forward+backward on this machine (the highest ratio if none does)."""
    from zfbench.real.engine import default_thread_split
    from zfbench.real.scenario_probe import size_scenario

    dev, host = default_thread_split()
    shape = spec.shape()
    candidates = [(shape, spec.micro_batch, DEFAULT_SEQ), (shape, spec.micro_batch, 1)]
    result = size_scenario(candidates, spec.device_threads or dev,
                           spec.host_threads or host, precision=spec.precision)
    from zfbench.run.proxy import node_regime

    result["node_ratio"] = node_regime()  # what a real offloading node shows, simulated
    if not quiet:  # the run's header prints describe_scenario(result)
        if not result["in_regime"]:
            print(f"warning: no candidate shape puts host AdamW at {result['target_ratio']}x"
                  f" forward+backward on this machine (best {result['ratio']:.2f}x): "
                  f"ZenFlow's regime is not reached here; the run goes on with it",
                  file=sys.stderr)
    return result


def describe_scenario(r: dict) -> str:
    return (f"scenario sized on this machine: {r['shape']} batch {r['batch']} x seq "
            f"{r['seq']}, {r['precision']}: host AdamW alone {r['host_adam_s'] * 1e3:.0f} ms"
            f" / forward+backward {r['forward_backward_s'] * 1e3:.0f} ms = "
            f"{r['ratio']:.2f}x (wanted >= {r['target_ratio']}; measured"
            f"{', cached' if r.get('cached') else ''})" + (
                f"; on 4 x A100-80GB, llama2-7b's ZeRO-Offload step has host AdamW at "
                f"{r['node_ratio']:.2f}x forward+backward (simulated)"
                if r.get("node_ratio") is not None else ""))


def decide_precision(spec, shape, use_cuda: bool, world: int, launched: bool,
                     quiet: bool = False) -> dict:
    """The default precision: bf16 on CUDA; on the emulated accelerator bf16 only where
    this CPU runs forward+backward in it about as fast as in fp32 (`zfbench.real.precision_probe`).
    Ranks started by torchrun directly cannot share one probe: they decide by whether the
    CPU has native bf16, the same answer on every rank."""
    if use_cuda:
        return {"precision": DEFAULT_PRECISION, "rule": "bf16 on CUDA"}
    from zfbench.real.precision_probe import choose_precision
    from zfbench.core.provenance import machine

    if launched:
        native = bool(machine()["cpu_native_bf16"])
        return {"precision": "bf16" if native else "fp32",
                "rule": "under torchrun: bf16 where the CPU has native bf16"}
    from zfbench.real.engine import default_thread_split
    from zfbench.real.distributed import rank_threads

    threads = spec.device_threads or (rank_threads(world)[0] if world > 1
                                      else default_thread_split()[0])
    probe = choose_precision(shape, spec.micro_batch, spec.seq, threads)
    if not quiet:
        print(f"precision {probe['precision']}: forward+backward measured "
              f"{probe['fp32_forward_backward_s'] * 1e3:.0f} ms in fp32, "
              f"{probe['bf16_forward_backward_s'] * 1e3:.0f} ms in bf16 ({probe['rule']}"
              f"{'; cached' if probe['cached'] else ''}; --precision forces one)",
              file=sys.stderr)
    return probe
