// The avx512-vnni build's own code paths: a prompt's dense products with two activation rows to a 512-bit register
// (dense_group2), Q8_0 products in 256-bit tiles (q8_tile) and in pairs of rows in 512-bit ones (q8_tile2), eight
// 8-lane sums at once (sum8, paged_attention.h) and the 4-bit rows sixteen to a register (Lanes16). Each gives the
// avx2 build's bits. Included by simd.h after the helpers it builds on (prefetching, prefetch_q8_blocks) and before
// the spans that call it (dense_span, q8_span, q4_span); empty unless REDLINE_AVX512_VNNI is defined (build.py).
#pragma once

#include "../vec.h"

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(REDLINE_AVX512_VNNI)
namespace redline_kernels {
// -- a prompt's dense products in 512-bit tiles (avx512-vnni) ------------------------------------------------------
// One zmm register holds two activation rows' accumulators for one weight row: lanes 0-7 row t, lanes 8-15 row t+1,
// each half the 8-lane sum dense_tile keeps in a ymm register, multiplied and added in the same order. So one 512-bit
// multiply-add does two 256-bit ones' work and every output is still dense_tile's bits (the avx2 build's). Where the
// CPU has 512-bit multiply-adders (Zen 5, Intel's server cores) that is twice the arithmetic a cycle for a prompt,
// which is bound by it; on Zen 4, which splits a 512-bit operation in two, it halves the instructions. The
// activations are read paired (pair_rows): rows t and t+1 interleaved eight floats at a time, the weights eight (or
// sixteen) at a time broadcast to both halves.
constexpr int64_t PAIRED_ROWS = 8;  // from this many activation rows on (a prompt's chunk, not a decode batch)

// out[p·2K + 16c + i] = x[2p][8c + i] for i < 8, x[2p + 1][8c + i − 8] for i ≥ 8; an odd last row's partner is zeros.
inline void pair_rows(const float* x, int64_t T, int64_t K, float* out) {
  for (int64_t t = 0; t < T; t += 2) {
    const float* a = x + t * K;
    float* o = out + t * K;
    for (int64_t c = 0; c < K; c += 8) {
      _mm256_storeu_ps(o + 2 * c, _mm256_loadu_ps(a + c));
      _mm256_storeu_ps(o + 2 * c + 8, t + 1 < T ? _mm256_loadu_ps(a + K + c) : _mm256_setzero_ps());
    }
  }
}
inline __m512 w2_load(const float* p) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}
inline __m512 w2_load(const uint16_t* p) {  // f8_from_bf16 in both halves
  const __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// Sixteen bf16 weights in both halves, as w16_lo / w16_hi order them (permute16).
inline __m512i w2_16(const uint16_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The 8-lane sum (f8_hsum) of a register's low and high half: two rows' (or keys') outputs.
inline float hsum_lo(__m512 v) { return f8_hsum(_mm512_castps512_ps256(v)); }
inline float hsum_hi(__m512 v) { return f8_hsum(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))); }

// R weight rows against PP pairs of activation rows: out[t][r] for t < 2·PP.
template <typename W, int R, int PP, bool P16>
inline void dense_tile2(const W* w, int64_t stride, const float* x2, int64_t K, float (*out)[R], bool prefetch) {
  __m512 a[PP][R];
  for (int p = 0; p < PP; ++p)
    for (int r = 0; r < R; ++r) a[p][r] = _mm512_setzero_ps();
  const bool pf = prefetch && prefetching();
  if constexpr (P16) {
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 16) {
      if (pf && (k * 2) % 64 == 0)
        for (int r = 0; r < R; ++r) redline_kernels::prefetch(w + (AHEAD + r) * stride + k);
      __m512 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w2_16(w + r * stride + k)));
      for (int p = 0; p < PP; ++p) {
        const __m512 xv = _mm512_loadu_ps(x2 + p * 2 * K + 2 * k);
        for (int r = 0; r < R; ++r) a[p][r] = _mm512_fmadd_ps(wv[r], xv, a[p][r]);
      }
      for (int r = 0; r < R; ++r) wv[r] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w2_16(w + r * stride + k)));
      for (int p = 0; p < PP; ++p) {
        const __m512 xv = _mm512_loadu_ps(x2 + p * 2 * K + 2 * k + 16);
        for (int r = 0; r < R; ++r) a[p][r] = _mm512_fmadd_ps(wv[r], xv, a[p][r]);
      }
    }
  } else {
    for (int64_t k = 0; k < K; k += 8) {
      if (pf && (k * static_cast<int64_t>(sizeof(W))) % 64 == 0)
        for (int r = 0; r < R; ++r) redline_kernels::prefetch(w + (AHEAD + r) * stride + k);
      __m512 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = w2_load(w + r * stride + k);
      for (int p = 0; p < PP; ++p) {
        const __m512 xv = _mm512_loadu_ps(x2 + p * 2 * K + 2 * k);
        for (int r = 0; r < R; ++r) a[p][r] = _mm512_fmadd_ps(wv[r], xv, a[p][r]);
      }
    }
  }
  for (int p = 0; p < PP; ++p)
    for (int r = 0; r < R; ++r) out[2 * p][r] = hsum_lo(a[p][r]), out[2 * p + 1][r] = hsum_hi(a[p][r]);
}

