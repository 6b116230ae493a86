// Attention over Redline's paged KV cache (inference/decoding/kv_cache.py), one head at a time, shared by the
// `attend` operator (cpu_kernels.cpp) and the whole-step operator (decode_step.cpp) so both compute the same.
// Pools are [pages, Hkv, page, D]; a sequence's pages are listed, in order, in its row of the page table.
//
// The cache holds fp32, bf16 or 8 bits (C = int8_t, `--kv q8`): then each token's row of a head is D int8 and its
// fp16 scale after them (D + 2 bytes: the pool is [pages, Hkv, page, D + 2] int8; kernels/kv_quant.py is the same
// layout in torch). One scale per token and head, not GGUF's per 32 values, because it factors out of both sums
// attention does: a key's score is scale·Σ q·k_int8 (one multiply per key, after the dot product) and a value's
// weight becomes p·scale (one multiply per key, before the weighted sum), so the inner loops are the bf16 ones with
// an int8 load; per-32 blocks would need a multiply per block inside each. The row costs (D + 2) / 2D of bf16's:
// 0.516 for D = 64, 0.508 for D = 128.
#pragma once

#include <type_traits>

#include "simd.h"

namespace redline_kernels {

template <typename C> inline F8 load8(const C* p);
template <> inline F8 load8<float>(const float* p) { return f8_load(p); }
template <> inline F8 load8<bf16>(const bf16* p) { return f8_from_bf16(reinterpret_cast<const uint16_t*>(p)); }
template <> inline F8 load8<int8_t>(const int8_t* p) { return f8_from_i8(p); }

template <typename C> constexpr bool is_q8 = std::is_same_v<C, int8_t>;
// Elements of one token's row of one head: D, or D int8 and their fp16 scale.
template <typename C> inline int64_t row_elems(int64_t D) { return is_q8<C> ? D + 2 : D; }
// The factor a row's values are multiplied by: 1 (exact, so fp32 and bf16 keep their bits), or its scale.
template <typename C> inline float row_scale(const C* row, int64_t D) {
  if constexpr (is_q8<C>) {
    uint16_t h;
    std::memcpy(&h, row + D, 2);
    return f16_to_f32(h);
  } else {
    return 1.f;
  }
}

// One token's row of one head (x [D] fp32) into the cache: converted, or quantised to int8 with the scale
// max|x| / 127 rounded to fp16 first (each value then within half a step of that scale; kv_quant.py rounds the same).
template <typename C> inline void store_row(const float* x, int64_t D, C* out) {
  if constexpr (is_q8<C>) {
    float amax = 0.f;
    for (int64_t i = 0; i < D; ++i) amax = std::max(amax, std::fabs(x[i]));
    const uint16_t h = f32_to_f16(std::min(amax / 127.f, 65504.f));
    const float d = f16_to_f32(h), inv = d > 0.f ? 1.f / d : 0.f;
    for (int64_t i = 0; i < D; ++i)
      out[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, std::nearbyint(x[i] * inv))));
    std::memcpy(out + D, &h, 2);
  } else {
    for (int64_t i = 0; i < D; ++i) out[i] = static_cast<C>(x[i]);
  }
}

template <typename C>
struct PagedPools {
  C* k;
  C* v;
  const int32_t* pages;  // [rows, max_pages]
  int64_t max_pages, Hkv, page, D;
  C* at(C* pool, int64_t row, int64_t h, int64_t t) const {
    // Redline's pages are 64 positions (kv_cache.PAGE_TOKENS): a shift and a mask for them, where a page size known
    // only at run time took two 64-bit divisions per key and pass.
    const uint64_t u = static_cast<uint64_t>(t);
    const int64_t p = page == 64 ? static_cast<int64_t>(u / 64) : t / page;
    const int64_t o = page == 64 ? static_cast<int64_t>(u % 64) : t % page;
    return pool + ((static_cast<int64_t>(pages[row * max_pages + p]) * Hkv + h) * page + o) * row_elems<C>(D);
  }
};

