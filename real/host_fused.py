"""The host chunk in one pass over memory: AdamW and the upload wire together (and a
gradient's zeroing, which the engine no longer asks for), ZenFlow's accumulation with
16-bit gradients widened on the fly (a window's first writes it: no zeroing pass), and the
conversions between fp32 and the 16-bit wires.

This module owns the kernels the engine calls through `zfbench.real.kernels`
(`host_adamw_`, `accumulate_`, and `convert_` inside `copy_`; `adamw_segments_` through
real/adamw.py), the torch paths they fall back to, and the check that the C++ library
(real/host_fused.cpp, built by real/host_native.py on first use) gives those paths' bits
on the machine at hand; `backend()` says which ran ('cpp' or 'torch').

Why one pass (issue 45: 30 B per parameter instead of 34 over two passes, with the
H100 host's measurements) is in `host_adamw_`'s docstring. Results are the torch path's
bits, by construction and by test (tests/test_host_fused.py); how the C++ loop keeps
them, and the self-check on load that rejects the library with one warning line where any
bit differs, is in `_self_check`'s docstring.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from pathlib import Path

import torch
from torch import Tensor

from zfbench.real import host_native
from zfbench.real.host_accum import accumulate_ as torch_accumulate_
from zfbench.real.host_adam import _check, host_adamw_ as torch_host_adamw_
from zfbench.real.host_segments import (check_segments, cpp_adamw_segments_,
                                        torch_adamw_segments_)

__all__ = ["accumulate_", "adamw_segments_", "backend", "convert_", "copy_checked_",
           "host_adamw_", "status", "sum_of_squares", "zero_"]

#: elements torch's vector loop covers per step at most (AVX512 floats); the last
#: n % TAIL elements go to torch (its remainder loop has its own rounding)
TAIL = 16
#: below this many elements a call runs on the calling thread alone (no parallel region)
SERIAL_BELOW = 1 << 14
#: widenings of at least this many elements write with non-temporal stores (x86 with
#: AVX-512 or AVX2): a plain store reads each line before writing it, 4 of the 10 bytes a
#: widening to fp32 moves per element (real/host_fused.cpp `widen_streamed`); smaller
#: buffers are likely read again from the cache
STREAM_ABOVE = 1 << 20
#: fp32 copies and zeroing (`zf_words`) from this many elements on with non-temporal
#: stores: never by default. Measured in bench/vs_deepspeed.py (2-core Xeon-AMX, 300 MB
#: L3, sequential mode, load 3.7-4.2): with them from STREAM_ABOVE on, zfbench's forward
#: and backward ran 0.28 + 0.55 s against 0.23 + 0.47 s with plain stores, beside
#: DeepSpeed's 0.15-0.24 s forward; the copied gradients and the zeroed buffer are read
#: or written again soon, from the cache, which the streamed stores bypass
WORDS_STREAM_ABOVE = 1 << 62
#: the sum of squares adds fixed blocks of this many elements (256 KiB of fp32), each on
#: one thread, then the blocks' sums in order: the same bits at any thread count
SUMSQ_BLOCK = 1 << 16
#: ... except into a buffer larger than the last-level cache (`last_level_cache_bytes`):
#: its lines are gone from the cache before anything reads them again, and a plain store
#: reads each line first (12 B per element copied, 8 streamed). Measured (issue 45, 2-core
#: Xeon-AMX, 300 MB L3, load 4.5): 4M-element chunks of a 700 MB fp32 copy on one thread,
#: 133 ms of CPU plain, 90 ms streamed (the no-flag run's upload of tinyllama-1.1b[1L]);
#: in that run's ZeRO-Offload (bench/host_lane.py beside main, load 3.7-4.7) the uploads
#: took 0.122 / 0.082 s a step against 0.175 / 0.129, the step 0.95 / 0.63 s against
#: 1.07 / 0.81 (bench/results/host_lane/, 2026-11-28_1025)
_llc: list[int | None] = []
_WIRE_KIND = {torch.bfloat16: 1, torch.float16: 2}
_GRAD_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

_lock = threading.Lock()
_checked: dict = {}


def _torch_adamw(p, g, m, v, wire, step, lr, beta1, beta2, eps, wd, zero_grad) -> None:
    """The reference: host AdamW (torch's fused kernel), the wire copy, the zeroing."""
    torch_host_adamw_(p, g, m, v, step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                      weight_decay=wd)
    if wire is not None:
        wire.copy_(p)
    if zero_grad:
        g.zero_()


def _cpp_adamw(lib, p, g, m, v, wire, step, lr, beta1, beta2, eps, wd, zero_grad) -> None:
    n = p.numel()
    body = n - n % TAIL
    if body:
        lib.zf_adamw(p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(),
                     None if wire is None else wire.data_ptr(),
                     0 if wire is None else _WIRE_KIND[wire.dtype], int(zero_grad), body,
                     float(step), float(lr), float(beta1), float(beta2), float(eps),
                     float(wd), torch.get_num_threads(), SERIAL_BELOW)
    if body < n:
        _torch_adamw(p[body:], g[body:], m[body:], v[body:],
                     None if wire is None else wire[body:], step, lr, beta1, beta2, eps, wd,
                     zero_grad)


def _cpp_accumulate(lib, window: Tensor, grads: Tensor, alpha: float,
                    fresh: bool = False, stream_above: int | None = None) -> Tensor:
    """The C++ accumulation; a `fresh` one streams its stores from `stream_above`
    elements on (None: `words_stream_above(window)`)."""
    if stream_above is None:
        stream_above = fresh_stream_above(window, grads) if fresh else WORDS_STREAM_ABOVE
    if window.numel():
        lib.zf_accumulate(window.data_ptr(), grads.data_ptr(), _GRAD_KIND[grads.dtype],
                          float(alpha), int(fresh), window.numel(), torch.get_num_threads(),
                          SERIAL_BELOW, stream_above)
    return window


def _cpp_convert(lib, dst: Tensor, src: Tensor, stream_above: int | None = None) -> Tensor:
    widen = dst.dtype == torch.float32
    stream_above = STREAM_ABOVE if stream_above is None else stream_above
    if dst.numel():
        lib.zf_convert(dst.data_ptr(), src.data_ptr(),
                       _WIRE_KIND[src.dtype if widen else dst.dtype], int(widen), dst.numel(),
                       torch.get_num_threads(), SERIAL_BELOW, stream_above)
    return dst


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache's size in bytes as Linux reports it (sysfs cacheinfo of
    CPU 0, else glibc's sysconf); None where neither says."""
    if not _llc:
        sizes = []
        for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
            try:
                text = (index / "size").read_text().strip()
            except OSError:
                continue
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            digits = text.rstrip("KMG")
            if digits.isdigit():
                sizes.append(int(digits) * unit)
        if not sizes and hasattr(os, "sysconf"):
            try:
                sizes = [os.sysconf("SC_LEVEL3_CACHE_SIZE")]
            except (ValueError, OSError):
                pass
        _llc.append(max(sizes) if sizes and max(sizes) > 0 else None)
    return _llc[0]


def words_stream_above(dst: Tensor) -> int:
    """Words from which a copy or zeroing into `dst` is streamed: from the first where
    `dst`'s whole buffer (its storage: a chunk's flat buffer) is larger than the
    last-level cache, else `WORDS_STREAM_ABOVE`."""
    llc = last_level_cache_bytes()
    if llc is not None and dst.untyped_storage().nbytes() > llc:
        return 0
    return WORDS_STREAM_ABOVE


def fresh_stream_above(window: Tensor, grads: Tensor) -> int:
    """Elements from which a window's first accumulation streams its stores: from the
    first where the call's own bytes (the window written, the gradients read) pass the
    last-level cache, which its own traffic then evicts the window's lines from before
    anything reads them again; else never. Measured (issue 45, 2-core Xeon-AMX, 300 MB
    L3, load 3.4-3.8, one thread): a 54M-element window (bench/vs_deepspeed.py's model)
    22 ms of CPU streamed against 31 ms plain from fp32 gradients, 18 against 28 from bf16;
    an accumulation that adds 27-29 ms."""
    llc = last_level_cache_bytes()
    if llc is not None and window.numel() * (4 + grads.element_size()) > llc:
        return 0
    return WORDS_STREAM_ABOVE


def _cpp_words(lib, dst: Tensor | None, src: Tensor | None, check: bool = False,
               stream_above: int | None = None) -> bool:
    """dst = src over fp32 words (src None: zeros; dst None: src only checked); with
    `check`, whether a word of src is an inf or NaN. Streamed stores from `stream_above`
    words on (None: `words_stream_above(dst)`)."""
    ref = src if dst is None else dst
    if stream_above is None:
        stream_above = WORDS_STREAM_ABOVE if dst is None else words_stream_above(dst)
    if not ref.numel():
        return False
    return bool(lib.zf_words(None if dst is None else dst.data_ptr(),
                             None if src is None else src.data_ptr(), int(check), ref.numel(),
                             torch.get_num_threads(), SERIAL_BELOW, stream_above))


def _torch_sum_of_squares(grad: Tensor) -> float:
    """The reference: the sum of squares in fp64, block by block (`SUMSQ_BLOCK`), each
    block's fp32 values widened (their squares exact in fp64): within about 1e-7 of the
    C++ loop, whose squares are fp32 (real/host_fused.cpp `sumsq_span`)."""
    flat = grad.reshape(-1)
    total = 0.0
    for lo in range(0, flat.numel(), SUMSQ_BLOCK):
        block = flat[lo:lo + SUMSQ_BLOCK].double()
        total += float(torch.dot(block, block))
    return total


def _cpp_sum_of_squares(lib, grad: Tensor) -> float:
    return float(lib.zf_sumsq(grad.data_ptr(), grad.numel(), SUMSQ_BLOCK,
                              torch.get_num_threads(), SERIAL_BELOW))


def _words_fit(*tensors: Tensor) -> bool:
    """fp32, contiguous, on the CPU, all of one shape: what `zf_words` takes."""
    first = tensors[0]
    return all(t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu"
               and t.shape == first.shape for t in tensors)


def _self_check(lib) -> str | None:
    """None when the library gives the torch paths' bits here, else what differed.

    Results are the torch path's bits, by construction and by test (tests/test_host_fused.py):
    the C++ loop does torch._fused_adamw_'s float operations in its order (with the one fma
    its x86 build contracts) over the chunk but for its last `n % 16` elements, which it
    hands to torch itself (torch's remainder loop contracts `v`'s update otherwise: on a
    15-element tensor its last 2 elements rounded another way), then rounds to the wire as
    `Tensor.copy_` (nearest even; NaN to bf16 0xFFFF as torch) and zeroes. A NaN may come
    out as another NaN (its sign and payload follow each instruction's operand order; torch's
    own loops differ there too). On load, a self-check runs both paths on a buffer past the
    threading threshold, for every wire dtype, with and without zeroing, with and without
    weight decay, and for both lerp branches, the segments loop over a list of views
    (real/host_segments.py `check_segments`: gradient divisors too), and both conversions
    on special values; any
    difference in a number's bits (a torch built otherwise, another CPU) rejects the library
    with one warning line, and torch's ops run.
    """
    n = SERIAL_BELOW + 2 * TAIL + 5  # threaded, with a remainder for torch
    gen = torch.Generator().manual_seed(45)
    base = [torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 1e-2,
            torch.randn(n, generator=gen) * 1e-3, torch.rand(n, generator=gen) * 1e-5]
    base[1][::97] = 0.0
    base[0][::89] *= 1e4
    want, got = [torch.empty(n) for _ in base], [torch.empty(n) for _ in base]
    wires = {d: (torch.empty(n, dtype=d), torch.empty(n, dtype=d)) for d in _WIRE_KIND}
    # every wire, zeroing on and off, both lerp branches, weight decay on and off
    cases = [((3, 1e-3, 0.9, 0.999, 1e-8, 0.01), None, False),
             ((3, 1e-3, 0.9, 0.999, 1e-8, 0.01), torch.bfloat16, True),
             ((3, 1e-3, 0.9, 0.999, 1e-8, 0.01), torch.float16, False),
             ((1, 1e-2, 0.3, 0.95, 1e-6, 0.0), None, True),
             ((1, 1e-2, 0.3, 0.95, 1e-6, 0.0), torch.bfloat16, False),
             ((1, 1e-2, 0.3, 0.95, 1e-6, 0.0), torch.float16, True)]
    for hyper, dtype, zero in cases:
        for bufs in (want, got):
            for dst, src in zip(bufs, base):
                dst.copy_(src)
        w = wires.get(dtype, (None, None))
        _torch_adamw(*want, w[0], *hyper, zero)
        _cpp_adamw(lib, *got, w[1], *hyper, zero)
        pairs = list(zip(want, got)) + ([] if dtype is None else [w])
        if not all(_same_bits(a, b) for a, b in pairs):
            return f"AdamW bits differ from torch's ({hyper}, wire {dtype}, zero {zero})"
    for dtype in _GRAD_KIND:
        grads = base[1].to(dtype)
        # the first accumulation of a window, streamed and plain (offset by an element:
        # the streamed loop's unaligned head)
        for alpha, fresh, stream_above in ((1.0, False, None), (1 / 3, False, None),
                                           (-0.25, True, 0), (0.5, True, n + 1)):
            want[0].copy_(base[0])
            got[0].copy_(base[0])
            got[0][::31] = float("nan")  # a fresh window's old values are never read
            if not fresh:
                want[0][::31] = float("nan")
            torch_accumulate_(want[0][1:], grads[1:], alpha, fresh=fresh)
            _cpp_accumulate(lib, got[0][1:], grads[1:], alpha, fresh, stream_above)
            if not _same_bits(want[0][1:], got[0][1:]):
                return (f"accumulation bits differ from torch's ({dtype}, alpha {alpha}, "
                        f"fresh {fresh})")
    special = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0,
                            -0.0, 65520.0, 65504.0, 3e38, 1e-42, 2.0 ** -25, 2.0 ** -24])
    values = torch.cat([base[0] * 0.1, base[1] * 1e-3, base[3], special])
    for dtype in _WIRE_KIND:
        low = values.to(dtype)
        for stream_above in (0, values.numel() + 1):  # streamed stores and plain ones
            if not (_same_bits(low, _cpp_convert(lib, torch.empty_like(low), values,
                                                 stream_above))
                    and _same_bits(low.float(), _cpp_convert(
                        lib, torch.empty_like(values), low, stream_above))):
                return f"conversion bits differ from torch's ({dtype})"
    return (_check_words(lib, values) or _check_sum_of_squares(lib, values)
            or check_segments(lib, torch.get_num_threads(), SERIAL_BELOW, TAIL))