// The tile sizes a prompt's pairs of rows go in, for R weight rows (4, or 1 for a remainder): six pairs while there
// are six, then three, two, one. run(rows, pairs) gets both as std::integral_constant (the tiles' sizes are known
// when compiled, so their sums stay in registers) and returns; pair_tiles returns how many pairs it took.
template <typename Run>
inline int64_t pair_tiles(int R, int64_t left, Run run) {
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I3 = std::integral_constant<int, 3>;
  using I4 = std::integral_constant<int, 4>;
  using I6 = std::integral_constant<int, 6>;
  const int pairs = left >= 6 ? 6 : left >= 3 ? 3 : static_cast<int>(left);
  if (R == 4) {
    if (pairs == 6) run(I4{}, I6{});
    else if (pairs == 3) run(I4{}, I3{});
    else if (pairs == 2) run(I4{}, I2{});
    else run(I4{}, I1{});
  } else {
    if (pairs == 6) run(I1{}, I6{});
    else if (pairs == 3) run(I1{}, I3{});
    else if (pairs == 2) run(I1{}, I2{});
    else run(I1{}, I1{});
  }
  return pairs;
}

// dense_group on paired activations (x2: pair_rows' layout of T rows), in pair_tiles' tiles.
template <typename W, bool P16, typename Emit>
inline void dense_group2(const W* w, int64_t stride, int R, const float* x2, int64_t T, int64_t K, bool prefetch,
                         Emit emit) {
  const int64_t pairs = (T + 1) / 2;
  for (int64_t p = 0; p < pairs;) {
    p += pair_tiles(R, pairs - p, [&](auto rows, auto tile) {  // the tile reads p before it moves on (C++17)
      constexpr int RR = decltype(rows)::value, PP = decltype(tile)::value;
      float o[2 * PP][RR];
      dense_tile2<W, RR, PP, P16>(w, stride, x2 + p * 2 * K, K, o, prefetch && p == 0);
      for (int t = 0; t < 2 * PP && 2 * p + t < T; ++t)
        for (int r = 0; r < RR; ++r) emit(2 * p + t, r, o[t][r]);
    });
  }
}

// R Q8_0 rows against TT activation rows in one tile (a prompt, a batch), out[t][r]: each weight vector loaded and
// its offset share computed once for TT rows, each activation vector offset once for R rows, one vpdpbusd per pair
// (vec.h f8_dot_from) and the scale products stored once per eight blocks and broadcast from memory. Every (t, r)
// runs q8_rows' operations in q8_rows' order on the same integers and scales: the same bits as q8_rows<R>.
template <int R, int TT>
inline void q8_tile(const int8_t* w, int64_t wstride, const uint16_t* sc, int64_t nb, const int8_t* qx,
                    const float* dx, int64_t K, bool prefetch, float (*out)[R]) {
  F8 acc[TT][R];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = f8_zero();
  alignas(32) float ds[TT][R][8];
  const bool pf = prefetch && prefetching();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    if (pf) prefetch_q8_blocks(w, wstride, sc, nb, b, R);
    for (int r = 0; r < R; ++r) {
      const F8 s = f8_from_f16(sc + r * nb + b);
      for (int t = 0; t < TT; ++t) f8_store(ds[t][r], f8_mul(s, f8_load(dx + t * nb + b)));
    }
    for (int j = 0; j < 8; ++j) {
      I8x32 wv[R];
      __m256i neg[R];
      for (int r = 0; r < R; ++r) {
        wv[r] = i8_load(w + r * wstride + (b + j) * BLOCK);
        neg[r] = i32_neg_offset(wv[r]);
      }
      for (int t = 0; t < TT; ++t) {
        const __m256i u = i8_offset(i8_load(qx + t * K + (b + j) * BLOCK));
        for (int r = 0; r < R; ++r) acc[t][r] = f8_madd(f8_set1(ds[t][r][j]), f8_dot_from(neg[r], u, wv[r]), acc[t][r]);
      }
    }
  }
  for (; b < nb; ++b)
    for (int t = 0; t < TT; ++t) {
      const I8x32 q = i8_load(qx + t * K + b * BLOCK);
      for (int r = 0; r < R; ++r)
        acc[t][r] = f8_madd(f8_set1(f16(sc[r * nb + b]) * dx[t * nb + b]),
                            f8_dot_i8(i8_load(w + r * wstride + b * BLOCK), q), acc[t][r]);
    }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) out[t][r] = f8_hsum(acc[t][r]);
}

