// The vector operations Redline's kernels are written in, for each CPU family the library is built for:
//
//   REDLINE_AVX2   x86-64 with AVX2, FMA and F16C: an F8 is one 256-bit register (the intrinsics the kernels were
//                  first written in, unchanged); with REDLINE_AVX_VNNI or REDLINE_AVX512_VNNI the byte products
//                  take one vpdpbusd instead of two instructions (the same integers);
//   REDLINE_NEON   ARM64 (AArch64) NEON, two 128-bit registers; with REDLINE_DOTPROD the int8 dot products use
//                  ARMv8.2's SDOT, without it widening multiplies and pairwise adds (any ARMv8-A CPU);
//   neither        plain C++ for any CPU (on x86-64 the compiler's SSE2): the portable build.
//
// F8 is eight fp32 lanes, I8x32 thirty-two int8 lanes, W16 sixteen bf16 weights. Every operation does, lane by lane,
// what the AVX2 instruction does, and the reductions (f8_hsum) add in the AVX2 order, so a kernel computes the same
// numbers on every build whose multiply-adds are fused: AVX2 and NEON give the same bits. The integer dot products
// are exact everywhere. The portable build rounds a multiply and an add separately (a CPU without FMA has no fused
// multiply-add, and std::fma emulated in software costs tens of times more), so there the sums can differ from AVX2
// in the last bits; built with REDLINE_EXACT_FMA (tests only: slow) it fuses them with std::fma and matches AVX2.
//
// No torch, no ATen: the library is plain C ABI (see cpu_kernels.cpp, decode_step.cpp), loaded with ctypes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(REDLINE_AVX2)
#include <immintrin.h>
#elif defined(REDLINE_NEON)
#include <arm_neon.h>
#elif defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define REDLINE_SSE2_ROUND 1
#endif

#ifdef _OPENMP
#include <omp.h>
#else  // built without OpenMP (e.g. Apple's clang without libomp): one thread, the pragmas ignored
inline int omp_get_thread_num() { return 0; }
inline int omp_get_num_threads() { return 1; }
inline int omp_in_parallel() { return 0; }
inline double omp_get_wtime() { return 0.0; }
#endif

namespace redline_kernels {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 as torch stores it (the high half of an fp32); conversion from fp32 rounds to nearest even, NaN to 0x7FC0,
// as c10::BFloat16 does.
struct bf16 {
  uint16_t bits;
  bf16() = default;
  explicit bf16(float v) {
    if (std::isnan(v)) {
      bits = 0x7FC0;
    } else {
      const uint32_t u = f32_bits(v);
      bits = static_cast<uint16_t>((u + ((u >> 16) & 1) + 0x7FFF) >> 16);
    }
  }
  explicit operator float() const { return f32_from(static_cast<uint32_t>(bits) << 16); }
};

// IEEE half <-> float in software (the portable build; AVX2 and NEON convert in hardware, with the same results:
// every half is exact as a float, and float -> half rounds to nearest even).
inline float f16_to_f32_soft(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0x1F) return f32_from(sign | 0x7F800000 | (m << 13) | (m ? 0x400000 : 0));  // inf, NaN (quietened)
  if (e != 0) return f32_from(sign | ((e + 112) << 23) | (m << 13));
  if (m == 0) return f32_from(sign);
  const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
  return sign ? -v : v;
}