// The value rows of eight keys whose key rows the scores are reading, asked for now, so the values' pass after the
// softmax finds them in cache: a value row is at its key row's place in the other pool. Without it perf put 40 % of
// the values' pass (the starter at 4,000 positions) on the load of each row's first bytes. An asm prefetch, which
// the compiler keeps: GCC 12 deleted __builtin_prefetch here (an inline template whose only effect is prefetches).
inline void prefetch_kept(const char* p) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  asm volatile("prefetcht0 %0" : : "m"(*p));
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
  asm volatile("prfm pldl1keep, %0" : : "Q"(*p));
#else
  prefetch(p);
#endif
}
template <typename C>
inline void prefetch_values(const PagedPools<C>& kv, const C* const* kp) {
  const std::ptrdiff_t to_v = kv.v - kv.k;
  const int64_t last = row_elems<C>(kv.D) * static_cast<int64_t>(sizeof(C)) - 1;
  for (int k = 0; k < 8; ++k) {
    const char* p = reinterpret_cast<const char*>(kp[k] + to_v);
    prefetch_kept(p);
    if (last >= 64) prefetch_kept(p + 64);  // rows of up to 192 bytes: their three lines
    if (last >= 128) prefetch_kept(p + 128);
    prefetch_kept(p + last);
  }
}

// Key rows t..t+7 asked for ahead of the scores (KEYS_AHEAD rows on): a head's page is a few KB of rows and the next
// page is elsewhere, where the hardware's prefetcher does not follow; the scores then waited on each page's first
// rows (perf, the starter at 4,000 positions). Eight rows of one page are one span of lines.
constexpr int64_t KEYS_AHEAD = 32;
template <typename C>
inline void prefetch_keys(const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t t, int64_t end) {
  if (t + 8 > end) return;
  const int64_t bytes = row_elems<C>(kv.D) * static_cast<int64_t>(sizeof(C));
  const char* a = reinterpret_cast<const char*>(kv.at(kv.k, row, kvh, t));
  const char* b = reinterpret_cast<const char*>(kv.at(kv.k, row, kvh, t + 7));
  if (b == a + 7 * bytes) {
    for (int64_t o = 0; o < 8 * bytes; o += 64) prefetch_kept(a + o);
    prefetch_kept(a + 8 * bytes - 1);
    return;
  }
  for (int64_t k = 0; k < 8; ++k) {
    const char* p = reinterpret_cast<const char*>(kv.at(kv.k, row, kvh, t + k));
    prefetch_kept(p);
    prefetch_kept(p + bytes - 1);
  }
}

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

// A key rotated and stored in the cache (the largest head this supports in 8 bits: 1,024, checked by the callers).
template <typename C>
inline void store_key(const float* x, const float* c, const float* s, int64_t D, C* out) {
  if constexpr (is_q8<C>) {
    float tmp[1024];
    rotate_half(x, c, s, D, tmp);
    store_row(tmp, D, out);
  } else {
    rotate_half(x, c, s, D, out);
  }
}