def _check_sum_of_squares(lib, values: Tensor) -> str | None:
    """The sum of squares against the fp64 reference: the same to 1e-6 relative (the C++
    loop rounds each square to fp32 and adds eight in fp32 before fp64; worst case
    8 x 2^-24), non-finite where an element is."""
    finite = values[torch.isfinite(values)]
    big = finite.repeat(SUMSQ_BLOCK * 3 // finite.numel() + 1)  # several blocks, threaded
    for src in (finite, big):
        want, got = _torch_sum_of_squares(src), _cpp_sum_of_squares(lib, src)
        if not abs(got - want) <= 1e-6 * want:
            return f"the sum of squares differs from fp64's ({got!r} vs {want!r})"
    if math.isfinite(_cpp_sum_of_squares(lib, values)):
        return "the sum of squares of non-finite values came out finite"
    return None


def _check_words(lib, values: Tensor) -> str | None:
    """The fp32 copy, the zeroing and the non-finite test against torch's, on `values`
    (special values included) and on a finite buffer, streamed and plain, serial and
    threaded, at every offset of a vector's misalignment."""
    finite = values[torch.isfinite(values)]
    for src in (values, finite):
        for lo in range(0, 17):
            part = src[lo:]
            want_bad = not bool(torch.isfinite(part).all())
            for stream_above in (0, part.numel() + 1):
                out = torch.full_like(part, 7.0)
                bad = _cpp_words(lib, out, part, True, stream_above)
                if bad != want_bad or not torch.equal(out.view(torch.int32),
                                                      part.view(torch.int32)):
                    return "fp32 copy or its non-finite test differs from torch's"
                if _cpp_words(lib, None, part, True, stream_above) != want_bad:
                    return "the non-finite test differs from torch's isfinite"
                _cpp_words(lib, out, None, False, stream_above)
                if torch.count_nonzero(out.view(torch.int32)):
                    return "fp32 zeroing differs from torch's zero_"
    return None


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """The same dtype and bits, but that a NaN may be any NaN: torch itself writes
    different ones in its vector loops and its remainder loops (an fp16 NaN widens to
    0x7FC00000 in the one, 0x7FFFFFFF in the other)."""
    if a.dtype != b.dtype:
        return False
    view = {4: torch.int32, 2: torch.int16}[a.element_size()]
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a.view(view)[~nan],
                                                            b.view(view)[~nan])


