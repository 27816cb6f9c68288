// zfbench's fused host kernels (real/host_fused.py calls them, real/host_native.py builds
// and loads them).
//
// One pass over memory per host chunk: AdamW on fp32 master, moments and gradient, the
// updated parameter also written into the 16-bit upload wire (bf16 or fp16, or none) and,
// optionally, the gradient zeroed where it was read; the same AdamW over a list of
// tensors in one parallel region, the gradients divided first (torch's grad_scale: ZenFlow's
// device update, real/host_segments.py); ZenFlow's accumulation
// `window += alpha * grads` with 16-bit gradients widened on the fly (a window's first
// accumulation writes instead, so that nothing zeroes the window: issue 45); and
// the conversions between fp32 and the 16-bit wires.
//
// The arithmetic is torch's, operation by operation, so the results are its bits
// (tests/test_host_fused.py; a self-check at load rejects the library where they are not):
// torch._fused_adamw_ on CPU (aten/src/ATen/native/cpu/FusedAdamKernel.cpp: float ops on
// float-rounded constants computed in double, exp_avg by lerp as one fma, and exp_avg_sq
// as the one fma its x86 build contracts `v * beta2 + (1 - beta2) * g * g` into) over the
// vector loop's elements -- the caller hands the last n % 16 to torch, whose remainder
// loop rounds exp_avg_sq otherwise -- followed by Tensor.copy_ into the wire (round to
// nearest even; NaN to bf16 0xFFFF, as torch) and Tensor.zero_; Tensor.add_(grads, alpha)
// (one fma per element); Tensor.copy_ between fp32 and bf16 or fp16 (the fp16 roundings
// in integer operations, which vectorize: checked against torch over all 2^32 floats
// and all 2^16 halves). Built with -ffp-contract=off so that the compiler adds no fma
// the source does not write. Plain C ABI (ctypes), no torch headers: about a second to
// compile. The parallel split is OpenMP's (torch's own libgomp) over the caller's thread
// count, spans on 64-byte boundaries.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <omp.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__F16C__) && defined(__AVX__)
#define ZF_F16C 1  // the hardware fp16 conversions (x86), as torch's own
#endif

namespace {

struct Adam {
  float decay;  // 1 - lr * wd, float-rounded (unused when wd == 0)
  float coeff;  // the lerp's weight 1 - beta1, or (1 - beta1) - 1 when it is >= 0.5
  float b2, c2;  // beta2, 1 - beta2
  float bc2s;  // sqrt(1 - beta2^step)
  float eps;
  float nss;  // -lr / (1 - beta1^step)
  float div;  // the gradient's divisor (torch's grad_scale, float-rounded; read with DIV)
};

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  // round to nearest even
  return f != f ? uint16_t(0xFFFF) : uint16_t(r);  // NaN: 0xFFFF, as torch writes it
}

inline float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// fp32 -> fp16, round to nearest even, in integer operations (they vectorize on every
// ISA, where compilers leave _Float16 conversions scalar): the results of the hardware
// conversion torch uses (F16C vcvtps2ph), NaN payloads included.
inline uint16_t to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7FFFFFFFu;
  // normal halves: exponent rebiased (127 -> 15), 13 bits rounded off to nearest even
  const uint32_t normal = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  // subnormal halves: the 24-bit significand shifted right by 126 - exponent, rounded
  const uint32_t e = a >> 23;
  // 14..24 below 2^-14 (126 - e); 31 where the value rounds to 0 or is not subnormal
  const uint32_t shift = e > 101u && e < 126u ? 126u - e : 31u;
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t sub = (mant + (1u << (shift - 1)) - 1u + ((mant >> shift) & 1u)) >> shift;
  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);  // quiet, payload's top bits
  const uint32_t h = a > 0x7F800000u ? nan : a >= 0x47800000u ? 0x7C00u
                   : a >= 0x38800000u ? normal : sub;
  return uint16_t(h | sign);
}