// -- Q8_0 products for two or more activation rows in 512-bit registers (avx512-vnni) --------------------------------
// One zmm register holds two activation rows' accumulators for one weight row: lanes 0-7 row 2p, lanes 8-15 row
// 2p + 1, each half the 8-lane sum q8_tile keeps in a ymm register, multiplied and added in its order on the same
// integers and scales: the same bits as q8_rows. Here the weights take the +128 offset vpdpbusd needs on one side
// (w ^ 0x80 = w + 128, unsigned) and the activations' share of it, 128 × the sum of each lane's four activation
// bytes, is taken out by starting the sum at its negative, computed once per product (pair_q8) instead of once per
// weight vector and tile as q8_tile does for the weights' share. Per pair of rows, weight row and block that is four
// 512-bit operations (the product, its conversion, the scale and the multiply-add) where q8_tile runs three 256-bit
// ones per row and block plus the weights' share. Measured on Zen 5 against q8_tile, A/B in one run
// (tools/experiments/before_after.py, q8): a 1,716-token prompt's first token 1.20x sooner on the starter and on the
// 1B-shaped model, a 44-token one's 1.32x (docs/performance.md, "Q8_0 rows paired").
//
// Pairs of activation rows [T, K] in q2 (2K bytes a pair): for pair p and block j, 64 bytes, row 2p's block then
// row 2p + 1's; and in corr, 16 int32 per pair and block: −128 × each lane's sum of four activation bytes.
inline void pair_q8(const int8_t* qx, int64_t pairs, int64_t K, int8_t* q2, int32_t* corr) {
  const int64_t nb = K / BLOCK;
  const __m512i ones = _mm512_set1_epi8(1), m128 = _mm512_set1_epi32(-128);
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t j = 0; j < nb; ++j) {
      const int8_t* a = qx + 2 * p * K + j * BLOCK;
      const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(i8_load(a)), i8_load(a + K), 1);
      _mm512_storeu_si512(q2 + (p * nb + j) * 2 * BLOCK, v);
      const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, v);  // 1 (unsigned) × q (signed)
      _mm512_storeu_si512(corr + (p * nb + j) * 16, _mm512_mullo_epi32(sums, m128));
    }
}

// R Q8_0 rows against TP pairs of activation rows (pair_q8's q2 and corr from pair 0, dx from row 0): out[t][r].
template <int R, int TP>
inline void q8_tile2(const int8_t* w, int64_t wstride, const uint16_t* sc, int64_t nb, const int8_t* q2,
                     const int32_t* corr, const float* dx, bool prefetch, float (*out)[R]) {
  __m512 acc[TP][R];
  for (int p = 0; p < TP; ++p)
    for (int r = 0; r < R; ++r) acc[p][r] = _mm512_setzero_ps();
  alignas(32) float sf[R][8];
  const bool pf = prefetch && prefetching();
  const __m512i off = _mm512_set1_epi8(static_cast<char>(0x80));
  // One block's products: the scale s·dx of each half's row (the products q8_tile stores, lane by lane), then
  // q8_tile's multiply-add on the block's integer sums.
  const auto block = [&](int64_t b, const float* s) {
    __m512i wv[R];
    for (int r = 0; r < R; ++r)
      wv[r] = _mm512_xor_si512(_mm512_broadcast_i64x4(i8_load(w + r * wstride + b * BLOCK)), off);
    for (int p = 0; p < TP; ++p) {
      const __m512i u = _mm512_loadu_si512(q2 + (p * nb + b) * 2 * BLOCK);
      const __m512i c = _mm512_loadu_si512(corr + (p * nb + b) * 16);
      const __m512 d = _mm512_mask_broadcastss_ps(_mm512_set1_ps(dx[2 * p * nb + b]), 0xFF00,
                                                  _mm_load_ss(dx + (2 * p + 1) * nb + b));
      for (int r = 0; r < R; ++r)
        acc[p][r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(s[r * 8]), d),
                                    _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c, wv[r], u)), acc[p][r]);
    }
  };
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    if (pf) prefetch_q8_blocks(w, wstride, sc, nb, b, R);
    for (int r = 0; r < R; ++r) f8_store(sf[r], f8_from_f16(sc + r * nb + b));
    for (int j = 0; j < 8; ++j) block(b + j, &sf[0][j]);
  }
  for (; b < nb; ++b) {
    for (int r = 0; r < R; ++r) sf[r][0] = f16(sc[r * nb + b]);
    block(b, &sf[0][0]);
  }
  for (int p = 0; p < TP; ++p)
    for (int r = 0; r < R; ++r) out[2 * p][r] = hsum_lo(acc[p][r]), out[2 * p + 1][r] = hsum_hi(acc[p][r]);
}