inline uint16_t f32_to_f16_soft(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFF;
  if (ax > 0x7F800000) return sign | 0x7E00 | static_cast<uint16_t>((ax >> 13) & 0x3FF);  // NaN, quietened
  if (ax >= 0x47800000) return sign | 0x7C00;                                           // >= 65536 (and inf)
  if (ax < 0x38800000) {  // below the smallest normal half: a subnormal or zero, in units of 2^-24
    if (ax < 0x33000000) return sign;  // at most 2^-25: rounds to zero (2^-25 itself ties to even zero)
    const uint32_t e = ax >> 23, m = (ax & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  uint32_t h = ((ax >> 23) - 112) << 10 | ((ax >> 13) & 0x3FF);
  const uint32_t rem = ax & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is right, up to inf
  return sign | static_cast<uint16_t>(h);
}

inline void prefetch(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 3);
#elif defined(REDLINE_AVX2) || defined(_M_X64)
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
#else
  (void)p;
#endif
}

#if defined(REDLINE_AVX2)
// ---------------------------------------------------------------------------------------------------- AVX2
using F8 = __m256;
using I8x32 = __m256i;
using W16 = __m256i;

inline F8 f8_zero() { return _mm256_setzero_ps(); }
inline F8 f8_set1(float v) { return _mm256_set1_ps(v); }
inline F8 f8_load(const float* p) { return _mm256_loadu_ps(p); }
inline void f8_store(float* p, F8 v) { _mm256_storeu_ps(p, v); }
inline F8 f8_add(F8 a, F8 b) { return _mm256_add_ps(a, b); }
inline F8 f8_sub(F8 a, F8 b) { return _mm256_sub_ps(a, b); }
inline F8 f8_mul(F8 a, F8 b) { return _mm256_mul_ps(a, b); }
inline F8 f8_div(F8 a, F8 b) { return _mm256_div_ps(a, b); }
inline F8 f8_max(F8 a, F8 b) { return _mm256_max_ps(a, b); }  // a > b ? a : b
inline F8 f8_min(F8 a, F8 b) { return _mm256_min_ps(a, b); }  // a < b ? a : b
inline F8 f8_madd(F8 a, F8 b, F8 c) { return _mm256_fmadd_ps(a, b, c); }   // a·b + c, one rounding
inline F8 f8_nmadd(F8 a, F8 b, F8 c) { return _mm256_fnmadd_ps(a, b, c); }  // c − a·b, one rounding
inline F8 f8_abs(F8 a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
inline F8 f8_neg(F8 a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
inline F8 f8_round(F8 a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// 2^k for whole k in -126..127 (the exponent bits).
inline F8 f8_pow2i(F8 k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
}
inline F8 f8_lane(F8 v, int j) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(j)); }
// ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))
inline float f8_hsum(F8 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, lo);
  return _mm_cvtss_f32(_mm_add_ss(lo, sh));
}
// Lane j = the sum of v[j]'s eight lanes, for sums of integers (exact in fp32 in any order: the order is free).
inline F8 f8_sums8(const F8* v) {
  const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
  const __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);  // [v0..v3 low | v0..v3 high], v4..v7
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}
// r[i] = row i's eight values -> r[j] = the eight rows' value j
inline void f8_transpose8(F8* r) {
  F8 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int q = 0; q < 2; ++q) {  // u[4q + m]: rows 4q..4q+3's values m and 4 + m
    u[4 * q] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
    u[4 * q + 1] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0xEE);
    u[4 * q + 2] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
    u[4 * q + 3] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xEE);
  }
  for (int m = 0; m < 4; ++m) {
    r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
    r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
  }
}
inline float f8_hmax(F8 m) {
  __m128 mm = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
  mm = _mm_max_ps(mm, _mm_movehl_ps(mm, mm));
  mm = _mm_max_ss(mm, _mm_movehdup_ps(mm));
  return _mm_cvtss_f32(mm);
}
inline F8 f8_from_bf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline F8 f8_from_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// Eight int8 (an 8-bit KV cache's row) as floats, exactly.
inline F8 f8_from_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f32_to_f16(float v) { return _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT); }

// Sixteen bf16 weights: the low half holds elements 0-3 and 8-11, the high half 4-7 and 12-15 (one shuffle per eight
// weights, see permute16 in simd.h).
inline W16 w16_load(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline F8 w16_lo(W16 v) { return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v)); }
inline F8 w16_hi(W16 v) { return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v)); }
// out[0..8) = x[0..4) x[8..12), out[8..16) = x[4..8) x[12..16)
inline void permute16_block(const float* x, float* out) {
  const __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
  _mm256_storeu_ps(out, _mm256_permute2f128_ps(a, b, 0x20));
  _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(a, b, 0x31));
}