// fp16 -> fp32, exact (a NaN comes out quiet, as the hardware conversion gives it);
// masks, no branch or select, so that the loops around it vectorize
inline float from_fp16(uint16_t h) {
  const uint32_t x = h, e = (x >> 10) & 0x1Fu, m = x & 0x3FFu;
  const uint32_t normal = ((e + 112u) << 23) | (m << 13);
  const uint32_t special = 0x7F800000u | (uint32_t(m != 0u) << 22) | (m << 13);
  const float small = float(int32_t(m)) * 0x1p-24f;  // subnormal halves and zero: exact
  uint32_t sub;
  std::memcpy(&sub, &small, sizeof sub);
  const uint32_t is_sub = 0u - uint32_t(e == 0u), is_special = 0u - uint32_t(e == 31u);
  const uint32_t u = (normal & ~(is_sub | is_special)) | (sub & is_sub)
                   | (special & is_special) | ((x & 0x8000u) << 16);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Elements per block where a loop's fp16 side is converted apart from its arithmetic
// (16 KB of fp32, in L1 when converted): one pass over memory still.
constexpr int64_t BLOCK = 4096;

// fp32 -> fp16 of [lo, hi): the hardware conversion where the CPU has one (integer
// operations are several times its cost), the same bits
void narrow_fp16(const float* __restrict src, uint16_t* __restrict dst, int64_t lo,
                 int64_t hi) {
  int64_t i = lo;
#ifdef ZF_F16C
  for (; i + 8 <= hi; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
#pragma omp simd
  for (int64_t j = i; j < hi; ++j) dst[j] = to_fp16(src[j]);
}

// fp16 -> fp32 of [lo, hi), likewise
void widen_fp16(const uint16_t* __restrict src, float* __restrict dst, int64_t lo,
                int64_t hi) {
  int64_t i = lo;
#ifdef ZF_F16C
  for (; i + 8 <= hi; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
#pragma omp simd
  for (int64_t j = i; j < hi; ++j) dst[j] = from_fp16(src[j]);
}

// WIRE: 0 none, 1 bf16, 2 fp16. DIV: the gradient divided by c.div first and the
// quotient stored back into it (torch's fused CPU kernel with grad_scale).
template <int WIRE, bool ZERO, bool DECAY, bool SMALL, bool DIV = false>
void adamw_span(float* __restrict p, float* __restrict g, float* __restrict m,
                float* __restrict v, void* __restrict wire, int64_t lo, int64_t hi,
                const Adam& c) {
  uint16_t* __restrict w16 = static_cast<uint16_t*>(wire);
  if constexpr (WIRE == 2) {  // block by block: AdamW, then the block's p into the wire
    for (int64_t b = lo; b < hi; b += BLOCK) {
      const int64_t e = b + BLOCK < hi ? b + BLOCK : hi;
      adamw_span<0, ZERO, DECAY, SMALL, DIV>(p, g, m, v, nullptr, b, e, c);
      narrow_fp16(p, w16, b, e);
    }
    return;
  }
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    const float gv = DIV ? g[i] / c.div : g[i];
    if (DIV) g[i] = gv;
    float pv = p[i];
    if (DECAY) pv = pv * c.decay;
    const float mv = m[i];
    const float mn = std::fma(c.coeff, gv - mv, SMALL ? mv : gv);
    // torch's `v * beta2 + (1 - beta2) * g * g`, as its x86 build contracts it
    const float vn = std::fma(c.c2 * gv, gv, v[i] * c.b2);
    const float den = std::sqrt(vn) / c.bc2s + c.eps;
    const float pn = pv + (c.nss * mn) / den;
    m[i] = mn;
    v[i] = vn;
    p[i] = pn;
    if (ZERO) g[i] = 0.0f;
    if (WIRE == 1) w16[i] = to_bf16(pn);
  }
}

using AdamSpan = void (*)(float*, float*, float*, float*, void*, int64_t, int64_t, const Adam&);

template <int WIRE, bool ZERO>
AdamSpan pick(bool decay, bool small) {
  if (decay) return small ? adamw_span<WIRE, ZERO, true, true> : adamw_span<WIRE, ZERO, true, false>;
  return small ? adamw_span<WIRE, ZERO, false, true> : adamw_span<WIRE, ZERO, false, false>;
}

AdamSpan pick(int wire, bool zero, bool decay, bool small) {
  switch (wire * 2 + (zero ? 1 : 0)) {
    case 0: return pick<0, false>(decay, small);
    case 1: return pick<0, true>(decay, small);
    case 2: return pick<1, false>(decay, small);
    case 3: return pick<1, true>(decay, small);
    case 4: return pick<2, false>(decay, small);
    default: return pick<2, true>(decay, small);
  }
}

// KIND: 0 fp32, 1 bf16, 2 fp16 gradients. FRESH: the window's first accumulation, which
// writes fma(g, alpha, +0.0) without reading the window: the bits of zeroing it and then
// adding (+0.0 as the addend turns a -0.0 product into +0.0, as the zeroed window did; a
// NaN or inf product stays one), in one pass that neither reads the stale window nor
// leaves the zeroing to the AdamW pass before it (real/zenflow.py).
template <int KIND, bool FRESH>
void accum_span(float* __restrict w, const void* __restrict grads, float alpha, int64_t lo,
                int64_t hi) {
  const float* __restrict gf = static_cast<const float*>(grads);
  const uint16_t* __restrict g16 = static_cast<const uint16_t*>(grads);
  if constexpr (KIND == 2) {  // block by block: widened into a buffer in L1, then added
    float wide[BLOCK];
    for (int64_t b = lo; b < hi; b += BLOCK) {
      const int64_t e = b + BLOCK < hi ? b + BLOCK : hi;
      widen_fp16(g16 + b, wide, 0, e - b);
#pragma omp simd
      for (int64_t i = b; i < e; ++i)
        w[i] = std::fma(wide[i - b], alpha, FRESH ? 0.0f : w[i]);
    }
    return;
  }
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    const float gv = KIND == 0 ? gf[i] : from_bf16(g16[i]);
    w[i] = std::fma(gv, alpha, FRESH ? 0.0f : w[i]);
  }
}

template <int KIND, bool WIDEN>
void convert_span(void* __restrict dst, const void* __restrict src, int64_t lo, int64_t hi) {
  float* __restrict df = static_cast<float*>(dst);
  uint16_t* __restrict d16 = static_cast<uint16_t*>(dst);
  const float* __restrict sf = static_cast<const float*>(src);
  const uint16_t* __restrict s16 = static_cast<const uint16_t*>(src);
  if constexpr (KIND == 2) {
    if constexpr (WIDEN) widen_fp16(s16, df, lo, hi);
    else narrow_fp16(sf, d16, lo, hi);
    return;
  }
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    if constexpr (WIDEN) df[i] = from_bf16(s16[i]);
    else d16[i] = to_bf16(sf[i]);
  }
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(ZF_F16C))
#define ZF_STREAM 1
// 16-bit -> fp32 of [lo, hi) (KIND 1 bf16, 2 fp16) with non-temporal stores from dst's
// first vector-aligned element on: a plain store that misses the cache reads the line
// before writing it, 4 of the 10 bytes per element (16M elements bf16 -> fp32, 1 core:
// torch's copy_ 1.97-2.01 G/s, plain stores 1.94-2.00, these 3.61-3.84)
template <int KIND>
void widen_streamed(void* __restrict dst_, const void* __restrict src_, int64_t lo,
                    int64_t hi) {
  float* __restrict dst = static_cast<float*>(dst_);
  const uint16_t* __restrict src = static_cast<const uint16_t*>(src_);
#ifdef __AVX512F__
  constexpr int64_t W = 16;
#else
  constexpr int64_t W = 8;
#endif
  int64_t i = lo;
  for (; i < hi && (reinterpret_cast<uintptr_t>(dst + i) & (W * 4 - 1)); ++i)
    dst[i] = KIND == 1 ? from_bf16(src[i]) : from_fp16(src[i]);
  for (; i + W <= hi; i += W) {
#ifdef __AVX512F__
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m512 f = KIND == 1
        ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        : _mm512_cvtph_ps(h);
    _mm512_stream_ps(dst + i, f);
#else
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256 f = KIND == 1
        ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        : _mm256_cvtph_ps(h);
    _mm256_stream_ps(dst + i, f);
#endif
  }
  for (; i < hi; ++i) dst[i] = KIND == 1 ? from_bf16(src[i]) : from_fp16(src[i]);
  _mm_sfence();  // the streamed stores are seen before the region ends
}
// A window's first accumulation (`accum_span<KIND, true>`'s bits: fma(g, alpha, +0.0))
// with non-temporal stores from the window's first vector-aligned element on: the window
// is not read, and a plain store that misses the cache reads the line before writing it
// (real/host_fused.py `fresh_stream_above` says when: past the last-level cache).
#ifdef __AVX512F__  // one vector of 16-bit gradients widened, and its streamed fma
using FreshVec = __m512;
inline FreshVec fresh_wide(const __m256i h, bool bf16) {
  return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h); }