// The eight sums of four registers of 8-lane pairs ([k0 | k1], [k2 | k3], …: two keys, two activation rows), in order,
// each added as f8_hsum adds its lanes: ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)), so the same bits as eight f8_hsum calls, in 14
// instructions instead of 56.
inline __m256 sum8(__m512 p0, __m512 p1, __m512 p2, __m512 p3) {
  // each key's low and high quarters: keys 0-3 and 4-7
  const __m512 b0 = _mm512_add_ps(_mm512_shuffle_f32x4(p0, p1, 0x88), _mm512_shuffle_f32x4(p0, p1, 0xDD));
  const __m512 b1 = _mm512_add_ps(_mm512_shuffle_f32x4(p2, p3, 0x88), _mm512_shuffle_f32x4(p2, p3, 0xDD));
  // (l0 + l1), (l2 + l3) per key: quarter i holds key i's, then key 4 + i's
  const __m512 c = _mm512_add_ps(_mm512_shuffle_ps(b0, b1, 0x88), _mm512_shuffle_ps(b0, b1, 0xDD));
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(c, c, 0x88), _mm512_shuffle_ps(c, c, 0xDD));
  // quarter i: [key i, key 4 + i, key i, key 4 + i]
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, s));
}

// Sixteen weight rows to a 512-bit register.
struct Lanes16 {
  static constexpr int G = 16;
  using I = __m512i;
  using F = __m512;
  static I load(const void* p) { return _mm512_loadu_si512(p); }
  static void store(void* p, I v) { _mm512_storeu_si512(p, v); }
  static F fload(const float* p) { return _mm512_loadu_ps(p); }
  static F fset1(float v) { return _mm512_set1_ps(v); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F fmul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fadd(F a, F b) { return _mm512_add_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static void fstore(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F from_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // rows i, i + 4, i + 8 and i + 12's sixteen bytes of one block, one row to each 128-bit lane
  static I rows_of(const uint8_t* const* r, int i, int64_t off) {
    const auto x = [&](int k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(r[i + 4 * k] + off)); };
    const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(x(0)), x(1), 1);
    const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(x(2)), x(3), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  static I lo32(I a, I b) { return _mm512_unpacklo_epi32(a, b); }
  static I hi32(I a, I b) { return _mm512_unpackhi_epi32(a, b); }
  static I lo64(I a, I b) { return _mm512_unpacklo_epi64(a, b); }
  static I hi64(I a, I b) { return _mm512_unpackhi_epi64(a, b); }
  static I low_nibbles(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static I high_nibbles(I v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  // r[i] = row i's sixteen values -> r[j] = the sixteen rows' value j
  static void transpose(F* r) {
    F t[16], s[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int q = 0; q < 4; ++q) {  // s[4q + m]: rows 4q..4q+3's value 4k + m in lane k
      s[4 * q] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
      s[4 * q + 1] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0xEE);
      s[4 * q + 2] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
      s[4 * q + 3] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xEE);
    }
    for (int m = 0; m < 4; ++m) {
      const F a = _mm512_shuffle_f32x4(s[m], s[4 + m], 0x88), b = _mm512_shuffle_f32x4(s[m], s[4 + m], 0xDD);
      const F c = _mm512_shuffle_f32x4(s[8 + m], s[12 + m], 0x88), d = _mm512_shuffle_f32x4(s[8 + m], s[12 + m], 0xDD);
      r[m] = _mm512_shuffle_f32x4(a, c, 0x88);
      r[8 + m] = _mm512_shuffle_f32x4(a, c, 0xDD);
      r[4 + m] = _mm512_shuffle_f32x4(b, d, 0x88);
      r[12 + m] = _mm512_shuffle_f32x4(b, d, 0xDD);
    }
  }
  struct Dot {  // vpdpbusd adds in int32 (no saturation)
    I acc = _mm512_setzero_si512();
    void add(I u, const int8_t* q) {
      int32_t four;
      std::memcpy(&four, q, 4);
      acc = _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(four));
    }
    F sum() const { return _mm512_cvtepi32_ps(acc); }
  };
};

}  // namespace redline_kernels
#endif