inline I8x32 i8_load(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// 16 bytes -> 32 values 0..15: the low nibbles, then the high nibbles (GGUF's order)
inline I8x32 i8_nibbles(const uint8_t* p) {
  const __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1),
                          _mm256_set1_epi8(0x0F));
}
// Four unsigned × signed byte products summed into each int32 lane. With VNNI one instruction (vpdpbusd: AVX-VNNI's
// VEX form, or AVX512-VNNI's EVEX form on 256 bits); without, maddubs (pairs into int16) then madd (pairs into
// int32). The sums are the same integers: no pair here reaches maddubs' int16 saturation (an unsigned operand is
// at most 128 and a signed one at most 127 in magnitude: 2 · 128 · 127 < 32767), so every build gives the same bits.
inline __m256i i32_dot4(__m256i u, __m256i s) {
#if defined(REDLINE_AVX512_VNNI)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(REDLINE_AVX_VNNI)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
#if defined(REDLINE_AVX512_VNNI)
// For tiles of q8 rows against several activation rows (simd.h q8_tile): the signed × signed dot as one vpdpbusd
// per pair, the activations offset to unsigned once (q + 128, as bytes q ^ 0x80) and the offset's share taken
// out beforehand, once per weight vector: neg_offset(w) = −128 · Σw per lane, so dot_from(neg_offset(w),
// offset(q), w) = Σ (q + 128)·w − 128·Σw = Σ q·w, the same integers as f8_dot_i8 (vpdpbusd adds in int32: no
// saturation).
inline __m256i i8_offset(I8x32 q) { return _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80))); }
inline __m256i i32_neg_offset(I8x32 w) {
  return _mm256_sub_epi32(_mm256_setzero_si256(),
                          _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(0x80)), w));
}
inline F8 f8_dot_from(__m256i neg_offset, __m256i u, I8x32 w) {
  return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(neg_offset, u, w));
}
#endif
// Lane j = Σ over bytes 4j..4j+3 of x·y, as a float: 32 int8 × int8 products (|x| as unsigned, y with x's sign)
inline F8 f8_dot_i8(I8x32 x, I8x32 y) {
  return _mm256_cvtepi32_ps(i32_dot4(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)));
}
// The same for u in 0..127 (4-bit weights) × int8
inline F8 f8_dot_u8_i8(I8x32 u, I8x32 s) { return _mm256_cvtepi32_ps(i32_dot4(u, s)); }

// 32 activations quantised to int8: d = max|x| / 127, q = round(x / d), s = d · Σq.
inline void quantize_block(const float* v, int8_t* q, float* dx, float* sx) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), v2 = _mm256_loadu_ps(v + 16),
               v3 = _mm256_loadu_ps(v + 24);
  __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
  m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
  const float d = f8_hmax(m) / 127.f;
  const __m256 mul = _mm256_set1_ps(d > 0 ? 1.f / d : 0.f);
  __m256i i0v = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i i1v = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i i2v = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i i3v = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0v, i1v), _mm256_add_epi32(i2v, i3v));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_hadd_epi32(s4, s4);
  s4 = _mm_hadd_epi32(s4, s4);
  *dx = d;
  *sx = d * static_cast<float>(_mm_cvtsi128_si32(s4));
  i0v = _mm256_packs_epi32(i0v, i1v);
  i2v = _mm256_packs_epi32(i2v, i3v);
  i0v = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i0v, i2v), perm);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), i0v);
}

#elif defined(REDLINE_NEON)
// ---------------------------------------------------------------------------------------------------- NEON
struct F8 {
  float32x4_t lo, hi;
};
struct I8x32 {
  int8x16_t lo, hi;
};
struct W16 {
  uint16x8_t a, b;  // elements 0-7, 8-15
};