def _library():
    """The checked library, or None (torch's ops): built, loaded and checked once."""
    if "lib" in _checked:
        return _checked["lib"]
    with _lock:
        if "lib" not in _checked:
            lib = host_native.library()
            reason = None if lib is None else _self_check(lib)
            if reason is not None:
                host_native.reject(reason)
                lib = None
            info = host_native.status()
            if lib is None and not info.get("reason", "").startswith("$"):
                print(f"zfbench: fused host kernels off ({info.get('reason')}); "
                      "torch's ops run instead", file=sys.stderr, flush=True)
            _checked["lib"] = lib
        return _checked["lib"]


def backend() -> str:
    """Which path the host kernels take in this process: 'cpp' or 'torch'."""
    return "cpp" if _library() is not None else "torch"


def status(load: bool = True) -> dict:
    """`backend()` with its details: the library, its build seconds, or why not; with
    `load` False, {"path": None} when no host kernel has run in this process yet."""
    if not load and "lib" not in _checked:
        return {"path": None, "reason": "no host kernel ran in this process"}
    _library()
    return host_native.status()


def host_adamw_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
                wire: Tensor | None = None, *, step: int, lr: float, beta1: float,
                beta2: float, eps: float, weight_decay: float,
                zero_grad: bool = False) -> None:
    """One in-place AdamW update of `param`, `exp_avg`, `exp_avg_sq` from `grad` at the
    global step `step` (real/host_adam.py's semantics: torch.optim.AdamW's math, 1-D
    contiguous fp32 CPU tensors of one length), then the new parameters rounded into
    `wire` (bf16 or fp16, same length; None: no wire) and, with `zero_grad`, zeros into
    `grad`, all in one pass. Equal in every bit to real.host_adam.host_adamw_ followed by
    `wire.copy_(param)` and `grad.zero_()`, which run instead without the library.

    Issue 45: the host chunk ran AdamW (torch's fused CPU kernel: one pass, 28 B per
    parameter), then `copy_` of the parameters into the bf16 h2d wire (a second pass, 6 B),
    then for ZenFlow's window `zero_` (a third, 4 B): each pass streams the chunk through
    memory again (an H100 host: 2.93-3.32 G params/s for AdamW + wire, 2.25-2.56 with the
    zeroing, against 4.70-4.96 for AdamW alone). The fused kernel reads p, g, m, v once and
    writes p, m, v, the wire element and the zero in the same pass: 30 B per parameter (34
    with zeroing) instead of 34 (38) over two (three) passes.
    """
    _check(param, grad, exp_avg, exp_avg_sq, step)
    if wire is not None and (wire.shape != param.shape or not wire.is_contiguous()
                             or wire.device.type != "cpu"):
        raise ValueError(f"wire must be a contiguous CPU tensor shaped as param "
                         f"{tuple(param.shape)}, got {tuple(wire.shape)} on {wire.device}")
    args = (param, grad, exp_avg, exp_avg_sq, wire, int(step), float(lr), float(beta1),
            float(beta2), float(eps), float(weight_decay), bool(zero_grad))
    lib = _library() if (wire is None or wire.dtype in _WIRE_KIND) else None
    if lib is None:
        _torch_adamw(*args)
    else:
        _cpp_adamw(lib, *args)


