"""The kernels one decoder layer launches, and the host time it takes to issue them: a
one-layer and a two-layer slice of each model, forward and forward+backward, profiled.

Covers: issue 44's per-op floor. Scenario: for each model (default llama2-7b, qwen2.5-1.5b,
opt-1.3b), its `[1L]` and `[2L]` slices at full width are built fresh and trained a few
steps at each micro-batch (default 1 and 4, seq 1024) in `forward` and `forward_backward`
modes (bench/reference_step.py's trainers), each step timed between synchronisations and
one step profiled. One layer's kernels are the two-layer slice's less the one-layer
slice's; the embedding, head and loss are the one-layer slice's less one layer. Where a
step's kernels keep the GPU busy for much less than the step (launch-bound), the step's
wall over its kernels is the host's time to issue one kernel of an eager training step
(Python, dispatcher, autograd, launch).

    python bench/kernel_census.py [--models llama2-7b,qwen2.5-1.5b,opt-1.3b]
        [--micro-batches 1,4] [--seq 1024] [--steps 5] [--out DIR]

Writes DIR/kernel_census.csv: a row per model slice, mode and micro-batch (kernels per
step, kernel busy seconds, step seconds, the model's style and features), and
kernel_census.json (the rows, the per-layer differences and the machine).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference_step as rs  # noqa: E402
from zfbench.core.models import get_model  # noqa: E402
from zfbench.core.provenance import provenance  # noqa: E402
from zfbench.core.trace import write_csv_atomic, write_json_atomic  # noqa: E402

MODES = ("forward", "forward_backward")


def features(model: str) -> dict:
    """What changes a layer's kernels: the style, grouped K/V heads, q/k/v biases."""
    shape = get_model(model)
    names = {v.name.split(".", 2)[-1] for v in shape.vectors() if v.name.startswith("layers.0.")}
    return {"style": shape.style, "grouped_kv": shape.kv_heads != shape.heads,
            "qkv_bias": "q_proj.bias" in names}


def per_layer(frame: pd.DataFrame) -> pd.DataFrame:
    """One layer's kernels (two-layer less one-layer slice) and the rest of the model."""
    rows = []
    for (model, mode, batch), group in frame.groupby(["model", "mode", "micro_batch"]):
        by_layers = group.set_index("layers")
        if not {1, 2} <= set(by_layers.index):
            continue
        one, two = by_layers.loc[1], by_layers.loc[2]
        layer = int(two["kernels_per_step"] - one["kernels_per_step"])
        rows.append({"model": model, "mode": mode, "micro_batch": batch,
                     "layer_kernels": layer,
                     "rest_kernels": int(one["kernels_per_step"]) - layer,
                     "layer_step_s": float(two["step_s_median"] - one["step_s_median"]),
                     "layer_busy_s": float(two["kernel_busy_s_per_step"]
                                           - one["kernel_busy_s_per_step"])})
    out = pd.DataFrame(rows)
    if not out.empty:
        kernels = out["layer_kernels"].where(out["layer_kernels"] > 0)  # none on a CPU
        out["layer_s_per_kernel"] = out["layer_step_s"] / kernels
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--models", default="llama2-7b,qwen2.5-1.5b,opt-1.3b")
    ap.add_argument("--micro-batches", default="1,4")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--out", type=Path, default=rs.ROOT / "bench" / "results" / "kernel_census")
    args = ap.parse_args(argv)
    device, dtype = rs.device_and_dtype(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for base in [m for m in args.models.split(",") if m]:
        for layers in (1, 2):
            for batch in [int(b) for b in args.micro_batches.split(",")]:
                for mode in MODES:
                    row, _ = rs.measure(mode, f"{base}[{layers}L]", batch, args.seq, device,
                                        dtype, args.steps, args.warmup)
                    rows.append({**row, "model": base, "layers": layers, **features(base)})
        print(f"kernel_census: {base} done", flush=True)
    frame = pd.DataFrame(rows)
    layers = per_layer(frame)
    write_csv_atomic(frame, args.out / "kernel_census.csv")
    write_json_atomic(args.out / "kernel_census.json",
                      {"rows": frame.to_dict("records"), "per_layer": layers.to_dict("records"),
                       "provenance": provenance(argv, "bench/kernel_census.py")})
    print(layers.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