inline F8 f8_zero() { return {vdupq_n_f32(0.f), vdupq_n_f32(0.f)}; }
inline F8 f8_set1(float v) { return {vdupq_n_f32(v), vdupq_n_f32(v)}; }
inline F8 f8_load(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
inline void f8_store(float* p, F8 v) { vst1q_f32(p, v.lo), vst1q_f32(p + 4, v.hi); }
inline F8 f8_add(F8 a, F8 b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
inline F8 f8_sub(F8 a, F8 b) { return {vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)}; }
inline F8 f8_mul(F8 a, F8 b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
inline F8 f8_div(F8 a, F8 b) { return {vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)}; }
// As x86's maxps / minps, NaNs included (the second operand when the comparison fails), not NEON's FMAX.
inline F8 f8_max(F8 a, F8 b) {
  return {vbslq_f32(vcgtq_f32(a.lo, b.lo), a.lo, b.lo), vbslq_f32(vcgtq_f32(a.hi, b.hi), a.hi, b.hi)};
}
inline F8 f8_min(F8 a, F8 b) {
  return {vbslq_f32(vcltq_f32(a.lo, b.lo), a.lo, b.lo), vbslq_f32(vcltq_f32(a.hi, b.hi), a.hi, b.hi)};
}
inline F8 f8_madd(F8 a, F8 b, F8 c) { return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)}; }
inline F8 f8_nmadd(F8 a, F8 b, F8 c) { return {vfmsq_f32(c.lo, a.lo, b.lo), vfmsq_f32(c.hi, a.hi, b.hi)}; }
inline F8 f8_abs(F8 a) { return {vabsq_f32(a.lo), vabsq_f32(a.hi)}; }
inline F8 f8_neg(F8 a) { return {vnegq_f32(a.lo), vnegq_f32(a.hi)}; }
inline F8 f8_round(F8 a) { return {vrndnq_f32(a.lo), vrndnq_f32(a.hi)}; }
inline F8 f8_pow2i(F8 k) {
  const int32x4_t bias = vdupq_n_s32(127);
  return {vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(k.lo), bias), 23)),
          vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(k.hi), bias), 23))};
}
inline F8 f8_lane(F8 v, int j) { return f8_set1(j < 4 ? v.lo[j] : v.hi[j - 4]); }
inline float f8_hsum(F8 v) {
  const float32x4_t s = vaddq_f32(v.lo, v.hi);  // a_i + a_{i+4}
  const float32x4_t p = vpaddq_f32(s, s);       // s0 + s1, s2 + s3, …
  return vgetq_lane_f32(p, 0) + vgetq_lane_f32(p, 1);
}
// Lane j = the sum of v[j]'s eight lanes, for sums of integers (exact in fp32 in any order: the order is free).
inline F8 f8_sums8(const F8* v) {
  float32x4_t x[8];
  for (int j = 0; j < 8; ++j) x[j] = vpaddq_f32(v[j].lo, v[j].hi);
  const float32x4_t a = vpaddq_f32(vpaddq_f32(x[0], x[1]), vpaddq_f32(x[2], x[3]));
  const float32x4_t b = vpaddq_f32(vpaddq_f32(x[4], x[5]), vpaddq_f32(x[6], x[7]));
  return {a, b};
}
// r[i] = row i's eight values -> r[j] = the eight rows' value j (four 4x4 transposes)
inline void f8_transpose8(F8* r) {
  const auto t4 = [](float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3, float32x4_t* c) {
    const float32x4_t t0 = vtrn1q_f32(a0, a1), t1 = vtrn2q_f32(a0, a1), t2 = vtrn1q_f32(a2, a3),
                      t3 = vtrn2q_f32(a2, a3);
    const auto d = [](float32x4_t x) { return vreinterpretq_f64_f32(x); };
    c[0] = vreinterpretq_f32_f64(vtrn1q_f64(d(t0), d(t2)));
    c[1] = vreinterpretq_f32_f64(vtrn1q_f64(d(t1), d(t3)));
    c[2] = vreinterpretq_f32_f64(vtrn2q_f64(d(t0), d(t2)));
    c[3] = vreinterpretq_f32_f64(vtrn2q_f64(d(t1), d(t3)));
  };
  float32x4_t tl[4], bl[4], tr[4], br[4];  // rows 0-3 / 4-7, values 0-3 (lo) / 4-7 (hi)
  t4(r[0].lo, r[1].lo, r[2].lo, r[3].lo, tl);
  t4(r[4].lo, r[5].lo, r[6].lo, r[7].lo, bl);
  t4(r[0].hi, r[1].hi, r[2].hi, r[3].hi, tr);
  t4(r[4].hi, r[5].hi, r[6].hi, r[7].hi, br);
  for (int j = 0; j < 4; ++j) {
    r[j] = {tl[j], bl[j]};
    r[4 + j] = {tr[j], br[j]};
  }
}
inline float f8_hmax(F8 m) {
  float t[8];
  f8_store(t, m);
  float r = t[0];
  for (int i = 1; i < 8; ++i) r = t[i] > r ? t[i] : r;
  return r;
}
inline F8 f8_from_bf16(const uint16_t* p) {
  const uint16x8_t h = vld1q_u16(p);
  return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)), vreinterpretq_f32_u32(vshll_high_n_u16(h, 16))};
}
inline F8 f8_from_f16(const uint16_t* p) {
  return {vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4)))};
}
inline F8 f8_from_i8(const int8_t* p) {
  const int16x8_t h = vmovl_s8(vld1_s8(p));
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), vcvtq_f32_s32(vmovl_high_s16(h))};
}
inline float f16_to_f32(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }
inline uint16_t f32_to_f16(float v) { return vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(v))), 0); }

