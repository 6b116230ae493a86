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
// `sc` is scratch for n scores.
template <typename C>
inline void attend_head(const float* q, const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t n, float scale,
                        float* sc, float* out) {
  const int64_t D = kv.D;
  float mx = -INFINITY;
  for (int64_t t = 0; t < n; ++t) {
    const C* kr = kv.at(kv.k, row, kvh, t);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(kr + d), acc);
    sc[t] = hsum(acc) * scale;
    mx = std::max(mx, sc[t]);
  }
  float sum = 0.f;
  for (int64_t t = 0; t < n; ++t) {
    sc[t] = std::exp(sc[t] - mx);
    sum += sc[t];
  }
  for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_setzero_ps());
  for (int64_t t = 0; t < n; ++t) {
    const C* vr = kv.at(kv.v, row, kvh, t);
    const __m256 wgt = _mm256_set1_ps(sc[t] / sum);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(out + d, _mm256_fmadd_ps(wgt, load8(vr + d), _mm256_loadu_ps(out + d)));
  }
}

}  // namespace redline_kernels
