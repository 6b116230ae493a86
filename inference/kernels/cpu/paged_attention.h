// Attention over Redline's paged KV cache (inference/decoding/kv_cache.py), one head at a time, shared by the
// `attend` operator (cpu_kernels.cpp) and the whole-step operator (decode_step.cpp) so both compute the same.
// Pools are [pages, Hkv, page, D]; a sequence's pages are listed, in order, in its row of the page table.
#pragma once

#include "simd.h"

namespace redline_kernels {

template <typename C> inline F8 load8(const C* p);
template <> inline F8 load8<float>(const float* p) { return f8_load(p); }
template <> inline F8 load8<bf16>(const bf16* p) { return f8_from_bf16(reinterpret_cast<const uint16_t*>(p)); }

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

// s[i] = e^(s[i] − max s) for n scores, eight at a time (a scalar exp per score was most of a long context's
// attention: 460,000 of them per token on the starter at 1,700 positions); returns their sum.
inline float softmax_unnormalised(float* s, int64_t n, float* max_out = nullptr) {
  F8 mv = f8_set1(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mv = f8_max(mv, f8_load(s + i));
  float mx = f8_hmax(mv);
  for (; i < n; ++i) mx = std::max(mx, s[i]);
  const F8 mxv = f8_set1(mx);
  F8 sv = f8_zero();
  for (i = 0; i + 8 <= n; i += 8) {
    const F8 e = exp8(f8_sub(f8_load(s + i), mxv));
    f8_store(s + i, e);
    sv = f8_add(sv, e);
  }
  float sum = f8_hsum(sv);
  for (; i < n; ++i) {
    s[i] = exp1(s[i] - mx);
    sum += s[i];
  }
  if (max_out) *max_out = mx;
  return sum;
}

// softmax(q·Kᵀ·scale)·V over positions 0..n-1 of KV head kvh of the sequence in page-table row `row`.
// `sc` is scratch for n scores. Four keys at a time (four independent sums, not one long dependency chain) and,
// for the usual head sizes (ND = D/8 of 8 or 16), the output kept in registers; each key's dot product and the
// weighted sum of values run in the same order either way.
template <typename C, int ND>
inline void attend_head_impl(const float* q, const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t n, float scale,
                             float* sc, float* out) {
  const int64_t D = ND > 0 ? ND * 8 : kv.D;
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const C* k0 = kv.at(kv.k, row, kvh, t);
    const C* k1 = kv.at(kv.k, row, kvh, t + 1);
    const C* k2 = kv.at(kv.k, row, kvh, t + 2);
    const C* k3 = kv.at(kv.k, row, kvh, t + 3);
    F8 a0 = f8_zero(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < D; d += 8) {
      const F8 qv = f8_load(q + d);
      a0 = f8_madd(qv, load8(k0 + d), a0);
      a1 = f8_madd(qv, load8(k1 + d), a1);
      a2 = f8_madd(qv, load8(k2 + d), a2);
      a3 = f8_madd(qv, load8(k3 + d), a3);
    }
    sc[t] = f8_hsum(a0) * scale;
    sc[t + 1] = f8_hsum(a1) * scale;
    sc[t + 2] = f8_hsum(a2) * scale;
    sc[t + 3] = f8_hsum(a3) * scale;
  }
  for (; t < n; ++t) {
    const C* kr = kv.at(kv.k, row, kvh, t);
    F8 acc = f8_zero();
    for (int64_t d = 0; d < D; d += 8) acc = f8_madd(f8_load(q + d), load8(kr + d), acc);
    sc[t] = f8_hsum(acc) * scale;
  }
  const float sum = softmax_unnormalised(sc, n);
  if constexpr (ND > 0) {
    F8 o[ND];
    for (int i = 0; i < ND; ++i) o[i] = f8_zero();
    for (int64_t i = 0; i < n; ++i) {
      const C* vr = kv.at(kv.v, row, kvh, i);
      const F8 wgt = f8_set1(sc[i] / sum);
      for (int j = 0; j < ND; ++j) o[j] = f8_madd(wgt, load8(vr + 8 * j), o[j]);
    }
    for (int j = 0; j < ND; ++j) f8_store(out + 8 * j, o[j]);
  } else {
    for (int64_t d = 0; d < D; d += 8) f8_store(out + d, f8_zero());
    for (int64_t i = 0; i < n; ++i) {
      const C* vr = kv.at(kv.v, row, kvh, i);
      const F8 wgt = f8_set1(sc[i] / sum);
      for (int64_t d = 0; d < D; d += 8) f8_store(out + d, f8_madd(wgt, load8(vr + d), f8_load(out + d)));
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

// Each of the G heads' n scores (sc, [G, n]) into softmax weights: normalised, or, for a part of the keys (`part`:
// [G][max, sum, D values]), unnormalised with its max and sum for the merge. Each weight is divided by the sum once,
// eight at a time (the same correctly rounded quotients as one at a time), not once per pass over the values and
// head: a scalar division per key, head and pass was a tenth of a long context's attention (the starter at 1,716
// positions: 54 -> 49 us a layer).
template <int G, int64_t D>
inline void normalise_scores(float* sc, int64_t n, float* part) {
  for (int g = 0; g < G; ++g) {
    float mx;
    const float sum = softmax_unnormalised(sc + g * n, n, &mx);
    if (part) {
      part[g * (D + 2)] = mx, part[g * (D + 2) + 1] = sum;
      continue;
    }
    const F8 sv = f8_set1(sum);
    float* w = sc + g * n;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) f8_store(w + i, f8_div(f8_load(w + i), sv));
    for (; i < n; ++i) w[i] /= sum;
  }
}

// The G query heads that share KV head kvh (grouped-query attention), together: each key and value is read and
// converted once for the group instead of once per head — at long contexts attention reads far more cache than
// weights (measured on the starter at 1,700 positions: 6.4 of a 16.9 ms q8 step before this). q and out are the
// group's heads, contiguous [G, D]; sc is scratch for G·n scores. Every head's sums run in the same order as in
// attend_head, so the results are the same bit for bit.
#if defined(REDLINE_AVX512_VNNI)
// avx512-vnni: the same sums in 512-bit registers. The scores take two keys to a register (lanes 0-7 key t, 8-15 key
// t+1, the head's query in both halves); the weighted sum of values sixteen outputs to a register (two of
// attend_group_impl's eight-lane vectors side by side). Each lane multiplies and adds what the 256-bit code does, in
// its order: the same bits, half the instructions (at 1,700 positions attention was 45 % of the starter's q8 step).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 load8x2(const float* a, const float* b) {
  return _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(a))), _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}
