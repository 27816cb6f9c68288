"""The fused host kernels (real/host_fused.py, real/host_fused.cpp) give the torch path's
bits: AdamW as real/host_adam.py's default (torch's fused CPU kernel), then
`wire.copy_(param)` and `grad.zero_()`; the accumulation as real/host_accum.py; the
conversions between fp32 and bf16/fp16 as `Tensor.copy_` (all 2^32 floats were compared
once outside the suite, 2026-11-27: no difference; every half is compared here). Bit for
bit wherever the values are numbers; a NaN where torch has a NaN (the fp32 NaN's sign and
payload follow the operand order of each instruction, which the C++ loop need not share
with torch's build, and torch's own differ from loop to loop; the bf16 wire's NaN is
0xFFFF as torch writes it). Sizes: 0, odd,
below and past the vector width and the threading threshold, views at any offset. The
C++ path's tests skip where the library did not build (no compiler): the torch path then
runs, which the fallback tests check."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from zfbench.real import host_fused, host_native
from zfbench.real.host_accum import accumulate_ as torch_accumulate_

SERIAL = host_fused.SERIAL_BELOW
sizes = st.one_of(st.integers(0, 200), st.integers(SERIAL - 40, SERIAL + 300))
hypers = st.fixed_dictionaries({
    "step": st.integers(1, 2000), "lr": st.sampled_from([0.0, 1e-4, 1e-3, 3e-2]),
    "beta1": st.sampled_from([0.0, 0.3, 0.5, 0.9, 0.99]),
    "beta2": st.sampled_from([0.0, 0.95, 0.999]),
    "eps": st.sampled_from([1e-8, 1e-6]),
    "weight_decay": st.sampled_from([0.0, 0.01, 0.1])})
WIRES = [None, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def lib():
    lib = host_fused._library()
    if lib is None:
        pytest.skip(f"no C++ library here: {host_fused.status()['reason']}")
    return lib


@pytest.fixture(scope="module")
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def assert_same(want: torch.Tensor, got: torch.Tensor, what: str) -> None:
    """Equal bits where torch has a number, NaN where it has a NaN (torch's own NaNs
    differ between its vector and remainder loops: an fp16 NaN widens to 0x7FC00000 in
    the one, 0x7FFFFFFF in the other)."""
    assert want.dtype == got.dtype, what
    nan = torch.isnan(want)
    assert torch.equal(nan, torch.isnan(got)), what
    assert torch.equal(bits(want)[~nan], bits(got)[~nan]), what
    if want.dtype == torch.bfloat16:  # torch's 16-bit NaN: 0xFFFF
        assert torch.equal(bits(want), bits(got)), what


def state(n: int, offset: int, seed: int, special: bool = False):
    """p, g, m, v of n elements as views at `offset` into larger buffers."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for scale in (1.0, 1e-2, 1e-3, None):
        buf = torch.rand(n + offset + 3, generator=gen) * 1e-5 if scale is None else \
            torch.randn(n + offset + 3, generator=gen) * scale
        out.append(buf[offset:offset + n])
    if special and n:
        p, g, m, v = out
        g[::7] = 0.0
        p[::11] = -0.0
        g[::13] = float("inf")
        g[::17] = float("nan")
        p[::19] = 3.0e38
        v[::23] = 1e-42  # subnormal
        m[::29] = -float("inf")
    return out


def run_both(lib, n, offset, seed, hyper, dtype, zero, special=False):
    want, got = state(n, offset, seed, special), state(n, offset, seed, special)
    wires = [None if dtype is None else torch.full((n,), 7.0).to(dtype) for _ in range(2)]
    host_fused._torch_adamw(*want, wires[0], hyper["step"], hyper["lr"], hyper["beta1"],
                            hyper["beta2"], hyper["eps"], hyper["weight_decay"], zero)
    host_fused._cpp_adamw(lib, *got, wires[1], hyper["step"], hyper["lr"], hyper["beta1"],
                          hyper["beta2"], hyper["eps"], hyper["weight_decay"], zero)
    for name, a, b in zip("pgmv", want, got):
        assert_same(a, b, f"{name} n={n} offset={offset} {hyper} wire={dtype} zero={zero}")
    if dtype is not None:
        assert_same(wires[0], wires[1], f"wire n={n} {hyper} {dtype}")


@settings(max_examples=60)
@given(n=sizes, offset=st.integers(0, 17), seed=st.integers(0, 1000), hyper=hypers,
       dtype=st.sampled_from(WIRES), zero=st.booleans())