def adamw_segments_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                    exp_avg_sqs: list[Tensor], *, step: int, lr: float, beta1: float,
                    beta2: float, eps: float, weight_decay: float,
                    grad_divisor: float = 1.0) -> None:
    """torch._fused_adamw_ over the lists at one step number, the gradients divided by
    `grad_divisor` first and the quotients stored into them (its `grad_scale`), in one
    parallel region over all the tensors (real/host_segments.py), with its bits; without
    the library that torch call itself. Every tensor contiguous fp32 on the CPU (the
    caller's `fused` check), each quadruple of one element count."""
    args = (int(step), float(lr), float(beta1), float(beta2), float(eps),
            float(weight_decay), float(grad_divisor))
    lib = _library()
    if lib is None:
        torch_adamw_segments_(params, grads, exp_avgs, exp_avg_sqs, *args)
    else:
        cpp_adamw_segments_(lib, params, grads, exp_avgs, exp_avg_sqs, *args,
                            torch.get_num_threads(), SERIAL_BELOW, TAIL)


def accumulate_(window: Tensor, grads: Tensor, alpha: float = 1.0,
                chunk_elems: int | None = None, fresh: bool = False) -> Tensor:
    """`window += alpha * grads` in place (1-D, same length; the fp32 window, gradients
    in fp32, bf16 or fp16); returns `window`. One pass, each gradient widened as it is
    read; the bits of real.host_accum.accumulate_ (torch's add_: one fma per element),
    which runs instead without the library (`chunk_elems` is its scratch chunk). With
    `fresh`, a window's first accumulation: the bits of zeroing the window and then
    adding, in one pass that writes the window without reading it (so nothing else need
    zero it: ZenFlow's AdamW pass no longer does, issue 45)."""
    fits = (window.dtype == torch.float32 and grads.dtype in _GRAD_KIND
            and window.shape == grads.shape and window.dim() == 1
            and window.is_contiguous() and grads.is_contiguous()
            and window.device.type == "cpu" and grads.device.type == "cpu")
    lib = _library() if fits else None
    if lib is None:
        return torch_accumulate_(window, grads, alpha, chunk_elems, fresh)
    return _cpp_accumulate(lib, window, grads, alpha, fresh)


