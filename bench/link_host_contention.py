"""Host AdamW and the host-to-device link at once: do they slow each other?

On one H100 (bench/results/gpu/NVIDIA-H100-80GB-HBM3, validate/ops.csv) the engine's
parameter uploads ran at about half the rate the profile's probe measured alone, and its
host AdamW chunks 1.2x slower, while the two ran side by side; the profile measures each
alone, and with a measured profile the simulator lets them share nothing. This script
times, side by side in one process on the buffers the engine uses (page-locked by
cudaHostRegister where the engine pins):

- h2d of the whole bf16 wire in one copy, and in 8 MiB copies (the engine's chunks),
  alone and while a thread runs host AdamW over the fp32 state in a loop;
- host AdamW over the state (torch's fused CPU AdamW, what the engine runs), alone and
  while the link copies in a loop; on pageable and on page-locked state;
- the engine's host chunk: AdamW on a chunk, its parameters into the bf16 wire, the
  gradient chunk zeroed (ZenFlow's window update), chunk by chunk: in one pass as the
  engine runs it (`kernels.host_adamw_`, real/host_fused.py; `host_kernels` names its
  path) and pass by pass with torch's ops as before issue 45 (`..._passes_...`);
- d2h of the device buffer into a page-locked wire, alone and beside host AdamW, and host
  AdamW beside the d2h copy loop (ZenFlow accumulates on the host while the next step's
  gradients come down);
- the engine's pipeline: each chunk's AdamW with its conversion, then its upload issued on
  the h2d stream between two CUDA events, as the host worker does it: the chunks' rate
  and the uploads' own rate by their events (inside validate's runs the uploads took
  2.2x the probe's time).

    python bench/link_host_contention.py [--elems 176M] [--threads 8] [--out DIR]

On the engine's own pieces (its pinned buffers, `zfbench.real.backend.register_pinned`;
its host AdamW kernel; the rate probe's thread and timing helpers): run it from this
checkout (`make gpu-check` does). Writes DIR/link_host_contention.json (the medians and
the machine). Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.real import host_fused, kernels  # noqa: E402
from zfbench.real.host_adam import host_adamw_ as torch_host_adamw_  # noqa: E402
from zfbench.real.backend import register_pinned  # noqa: E402
from zfbench.real.rate_probe import in_thread, median_time  # noqa: E402

CHUNK_BYTES = 8 << 20  # the engine's upload chunk at bf16: 4M elements


HP = dict(step=1, lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


def adamw(p, g, m, v, wire=None, zero: bool = False) -> None:
    """The engine's host chunk kernel (zfbench.real.kernels), at a fixed step: AdamW, the
    new parameters into `wire` and the gradient zeroed (`zero`) in one pass."""
    kernels.host_adamw_(p, g, m, v, wire, zero_grad=zero, **HP)


def adamw_passes(p, g, m, v, wire, zero: bool) -> None:
    """The host chunk as torch's ops, pass by pass (the engine before issue 45)."""
    torch_host_adamw_(p, g, m, v, **HP)
    wire.copy_(p)
    if zero:
        g.zero_()


def median_s(fn, repeats: int) -> float:
    """One warm-up call, then the median of `repeats` (each `fn` waits for its own work)."""
    fn()
    return median_time(fn, repeats)