inline void fresh_store(float* w, FreshVec g, FreshVec a) { _mm512_stream_ps(w, _mm512_fmadd_ps(g, a, _mm512_setzero_ps())); }
#else
using FreshVec = __m256;
inline FreshVec fresh_wide(const __m128i h, bool bf16) {
  return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h); }
inline void fresh_store(float* w, FreshVec g, FreshVec a) { _mm256_stream_ps(w, _mm256_fmadd_ps(g, a, _mm256_setzero_ps())); }
#endif

template <int KIND>
void accum_fresh_streamed(float* __restrict w, const void* __restrict grads, float alpha,
                          int64_t lo, int64_t hi) {
  const float* __restrict gf = static_cast<const float*>(grads);
  const uint16_t* __restrict g16 = static_cast<const uint16_t*>(grads);
  constexpr int64_t W = sizeof(FreshVec) / sizeof(float);
  using Half = std::conditional_t<W == 16, __m256i, __m128i>;  // W 16-bit gradients
  FreshVec a;
  for (int64_t k = 0; k < W; ++k) reinterpret_cast<float*>(&a)[k] = alpha;
  auto one = [&](int64_t i) {
    const float gv = KIND == 0 ? gf[i] : KIND == 1 ? from_bf16(g16[i]) : from_fp16(g16[i]);
    w[i] = std::fma(gv, alpha, 0.0f);
  };
  int64_t i = lo;
  for (; i < hi && (reinterpret_cast<uintptr_t>(w + i) & (W * 4 - 1)); ++i) one(i);
  for (; i + W <= hi; i += W) {
    FreshVec g;
    if constexpr (KIND == 0) {
      std::memcpy(&g, gf + i, sizeof g);
    } else {
      Half h;
      std::memcpy(&h, g16 + i, sizeof h);
      g = fresh_wide(h, KIND == 1);
    }
    fresh_store(w + i, g, a);
  }
  for (; i < hi; ++i) one(i);
  _mm_sfence();  // the streamed stores are seen before the region ends
}
#endif