def convert_(dst: Tensor, src: Tensor) -> Tensor:
    """`dst[:] = src` converting between fp32 and bf16 or fp16 (Tensor.copy_'s bits: round
    to nearest even, NaN as torch writes it), or fp32 into fp32 (the bits themselves; plain
    stores, streamed into a buffer larger than the last-level cache, `words_stream_above`),
    one pass over the calling thread's torch threads; any other pair, layout or device
    is `dst.copy_(src)`. Returns `dst`."""
    if _words_fit(dst, src) and dst.data_ptr() != src.data_ptr():
        lib = _library()
        if lib is None:
            return dst.copy_(src)
        _cpp_words(lib, dst, src)
        return dst
    pair = {dst.dtype, src.dtype}
    fits = (torch.float32 in pair and len(pair) == 2 and not pair - {torch.float32, *_WIRE_KIND}
            and dst.shape == src.shape and dst.is_contiguous() and src.is_contiguous()
            and dst.device.type == "cpu" and src.device.type == "cpu")
    lib = _library() if fits else None
    if lib is None:
        return dst.copy_(src)
    return _cpp_convert(lib, dst, src)


def zero_(dst: Tensor) -> Tensor:
    """`dst.zero_()`: contiguous fp32 on the CPU in the C++ loop (stores as
    `convert_`'s), anything else torch's `zero_`. Returns `dst`."""
    lib = _library() if _words_fit(dst) else None
    if lib is None:
        return dst.zero_()
    _cpp_words(lib, dst, None)
    return dst