def test_adamw_wire_zero_equals_the_torch_path_bit_for_bit(lib, two_threads, n, offset,
                                                           seed, hyper, dtype, zero):
    run_both(lib, n, offset, seed, hyper, dtype, zero)


@settings(max_examples=20)
@given(n=st.integers(1, 300), seed=st.integers(0, 1000), hyper=hypers,
       dtype=st.sampled_from(WIRES), zero=st.booleans())
def test_infinities_nans_zeros_and_subnormals(lib, n, seed, hyper, dtype, zero):
    run_both(lib, n, 0, seed, hyper, dtype, zero, special=True)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", WIRES)
def test_many_steps_past_the_threading_threshold(lib, threads, dtype):
    """20 steps on buffers of several threads' spans (each span rounded to 16 elements)
    with a remainder: the same bits however many threads split the chunk."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 3 * SERIAL + 16 * 5 + 11
        want, got = state(n, 5, 1), state(n, 5, 1)
        wires = [None if dtype is None else torch.empty(n, dtype=dtype) for _ in range(2)]
        for step in range(1, 21):
            args = (step, 1e-3, 0.9, 0.999, 1e-8, 0.01, step % 5 == 0)
            host_fused._torch_adamw(*want, wires[0], *args)
            host_fused._cpp_adamw(lib, *got, wires[1], *args)
        for a, b in zip(want + wires[:1], got + wires[1:]):
            if a is not None:
                assert torch.equal(bits(a), bits(b))
    finally:
        torch.set_num_threads(before)


def test_the_wire_rounds_to_nearest_even_as_torch():
    """Halfway cases, the largest floats (bf16 overflows to inf, fp16 too), subnormals,
    signed zeros: lr 0 and no weight decay leave p as it is, the wire is p rounded."""
    raw = [0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x7F7FFFFF, 0xFF7FFFFF,
           0x00000001, 0x80000001, 0x007FFFFF, 0x00000000, 0x80000000, 0x7F800000,
           0x477FF000, 0x477FE000, 0x33000000, 0x33000001, 0x387FC000, 0x38800000]
    p = torch.tensor(raw * 3, dtype=torch.int64).to(torch.int32).view(torch.float32)
    n = p.numel()
    for dtype in (torch.bfloat16, torch.float16):
        wire = torch.empty(n, dtype=dtype)
        host_fused.host_adamw_(p.clone(), torch.zeros(n), torch.zeros(n), torch.zeros(n),
                               wire, step=1, lr=0.0, beta1=0.9, beta2=0.999, eps=1e-8,
                               weight_decay=0.0)
        assert torch.equal(bits(wire), bits(p.to(dtype)))


@settings(max_examples=40)
@given(n=sizes, offset=st.integers(0, 9), dtype=st.sampled_from(
    [torch.float32, torch.bfloat16, torch.float16]),
    alpha=st.sampled_from([1.0, 0.25, 1 / 3, -2.5]), seed=st.integers(0, 100))
def test_accumulate_equals_the_torch_path_bit_for_bit(lib, two_threads, n, offset, dtype,
                                                      alpha, seed):
    gen = torch.Generator().manual_seed(seed)
    window = torch.randn(n + offset, generator=gen)[offset:]
    grads = (torch.randn(n + offset, generator=gen) * 3).to(dtype)[offset:]
    if n:
        grads[::5] = float("inf")
    want = torch_accumulate_(window.clone(), grads, alpha)
    got = window.clone()
    assert host_fused._cpp_accumulate(lib, got, grads, alpha) is got
    assert_same(want, got, f"n={n} {dtype} alpha={alpha}")


@settings(max_examples=40)
@given(n=sizes, offset=st.integers(0, 9), dtype=st.sampled_from([torch.bfloat16,
                                                                  torch.float16]),
       widen=st.booleans(), scale=st.sampled_from([1e-30, 1e-6, 1.0, 1e4, 1e38]),
       seed=st.integers(0, 100), stream=st.booleans())
def test_conversions_equal_torchs_copy_bit_for_bit(lib, two_threads, n, offset, dtype,
                                                   widen, scale, seed, stream):
    """With plain stores and with non-temporal ones (any buffer: `stream`), at any
    offset from a 32-byte boundary."""
    gen = torch.Generator().manual_seed(seed)
    values = (torch.randn(n + offset, generator=gen) * scale)[offset:]
    if n:
        values[::7] = float("nan")
        values[::11] = -float("inf")
        values[::13] = -0.0
    src = values.to(dtype) if widen else values
    dst_dtype = torch.float32 if widen else dtype
    want = torch.empty(n, dtype=dst_dtype).copy_(src)
    got = torch.full((n + offset,), 3.0).to(dst_dtype)[offset:]
    assert host_fused._cpp_convert(lib, got, src, 0 if stream else None) is got
    assert_same(want, got, f"n={n} {dtype} widen={widen} stream={stream}")


@settings(max_examples=60)
@given(n=sizes, offset=st.integers(0, 17), seed=st.integers(0, 100), stream=st.booleans(),
       special=st.sampled_from([None, "nan", "inf", "-inf", "max"]),
       where=st.floats(0.0, 0.999))
def test_fp32_copy_zero_and_nonfinite_test_equal_torchs(lib, two_threads, n, offset, seed,
                                                       stream, special, where):
    """The fp32 copy (`convert_`, `copy_checked_`), the zeroing (`zero_`) and the
    non-finite test (`_cpp_words`, `copy_checked_`) against torch's copy_, zero_ and
    isfinite: every bit, NaN payloads included (a copy moves words); one special value
    anywhere, or none; plain and non-temporal stores, at any offset."""
    gen = torch.Generator().manual_seed(seed)
    src = (torch.randn(n + offset, generator=gen) * 1e30)[offset:]
    if n and special is not None:
        src[int(where * n)] = {"nan": float("nan"), "inf": float("inf"),
                               "-inf": -float("inf"), "max": 3.4e38}[special]
    finite = bool(torch.isfinite(src).all())
    stream_above = 0 if stream else None
    for check in (False, True):
        got = torch.full((n + offset,), 7.0)[offset:]
        bad = host_fused._cpp_words(lib, got, src, check, stream_above)
        assert torch.equal(bits(got), bits(src))
        assert bad == (check and not finite)
    assert host_fused._cpp_words(lib, None, src, True, stream_above) == (not finite)
    host_fused._cpp_words(lib, got, None, False, stream_above)
    assert torch.equal(bits(got), bits(torch.zeros(n)))
    # the public functions
    out = torch.empty(n)
    assert host_fused.copy_checked_(out, src) == finite and torch.equal(bits(out), bits(src))
    assert host_fused._cpp_words(lib, None, src, True) == (not finite)  # default stores
    assert torch.equal(bits(host_fused.convert_(torch.empty(n), src)), bits(src))
    assert torch.equal(bits(host_fused.zero_(out)), bits(torch.zeros(n)))


def test_without_the_library_fp32_copy_zero_and_check_are_torchs(monkeypatch):
    """The torch path: copy_, zero_, and the check as the sum's finiteness (False also
    where the sum overflows; the engine then looks element-wise)."""
    monkeypatch.setattr(host_fused, "_library", lambda: None)
    src = torch.tensor([1.0, -2.5, 3e38, 3e38])
    out = torch.empty(4)
    assert host_fused.copy_checked_(out, src) is False  # the sum overflows
    assert torch.equal(out, src)
    assert host_fused.copy_checked_(out[:2], src[:2]) is True
    assert host_fused.copy_checked_(out[:3], src[:3]) is True  # 3e38 alone: finite
    assert torch.equal(host_fused.zero_(out), torch.zeros(4))


def test_every_half_widens_and_narrows_back_as_torch(lib):
    halves = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    wide = host_fused._cpp_convert(lib, torch.empty(1 << 16), halves)
    assert torch.equal(bits(wide), bits(halves.float()))
    back = host_fused._cpp_convert(lib, torch.empty(1 << 16, dtype=torch.float16), wide)
    assert torch.equal(bits(back), bits(wide.to(torch.float16)))


def test_convert_leaves_what_it_does_not_fit_to_torch():
    src = torch.randn(6, 4)
    for dst in (torch.empty(4, 6, dtype=torch.bfloat16).t(), torch.empty(6, 4),
                torch.empty(6, 4, dtype=torch.float64)):
        assert torch.equal(host_fused.convert_(dst, src), src.to(dst.dtype))


def test_the_kernels_module_runs_the_fused_path(lib):
    from zfbench.real import kernels

    assert kernels.host_adamw_ is host_fused.host_adamw_
    assert kernels.accumulate_ is host_fused.accumulate_
    x = torch.randn(100)
    assert torch.equal(kernels.copy_(torch.empty(100, dtype=torch.bfloat16), x),
                       x.bfloat16())
    assert host_fused.backend() == "cpp"
    assert host_fused.status()["library"].endswith(host_native.LIB_NAME)


def test_bad_arguments_are_refused():
    p = torch.zeros(8)
    with pytest.raises(ValueError, match="wire"):
        host_fused.host_adamw_(p, p.clone(), p.clone(), p.clone(), torch.zeros(9).bfloat16(),
                               step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                               weight_decay=0.0)
    with pytest.raises(ValueError, match="float32"):
        host_fused.host_adamw_(p.bfloat16(), p, p, p, step=1, lr=1e-3, beta1=0.9,
                               beta2=0.999, eps=1e-8, weight_decay=0.0)
    with pytest.raises(ValueError, match="differ in shape"):
        host_fused.accumulate_(torch.zeros(4), torch.zeros(5).bfloat16())


# -- falling back ---------------------------------------------------------------------------
@pytest.fixture
def fresh(monkeypatch):
    """A process state in which no host kernel has run yet (restored after)."""
    monkeypatch.setattr(host_native, "_state", {})
    monkeypatch.setattr(host_fused, "_checked", {})
    return monkeypatch


def one_step_matches_torch() -> None:
    want, got = state(1000, 0, 3), state(1000, 0, 3)
    wires = [torch.empty(1000, dtype=torch.bfloat16) for _ in range(2)]
    host_fused._torch_adamw(*want, wires[0], 2, 1e-3, 0.9, 0.999, 1e-8, 0.01, True)
    host_fused.host_adamw_(*got, wires[1], step=2, lr=1e-3, beta1=0.9, beta2=0.999,
                           eps=1e-8, weight_decay=0.01, zero_grad=True)
    for a, b in zip(want + wires[:1], got + wires[1:]):
        assert torch.equal(bits(a), bits(b))


def test_without_a_compiler_the_torch_path_runs_with_one_warning_line(fresh, tmp_path,
                                                                      capsys):
    fresh.setenv("ZFBENCH_CXX", str(tmp_path / "no-such-g++"))
    fresh.setenv("ZFBENCH_CACHE_DIR", str(tmp_path / "cache"))
    one_step_matches_torch()
    assert host_fused.backend() == "torch"
    assert "no-such-g++" in host_fused.status()["reason"]
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "torch's ops run instead" in err


def test_the_switch_turns_the_library_off_without_a_warning(fresh, capsys):
    fresh.setenv(host_native.ENV_SWITCH, "torch")
    one_step_matches_torch()
    assert host_fused.backend() == "torch"
    assert capsys.readouterr().err == ""


def test_a_library_whose_bits_differ_is_rejected(fresh, capsys):
    """Negative control of the self-check: a library that skips the update is caught
    before any kernel uses it."""
    class Idle:
        def zf_adamw(self, *args):
            pass

        def zf_accumulate(self, *args):
            pass
    fresh.setattr(host_native, "_build_and_load", lambda: (Idle(), {"path": "cpp"}))
    one_step_matches_torch()
    assert host_fused.backend() == "torch"
    assert "differ" in host_fused.status()["reason"]
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_fresh_build_is_cached_and_quick(fresh, tmp_path):
    """A cold cache compiles (seconds, not the minute of a torch extension), the next
    process loads it without compiling; the key names the CPU, so another CPU builds
    its own."""
    if host_native.compiler() is None:
        pytest.skip("no g++")
    fresh.setenv("ZFBENCH_CACHE_DIR", str(tmp_path))
    assert host_native.library() is not None
    info = host_native.status()
    assert info["path"] == "cpp" and 0 < info["built_s"] < 60
    fresh.setattr(host_native, "_state", {})
    assert host_native.library() is not None and host_native.status()["built_s"] is None
    fresh.setattr(host_native, "_cpu_fingerprint", lambda: "another cpu")
    fresh.setattr(host_native, "_state", {})
    host_native.library()
    assert host_native.status()["built_s"] is not None
    assert len(list(tmp_path.glob("host_kernels/*/" + host_native.LIB_NAME))) == 2


def exact_sum_of_squares(x: torch.Tensor) -> float:
    """math.fsum of the fp64 squares of fp32 values: each square exact, the sum rounded
    once."""
    import math
    return math.fsum(v * v for v in x.double().tolist())


@settings(max_examples=60)
@given(n=st.one_of(st.integers(0, 700), st.integers(SERIAL - 40, SERIAL + 600)),
       offset=st.integers(0, 17), seed=st.integers(0, 1000),
       scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e15]),
       block=st.sampled_from([64, 512, 4096, host_fused.SUMSQ_BLOCK]),
       threads=st.sampled_from([1, 2, 3]))
def test_sum_of_squares_is_within_its_bound_of_the_exact_sum(lib, n, offset, seed, scale,
                                                             block, threads):
    """The C++ loop's fp32 squares, eight a lane summed in fp32 before fp64: within
    8 x 2^-24 relative of the exact sum (fsum), at any offset, block size and thread
    count; and the same bits at every thread count (fixed blocks, summed in order)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n + offset, generator=gen) * scale)[offset:]
    want = exact_sum_of_squares(x)
    got = lib.zf_sumsq(x.data_ptr(), n, block, threads, 0)
    assert abs(got - want) <= 8 * 2.0 ** -24 * want
    assert got == lib.zf_sumsq(x.data_ptr(), n, block, 1, 0)
    assert abs(host_fused._torch_sum_of_squares(x) - want) <= 1e-12 * want


