// Building blocks shared by Redline's CPU kernels (cpu_kernels.cpp: one operator per call; decode_step.cpp: a whole
// decode step in one call): AVX2 loads and reductions, the int8 activation quantiser, the block-quantised and
// bf16 row products. Header-only and inline, so each translation unit inlines them into its own loops.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace redline_kernels {

constexpr int64_t BLOCK = 32;

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, lo);
  return _mm_cvtss_f32(_mm_add_ss(lo, sh));
}

inline __m256 bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float f16(uint16_t h) { return _cvtsh_ss(h); }

// -- activations quantised per block of 32: q int8, d = max|x| / 127, s = d * sum(q) -------------------
inline void quantize_block(const float* v, int8_t* q, float* dx, float* sx) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), v2 = _mm256_loadu_ps(v + 16),
               v3 = _mm256_loadu_ps(v + 24);
  __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
  m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
  __m128 mm = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
  mm = _mm_max_ps(mm, _mm_movehl_ps(mm, mm));
  mm = _mm_max_ss(mm, _mm_movehdup_ps(mm));
  const float d = _mm_cvtss_f32(mm) / 127.f;
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

inline void quantize_rows(const float* x, int64_t T, int64_t K, int8_t* qx, float* dx, float* sx) {
  at::parallel_for(0, T * (K / BLOCK), 64, [&](int64_t i0, int64_t i1) {
    // rows are contiguous, so block i of the whole matrix
    for (int64_t i = i0; i < i1; ++i) quantize_block(x + i * BLOCK, qx + i * BLOCK, dx + i, sx + i);
  });
}

// -- between the products: one row at a time --------------------------------------------------------
inline void rms_norm_row(const float* x, const float* w, float eps, int64_t H, float* y) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < H; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  const __m256 r = _mm256_set1_ps(1.f / std::sqrt(hsum(acc) / H + eps));
  for (int64_t i = 0; i < H; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), r)));
}

inline void silu_mul_span(const float* gate, const float* up, int64_t n, float* y) {  // y = silu(gate) * up
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

inline __m256 dot_i8(__m256i x, __m256i y) {  // 32 int8 × int8 products, summed in pairs, as 8 floats
  const __m256i dot = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)));
}

inline __m256 dot_u8_i8(__m256i u, __m256i s) {  // uint8 (0..15) × int8
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

inline __m256i nibbles(const uint8_t* p) {  // 16 bytes → 32 values 0..15: low nibbles, then high nibbles
  const __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1),
                          _mm256_set1_epi8(0x0F));
}

// R rows of block-quantised weights against one activation row. BITS 8: w int8 [R, K]; BITS 4: w uint8
// [R, K/2], symmetric (q - 8) without mins, asymmetric (scale·q + min) with them. Scales are converted
// eight blocks at a time.
template <int BITS, bool ASYM, int R>
inline void block_rows(const void* wv, int64_t wstride, const uint16_t* sc, const uint16_t* mn, int64_t nb,
                       const int8_t* qx, const float* dx, const float* sx, float* y) {
  __m256 acc[R], macc[R];
  for (int r = 0; r < R; ++r) acc[r] = macc[r] = _mm256_setzero_ps();
  float tail[R] = {};
  const auto row_dot = [&](int r, int64_t b, __m256i q) -> __m256 {
    if (BITS == 8) {
      const int8_t* w = static_cast<const int8_t*>(wv) + r * wstride + b * BLOCK;
      return dot_i8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), q);
    }
    const __m256i u = nibbles(static_cast<const uint8_t*>(wv) + r * wstride + b * (BLOCK / 2));
    return ASYM ? dot_u8_i8(u, q) : dot_i8(_mm256_sub_epi8(u, _mm256_set1_epi8(8)), q);
  };
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    const __m256 dxv = _mm256_loadu_ps(dx + b);
    __m256 d[R];
    for (int r = 0; r < R; ++r) {
      d[r] = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + r * nb + b))), dxv);
      if (ASYM)
        macc[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + r * nb + b))),
                                  _mm256_loadu_ps(sx + b), macc[r]);
    }
    for (int j = 0; j < 8; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + (b + j) * BLOCK));
      const __m256i idx = _mm256_set1_epi32(j);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(d[r], idx), row_dot(r, b + j, q), acc[r]);
    }
  }
  for (; b < nb; ++b) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + b * BLOCK));
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(f16(sc[r * nb + b]) * dx[b]), row_dot(r, b, q), acc[r]);
      if (ASYM) tail[r] += f16(mn[r * nb + b]) * sx[b];
    }
  }
  for (int r = 0; r < R; ++r) y[r] = hsum(acc[r]) + (ASYM ? hsum(macc[r]) + tail[r] : 0.f);
}

// Up to four activation rows (TT) share each converted weight vector; two weight rows at a time.
template <int TT>
inline void bf16_rows(const uint16_t* w0, const uint16_t* w1, const float* x, int64_t K, float* y0, float* y1,
                      int64_t stride0, int64_t stride1) {
  __m256 a0[TT], a1[TT];
  for (int t = 0; t < TT; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 wa = bf16x8(w0 + k), wb = bf16x8(w1 + k);
    for (int t = 0; t < TT; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * K + k);
      a0[t] = _mm256_fmadd_ps(wa, xv, a0[t]);
      a1[t] = _mm256_fmadd_ps(wb, xv, a1[t]);
    }
  }
  for (int t = 0; t < TT; ++t) {
    y0[t * stride0] = hsum(a0[t]);
    y1[t * stride1] = hsum(a1[t]);
  }
}


}  // namespace redline_kernels