def copy_checked_(dst: Tensor, src: Tensor) -> bool:
    """`dst[:] = src` (as `convert_`) and whether `src` is free of inf and NaN, in one pass
    for contiguous fp32 on the CPU (the test rides on the copy's loads; exact: `torch.
    isfinite(src).all()`). Otherwise the copy, then the finiteness of `src`'s sum (a
    second pass; False also where the sum merely overflowed, so a caller that refuses
    non-finite values looks element-wise before it does)."""
    lib = _library() if _words_fit(dst, src) and dst.data_ptr() != src.data_ptr() else None
    if lib is None:
        convert_(dst, src)
        return bool(torch.isfinite(src.sum()))
    return not _cpp_words(lib, dst, src, True)


def sum_of_squares(grad: Tensor) -> float:
    """The sum of the squares of `grad`'s elements (a Python float; inf or NaN where an
    element is): the L2 norm's square for gradient clipping. One read of an fp32
    contiguous CPU tensor in the C++ loop (fp32 squares, eight a lane added in fp32, then
    fp64), in fixed blocks so that the thread count does not change the result; anything
    else, and without the library, torch's dot products in fp64 block by block. The two
    agree to about 1e-7 relative (worst case 5e-7), the norm to half that.

    Why not torch.linalg.vector_norm in fp32: on 16M fp32 elements it reached 0.32-0.53 of
    the measured memory bandwidth on a 2-core Xeon (bench/kernels.py, 2026-11-27; one
    thread's rate at two) and its fp32 accumulation was 6.5e-4 off the exact norm of 16M
    normal values; this loop is within 1e-7.
    """
    fits = grad.dtype == torch.float32 and grad.is_contiguous() and grad.device.type == "cpu"
    lib = _library() if fits and grad.numel() else None
    if lib is None:
        return _torch_sum_of_squares(grad.float() if grad.dtype != torch.float32 else grad)
    return _cpp_sum_of_squares(lib, grad)