inline W16 w16_load(const uint16_t* p) { return {vld1q_u16(p), vld1q_u16(p + 8)}; }
inline F8 w16_lo(W16 v) {  // elements 0-3, 8-11
  return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v.a), 16)),
          vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v.b), 16))};
}
inline F8 w16_hi(W16 v) {  // elements 4-7, 12-15
  return {vreinterpretq_f32_u32(vshll_high_n_u16(v.a, 16)), vreinterpretq_f32_u32(vshll_high_n_u16(v.b, 16))};
}
inline void permute16_block(const float* x, float* out) {
  vst1q_f32(out, vld1q_f32(x));
  vst1q_f32(out + 4, vld1q_f32(x + 8));
  vst1q_f32(out + 8, vld1q_f32(x + 4));
  vst1q_f32(out + 12, vld1q_f32(x + 12));
}

inline I8x32 i8_load(const int8_t* p) { return {vld1q_s8(p), vld1q_s8(p + 16)}; }
inline I8x32 i8_nibbles(const uint8_t* p) {
  const uint8x16_t b = vld1q_u8(p);
  return {vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))), vreinterpretq_s8_u8(vshrq_n_u8(b, 4))};
}
inline int32x4_t dot4(int8x16_t a, int8x16_t b) {
#if defined(REDLINE_DOTPROD)
  return vdotq_s32(vdupq_n_s32(0), a, b);
#else
  const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));  // pairs of products 0-7
  const int32x4_t hi = vpaddlq_s16(vmull_high_s8(a, b));                        // 8-15
  return vpaddq_s32(lo, hi);                                                    // sums of four
#endif
}
inline F8 f8_dot_i8(I8x32 x, I8x32 y) { return {vcvtq_f32_s32(dot4(x.lo, y.lo)), vcvtq_f32_s32(dot4(x.hi, y.hi))}; }
inline F8 f8_dot_u8_i8(I8x32 u, I8x32 s) { return f8_dot_i8(u, s); }  // u is 0..15: as signed bytes the same

inline void quantize_block(const float* v, int8_t* q, float* dx, float* sx) {
  const F8 a = f8_load(v), b = f8_load(v + 8), c = f8_load(v + 16), e = f8_load(v + 24);
  const float d = f8_hmax(f8_max(f8_max(f8_abs(a), f8_abs(b)), f8_max(f8_abs(c), f8_abs(e)))) / 127.f;
  const float32x4_t mul = vdupq_n_f32(d > 0 ? 1.f / d : 0.f);
  int32x4_t i[8];
  for (int k = 0; k < 8; ++k) i[k] = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(v + 4 * k), mul));  // round to nearest even
  int32x4_t s = vaddq_s32(vaddq_s32(vaddq_s32(i[0], i[1]), vaddq_s32(i[2], i[3])),
                          vaddq_s32(vaddq_s32(i[4], i[5]), vaddq_s32(i[6], i[7])));
  *dx = d;
  *sx = d * static_cast<float>(vaddvq_s32(s));
  for (int k = 0; k < 2; ++k) {
    const int16x8_t h0 = vcombine_s16(vqmovn_s32(i[4 * k]), vqmovn_s32(i[4 * k + 1]));
    const int16x8_t h1 = vcombine_s16(vqmovn_s32(i[4 * k + 2]), vqmovn_s32(i[4 * k + 3]));
    vst1q_s8(q + 16 * k, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
  }
}

