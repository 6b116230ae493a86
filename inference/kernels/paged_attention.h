// Attention over Redline's paged KV cache (inference/decoding/kv_cache.py), one head at a time, shared by the
// `attend` operator (cpu_kernels.cpp) and the whole-step operator (decode_step.cpp) so both compute the same.
// Pools are [pages, Hkv, page, D]; a sequence's pages are listed, in order, in its row of the page table.
#pragma once

#include "simd.h"

namespace redline_kernels {

template <typename C> inline __m256 load8(const C* p);
template <> inline __m256 load8<float>(const float* p) { return _mm256_loadu_ps(p); }
template <> inline __m256 load8<at::BFloat16>(const at::BFloat16* p) { return bf16x8(reinterpret_cast<const uint16_t*>(p)); }

template <typename C>
struct PagedPools {
  C* k;
  C* v;
  const int32_t* pages;  // [rows, max_pages]
  int64_t max_pages, Hkv, page, D;
  C* at(C* pool, int64_t row, int64_t h, int64_t t) const {
    return pool + ((static_cast<int64_t>(pages[row * max_pages + t / page]) * Hkv + h) * page + t % page) * D;
  }
};

// The rotary embedding (rotate-half convention) of one head vector x [D] at one position's cos/sin rows.
template <typename C>
inline void rotate_half(const float* x, const float* c, const float* s, int64_t D, C* out) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    out[i] = static_cast<C>(x1 * c[i] - x2 * s[i]);
    out[i + half] = static_cast<C>(x2 * c[i + half] + x1 * s[i + half]);
  }
}

// softmax(q·Kᵀ·scale)·V over positions 0..n-1 of KV head kvh of the sequence in page-table row `row`.
// `sc` is scratch for n scores. Four keys at a time (four independent sums, not one long dependency chain) and,
// for the usual head sizes (ND = D/8 of 8 or 16), the output kept in registers; each key's dot product and the
// weighted sum of values run in the same order either way.
template <typename C, int ND>
inline void attend_head_impl(const float* q, const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t n, float scale,
                             float* sc, float* out) {
  const int64_t D = ND > 0 ? ND * 8 : kv.D;
  float mx = -INFINITY;
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const C* k0 = kv.at(kv.k, row, kvh, t);
    const C* k1 = kv.at(kv.k, row, kvh, t + 1);
    const C* k2 = kv.at(kv.k, row, kvh, t + 2);
    const C* k3 = kv.at(kv.k, row, kvh, t + 3);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, load8(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, load8(k1 + d), a1);
      a2 = _mm256_fmadd_ps(qv, load8(k2 + d), a2);
      a3 = _mm256_fmadd_ps(qv, load8(k3 + d), a3);
    }
    sc[t] = hsum(a0) * scale;
    sc[t + 1] = hsum(a1) * scale;
    sc[t + 2] = hsum(a2) * scale;
    sc[t + 3] = hsum(a3) * scale;
    mx = std::max(mx, std::max(std::max(sc[t], sc[t + 1]), std::max(sc[t + 2], sc[t + 3])));
  }
  for (; t < n; ++t) {
    const C* kr = kv.at(kv.k, row, kvh, t);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(kr + d), acc);
    sc[t] = hsum(acc) * scale;
    mx = std::max(mx, sc[t]);
  }
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    sc[i] = std::exp(sc[i] - mx);
    sum += sc[i];
  }
  if constexpr (ND > 0) {
    __m256 o[ND];
    for (int i = 0; i < ND; ++i) o[i] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; ++i) {
      const C* vr = kv.at(kv.v, row, kvh, i);
      const __m256 wgt = _mm256_set1_ps(sc[i] / sum);
      for (int j = 0; j < ND; ++j) o[j] = _mm256_fmadd_ps(wgt, load8(vr + 8 * j), o[j]);
    }
    for (int j = 0; j < ND; ++j) _mm256_storeu_ps(out + 8 * j, o[j]);
  } else {
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_setzero_ps());
    for (int64_t i = 0; i < n; ++i) {
      const C* vr = kv.at(kv.v, row, kvh, i);
      const __m256 wgt = _mm256_set1_ps(sc[i] / sum);
      for (int64_t d = 0; d < D; d += 8)
        _mm256_storeu_ps(out + d, _mm256_fmadd_ps(wgt, load8(vr + d), _mm256_loadu_ps(out + d)));
    }
  }
}

template <typename C>
inline void attend_head(const float* q, const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t n, float scale,
                        float* sc, float* out) {
  if (kv.D == 64) return attend_head_impl<C, 8>(q, kv, row, kvh, n, scale, sc, out);
  if (kv.D == 128) return attend_head_impl<C, 16>(q, kv, row, kvh, n, scale, sc, out);
  attend_head_impl<C, 0>(q, kv, row, kvh, n, scale, sc, out);
}

}  // namespace redline_kernels
