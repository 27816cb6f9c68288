"""Achieved efficiency of a model's GEMMs, attention and element-wise ops at fine-tuning's
token counts, on the accelerator at hand, beside its measured peaks and its launch floor.

Covers: issue 44's census (item 5). Scenario: for each model named, every distinct weight
matrix of a decoder layer and the LM head, timed as the three GEMMs training runs on it
(forward `X W^T`, input gradient `dY W`, weight gradient `dY^T X`) at each token count
(micro-batch x sequence); causal `scaled_dot_product_attention` forward and forward +
backward at each sequence length with the model's heads; the element-wise ops of a layer
(residual add, SwiGLU's `silu(a) * b`, RMSNorm) at the token count; and three references
measured in the same run: a large square bf16 GEMM (the compute peak), a large copy (the
memory peak), and the time per op of a stream of tiny kernels (the launch floor).

    python bench/op_efficiency.py [--models qwen2.5-1.5b,llama2-7b] [--tokens 1024,4096]
        [--seqs 1024,4096] [--repeats 20] [--out bench/results/gpu/<gpu>/op_efficiency]

Each op is repeated back to back between two timestamps (CUDA events on a GPU), so a row's
seconds are what the op costs in a stream of its kind: a launch-bound op shows the floor.
FLOPs count multiply-adds as 2 (`2 m n k`); causal attention counts half the score matrix
(forward `2 b h s^2 d`, backward 2.5x forward: FlashAttention-2's convention). Writes
op_efficiency.csv (a row per op) and op_efficiency.json (the rows, the references and the
machine). On a CPU it runs too (tiny sizes with --quick), for the tests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.models import get_model  # noqa: E402
from zfbench.core.provenance import provenance  # noqa: E402
from zfbench.core.trace import write_csv_atomic, write_json_atomic  # noqa: E402

BACKWARD_OVER_FORWARD_ATTENTION = 2.5  # FlashAttention-2 (Dao 2023), section 4.1


class Clock:
    """Seconds per call of `fn`, repeated `repeats` times back to back, median of rounds."""

    def __init__(self, device: torch.device, repeats: int, rounds: int = 3) -> None:
        self.device, self.repeats, self.rounds = device, repeats, rounds

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def per_call_s(self, fn) -> float:
        fn()  # warm-up: allocator, kernel selection
        fn()
        self.sync()
        rounds = []
        for _ in range(self.rounds):
            if self.device.type == "cuda":
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(self.repeats):
                    fn()
                end.record()
                end.synchronize()
                rounds.append(start.elapsed_time(end) / 1e3 / self.repeats)
            else:
                t0 = time.perf_counter()
                for _ in range(self.repeats):
                    fn()
                rounds.append((time.perf_counter() - t0) / self.repeats)
        return statistics.median(rounds)


def gemm_flops(m: int, n: int, k: int) -> float:
    """Multiply-adds as 2: an (m x k) by (k x n) product."""
    return 2.0 * m * n * k


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True) -> float:
    """Forward FLOPs of softmax(Q K^T) V: two (s x d) by (d x s) products per head, half of
    the score matrix when causal."""
    full = 4.0 * batch * heads * seq * seq * head_dim
    return full / 2 if causal else full


def layer_matrices(model: str) -> list[tuple[str, int, int]]:
    """(kind, out_features, in_features) of every distinct matrix of layer 0 and the LM head
    (the token embedding where the head is tied to it)."""
    shape = get_model(model)
    mats = [m for m in shape.matrices() if m.name.startswith(("layers.0.", "head."))]
    if not any(m.kind == "lm_head" for m in mats):
        mats += [m for m in shape.matrices() if m.kind == "embedding"]
    seen, rows = set(), []
    for m in mats:
        kind = "lm_head" if m.kind in ("lm_head", "embedding") else m.name.split(".")[-1]
        if (kind, m.rows, m.cols) not in seen:
            seen.add((kind, m.rows, m.cols))
            rows.append((kind, m.rows, m.cols))
    return rows


def gemm_rows(clock: Clock, model: str, tokens: int, dtype, device) -> list[dict]:
    rows = []
    for kind, out_f, in_f in layer_matrices(model):
        w = torch.randn(out_f, in_f, dtype=dtype, device=device)
        x = torch.randn(tokens, in_f, dtype=dtype, device=device)
        dy = torch.randn(tokens, out_f, dtype=dtype, device=device)
        passes = {"forward": (lambda: x @ w.t(), (tokens, out_f, in_f)),
                  "input_grad": (lambda: dy @ w, (tokens, in_f, out_f)),
                  "weight_grad": (lambda: dy.t() @ x, (out_f, in_f, tokens))}
        for name, (fn, (m, n, k)) in passes.items():
            seconds = clock.per_call_s(fn)
            flops = gemm_flops(m, n, k)
            nbytes = (m * k + k * n + m * n) * w.element_size()
            rows.append({"kind": "gemm", "model": model, "op": f"{kind}.{name}",
                         "tokens": tokens, "m": m, "n": n, "k": k, "seconds": seconds,
                         "flops": flops, "bytes": nbytes, "tflops_per_s": flops / seconds / 1e12,
                         "gb_per_s": nbytes / seconds / 1e9})
        del w, x, dy
    return rows


def attention_rows(clock: Clock, model: str, seq: int, batch: int, dtype, device) -> list[dict]:
    shape = get_model(model)
    heads, head_dim = shape.heads, shape.head_dim
    q, k, v = (torch.randn(batch, heads, seq, head_dim, dtype=dtype, device=device,
                           requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    fwd = attention_flops(batch, heads, seq, head_dim)

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(y, (q, k, v), grad)

    rows = []
    for name, fn, flops in (("forward", forward, fwd),
                            ("forward_backward", forward_backward,
                             fwd * (1 + BACKWARD_OVER_FORWARD_ATTENTION))):
        if name == "forward":
            with torch.no_grad():
                seconds = clock.per_call_s(fn)
        else:
            seconds = clock.per_call_s(fn)
        rows.append({"kind": "attention", "model": model, "op": f"sdpa_causal.{name}",
                     "tokens": batch * seq, "m": batch * heads, "n": seq, "k": head_dim,
                     "seconds": seconds, "flops": flops, "bytes": 4 * q.numel() * q.element_size(),
                     "tflops_per_s": flops / seconds / 1e12,
                     "gb_per_s": 4 * q.numel() * q.element_size() / seconds / 1e9})
    return rows


def elementwise_rows(clock: Clock, model: str, tokens: int, dtype, device) -> list[dict]:
    shape = get_model(model)
    hidden, inter = shape.hidden, shape.intermediate
    x, r = (torch.randn(tokens, hidden, dtype=dtype, device=device) for _ in range(2))
    a, b = (torch.randn(tokens, inter, dtype=dtype, device=device) for _ in range(2))
    weight = torch.ones(hidden, dtype=dtype, device=device)
    size = x.element_size()

    def rms_norm():
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + 1e-6)).to(dtype) * weight

    ops = {"residual_add": (lambda: x + r, 3 * x.numel() * size),
           "swiglu_silu_mul": (lambda: F.silu(a) * b, 3 * a.numel() * size),
           "rms_norm": (rms_norm, 2 * x.numel() * size)}
    rows = []
    for name, (fn, nbytes) in ops.items():
        seconds = clock.per_call_s(fn)
        rows.append({"kind": "elementwise", "model": model, "op": name, "tokens": tokens,
                     "m": tokens, "n": hidden if name != "swiglu_silu_mul" else inter, "k": 1,
                     "seconds": seconds, "flops": 0.0, "bytes": nbytes, "tflops_per_s": 0.0,
                     "gb_per_s": nbytes / seconds / 1e9})
    return rows


def references(clock: Clock, dtype, device, square: int, copy_elems: int) -> dict:
    """The run's own peaks: a large square GEMM, a large copy, and the launch floor."""
    a = torch.randn(square, square, dtype=dtype, device=device)
    b = torch.randn(square, square, dtype=dtype, device=device)
    gemm_s = clock.per_call_s(lambda: a @ b)
    src = torch.empty(copy_elems, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    copy_s = clock.per_call_s(lambda: dst.copy_(src))
    tiny = torch.zeros(1, device=device)
    floor = Clock(device, repeats=max(clock.repeats, 200), rounds=clock.rounds)
    launch_s = floor.per_call_s(lambda: tiny.add_(1.0))
    return {"square_gemm_n": square, "square_gemm_s": gemm_s,
            "peak_gemm_tflops_per_s": gemm_flops(square, square, square) / gemm_s / 1e12,
            "copy_elems": copy_elems, "copy_s": copy_s,
            "peak_copy_gb_per_s": 2 * src.numel() * 4 / copy_s / 1e9,
            "launch_floor_s_per_op": launch_s}


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--models", default="qwen2.5-1.5b,llama2-7b")
    ap.add_argument("--tokens", type=ints, default=[512, 1024, 2048, 4096, 8192],
                    help="GEMM and element-wise token counts (micro-batch x sequence)")
    ap.add_argument("--seqs", type=ints, default=[512, 1024, 2048, 4096],
                    help="attention sequence lengths (batch 1)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes (the CPU test): model 'tiny', 64/128 tokens, 3 repeats")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "op_efficiency")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.quick:
        args.models, args.tokens, args.seqs, args.repeats = "tiny", [64, 128], [64], 3
    clock = Clock(device, args.repeats)
    square, copy_elems = (8192, 1 << 28) if device.type == "cuda" else (256, 1 << 20)
    refs = references(clock, dtype, device, square, copy_elems)
    rows = []
    for model in [m for m in args.models.split(",") if m]:
        for tokens in args.tokens:
            rows += gemm_rows(clock, model, tokens, dtype, device)
            rows += elementwise_rows(clock, model, tokens, dtype, device)
        for seq in args.seqs:
            rows += attention_rows(clock, model, seq, 1, dtype, device)
        print(f"op_efficiency: {model} done ({len(rows)} rows)", flush=True)
    frame = pd.DataFrame(rows)
    frame["dtype"] = str(dtype).replace("torch.", "")
    frame["share_of_peak_gemm"] = frame["tflops_per_s"] / refs["peak_gemm_tflops_per_s"]
    frame["share_of_peak_copy"] = frame["gb_per_s"] / refs["peak_copy_gb_per_s"]
    frame["launch_floors"] = frame["seconds"] / refs["launch_floor_s_per_op"]
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(frame, args.out / "op_efficiency.csv")
    write_json_atomic(args.out / "op_efficiency.json",
                      {"references": refs, "rows": frame.to_dict("records"),
                       "device": str(device), "dtype": str(dtype),
                       "provenance": provenance(argv, "bench/op_efficiency.py")})
    print(f"op_efficiency: peak GEMM {refs['peak_gemm_tflops_per_s']:.1f} TFLOP/s, copy "
          f"{refs['peak_copy_gb_per_s']:.1f} GB/s, launch floor "
          f"{refs['launch_floor_s_per_op'] * 1e6:.1f} us/op; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