#else
// ---------------------------------------------------------------------------------------------------- portable
struct F8 {
  float v[8];
};
struct I8x32 {
  int8_t v[32];
};
struct W16 {
  uint16_t v[16];
};

#define REDLINE_F8_MAP(expr) \
  F8 r;                      \
  for (int i = 0; i < 8; ++i) r.v[i] = (expr);  \
  return r

inline F8 f8_zero() { REDLINE_F8_MAP(0.f); }
inline F8 f8_set1(float x) { REDLINE_F8_MAP(x); }
inline F8 f8_load(const float* p) {
  F8 r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline void f8_store(float* p, const F8& v) { std::memcpy(p, v.v, sizeof v.v); }
inline F8 f8_add(const F8& a, const F8& b) { REDLINE_F8_MAP(a.v[i] + b.v[i]); }
inline F8 f8_sub(const F8& a, const F8& b) { REDLINE_F8_MAP(a.v[i] - b.v[i]); }
inline F8 f8_mul(const F8& a, const F8& b) { REDLINE_F8_MAP(a.v[i] * b.v[i]); }
inline F8 f8_div(const F8& a, const F8& b) { REDLINE_F8_MAP(a.v[i] / b.v[i]); }
inline F8 f8_max(const F8& a, const F8& b) { REDLINE_F8_MAP(a.v[i] > b.v[i] ? a.v[i] : b.v[i]); }
inline F8 f8_min(const F8& a, const F8& b) { REDLINE_F8_MAP(a.v[i] < b.v[i] ? a.v[i] : b.v[i]); }
#if defined(REDLINE_EXACT_FMA)
inline F8 f8_madd(const F8& a, const F8& b, const F8& c) { REDLINE_F8_MAP(std::fma(a.v[i], b.v[i], c.v[i])); }
inline F8 f8_nmadd(const F8& a, const F8& b, const F8& c) { REDLINE_F8_MAP(std::fma(-a.v[i], b.v[i], c.v[i])); }
#else
inline F8 f8_madd(const F8& a, const F8& b, const F8& c) { REDLINE_F8_MAP(a.v[i] * b.v[i] + c.v[i]); }
inline F8 f8_nmadd(const F8& a, const F8& b, const F8& c) { REDLINE_F8_MAP(c.v[i] - a.v[i] * b.v[i]); }
#endif
inline F8 f8_abs(const F8& a) { REDLINE_F8_MAP(f32_from(f32_bits(a.v[i]) & 0x7FFFFFFF)); }
inline F8 f8_neg(const F8& a) { REDLINE_F8_MAP(f32_from(f32_bits(a.v[i]) ^ 0x80000000)); }
// Round to nearest even for |x| < 2^22 (all the kernels need): adding and subtracting 1.5·2^23 rounds in the FPU's
// default mode. (The sign of a zero result may differ from roundps; no kernel depends on it.)
inline float round_small(float x) {
  const float big = 12582912.f;  // not folded away: without -ffast-math, (x + big) - big is not x
  return (x + big) - big;
}
inline int32_t to_int_nearest(float x) {  // x rounded to nearest even, as an integer (|x| < 2^31)
#if defined(REDLINE_SSE2_ROUND)
  return _mm_cvtss_si32(_mm_set_ss(x));
#else
  return static_cast<int32_t>(std::nearbyint(x));
#endif
}
inline F8 f8_round(const F8& a) { REDLINE_F8_MAP(round_small(a.v[i])); }
inline F8 f8_pow2i(const F8& k) { REDLINE_F8_MAP(f32_from(static_cast<uint32_t>(static_cast<int32_t>(k.v[i]) + 127) << 23)); }
inline F8 f8_lane(const F8& v, int j) { return f8_set1(v.v[j]); }
inline float f8_hsum(const F8& a) {
  const float s0 = a.v[0] + a.v[4], s1 = a.v[1] + a.v[5], s2 = a.v[2] + a.v[6], s3 = a.v[3] + a.v[7];
  return (s0 + s1) + (s2 + s3);
}
// Lane j = the sum of v[j]'s eight lanes, for sums of integers (exact in fp32 in any order).
inline F8 f8_sums8(const F8* v) {
  F8 r;
  for (int j = 0; j < 8; ++j) r.v[j] = f8_hsum(v[j]);
  return r;
}
// r[i] = row i's eight values -> r[j] = the eight rows' value j
inline void f8_transpose8(F8* r) {
  F8 t[8];
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) t[j].v[i] = r[i].v[j];
  for (int j = 0; j < 8; ++j) r[j] = t[j];
}
inline float f8_hmax(const F8& m) {
  float r = m.v[0];
  for (int i = 1; i < 8; ++i) r = m.v[i] > r ? m.v[i] : r;
  return r;
}
inline F8 f8_from_bf16(const uint16_t* p) { REDLINE_F8_MAP(f32_from(static_cast<uint32_t>(p[i]) << 16)); }
inline float f16_to_f32(uint16_t h) { return f16_to_f32_soft(h); }
inline uint16_t f32_to_f16(float v) { return f32_to_f16_soft(v); }
inline F8 f8_from_f16(const uint16_t* p) { REDLINE_F8_MAP(f16_to_f32_soft(p[i])); }
inline F8 f8_from_i8(const int8_t* p) { REDLINE_F8_MAP(static_cast<float>(p[i])); }