// 4-byte words (fp32) of [lo, hi): copied (`src` non-null) or zeroed, and with `check`
// each copied word tested for an all-ones fp32 exponent (inf or NaN), the test riding on
// the copy's load; returns whether one was found. Where the CPU has AVX-512 or AVX2 and
// `stream` is set, the stores are non-temporal from dst's first vector-aligned word on
// (a plain store that misses the cache reads the line first; but the engine's copies are
// read again soon, from the cache: real/host_fused.py WORDS_STREAM_ABOVE, off there).
// whether [lo, hi) of `src` (fp32 words) holds an inf or NaN: one read, no store
bool nonfinite_span(uint32_t* __restrict, const uint32_t* __restrict src, int64_t lo,
                    int64_t hi) {
  uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
  for (int64_t j = lo; j < hi; ++j) bad |= uint32_t((src[j] & 0x7F800000u) == 0x7F800000u);
  return bad != 0;
}

template <bool CHECK, bool STREAM>
bool words_span(uint32_t* __restrict dst, const uint32_t* __restrict src, int64_t lo,
                int64_t hi) {
  constexpr uint32_t EXP = 0x7F800000u;
  uint32_t bad = 0;
  int64_t i = lo;
#ifdef ZF_STREAM
  if constexpr (STREAM) {
#ifdef __AVX512F__
    constexpr int64_t W = 16;
#else
    constexpr int64_t W = 8;
#endif
    for (; i < hi && (reinterpret_cast<uintptr_t>(dst + i) & (W * 4 - 1)); ++i) {
      const uint32_t x = src ? src[i] : 0u;
      if (CHECK) bad |= uint32_t((x & EXP) == EXP);
      dst[i] = x;
    }
#ifdef __AVX512F__
    const __m512i exp = _mm512_set1_epi32(int(EXP));
    __mmask16 acc = 0;
    for (; i + W <= hi; i += W) {
      const __m512i x = src ? _mm512_loadu_si512(src + i) : _mm512_setzero_si512();
      if (CHECK) acc |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(x, exp), exp);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), x);
    }
    bad |= uint32_t(acc != 0);