// 8-bit rows: the scores of keys lo..lo+n-1 (sc [G, n]) times their keys' scales, and after the softmax the weights
// times their values' scales (the weights' sum stays the softmax's). Nothing for fp32 and bf16.
template <typename C>
inline void scale_rows(const PagedPools<C>& kv, C* pool, int64_t row, int64_t kvh, int64_t lo, int64_t n,
                       int64_t G, float* sc) {
  if constexpr (is_q8<C>) {
    for (int64_t t = 0; t < n; ++t) {
      const float f = row_scale(kv.at(pool, row, kvh, lo + t), kv.D);
      for (int64_t g = 0; g < G; ++g) sc[g * n + t] *= f;
    }
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
  scale_rows(kv, kv.k, row, kvh, 0, n, 1, sc);
  const float sum = softmax_unnormalised(sc, n);
  scale_rows(kv, kv.v, row, kvh, 0, n, 1, sc);
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
inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 load8x2(const int8_t* a, const int8_t* b) {
  const __m128i h = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                       _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(h));
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
      prefetch_values(kv, kp);
      prefetch_keys(kv, row, kvh, lo + t + KEYS_AHEAD, lo + n);
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
      const C* vrow = kv.at(kv.v, row, kvh, lo + i);
      const C* vr = vrow + 16 * w0;
      const float f = row_scale(vrow, D);  // 8-bit values: the weight times the row's scale (else 1, exactly)
      __m512 wgt[G];
      for (int g = 0; g < G; ++g) wgt[g] = _mm512_set1_ps(sc[g * n + i] * f);
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

// -- 8-bit keys: scores from integer dot products ------------------------------------------------------------------
// With an 8-bit cache the query heads are quantised too (per head: max|q| / 127, not rounded to fp16), and a key's
// score is (Σ q_int8·k_int8) · k_scale · (q_scale · 1/√D): the integer sum is exact on every build (vpdpbusd,
// maddubs, NEON's dot products or plain C), so every build gives the same scores. Converting each key to floats
// cost as much as reading bf16 (attention at 4,000 positions on the starter was 8.4 ms of a 16.6 ms step with either
// cache): the int8 products take a quarter of the instructions. (What llama.cpp does for q8_0 keys, too.)
inline float quantise_query(const float* x, int64_t D, int8_t* out) {
  float amax = 0.f;
  for (int64_t i = 0; i < D; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
  for (int64_t i = 0; i < D; ++i)
    out[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, std::nearbyint(x[i] * inv))));
  return d;
}

inline F8 key_scales8(const int8_t* const* kp, int64_t D) {
  alignas(32) float s[8];
  for (int k = 0; k < 8; ++k) s[k] = row_scale(kp[k], D);
  return f8_load(s);
}

#if defined(REDLINE_AVX512_VNNI)
// Eight keys at a time in 512-bit registers: each key's bytes offset to unsigned once (k + 128, as bytes k ^ 0x80,
// shared by the group's heads) and one vpdpbusd per 64 bytes and head, started from −128·Σq (the offset's share,
// once per head): Σ (k + 128)·q − 128·Σq = Σ k·q, the integers f8_dot_i8 gives. Returns how many keys it scored.
template <int64_t D, int G>
inline int64_t q8_wide_scores(const int8_t* qi, const float* qs, const PagedPools<int8_t>& kv, int64_t row,
                              int64_t kvh, int64_t lo, int64_t n, float* sc) {
  constexpr int NZ = D / 64;
  static_assert(D % 64 == 0, "512-bit rows of 64 bytes");
  const __m512i off = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i qv[G][NZ], start[G];
  for (int g = 0; g < G; ++g) {
    start[g] = _mm512_setzero_si512();
    for (int z = 0; z < NZ; ++z) {
      qv[g][z] = _mm512_loadu_si512(qi + g * D + 64 * z);
      start[g] = _mm512_sub_epi32(start[g], _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, qv[g][z]));
    }
  }
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const int8_t* kp[8];
    __m512i u[8][NZ];
    for (int k = 0; k < 8; ++k) {
      kp[k] = kv.at(kv.k, row, kvh, lo + t + k);
      for (int z = 0; z < NZ; ++z) u[k][z] = _mm512_xor_si512(_mm512_loadu_si512(kp[k] + 64 * z), off);
    }
    prefetch_values(kv, kp);
    prefetch_keys(kv, row, kvh, lo + t + KEYS_AHEAD, lo + n);
    const F8 ks = key_scales8(kp, D);
    for (int g = 0; g < G; ++g) {
      F8 acc[8];
      for (int k = 0; k < 8; ++k) {
        __m512i a = start[g];
        for (int z = 0; z < NZ; ++z) a = _mm512_dpbusd_epi32(a, u[k][z], qv[g][z]);
        const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
        acc[k] = _mm256_cvtepi32_ps(h);
      }
      f8_store(sc + g * n + t, f8_mul(f8_mul(f8_sums8(acc), ks), f8_set1(qs[g])));
    }
  }
  return t;
}
#endif