inline __m512 load8x2(const bf16* a, const bf16* b) {
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The scores of keys lo..lo+n-1 two (and, for groups of up to four heads, eight) at a time; returns how many keys
// it scored (all but an odd last one), which the 256-bit code scores one by one.
template <typename C, int64_t D, int G>
inline int64_t wide_scores(const float* q, const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t lo, int64_t n,
                           float scale, float* sc) {
  int64_t t = 0;
  if constexpr (G <= 4) {  // eight keys at a time, their sums reduced together (sum8)
    for (; t + 8 <= n; t += 8) {
      __m512 a[4][G];
      for (int p = 0; p < 4; ++p)
        for (int g = 0; g < G; ++g) a[p][g] = _mm512_setzero_ps();
      const C* kp[8];
      for (int k = 0; k < 8; ++k) kp[k] = kv.at(kv.k, row, kvh, lo + t + k);
      for (int64_t d = 0; d < D; d += 8) {
        __m512 qv[G];
        for (int g = 0; g < G; ++g) qv[g] = w2_load(q + g * D + d);
        for (int p = 0; p < 4; ++p) {
          const __m512 kk = load8x2(kp[2 * p] + d, kp[2 * p + 1] + d);
          for (int g = 0; g < G; ++g) a[p][g] = _mm512_fmadd_ps(qv[g], kk, a[p][g]);
        }
      }
      const __m256 sv = _mm256_set1_ps(scale);
      for (int g = 0; g < G; ++g)
        _mm256_storeu_ps(sc + g * n + t, _mm256_mul_ps(sum8(a[0][g], a[1][g], a[2][g], a[3][g]), sv));
    }
  }
  for (; t + 2 <= n; t += 2) {
    const C* k0 = kv.at(kv.k, row, kvh, lo + t);
    const C* k1 = kv.at(kv.k, row, kvh, lo + t + 1);
    __m512 a[G];
    for (int g = 0; g < G; ++g) a[g] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      const __m512 kk = load8x2(k0 + d, k1 + d);
      for (int g = 0; g < G; ++g) a[g] = _mm512_fmadd_ps(w2_load(q + g * D + d), kk, a[g]);
    }
    for (int g = 0; g < G; ++g) sc[g * n + t] = hsum_lo(a[g]) * scale, sc[g * n + t + 1] = hsum_hi(a[g]) * scale;
  }
  return t;
}