def while_looping(background, threads: int | None, measure):
    """`measure()` while another thread (of `threads` torch threads; None: the count is
    left alone) runs `background` in a loop; returns measure's result."""
    stop = threading.Event()

    def loop():
        if threads is not None:
            torch.set_num_threads(threads)
        while not stop.is_set():
            background()
    worker = threading.Thread(target=loop)
    worker.start()
    time.sleep(0.05)
    try:
        return measure()
    finally:
        stop.set()
        worker.join()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elems", type=float, default=176e6)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("runs/link_host_contention"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: needs CUDA", file=sys.stderr)
        return 2
    n, T, R = int(args.elems), args.threads, args.repeats
    dev = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
    wire = register_pinned(n, torch.bfloat16)
    stream = torch.cuda.Stream()
    chunk = CHUNK_BYTES // 2
    bounds = [(a, min(a + chunk, n)) for a in range(0, n, chunk)]
    state = {"pageable": [torch.randn(n), torch.randn(n) * 1e-3, torch.zeros(n),
                          torch.zeros(n)]}
    locked = [register_pinned(n, torch.float32) for _ in range(4)]
    for dst, src in zip(locked, state["pageable"]):
        dst.copy_(src)
    state["page_locked"] = locked

    def h2d_whole():
        with torch.cuda.stream(stream):
            dev.copy_(wire, non_blocking=True)
        stream.synchronize()

    def h2d_chunks():
        with torch.cuda.stream(stream):
            for a, b in bounds:
                dev[a:b].copy_(wire[a:b], non_blocking=True)
        stream.synchronize()

    down_wire = register_pinned(n, torch.bfloat16)
    down_stream = torch.cuda.Stream()

    def d2h_whole():
        with torch.cuda.stream(down_stream):
            down_wire.copy_(dev, non_blocking=True)
        down_stream.synchronize()

    res = {"elems": n, "threads": T, "repeats": R, "chunk_elems": chunk}
    nbytes = 2 * n
    p, g, m, v = state["page_locked"]

    def adam_locked():
        adamw(p, g, m, v)

    def engine_chunks(zero: bool, kernel=adamw):
        def run():
            for a, b in bounds:
                kernel(p[a:b], g[a:b], m[a:b], v[a:b], wire[a:b], zero)
        return run

    def engine_pipeline(spacing_s: float | None = None):
        """As the engine's host worker: each chunk's AdamW and conversion into the wire,
        then its upload issued on the h2d stream between two events; returns the
        uploads' busy seconds (the sum of the event intervals). With `spacing_s` the host
        spins that long instead of the AdamW (no memory traffic): the uploads spaced as
        in the pipeline, to tell a link that idles between copies from contention."""
        marks = []
        for a, b in bounds:
            if spacing_s is None:
                adamw(p[a:b], g[a:b], m[a:b], v[a:b], wire[a:b])
            else:
                until = time.perf_counter() + spacing_s
                while time.perf_counter() < until:
                    pass
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            with torch.cuda.stream(stream):
                start.record()
                dev[a:b].copy_(wire[a:b], non_blocking=True)
                end.record()
            marks.append((start, end))
        stream.synchronize()
        return sum(s.elapsed_time(e) for s, e in marks) / 1e3

    def pipeline_rates(spacing_s: float | None = None):
        engine_pipeline(spacing_s)
        runs = []
        for _ in range(R):
            t0 = time.perf_counter()
            up_s = engine_pipeline(spacing_s)
            runs.append((time.perf_counter() - t0, up_s))
        wall = statistics.median(w for w, _ in runs)
        up = statistics.median(u for _, u in runs)
        return n / wall / 1e9, nbytes / up / 1e9

    for _round in range(2):  # two rounds, side by side: the machine drifts
        r = {}
        r["h2d_whole_alone_GBps"] = nbytes / median_s(h2d_whole, R) / 1e9
        r["h2d_chunks_alone_GBps"] = nbytes / median_s(h2d_chunks, R) / 1e9
        r["h2d_whole_beside_adam_GBps"] = nbytes / while_looping(
            adam_locked, T, lambda: median_s(h2d_whole, R)) / 1e9
        r["h2d_chunks_beside_adam_GBps"] = nbytes / while_looping(
            adam_locked, T, lambda: median_s(h2d_chunks, R)) / 1e9
        for kind, bufs in state.items():
            r[f"adam_{kind}_alone_Gparams"] = n / in_thread(
                lambda bufs=bufs: median_s(lambda: adamw(*bufs), R), T) / 1e9
        r["adam_page_locked_beside_h2d_Gparams"] = n / in_thread(
            lambda: while_looping(h2d_whole, None, lambda: median_s(adam_locked, R)),
            T) / 1e9
        r["engine_chunks_adam_convert_Gparams"] = n / in_thread(
            lambda: median_s(engine_chunks(False), R), T) / 1e9
        r["engine_chunks_adam_convert_zero_Gparams"] = n / in_thread(
            lambda: median_s(engine_chunks(True), R), T) / 1e9
        r["engine_chunks_adam_convert_passes_Gparams"] = n / in_thread(
            lambda: median_s(engine_chunks(False, adamw_passes), R), T) / 1e9
        r["engine_chunks_adam_convert_zero_passes_Gparams"] = n / in_thread(
            lambda: median_s(engine_chunks(True, adamw_passes), R), T) / 1e9
        r["d2h_whole_alone_GBps"] = nbytes / median_s(d2h_whole, R) / 1e9
        r["d2h_whole_beside_adam_GBps"] = nbytes / while_looping(
            adam_locked, T, lambda: median_s(d2h_whole, R)) / 1e9
        r["adam_page_locked_beside_d2h_Gparams"] = n / in_thread(
            lambda: while_looping(d2h_whole, None, lambda: median_s(adam_locked, R)),
            T) / 1e9
        chunks_rate, uploads_rate = in_thread(pipeline_rates, T)
        r["engine_pipeline_Gparams"] = chunks_rate
        r["engine_pipeline_uploads_GBps"] = uploads_rate  # by the uploads' own events
        spacing = (bounds[0][1] - bounds[0][0]) / (chunks_rate * 1e9)  # one chunk's host time
        r["spaced_uploads_spacing_s"] = spacing
        r["spaced_uploads_GBps"] = pipeline_rates(spacing)[1]
        r["convert_alone_Gelems"] = n / in_thread(
            lambda: median_s(lambda: wire.copy_(p), R), T) / 1e9
        r["zero_alone_Gelems"] = n / in_thread(lambda: median_s(g.zero_, R), T) / 1e9
        res[f"round{_round}"] = r
        print(json.dumps(r, indent=1), flush=True)
    res["host_kernels"] = host_fused.status()
    res["machine"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "cpu_count": os.cpu_count(), "processor": platform.processor(),
                      "python": platform.python_version()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "link_host_contention.json").write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}/link_host_contention.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