def test_sum_of_squares_of_large_and_non_finite_values():
    """Squares past fp32's range are summed in fp64 (the block's wide loop); an inf
    gives inf and a NaN NaN, with the library or without."""
    import math
    big = torch.full((1000,), 1e20)
    big[::7] = -3e38
    for path in ("cpp", "torch"):
        fn = (host_fused.sum_of_squares if path == "cpp"
              else host_fused._torch_sum_of_squares)
        assert math.isclose(fn(big), exact_sum_of_squares(big), rel_tol=1e-12), path
        for special, want in ((float("inf"), math.isinf), (float("nan"), math.isnan)):
            x = big.clone()
            x[500] = special
            assert want(fn(x)), (path, special)
    assert host_fused.sum_of_squares(torch.empty(0)) == 0.0


def test_sum_of_squares_without_the_library_and_of_16bit_values(monkeypatch):
    """torch's fp64 dot products block by block, also for what the C++ loop does not
    take (16-bit, non-contiguous)."""
    x = torch.randn(3000, generator=torch.Generator().manual_seed(4))
    strided = torch.randn(3000, 2)[:, 0]
    for t in (x.bfloat16(), strided):
        assert host_fused.sum_of_squares(t) == pytest.approx(
            exact_sum_of_squares(t.float()), rel=1e-12)
    monkeypatch.setattr(host_fused, "_library", lambda: None)
    assert host_fused.sum_of_squares(x) == pytest.approx(exact_sum_of_squares(x), rel=1e-12)