// The weighted sum of the values of keys lo..lo+n-1 (weights in sc), sixteen outputs to a register; written to out,
// or to part (unnormalised) as the 256-bit code writes them.
template <typename C, int ND, int G>
inline void wide_values(const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t lo, int64_t n, const float* sc,
                        float* out, float* part) {
  constexpr int64_t D = ND * 8;
  constexpr int NW = ND / 2;                                         // 512-bit vectors of a head's output
  constexpr int PW = G * NW <= 16 ? NW : (16 / G > 0 ? 16 / G : 1);  // of them per pass: G·PW accumulators
  for (int64_t w0 = 0; w0 < NW; w0 += PW) {
    __m512 o[G][PW];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < PW; ++j) o[g][j] = _mm512_setzero_ps();
    const int pw = static_cast<int>(std::min<int64_t>(PW, NW - w0));
    for (int64_t i = 0; i < n; ++i) {
      const C* vr = kv.at(kv.v, row, kvh, lo + i) + 16 * w0;
      __m512 wgt[G];
      for (int g = 0; g < G; ++g) wgt[g] = _mm512_set1_ps(sc[g * n + i]);
      for (int j = 0; j < pw; ++j) {
        const __m512 vv = load16(vr + 16 * j);
        for (int g = 0; g < G; ++g) o[g][j] = _mm512_fmadd_ps(wgt[g], vv, o[g][j]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < pw; ++j)
        _mm512_storeu_ps(part ? part + g * (D + 2) + 2 + 16 * (w0 + j) : out + g * D + 16 * (w0 + j), o[g][j]);
  }
}
#endif

template <typename C, int ND, int G>
inline void attend_group_impl(const float* q, const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t lo,
                              int64_t hi, float scale, float* sc, float* out, float* part) {
  constexpr int64_t D = ND * 8;
  const int64_t n = hi - lo;
  constexpr int CW = G == 1 ? 8 : G <= 3 ? 4 : G <= 6 ? 2 : 1;  // output vectors per pass: G·CW accumulators
  constexpr int PASS = CW < ND ? CW : ND;
  int64_t t = 0;
#if defined(REDLINE_AVX512_VNNI)
  if (wide_tiles()) t = wide_scores<C, D, G>(q, kv, row, kvh, lo, n, scale, sc);
#endif
  for (; t + 2 <= n; t += 2) {
    const C* k0 = kv.at(kv.k, row, kvh, lo + t);
    const C* k1 = kv.at(kv.k, row, kvh, lo + t + 1);
    F8 a0[G], a1[G];
    for (int g = 0; g < G; ++g) a0[g] = a1[g] = f8_zero();
    for (int64_t d = 0; d < D; d += 8) {
      const F8 x0 = load8(k0 + d), x1 = load8(k1 + d);
      for (int g = 0; g < G; ++g) {
        const F8 qv = f8_load(q + g * D + d);
        a0[g] = f8_madd(qv, x0, a0[g]);
        a1[g] = f8_madd(qv, x1, a1[g]);
      }
    }
    for (int g = 0; g < G; ++g) {
      sc[g * n + t] = f8_hsum(a0[g]) * scale;
      sc[g * n + t + 1] = f8_hsum(a1[g]) * scale;
    }
  }
  for (; t < n; ++t) {
    const C* kr = kv.at(kv.k, row, kvh, lo + t);
    for (int g = 0; g < G; ++g) {
      F8 acc = f8_zero();
      for (int64_t d = 0; d < D; d += 8) acc = f8_madd(f8_load(q + g * D + d), load8(kr + d), acc);
      sc[g * n + t] = f8_hsum(acc) * scale;
    }
  }
  normalise_scores<G, D>(sc, n, part);
#if defined(REDLINE_AVX512_VNNI)
  if (wide_tiles()) return wide_values<C, ND, G>(kv, row, kvh, lo, n, sc, out, part);
#endif
  for (int64_t d0 = 0; d0 < D; d0 += 8 * PASS) {
    F8 o[G][PASS];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < PASS; ++j) o[g][j] = f8_zero();
    for (int64_t i = 0; i < n; ++i) {
      const C* vr = kv.at(kv.v, row, kvh, lo + i) + d0;
      F8 wgt[G];
      for (int g = 0; g < G; ++g) wgt[g] = f8_set1(sc[g * n + i]);
      for (int j = 0; j < PASS; ++j) {
        const F8 vv = load8(vr + 8 * j);
        for (int g = 0; g < G; ++g) o[g][j] = f8_madd(wgt[g], vv, o[g][j]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < PASS; ++j)
        f8_store(part ? part + g * (D + 2) + 2 + d0 + 8 * j : out + g * D + d0 + 8 * j, o[g][j]);
  }
}

template <typename C, int ND>
inline bool attend_group_nd(int64_t G, const float* q, const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t lo,
                            int64_t hi, float scale, float* sc, float* out, float* part) {
  switch (G) {
    case 1: attend_group_impl<C, ND, 1>(q, kv, row, kvh, lo, hi, scale, sc, out, part); return true;
    case 2: attend_group_impl<C, ND, 2>(q, kv, row, kvh, lo, hi, scale, sc, out, part); return true;
    case 3: attend_group_impl<C, ND, 3>(q, kv, row, kvh, lo, hi, scale, sc, out, part); return true;
    case 4: attend_group_impl<C, ND, 4>(q, kv, row, kvh, lo, hi, scale, sc, out, part); return true;
    case 5: attend_group_impl<C, ND, 5>(q, kv, row, kvh, lo, hi, scale, sc, out, part); return true;
    case 6: attend_group_impl<C, ND, 6>(q, kv, row, kvh, lo, hi, scale, sc, out, part); return true;
    case 7: attend_group_impl<C, ND, 7>(q, kv, row, kvh, lo, hi, scale, sc, out, part); return true;
    case 8: attend_group_impl<C, ND, 8>(q, kv, row, kvh, lo, hi, scale, sc, out, part); return true;
    default: return false;
  }
}

// Attention for the G heads of one KV head; other group or head sizes go head by head (attend_head).
template <typename C>
inline void attend_group(int64_t G, const float* q, const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t n,
                         float scale, float* sc, float* out) {
  if (kv.D == 64 && attend_group_nd<C, 8>(G, q, kv, row, kvh, 0, n, scale, sc, out, nullptr)) return;
  if (kv.D == 128 && attend_group_nd<C, 16>(G, q, kv, row, kvh, 0, n, scale, sc, out, nullptr)) return;
  for (int64_t g = 0; g < G; ++g) attend_head(q + g * kv.D, kv, row, kvh, n, scale, sc, out + g * kv.D);
}

// Long contexts in parts (as flash-decoding does): keys lo..hi of the group, written unnormalised to `part`
// ([G][max, sum, D values]); merge_parts combines a head's parts. Only where attend_group_nd runs (splittable()).
inline bool splittable(int64_t G, int64_t D) { return (D == 64 || D == 128) && G >= 1 && G <= 8; }

template <typename C>
inline void attend_group_part(int64_t G, const float* q, const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t lo,
                              int64_t hi, float scale, float* sc, float* part) {
  if (kv.D == 64) attend_group_nd<C, 8>(G, q, kv, row, kvh, lo, hi, scale, sc, nullptr, part);
  else attend_group_nd<C, 16>(G, q, kv, row, kvh, lo, hi, scale, sc, nullptr, part);
}

// out [D] = Σ_s e^(m_s − M)·o_s / Σ_s e^(m_s − M)·l_s over a head's S parts, `stride` floats apart.
inline void merge_parts(const float* parts, int64_t S, int64_t stride, int64_t D, float* out) {
  float M = -INFINITY;
  for (int64_t s = 0; s < S; ++s) M = std::max(M, parts[s * stride]);
  float L = 0.f;
  for (int64_t d = 0; d < D; d += 8) f8_store(out + d, f8_zero());
  for (int64_t s = 0; s < S; ++s) {
    const float* p = parts + s * stride;
    const float w = exp1(p[0] - M);
    L += w * p[1];
    const F8 wv = f8_set1(w);
    for (int64_t d = 0; d < D; d += 8) f8_store(out + d, f8_madd(wv, f8_load(p + 2 + d), f8_load(out + d)));
  }
  const F8 inv = f8_set1(1.f / L);
  for (int64_t d = 0; d < D; d += 8) f8_store(out + d, f8_mul(f8_load(out + d), inv));
}

}  // namespace redline_kernels