// The scores of keys lo..lo+n-1 for the G heads of q (fp32 [G, D]) into sc [G, n], key and query scales applied.
template <int ND, int G>
inline void q8_scores(const float* q, const PagedPools<int8_t>& kv, int64_t row, int64_t kvh, int64_t lo, int64_t n,
                      float scale, float* sc) {
  constexpr int64_t D = ND * 8;
  alignas(64) int8_t qi[G * D];
  float qs[G];
  for (int g = 0; g < G; ++g) qs[g] = quantise_query(q + g * D, D, qi + g * D) * scale;
  int64_t t = 0;
#if defined(REDLINE_AVX512_VNNI)
  if constexpr (D % 64 == 0)
    if (wide_tiles()) t = q8_wide_scores<D, G>(qi, qs, kv, row, kvh, lo, n, sc);
#endif
  for (; t + 8 <= n; t += 8) {
    const int8_t* kp[8];
    for (int k = 0; k < 8; ++k) kp[k] = kv.at(kv.k, row, kvh, lo + t + k);
    prefetch_values(kv, kp);
    prefetch_keys(kv, row, kvh, lo + t + KEYS_AHEAD, lo + n);
    const F8 ks = key_scales8(kp, D);
    for (int g = 0; g < G; ++g) {
      F8 acc[8];
      for (int k = 0; k < 8; ++k) {
        F8 a = f8_dot_i8(i8_load(qi + g * D), i8_load(kp[k]));
        for (int64_t c = 32; c < D; c += 32) a = f8_add(a, f8_dot_i8(i8_load(qi + g * D + c), i8_load(kp[k] + c)));
        acc[k] = a;
      }
      f8_store(sc + g * n + t, f8_mul(f8_mul(f8_sums8(acc), ks), f8_set1(qs[g])));
    }
  }
  for (; t < n; ++t) {
    const int8_t* kr = kv.at(kv.k, row, kvh, lo + t);
    const float ks = row_scale(kr, D);
    for (int g = 0; g < G; ++g) {
      F8 a = f8_dot_i8(i8_load(qi + g * D), i8_load(kr));
      for (int64_t c = 32; c < D; c += 32) a = f8_add(a, f8_dot_i8(i8_load(qi + g * D + c), i8_load(kr + c)));
      sc[g * n + t] = (f8_hsum(a) * ks) * qs[g];
    }
  }
}

template <typename C, int ND, int G>
inline void attend_group_impl(const float* q, const PagedPools<C>& kv, int64_t row, int64_t kvh, int64_t lo,
                              int64_t hi, float scale, float* sc, float* out, float* part) {
  constexpr int64_t D = ND * 8;
  const int64_t n = hi - lo;
  constexpr int CW = G == 1 ? 8 : G <= 3 ? 4 : G <= 6 ? 2 : 1;  // output vectors per pass: G·CW accumulators
  constexpr int PASS = CW < ND ? CW : ND;
  int64_t t = 0;
  if constexpr (is_q8<C>) {  // integer products (q8_scores), D being 64 or 128 here
    q8_scores<ND, G>(q, kv, row, kvh, lo, n, scale, sc);
    t = n;
  } else {
#if defined(REDLINE_AVX512_VNNI)
    if (wide_tiles()) t = wide_scores<C, D, G>(q, kv, row, kvh, lo, n, scale, sc);
#endif
  }
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
  // (8-bit keys: their scales are in the scores already; 8-bit values': in each weight, below)
  normalise_scores<G, D>(sc, n, part);
#if defined(REDLINE_AVX512_VNNI)
  if (wide_tiles()) return wide_values<C, ND, G>(kv, row, kvh, lo, n, sc, out, part);
#endif
  for (int64_t d0 = 0; d0 < D; d0 += 8 * PASS) {
    F8 o[G][PASS];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < PASS; ++j) o[g][j] = f8_zero();
    for (int64_t i = 0; i < n; ++i) {
      const C* vrow = kv.at(kv.v, row, kvh, lo + i);
      const C* vr = vrow + d0;
      const float f = row_scale(vrow, D);
      F8 wgt[G];
      for (int g = 0; g < G; ++g) wgt[g] = f8_set1(sc[g * n + i] * f);
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