#else
    const __m256i exp = _mm256_set1_epi32(int(EXP));
    __m256i acc = _mm256_setzero_si256();
    for (; i + W <= hi; i += W) {
      const __m256i x = src ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))
                            : _mm256_setzero_si256();
      if (CHECK) acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(_mm256_and_si256(x, exp), exp));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), x);
    }
    bad |= uint32_t(!_mm256_testz_si256(acc, acc));
#endif
    _mm_sfence();  // the streamed stores are seen before the region ends
  }
#endif
  if (src) {
#pragma omp simd reduction(| : bad)
    for (int64_t j = i; j < hi; ++j) {
      const uint32_t x = src[j];
      if (CHECK) bad |= uint32_t((x & EXP) == EXP);
      dst[j] = x;
    }
  } else {
#pragma omp simd
    for (int64_t j = i; j < hi; ++j) dst[j] = 0u;
  }
  return bad != 0;
}

// [lo, hi) of thread t of T over n elements: contiguous spans that start on 64-byte
// multiples (16 floats) so no two threads write one cache line of an fp32 buffer.
template <typename F>
void split(int64_t n, int threads, int64_t serial_below, F&& body) {
  if (threads <= 1 || n < serial_below) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t units = (n + 15) / 16, per = (units + T - 1) / T;
    const int64_t lo = t * per * 16, hi = lo + per * 16 < n ? lo + per * 16 : n;
    if (lo < hi) body(lo, hi);
  }
}

// the sum of squares of [lo, hi) of fp32 `src`: the span read as STREAMS equal parts at
// once (one core keeps more reads in flight over several streams: 1.36x over one stream
// from DRAM on a 2-core Xeon), each with LANES lanes that add R fp32 squares in fp32
// before adding their sum to the lane's fp64 total (fp64 all the way is 1.4x slower:
// the widening is not free; fp32 all the way loses digits over millions of elements);
// what the parts leave over in fp64; the totals added pairwise at the end
double sumsq_span(const float* __restrict src, int64_t lo, int64_t hi) {
  constexpr int STREAMS = 4, LANES = 16, R = 8, STEP = LANES * R;
  const int64_t part_len = (hi - lo) / (STREAMS * STEP) * STEP;
  double acc[STREAMS * LANES] = {};
  for (int64_t i = 0; i < part_len; i += STEP) {
    float part[STREAMS][LANES] = {};
    for (int r = 0; r < R; ++r) {
      for (int s = 0; s < STREAMS; ++s) {
        const float* __restrict x = src + lo + s * part_len + i + r * LANES;
#pragma omp simd
        for (int k = 0; k < LANES; ++k) part[s][k] += x[k] * x[k];
      }
    }
    for (int s = 0; s < STREAMS; ++s) {
#pragma omp simd
      for (int k = 0; k < LANES; ++k) acc[s * LANES + k] += part[s][k];
    }
  }
  int k = 0;
  for (int64_t j = lo + STREAMS * part_len; j < hi; ++j, k = (k + 1) % (STREAMS * LANES)) {
    const double x = src[j];
    acc[k] += x * x;
  }
  for (int w = STREAMS * LANES / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) acc[i] += acc[i + w];
  return acc[0];
}

// the same sum with every square in fp64: where an fp32 square or partial sum overflowed
// (elements past 1.8e19 in magnitude) but the fp64 one may not, or where squares below
// fp32's normal range (elements under 1.1e-19) may carry the sum
double sumsq_span_wide(const float* __restrict src, int64_t lo, int64_t hi) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = lo; j < hi; ++j) {
    const double x = src[j];
    s += x * x;
  }
  return s;
}

// a block's sum: the fp32-squares loop, or the wide one where that came out inf, NaN or
// under 1e-20 (then the squares lost below fp32's normal range, at most a block's length
// times 1.2e-38, could matter; an all-zero block takes this path too, at the fp64 loop's
// cost)
double sumsq_block(const float* src, int64_t lo, int64_t hi) {
  const double s = sumsq_span(src, lo, hi);
  return (s >= 1e-20 && !std::isinf(s)) ? s : sumsq_span_wide(src, lo, hi);
}

// whether torch's lerp takes its `1 - beta1 < 0.5` branch (exp_avg + w * (g - exp_avg))
bool small_lerp(double beta1) { return std::fabs(float(1 - beta1)) < 0.5f; }