def test_stores_stream_into_buffers_larger_than_the_last_level_cache(monkeypatch):
    """Streamed from the first word where the destination's whole buffer (a chunk's
    flat buffer, not the chunk) is larger than the last-level cache; plain otherwise,
    and where the cache's size is unknown."""
    monkeypatch.setattr(host_fused, "_llc", [1000])
    big, small = torch.zeros(251), torch.zeros(250)  # 1004 and 1000 bytes
    assert host_fused.words_stream_above(big[3:7]) == 0
    assert host_fused.words_stream_above(small) == host_fused.WORDS_STREAM_ABOVE
    monkeypatch.setattr(host_fused, "_llc", [None])
    assert host_fused.words_stream_above(big) == host_fused.WORDS_STREAM_ABOVE


def test_the_last_level_cache_is_the_largest_linux_reports(monkeypatch, tmp_path):
    for i, size in enumerate(["48K", "2048K", "300M", "junk"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    real_path = host_fused.Path
    monkeypatch.setattr(host_fused, "Path", lambda p: real_path(tmp_path)
                        if p == "/sys/devices/system/cpu/cpu0/cache" else real_path(p))
    monkeypatch.setattr(host_fused, "_llc", [])
    assert host_fused.last_level_cache_bytes() == 300 << 20


@pytest.mark.parametrize("offset", [0, 1, 5, 16])
def test_copies_and_zeroing_into_a_big_buffer_are_torchs_bits(lib, two_threads, monkeypatch,
                                                               offset):
    """The public copy, checked copy and zeroing, streamed because the buffer is larger
    than a (patched) last-level cache: the bits of torch's copy_ and zero_."""
    monkeypatch.setattr(host_fused, "_llc", [1 << 12])
    n = host_fused.SERIAL_BELOW + 37
    gen = torch.Generator().manual_seed(offset)
    src = torch.randn(n, generator=gen) * 1e30
    src[n // 3] = float("nan")
    dst = torch.full((n + offset,), 7.0)[offset:]
    assert host_fused.words_stream_above(dst) == 0
    assert torch.equal(bits(host_fused.convert_(dst, src)), bits(src))
    dst.fill_(7.0)
    assert host_fused.copy_checked_(dst, src) is False
    assert torch.equal(bits(dst), bits(src))
    assert torch.equal(bits(host_fused.zero_(dst)), bits(torch.zeros(n)))