inline W16 w16_load(const uint16_t* p) {
  W16 r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline F8 w16_lo(const W16& w) { REDLINE_F8_MAP(f32_from(static_cast<uint32_t>(w.v[i < 4 ? i : i + 4]) << 16)); }
inline F8 w16_hi(const W16& w) { REDLINE_F8_MAP(f32_from(static_cast<uint32_t>(w.v[i < 4 ? i + 4 : i + 8]) << 16)); }
inline void permute16_block(const float* x, float* out) {
  for (int i = 0; i < 4; ++i) out[i] = x[i], out[4 + i] = x[8 + i], out[8 + i] = x[4 + i], out[12 + i] = x[12 + i];
}
#undef REDLINE_F8_MAP

inline I8x32 i8_load(const int8_t* p) {
  I8x32 r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline I8x32 i8_nibbles(const uint8_t* p) {
  I8x32 r;
  for (int i = 0; i < 16; ++i) r.v[i] = static_cast<int8_t>(p[i] & 0x0F), r.v[16 + i] = static_cast<int8_t>(p[i] >> 4);
  return r;
}
inline F8 f8_dot_i8(const I8x32& x, const I8x32& y) {
  F8 r;
  for (int j = 0; j < 8; ++j) {
    int32_t s = 0;
    for (int i = 4 * j; i < 4 * j + 4; ++i) s += static_cast<int32_t>(x.v[i]) * y.v[i];
    r.v[j] = static_cast<float>(s);
  }
  return r;
}
inline F8 f8_dot_u8_i8(const I8x32& u, const I8x32& s) { return f8_dot_i8(u, s); }

inline void quantize_block(const float* v, int8_t* q, float* dx, float* sx) {
  float amax = 0.f;
  for (int i = 0; i < 32; ++i) {
    const float a = std::fabs(v[i]);
    amax = a > amax ? a : amax;
  }
  const float d = amax / 127.f;
  const float mul = d > 0 ? 1.f / d : 0.f;
  int32_t sum = 0;
  for (int i = 0; i < 32; ++i) {
    const int32_t r = to_int_nearest(v[i] * mul);
    sum += r;
    q[i] = static_cast<int8_t>(std::min(127, std::max(-128, r)));
  }
  *dx = d;
  *sx = d * static_cast<float>(sum);
}
#endif

// A float → half at load time (scales): the same rounding on every build.
inline float f16(uint16_t h) { return f16_to_f32(h); }

}  // namespace redline_kernels