// torch._fused_adamw_'s constants at global step `step` (computed in double, then
// float-rounded, as its kernel does); `div`: the gradient's divisor (its grad_scale)
Adam adam_constants(double step, double lr, double beta1, double beta2, double eps,
                    double wd, double div) {
  const double bc1 = 1 - std::pow(beta1, step);
  const double bc2 = 1 - std::pow(beta2, step);
  const double step_size = lr / bc1;
  const float w = float(1 - beta1);
  return Adam{float(1 - lr * wd), small_lerp(beta1) ? w : w - 1.0f, float(beta2),
              float(1 - beta2), float(std::sqrt(bc2)), float(eps), float(-step_size),
              float(div)};
}

}  // namespace

extern "C" {

int zf_abi_version() { return 7; }

// AdamW (torch._fused_adamw_'s arithmetic) on n fp32 elements at global step `step`,
// then the new parameters into `wire` (wire_kind 1 bf16, 2 fp16, 0 none) and, with
// zero_grad, zeros into `g`.
void zf_adamw(float* p, float* g, float* m, float* v, void* wire, int wire_kind,
              int zero_grad, int64_t n, double step, double lr, double beta1, double beta2,
              double eps, double wd, int threads, int64_t serial_below) {
  const Adam c = adam_constants(step, lr, beta1, beta2, eps, wd, 1.0);
  const AdamSpan span = pick(wire_kind, zero_grad != 0, wd != 0.0, small_lerp(beta1));
  split(n, threads, serial_below, [&](int64_t lo, int64_t hi) {
    span(p, g, m, v, wire, lo, hi, c);
  });
}

// AdamW (as zf_adamw, no wire, no zeroing) on `count` segments of fp32 elements, all at
// global step `step`: segment k is ptrs[k], ptrs[count + k], ptrs[2 count + k],
// ptrs[3 count + k] (param, grad, exp_avg, exp_avg_sq), `lens[k]` elements, each a
// multiple of 16 (the caller hands each segment's last n % 16 to torch). With div != 1
// each gradient is divided by `div` first and the quotient stored into it (torch's
// grad_scale). One parallel region: the total element count is split as `split` splits
// one buffer, each thread walking the segments its global range covers (a range starts
// on a multiple of 16 elements, so inside each segment too).
void zf_adamw_segments(void* const* ptrs, const int64_t* lens, int64_t count, double step,
                       double lr, double beta1, double beta2, double eps, double wd,
                       double div, int threads, int64_t serial_below) {
  const Adam c = adam_constants(step, lr, beta1, beta2, eps, wd, div);
  const bool decay = wd != 0.0, small = small_lerp(beta1), divide = c.div != 1.0f;
  using S = AdamSpan;
  static const S spans[2][2][2] = {
      {{adamw_span<0, false, false, false>, adamw_span<0, false, false, true>},
       {adamw_span<0, false, true, false>, adamw_span<0, false, true, true>}},
      {{adamw_span<0, false, false, false, true>, adamw_span<0, false, false, true, true>},
       {adamw_span<0, false, true, false, true>, adamw_span<0, false, true, true, true>}}};
  const S span = spans[divide][decay][small];
  int64_t* starts = new int64_t[count + 1];  // each segment's first global element
  starts[0] = 0;
  for (int64_t k = 0; k < count; ++k) starts[k + 1] = starts[k] + lens[k];
  float* const* f = reinterpret_cast<float* const*>(ptrs);
  split(starts[count], threads, serial_below, [&](int64_t lo, int64_t hi) {
    // the last segment starting at or before lo (binary search), then on while < hi
    int64_t a = 0, b = count;
    while (b - a > 1) {
      const int64_t mid = (a + b) / 2;
      (starts[mid] <= lo ? a : b) = mid;
    }
    for (int64_t k = a; k < count && starts[k] < hi; ++k) {
      const int64_t s0 = starts[k], from = lo > s0 ? lo - s0 : 0;
      const int64_t to = (hi < starts[k + 1] ? hi : starts[k + 1]) - s0;
      if (from < to)
        span(f[k], f[count + k], f[2 * count + k], f[3 * count + k], nullptr, from, to, c);
    }
  });
  delete[] starts;
}

// window[i] = fma(grads[i] widened to fp32, alpha, window[i]) (grads_kind 0 fp32, 1 bf16,
// 2 fp16); with `fresh`, fma(..., +0.0): the window's first accumulation, its old
// contents never read (`accum_span`), with non-temporal stores from `stream_above`
// elements on where the CPU has them.
void zf_accumulate(float* window, const void* grads, int grads_kind, double alpha,
                   int fresh, int64_t n, int threads, int64_t serial_below,
                   int64_t stream_above) {
  using Span = void (*)(float*, const void*, float, int64_t, int64_t);
  static const Span spans[2][3] = {
      {accum_span<0, false>, accum_span<1, false>, accum_span<2, false>},
      {accum_span<0, true>, accum_span<1, true>, accum_span<2, true>}};
  const int kind = grads_kind == 1 || grads_kind == 2 ? grads_kind : 0;
  Span span = spans[fresh ? 1 : 0][kind];
#ifdef ZF_STREAM
  static const Span streamed[3] = {accum_fresh_streamed<0>, accum_fresh_streamed<1>,
                                   accum_fresh_streamed<2>};
  if (fresh && n >= stream_above) span = streamed[kind];
#else
  (void)stream_above;
#endif
  const float a = float(alpha);
  split(n, threads, serial_below, [&](int64_t lo, int64_t hi) {
    span(window, grads, a, lo, hi);
  });
}

// dst = src converted (Tensor.copy_'s bits): kind 1 bf16, 2 fp16 on the 16-bit side,
// widen != 0: src 16-bit, dst fp32; else src fp32, dst 16-bit.
// Widening buffers of at least `stream_above` elements are written with non-temporal
// stores where the CPU has AVX-512 or AVX2 (they leave the cache anyway; smaller ones are
// likely read again from it).
void zf_convert(void* dst, const void* src, int kind, int widen, int64_t n, int threads,
                int64_t serial_below, int64_t stream_above) {
  using Span = void (*)(void*, const void*, int64_t, int64_t);
  Span span = widen ? (kind == 1 ? convert_span<1, true> : convert_span<2, true>)
                    : (kind == 1 ? convert_span<1, false> : convert_span<2, false>);
#ifdef ZF_STREAM
  if (widen && n >= stream_above) span = kind == 1 ? widen_streamed<1> : widen_streamed<2>;
#else
  (void)stream_above;
#endif
  split(n, threads, serial_below, [&](int64_t lo, int64_t hi) { span(dst, src, lo, hi); });
}

// dst = src over n 4-byte words (src null: zeros; dst null: nothing written, `src` only
// checked), non-temporal stores from `stream_above` words on (where the CPU has them);
// with `check`, returns 1 when a word of `src` is an fp32 inf or NaN, else 0 (without
// `check`: 0).
int zf_words(void* dst, const void* src, int check, int64_t n, int threads,
             int64_t serial_below, int64_t stream_above) {
  using Span = bool (*)(uint32_t*, const uint32_t*, int64_t, int64_t);
  const bool stream = n >= stream_above;
  const Span span = !dst ? nonfinite_span
                  : check ? (stream ? words_span<true, true> : words_span<true, false>)
                          : (stream ? words_span<false, true> : words_span<false, false>);
  uint32_t* d = static_cast<uint32_t*>(dst);
  const uint32_t* s = static_cast<const uint32_t*>(src);
  int bad = 0;
  if (threads <= 1 || n < serial_below) return int(span(d, s, 0, n));
#pragma omp parallel num_threads(threads) reduction(| : bad)
  {
    const int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t units = (n + 15) / 16, per = (units + T - 1) / T;
    const int64_t lo = t * per * 16, hi = lo + per * 16 < n ? lo + per * 16 : n;
    if (lo < hi) bad |= int(span(d, s, lo, hi));
  }
  return bad;
}

// The sum of squares of n fp32 elements (`sumsq_block`'s arithmetic): fixed blocks of `block` elements, each
// summed by one thread, the blocks' sums then added in order on the calling thread, so
// the result does not depend on the thread count. A non-finite element gives inf or NaN.
double zf_sumsq(const float* src, int64_t n, int64_t block, int threads,
                int64_t serial_below) {
  if (n <= 0) return 0.0;
  const int64_t blocks = (n + block - 1) / block;
  if (blocks == 1) return sumsq_block(src, 0, n);
  double* sums = new double[blocks];
  const int team = (threads <= 1 || n < serial_below) ? 1 : threads;
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
    sums[b] = sumsq_block(src, lo, hi);
  }
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) total += sums[b];
  delete[] sums;
  return total;
}

}  // extern "C"
