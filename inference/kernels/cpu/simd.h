// Building blocks shared by Redline's CPU kernels (cpu_kernels.cpp: one operator per call; decode_step.cpp: a whole
// decode step in one call): threads, the int8 activation quantiser, the norms, the vectorised exp, and the
// block-quantised and bf16 row products. Header-only and inline, so each translation unit inlines them into its own
// loops; written in vec.h's operations, so the same code serves AVX2, NEON and the portable build, except where an
// x86 form is faster and gives the same bits: the 4-bit rows interleaved into lanes (q4_span) and avx512-vnni's
// 512-bit tiles.
#pragma once

#include "vec.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <vector>

namespace redline_kernels {

constexpr int64_t BLOCK = 32;

// f(begin, end) over [begin, end) split into one contiguous chunk per thread, as ATen's OpenMP parallel_for splits
// it (the kernels were written against that): at most `threads` threads and at least `grain` items each; inline
// when the range is small, one thread is asked for, or this already runs inside a parallel region.
template <typename F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, int threads, const F& f) {
  if (begin >= end) return;
  const int64_t n = end - begin;
  if (n <= grain || n <= 1 || threads <= 1 || omp_in_parallel()) {
    f(begin, end);
    return;
  }
  const int64_t nt = std::min<int64_t>(threads, grain > 0 ? (n + grain - 1) / grain : n);
  const int64_t chunk = (n + nt - 1) / nt;
#pragma omp parallel num_threads(static_cast<int>(nt))
  {
    const int64_t b = begin + omp_get_thread_num() * chunk;
    if (b < end) f(b, std::min(end, b + chunk));
  }
}

// -- activations quantised per block of 32: q int8, d = max|x| / 127, s = d * sum(q) (quantize_block, vec.h) ------
inline void quantize_rows(const float* x, int64_t T, int64_t K, int8_t* qx, float* dx, float* sx, int threads) {
  parallel_for(0, T * (K / BLOCK), 64, threads, [&](int64_t i0, int64_t i1) {
    // rows are contiguous, so block i of the whole matrix
    for (int64_t i = i0; i < i1; ++i) quantize_block(x + i * BLOCK, qx + i * BLOCK, dx + i, sx + i);
  });
}

// -- between the products: one row at a time --------------------------------------------------------
inline void rms_norm_row(const float* x, const float* w, float eps, int64_t H, float* y) {
  F8 acc = f8_zero();
  for (int64_t i = 0; i < H; i += 8) {
    const F8 v = f8_load(x + i);
    acc = f8_madd(v, v, acc);
  }
  const F8 r = f8_set1(1.f / std::sqrt(f8_hsum(acc) / H + eps));
  for (int64_t i = 0; i < H; i += 8) f8_store(y + i, f8_mul(f8_load(w + i), f8_mul(f8_load(x + i), r)));
}

// e^x for eight floats (Cephes' expf: x = k·ln 2 + r with |r| <= ln 2 / 2, e^r by a degree-6 polynomial, 2^k
// through the exponent bits), within about two units in the last place; inputs clamped to the normal range.
inline F8 exp8(F8 x) {
  x = f8_min(f8_max(x, f8_set1(-87.3f)), f8_set1(88.3f));
  const F8 k = f8_round(f8_mul(x, f8_set1(1.44269504088896341f)));
  F8 r = f8_nmadd(k, f8_set1(0.693359375f), x);
  r = f8_nmadd(k, f8_set1(-2.12194440e-4f), r);
  F8 p = f8_set1(1.9875691500e-4f);
  p = f8_madd(p, r, f8_set1(1.3981999507e-3f));
  p = f8_madd(p, r, f8_set1(8.3334519073e-3f));
  p = f8_madd(p, r, f8_set1(4.1665795894e-2f));
  p = f8_madd(p, r, f8_set1(1.6666665459e-1f));
  p = f8_madd(p, r, f8_set1(5.0000001201e-1f));
  const F8 y = f8_madd(p, f8_mul(r, r), f8_add(r, f8_set1(1.f)));
  return f8_mul(y, f8_pow2i(k));
}

// e^x for one float, computed as exp8 computes each lane (not the C library's expf, whose last bit depends on the
// library and even on the CPU it picks a version for), so a remainder of fewer than eight values, and every build,
// gets the same numbers.
inline float exp1(float x) {
#ifdef REDLINE_LIBM_EXP  // the torch-extension build's expf (before December 2026), to compare the two bit for bit
  return std::exp(x);
#else
  float lanes[8];
  f8_store(lanes, exp8(f8_set1(x)));
  return lanes[0];
#endif
}

// y = silu(gate) * up = gate / (1 + e^-gate) * up; eight at a time (a scalar exp per element was 4 % of a q4 step).
inline void silu_mul_span(const float* gate, const float* up, int64_t n, float* y) {
  int64_t i = 0;
  const F8 one = f8_set1(1.f);
  for (; i + 8 <= n; i += 8) {
    const F8 g = f8_load(gate + i);
    const F8 s = f8_div(g, f8_add(one, exp8(f8_neg(g))));
    f8_store(y + i, f8_mul(s, f8_load(up + i)));
  }
  for (; i < n; ++i) y[i] = gate[i] / (1.f + exp1(-gate[i])) * up[i];
}

// Software prefetch of the weight rows AHEAD rows on (the next group a thread will read): on the 2-core Zen 3
// VM this was measured on, the hardware prefetchers alone left the products well under the memory's bandwidth
// (bf16 step 21 -> 15 ms with it; q8 12.3 -> 11.4 ms). With several activation rows only the first pass over a
// group prefetches: the later ones find the group in the cache. 4-bit rows too, since the Zen 4 VM: there a
// 4-bit product read from memory ran at about half its in-cache rate (25-28 against 52 G weights/s), and the
// prefetch made whole decode steps 1.24x (a 1B-shaped Q4_0 GGUF) and 1.32x (the starter in q4) faster, measured
// A/B interleaved with tools/experiments/before_after.py; 1.53x and 1.02x against the commit before, in a slower hour.
// (On the Zen 3 VM it had cost 7.6 -> 8.1 ms: recheck on new CPUs.)
constexpr int AHEAD = 4;
inline bool prefetching() {
  static const bool on = !(getenv("REDLINE_PREFETCH") && getenv("REDLINE_PREFETCH")[0] == '0');
  return on;
}
// REDLINE_WIDE_TILES=0 keeps a prompt's products in 256-bit tiles on the avx512-vnni build (for measuring the 512-bit
// ones against them: the same bits either way).
inline bool wide_tiles() {
  static const bool on = !(getenv("REDLINE_WIDE_TILES") && getenv("REDLINE_WIDE_TILES")[0] == '0');
  return on;
}
inline void prefetch_lines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) prefetch(c + o);
}

// Eight blocks from block b of the R Q8_0 rows AHEAD rows on, and their scales: what the first pass over a group of
// rows prefetches of the next group as it reads its own.
inline void prefetch_q8_blocks(const int8_t* w, int64_t wstride, const uint16_t* sc, int64_t nb, int64_t b, int R) {
  for (int r = 0; r < R; ++r) {
    prefetch_lines(w + (AHEAD + r) * wstride + b * BLOCK, 8 * BLOCK);
    redline_kernels::prefetch(sc + (AHEAD + r) * nb + b);
  }
}

// R rows of Q8_0 weights (int8 [R, K], fp16 scales) against one activation row. Scales are converted eight
// blocks at a time.
template <int R>
inline void q8_rows(const int8_t* w, int64_t wstride, const uint16_t* sc, int64_t nb, const int8_t* qx, const float* dx,
                    float* y, bool prefetch = true) {
  F8 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = f8_zero();
  const auto row_dot = [&](int r, int64_t b, const I8x32& q) -> F8 {
    return f8_dot_i8(i8_load(w + r * wstride + b * BLOCK), q);
  };
  int64_t b = 0;
  const bool pf = prefetch && prefetching();
  for (; b + 8 <= nb; b += 8) {
    if (pf) prefetch_q8_blocks(w, wstride, sc, nb, b, R);
    const F8 dxv = f8_load(dx + b);
    F8 d[R];
    for (int r = 0; r < R; ++r) d[r] = f8_mul(f8_from_f16(sc + r * nb + b), dxv);
    for (int j = 0; j < 8; ++j) {
      const I8x32 q = i8_load(qx + (b + j) * BLOCK);
      for (int r = 0; r < R; ++r) acc[r] = f8_madd(f8_lane(d[r], j), row_dot(r, b + j, q), acc[r]);
    }
  }
  for (; b < nb; ++b) {
    const I8x32 q = i8_load(qx + b * BLOCK);
    for (int r = 0; r < R; ++r) acc[r] = f8_madd(f8_set1(f16(sc[r * nb + b]) * dx[b]), row_dot(r, b, q), acc[r]);
  }
  for (int r = 0; r < R; ++r) y[r] = f8_hsum(acc[r]);
}

// run(t0, n) with n as a constant (its tile's accumulators in registers), for n = 1..N.
template <int N, typename Run>
inline void q4_sized(int n, int64_t t0, const Run& run) {
  if constexpr (N >= 1) {
    if (n == N) run(t0, std::integral_constant<int, N>{});
    else q4_sized<N - 1>(n, t0, run);
  }
}
// Activation rows in tiles of up to TMAX, the last tile smaller.
template <int TMAX, typename Run>
inline void q4_tiles(int64_t T, const Run& run) {
  for (int64_t t0 = 0; t0 < T; t0 += TMAX) q4_sized<TMAX>(static_cast<int>(std::min<int64_t>(T - t0, TMAX)), t0, run);
}
// A 4-bit row of zeros `nb` blocks long (this thread's): what a last group's missing rows read.
inline const uint8_t* q4_zero_row(int64_t nb) {
  thread_local std::vector<uint8_t> zeros;
  if (zeros.size() < static_cast<size_t>(nb * BLOCK / 2)) zeros.assign(static_cast<size_t>(nb * BLOCK / 2), 0);
  return zeros.data();
}

// 4-bit rows on the NEON and portable builds: the x86 builds' numbers (q4_span there) with vec.h's operations.
// Eight weight rows at a time: each row's block dot product is an 8-lane vector (f8_dot_u8_i8), and f8_sums8 turns
// the eight rows' vectors into one vector whose lane r is row r's whole dot (a sum of integers below 2^24: exact in
// fp32 in any order), so the scale and the multiply-add chain over blocks run eight rows to a vector, lane r doing
// what lane r of an x86 register does. Q4_1 is scale·u + min; Q4_0, scale·(u − 8), runs as Q4_1 with min =
// −8·scale. With several activation rows each block is unpacked once for all of them; a row's arithmetic does not
// depend on the others. out[t·8 + r]; `rows` ≤ 8 real weight rows (the rest read as zeros, never emitted).
template <bool ASYM, int TT>
inline void q4_tile8(const uint8_t* const* wr, const uint16_t* sc, const uint16_t* mn, int64_t nb, int rows,
                     const int8_t* qx, const float* dx, const float* sx, int64_t K, float* out, bool prefetch_next,
                     const uint8_t* next, int64_t row_bytes) {
  F8 acc[TT], macc[TT];
  for (int t = 0; t < TT; ++t) acc[t] = macc[t] = f8_zero();
  F8 S[8], C[8];  // this chunk of eight blocks' scales and minimums, lane r = row r
  for (int64_t b = 0; b < nb; ++b) {
    if (prefetch_next && b % 4 == 0) {
      // One activation row reads the rows from memory: a line (four blocks) of each 32 blocks ahead, into the next
      // eight rows near the end, and the scales' line 32 blocks ahead (as q4_direct on x86).
      const int64_t tb = b + 32;
      for (int r = 0; r < 8; ++r)
        redline_kernels::prefetch(tb < nb ? wr[r] + tb * (BLOCK / 2) : next + r * row_bytes + (tb - nb) * (BLOCK / 2));
      if (b % 32 == 0)
        for (int r = 0; r < 8; ++r) {
          const int64_t at = tb < nb ? r * nb + tb : (8 + r) * nb + tb - nb;
          redline_kernels::prefetch(sc + at);
          if (ASYM) redline_kernels::prefetch(mn + at);
        }
    }
    if (b % 8 == 0) {
      if (b + 8 <= nb) {  // eight rows' eight scales each, transposed in registers
        for (int r = 0; r < 8; ++r) {
          S[r] = r < rows ? f8_from_f16(sc + r * nb + b) : f8_zero();
          C[r] = ASYM && r < rows ? f8_from_f16(mn + r * nb + b) : f8_zero();
        }
        f8_transpose8(S);
        if (ASYM) f8_transpose8(C);
      } else {  // a last short chunk: value by value
        alignas(32) float s[8][8] = {}, c[8][8] = {};
        for (int64_t j = 0; j < nb - b; ++j)
          for (int r = 0; r < rows; ++r) {
            s[j][r] = f16(sc[r * nb + b + j]);
            if (ASYM) c[j][r] = f16(mn[r * nb + b + j]);
          }
        for (int j = 0; j < 8; ++j) S[j] = f8_load(s[j]), C[j] = f8_load(c[j]);
      }
      if (!ASYM)
        for (int j = 0; j < 8; ++j) C[j] = f8_mul(f8_set1(-8.f), S[j]);
    }
    // One activation row unpacks each row's nibbles as it takes its dot (fewer live registers); several unpack
    // them once for all.
    I8x32 u[TT > 1 ? 8 : 1];
    if constexpr (TT > 1)
      for (int r = 0; r < 8; ++r) u[r] = i8_nibbles(wr[r] + b * (BLOCK / 2));
    const F8 sv = S[b % 8], cv = C[b % 8];
    for (int t = 0; t < TT; ++t) {
      const I8x32 q = i8_load(qx + t * K + b * BLOCK);
      F8 dots[8];
      for (int r = 0; r < 8; ++r)
        dots[r] = f8_dot_u8_i8(TT > 1 ? u[TT > 1 ? r : 0] : i8_nibbles(wr[r] + b * (BLOCK / 2)), q);
      acc[t] = f8_madd(f8_mul(sv, f8_set1(dx[t * nb + b])), f8_sums8(dots), acc[t]);
      macc[t] = f8_madd(cv, f8_set1(sx[t * nb + b]), macc[t]);
    }
  }
  for (int t = 0; t < TT; ++t) f8_store(out + t * 8, f8_add(acc[t], macc[t]));
}

inline F8 wload(const float* p) { return f8_load(p); }
inline F8 wload(const uint16_t* p) { return f8_from_bf16(p); }

// R dense weight rows (fp32 or bf16, `stride` elements apart) against TT activation rows (`K` apart): each
// loaded and converted weight vector serves every activation row, and R rows keep more loads in flight (four rows
// against one were measured 15-30 % faster than two on a 2-core Zen 3 for the starter's shapes). Every output is
// one 8-lane sum over k in order, then a horizontal sum, whatever R and TT, so a row alone and the same row in a
// batch give the same numbers. R·TT + R + 1 vector registers: R = 4 with TT <= 2, R = 2 with TT <= 4 fit AVX2's 16.
// bf16 weights sixteen at a time (P16): unpacking each 128-bit lane's low and high four words into the high
// halves of fp32 lanes (a bf16 is an fp32's high half) costs one shuffle per eight weights, where widening and
// shifting (bf16x8) costs two. The halves hold elements 0-3, 8-11 and 4-7, 12-15 of the sixteen, so the
// activations are read in that order: `x` is permute16's copy of them. Needs K % 16 == 0. Measured (bf16 step,
// starter, 3 rounds alternating with bf16x8, load 1.4-1.8): four sequences 20.3 -> 18.1 ms; one to three and a
// 44-row prompt's products unchanged (they wait on memory, or on the multiply-adds).
inline void permute16(const float* x, int64_t T, int64_t K, float* out) {
  for (int64_t i = 0; i < T * K; i += 16) permute16_block(x + i, out + i);
}

template <typename W, int R, int TT, bool P16 = false>
inline void dense_tile(const W* w, int64_t stride, const float* x, int64_t K, float out[TT][R], bool prefetch) {
  F8 a[TT][R];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) a[t][r] = f8_zero();
  const bool pf = prefetch && prefetching();
  if constexpr (P16) {
    for (int64_t k = 0; k < K; k += 16) {
      if (pf && (k * 2) % 64 == 0)
        for (int r = 0; r < R; ++r) redline_kernels::prefetch(w + (AHEAD + r) * stride + k);
      W16 v[R];
      for (int r = 0; r < R; ++r) v[r] = w16_load(w + r * stride + k);
      F8 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = w16_lo(v[r]);
      for (int t = 0; t < TT; ++t) {
        const F8 xv = f8_load(x + t * K + k);
        for (int r = 0; r < R; ++r) a[t][r] = f8_madd(wv[r], xv, a[t][r]);
      }
      for (int r = 0; r < R; ++r) wv[r] = w16_hi(v[r]);
      for (int t = 0; t < TT; ++t) {
        const F8 xv = f8_load(x + t * K + k + 8);
        for (int r = 0; r < R; ++r) a[t][r] = f8_madd(wv[r], xv, a[t][r]);
      }
    }
  } else {
    for (int64_t k = 0; k < K; k += 8) {
      if (pf && (k * static_cast<int64_t>(sizeof(W))) % 64 == 0)
        for (int r = 0; r < R; ++r) redline_kernels::prefetch(w + (AHEAD + r) * stride + k);
      F8 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = wload(w + r * stride + k);
      for (int t = 0; t < TT; ++t) {
        const F8 xv = f8_load(x + t * K + k);
        for (int r = 0; r < R; ++r) a[t][r] = f8_madd(wv[r], xv, a[t][r]);
      }
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) out[t][r] = f8_hsum(a[t][r]);
}

template <typename W, int R, int TT, bool P16, typename Emit>
inline void dense_tile_at(const W* w, int64_t stride, const float* x, int64_t K, int64_t t0, int r0, bool pf,
                          Emit& emit) {
  float o[TT][R];
  dense_tile<W, R, TT, P16>(w + r0 * stride, stride, x + t0 * K, K, o, pf);
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) emit(t0 + t, r0 + r, o[t][r]);
}

// Weight rows w.. (four, or one for a remainder) against all T activation rows, in register-sized tiles; the rows
// are read from memory on the first tile (which prefetches the next group) and from the cache after it. Tiles of
// the batch's rows together, not one row at a time: bf16 step on the starter, 2-core Zen 3, before -> after:
// two sequences 20.4 -> 15.8 ms, three 27.7 -> 19.5 ms (40 steps a batch size, median of 3 rounds alternating
// the builds; one sequence 16.4 -> 14.4 ms).
// emit(t, r, value) for activation row t and weight row r of the group.
template <typename W, bool P16, typename Emit>
inline void dense_group(const W* w, int64_t stride, int R, const float* x, int64_t T, int64_t K, bool prefetch,
                        Emit emit) {
  for (int64_t t = 0; t < T;) {
    const int64_t left = T - t;
    const bool pf = prefetch && t == 0;
#if defined(REDLINE_AVX512_VNNI)
    // 32 vector registers (the EVEX encoding): the four weight rows against four activation rows in one tile, 16
    // accumulators, so each weight vector loaded serves four rows and each activation vector four (two tiles of
    // 2 x 4 load the activations twice). Every output is still one 8-lane sum in order: the same bits.
    if (R == 4 && left >= 6) {
      dense_tile_at<W, 4, 6, P16>(w, stride, x, K, t, 0, pf, emit);
      t += 6;
      continue;
    }
    if (R == 4 && left >= 4) {
      dense_tile_at<W, 4, 4, P16>(w, stride, x, K, t, 0, pf, emit);
      t += 4;
      continue;
    }
#endif
    if (R == 1) {
      if (left >= 4) dense_tile_at<W, 1, 4, P16>(w, stride, x, K, t, 0, false, emit), t += 4;
      else dense_tile_at<W, 1, 1, P16>(w, stride, x, K, t, 0, false, emit), t += 1;
    } else if (left >= 4) {
      dense_tile_at<W, 2, 4, P16>(w, stride, x, K, t, 0, pf, emit);
      dense_tile_at<W, 2, 4, P16>(w, stride, x, K, t, 2, pf, emit);
      t += 4;
    } else if (left == 3) {
      dense_tile_at<W, 2, 3, P16>(w, stride, x, K, t, 0, pf, emit);
      dense_tile_at<W, 2, 3, P16>(w, stride, x, K, t, 2, pf, emit);
      t += 3;
    } else if (left >= 2) {
      dense_tile_at<W, 4, 2, P16>(w, stride, x, K, t, 0, pf, emit), t += 2;
    } else {
      dense_tile_at<W, 4, 1, P16>(w, stride, x, K, t, 0, pf, emit), t += 1;
    }
  }
}

// Weight rows n0..n1 of a product against all T activation rows, in groups of four and single rows for a remainder;
// emit(t, n, value) for activation row t and output column n. One loop for the per-operator kernels
// (cpu_kernels.cpp) and the whole step (decode_step.cpp), so the two compute the same sums in the same order.
//
// A prompt's rows in blocks that stay in the L2 cache: weight rows in blocks of about PROMPT_W_BYTES, and against
// each, the activation rows in blocks of about PROMPT_X_BYTES (whole tiles of 12). Row by row (every group of four
// weight rows against all T activation rows) a 256-token chunk of a 1B model's 2,048-wide inputs is 2 MB of fp32
// activations, 8 MB for the 8,192-wide down projection: more than a core's L2, so each group of four weight rows
// read them again from L3, and a 300-token bf16 prompt was read 1.5x sooner in 64-token chunks than in 256-token
// ones. Blocked, the weights are still read from memory once, the activations from L3 once per weight block.
// Each output is still computed by one tile, so the numbers are the same bits. REDLINE_PROMPT_BLOCK_KB=0 turns
// the blocking off (REDLINE_PROMPT_BLOCK_KB=X,W sets both budgets, for measuring). Measured on a 2-core Zen 5,
// the 1B-shaped model's 300-token bf16 prompt (tools/experiments/before_after.py --before . --before-env
// REDLINE_PROMPT_BLOCK_KB=0, 3 rounds): read 1.07x sooner (1.07, 1.08, 1.04) blocked.
inline int64_t prompt_block_bytes(int which) {
  static const std::array<int64_t, 2> budget = [] {
    int64_t b[2] = {384 << 10, 256 << 10};
    if (const char* e = getenv("REDLINE_PROMPT_BLOCK_KB")) {
      char* end = nullptr;
      b[0] = strtoll(e, &end, 10) << 10;
      b[1] = (end && *end == ',') ? strtoll(end + 1, nullptr, 10) << 10 : b[0];
    }
    return std::array<int64_t, 2>{b[0], b[1]};
  }();
  return budget[which];
}

}  // namespace redline_kernels

// avx512-vnni's 512-bit tiles (a prompt's dense and Q8_0 products in pairs of rows, the 4-bit rows sixteen at a
// time): in their own file, built on the helpers above (prefetching, prefetch_q8_blocks) and called by the spans
// below. Empty in the other builds.
#include "arch/avx512.h"

namespace redline_kernels {

template <typename W, bool P16, typename Emit>
inline void dense_span(const W* w, int64_t stride, int64_t n0, int64_t n1, const float* x, int64_t T, int64_t K,
                       Emit emit) {
  const int64_t xb = prompt_block_bytes(0), wb = prompt_block_bytes(1);
  const int64_t tb = xb > 0 ? std::max<int64_t>(12, xb / (K * 4) / 12 * 12) : T;
  const int64_t nb = wb > 0 ? std::max<int64_t>(4, wb / (K * static_cast<int64_t>(sizeof(W))) / 4 * 4) : n1 - n0;
  const float* xs = x;
#if defined(REDLINE_AVX512_VNNI)
  thread_local std::vector<float> paired;  // this thread's copy of the activations in pair_rows' layout
  const bool pairs = T >= PAIRED_ROWS && wide_tiles();
  if (pairs) {
    paired.resize(static_cast<size_t>((T + 1) / 2 * 2 * K));
    pair_rows(x, T, K, paired.data());
    xs = paired.data();  // row t0's pair starts at t0 * K too (t0 even: tb is a multiple of 12)
  }
#endif
  // Weight rows n.. (four, or one for a remainder) against activation rows t0..t0+tt; `first`: the first pass over
  // these weights, which reads them from memory (and prefetches).
  const auto group = [&](int64_t n, int R, int64_t t0, int64_t tt, bool first) {
    const auto put = [&](int64_t t, int r, float v) { emit(t0 + t, n + r, v); };
#if defined(REDLINE_AVX512_VNNI)
    if (pairs) return dense_group2<W, P16>(w + n * stride, stride, R, xs + t0 * K, tt, K, first, put);
#endif
    dense_group<W, P16>(w + n * stride, stride, R, xs + t0 * K, tt, K, first, put);
  };
  if (T <= tb) {
    for (int64_t n = n0; n < n1;) {
      const int R = n + 4 <= n1 ? 4 : 1;
      group(n, R, 0, T, true);
      n += R;
    }
    return;
  }
  for (int64_t b0 = n0; b0 < n1; b0 += nb) {
    const int64_t b1 = std::min(n1, b0 + nb);
    for (int64_t t0 = 0; t0 < T; t0 += tb) {
      const int64_t tt = std::min(tb, T - t0);
      for (int64_t n = b0; n < b1;) {
        const int R = n + 4 <= b1 ? 4 : 1;
        // the first pass over a weight block reads it from memory (and prefetches); the later ones from L2
        group(n, R, t0, tt, t0 == 0);
        n += R;
      }
    }
  }
}

// Q8_0 rows (int8, `wstride` bytes apart, fp16 scales `nb` a row): each activation row in turn against a group of
// four; the group is read from memory by the first row (which prefetches the next group) and from the cache after.
// On avx512-vnni, pairs of activation rows in 512-bit tiles (q8_tile2; with REDLINE_WIDE_TILES=0, four rows at a
// time in 256-bit ones, q8_tile), the rest row by row.
template <typename Emit>
inline void q8_span(const int8_t* w, int64_t wstride, const uint16_t* sc, int64_t nb, int64_t n0, int64_t n1,
                    const int8_t* qx, const float* dx, int64_t T, int64_t K, Emit emit) {
  float out[4];
#if defined(REDLINE_AVX512_VNNI)
  // Two or more rows go in pairs in 512-bit tiles (q8_tile2), the activations paired once for the whole span; an
  // odd last row, and a group of fewer than four weight rows, row by row below.
  const int64_t pairs = T >= 2 && wide_tiles() ? T / 2 : 0;
  thread_local std::vector<int8_t> q2;
  thread_local std::vector<int32_t> corr;
  if (pairs > 0) {
    q2.resize(static_cast<size_t>(pairs * 2 * K));
    corr.resize(static_cast<size_t>(pairs * nb * 16));
    pair_q8(qx, pairs, K, q2.data(), corr.data());
  }
#endif
  for (int64_t n = n0; n < n1; n += 4) {
    int64_t t = 0;
#if defined(REDLINE_AVX512_VNNI)
    float tile[4][4];
    // TP pairs from pair p in one tile; the first tile of a group reads it from memory (and prefetches the next),
    // the later ones from the cache.
    const auto pair_tile = [&](int64_t p, auto tp) {
      constexpr int TP = decltype(tp)::value;
      q8_tile2<4, TP>(w + n * wstride, wstride, sc + n * nb, nb, q2.data() + p * 2 * K, corr.data() + p * nb * 16,
                      dx + 2 * p * nb, p == 0, tile);
      for (int u = 0; u < 2 * TP; ++u)
        for (int r = 0; r < 4; ++r) emit(2 * p + u, n + r, tile[u][r]);
    };
    if (n + 4 <= n1 && pairs > 0) {
      int64_t p = 0;
      for (; p + 2 <= pairs; p += 2) pair_tile(p, std::integral_constant<int, 2>{});
      if (p < pairs) pair_tile(p, std::integral_constant<int, 1>{});
      t = 2 * pairs;
    }
    // Without pairs (REDLINE_WIDE_TILES=0): tiles of four rows; five left go as three and two (not four and one).
    for (; n + 4 <= n1 && t + 4 <= T && T - t != 5; t += 4) {
      q8_tile<4, 4>(w + n * wstride, wstride, sc + n * nb, nb, qx + t * K, dx + t * nb, K, t == 0, tile);
      for (int u = 0; u < 4; ++u)
        for (int r = 0; r < 4; ++r) emit(t + u, n + r, tile[u][r]);
    }
    if (n + 4 <= n1 && T - t == 5) {
      q8_tile<4, 3>(w + n * wstride, wstride, sc + n * nb, nb, qx + t * K, dx + t * nb, K, t == 0, tile);
      for (int u = 0; u < 3; ++u)
        for (int r = 0; r < 4; ++r) emit(t + u, n + r, tile[u][r]);
      t += 3;
    }
    // Two or three rows left (a decode step of two or three replies, a chunk read beside one): one tile too. Row by
    // row each repeats the weight side of the arithmetic, which bounds a q8 step on a CPU that reads fast enough
    // (Zen 5: two replies' step 6.5 ms against one's 4.3 on the starter).
    if (n + 4 <= n1 && (T - t == 2 || T - t == 3)) {
      if (T - t == 2) q8_tile<4, 2>(w + n * wstride, wstride, sc + n * nb, nb, qx + t * K, dx + t * nb, K, t == 0, tile);
      else q8_tile<4, 3>(w + n * wstride, wstride, sc + n * nb, nb, qx + t * K, dx + t * nb, K, t == 0, tile);
      for (int u = 0; u < T - t; ++u)
        for (int r = 0; r < 4; ++r) emit(t + u, n + r, tile[u][r]);
      t = T;
    }
#endif
    for (; t < T; ++t) {
      const int8_t* q = qx + t * K;
      const float* d = dx + t * nb;
      if (n + 4 <= n1) {
        q8_rows<4>(w + n * wstride, wstride, sc + n * nb, nb, q, d, out, t == 0);
        for (int r = 0; r < 4; ++r) emit(t, n + r, out[r]);
      } else {
        for (int64_t m = n; m < n1; ++m) {
          q8_rows<1>(w + m * wstride, wstride, sc + m * nb, nb, q, d, out, t == 0);
          emit(t, m, out[0]);
        }
      }
    }
  }
}

#if defined(REDLINE_AVX2)
// -- 4-bit products on x86: weight rows interleaved, a block's dot product whole --------------------------------------
// A group of G weight rows (sixteen in a 512-bit register's int32 lanes, eight in a 256-bit one) is unpacked into
// lanes: for each block, vector g holds in lane r row r's four weights that meet the activation's bytes 4g..4g+3
// (GGUF's byte j holds weights j and j + 16, so the low nibbles of bytes 4c..4c+3 are weights 4c..4c+3 and the high
// ones 16 + 4c..16 + 4c + 3). An activation row's block is then eight byte dot products against its four bytes
// broadcast, summed in integers, and one conversion, one scale and one multiply-add serve all G rows, where a row
// at a time took a conversion, a lane broadcast and a multiply-add per row and block: llama.cpp's repacked Q4_0
// does the same. (The NEON and portable builds reach the same lanes after the dot products: q4_tile8.) The rows are interleaved as they are
// read, into a thread's buffer, so the weights keep GGUF's layout (a GGUF file's blocks used in place, one copy).
//
// The numbers, in every build and for any number of activation rows (alone or in a batch, a prompt or a decode
// step: lanes are weight rows, so no activation row changes another's arithmetic), for weight row n and activation
// row t, each sum a chain of fused multiply-adds in block order:
//   y = Σ_b (s[n][b] · dx[t][b]) · dot_b  +  Σ_b c[n][b] · sx[t][b]
// dot_b the block's exact integer dot product, c the Q4_1 minimum or −8·s (Q4_0 run as Q4_1, no sign fix-ups).
// Lane by lane that is the same in 256-bit and 512-bit registers, so either width gives the same bits.

// Eight weight rows to a 256-bit register.
struct Lanes8 {
  static constexpr int G = 8;
  using I = __m256i;
  using F = __m256;
  static I load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(void* p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static F fload(const float* p) { return _mm256_loadu_ps(p); }
  static F fset1(float v) { return _mm256_set1_ps(v); }
  static F fzero() { return _mm256_setzero_ps(); }
  static F fmul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fadd(F a, F b) { return _mm256_add_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static void fstore(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F from_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  // rows i and i + 4's sixteen bytes of one block, one row to each 128-bit lane
  static I rows_of(const uint8_t* const* r, int i, int64_t off) {
    const auto x = [&](int k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(r[i + 4 * k] + off)); };
    return _mm256_inserti128_si256(_mm256_castsi128_si256(x(0)), x(1), 1);
  }
  static I lo32(I a, I b) { return _mm256_unpacklo_epi32(a, b); }
  static I hi32(I a, I b) { return _mm256_unpackhi_epi32(a, b); }
  static I lo64(I a, I b) { return _mm256_unpacklo_epi64(a, b); }
  static I hi64(I a, I b) { return _mm256_unpackhi_epi64(a, b); }
  static I low_nibbles(I v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static I high_nibbles(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
  static void transpose(F* r) { f8_transpose8(r); }  // r[i] = row i's values -> r[j] = the rows' value j
  // A block's dot products for one activation row, summed in integers.
  struct Dot {
    I acc = _mm256_setzero_si256();
#if defined(REDLINE_AVX512_VNNI) || defined(REDLINE_AVX_VNNI)
    void add(I u, const int8_t* q) {
      int32_t four;
      std::memcpy(&four, q, 4);
#if defined(REDLINE_AVX512_VNNI)
      acc = _mm256_dpbusd_epi32(acc, u, _mm256_set1_epi32(four));
#else
      acc = _mm256_dpbusd_avx_epi32(acc, u, _mm256_set1_epi32(four));
#endif
    }
    F sum() const { return _mm256_cvtepi32_ps(acc); }
#else
    // maddubs' pairs summed in int16 over the block's eight vectors, then one madd into int32: a pair is at most
    // 2·15·127 = 3,810, eight of them 30,480 < 32,767, so nothing saturates or wraps: vpdpbusd's integers.
    void add(I u, const int8_t* q) {
      int32_t four;
      std::memcpy(&four, q, 4);
      acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, _mm256_set1_epi32(four)));
    }
    F sum() const { return _mm256_cvtepi32_ps(_mm256_madd_epi16(acc, _mm256_set1_epi16(1))); }
#endif
  };
};

// One block of L::G rows (their pointers r, a missing row pointing at zeros) into its eight lane vectors u.
template <typename L>
inline void q4_interleave(const uint8_t* const* r, int64_t off, typename L::I* u) {
  using I = typename L::I;
  const I z0 = L::rows_of(r, 0, off), z1 = L::rows_of(r, 1, off), z2 = L::rows_of(r, 2, off),
          z3 = L::rows_of(r, 3, off);
  // each 128-bit lane: rows 4k..4k+3's four words -> word c of each (a 4x4 transpose of 32-bit words)
  const I t0 = L::lo32(z0, z1), t1 = L::hi32(z0, z1), t2 = L::lo32(z2, z3), t3 = L::hi32(z2, z3);
  const I c[4] = {L::lo64(t0, t2), L::hi64(t0, t2), L::lo64(t1, t3), L::hi64(t1, t3)};
  for (int g = 0; g < 4; ++g) {
    u[g] = L::low_nibbles(c[g]);
    u[4 + g] = L::high_nibbles(c[g]);
  }
}

// `count` blocks of a group's fp16 scales (or minimums: `rows` rows `stride` apart, the rest zeros) as fp32 in lanes:
// out[b·G + i] = row i's value of block b. G blocks at a time through a transpose in registers (a value at a time
// was a fifth of a decode step's products).
template <typename L>
inline void q4_lanes(const uint16_t* v, int64_t stride, int64_t count, int rows, float* out) {
  constexpr int G = L::G;
  int64_t b = 0;
  for (; b + G <= count; b += G) {
    typename L::F r[G];
    for (int i = 0; i < G; ++i) r[i] = i < rows ? L::from_f16(v + i * stride + b) : L::fzero();
    L::transpose(r);
    for (int j = 0; j < G; ++j) L::fstore(out + (b + j) * G, r[j]);
  }
  for (; b < count; ++b)
    for (int i = 0; i < G; ++i) out[b * G + i] = i < rows ? f16(v[i * stride + b]) : 0.f;
}
// `count` blocks of a group's scales into S and minimums into M, in lanes (q4_lanes); Q4_0's "minimums" are −8·s
// (exact).
template <typename L, bool ASYM>
inline void q4_scales(const uint16_t* sc, const uint16_t* mn, int64_t stride, int64_t count, int rows, float* S,
                      float* M) {
  q4_lanes<L>(sc, stride, count, rows, S);
  if (ASYM) return q4_lanes<L>(mn, stride, count, rows, M);
  for (int64_t i = 0; i < count * L::G; i += L::G) L::fstore(M + i, L::fmul(L::fset1(-8.f), L::fload(S + i)));
}

// TT activation rows against one group's blocks, block b's weights from `weights(b, u)` (unpacked as they are read,
// or from the group's buffer), its scales in lanes at S + (b % held)·G (a chunk's, or all of them); out[t] = the G
// outputs of row t.
template <typename L, int TT, typename Weights>
inline void q4_group_tile(const Weights& weights, const float* S, const float* M, int64_t held, int64_t nb,
                          const int8_t* qx, const float* dx, const float* sx, int64_t K, float* out) {
  using F = typename L::F;
  F acc[TT], macc[TT];
  for (int t = 0; t < TT; ++t) acc[t] = macc[t] = L::fzero();
  typename L::I u[8];
  for (int64_t b = 0; b < nb; ++b) {
    weights(b, u);
    typename L::Dot dot[TT];
    for (int g = 0; g < 8; ++g)
      for (int t = 0; t < TT; ++t) dot[t].add(u[g], qx + t * K + b * BLOCK + 4 * g);
    const F s = L::fload(S + b % held * L::G), m = L::fload(M + b % held * L::G);
    for (int t = 0; t < TT; ++t) {
      acc[t] = L::fmadd(L::fmul(s, L::fset1(dx[t * nb + b])), dot[t].sum(), acc[t]);
      macc[t] = L::fmadd(m, L::fset1(sx[t * nb + b]), macc[t]);
    }
  }
  for (int t = 0; t < TT; ++t) L::fstore(out + t * L::G, L::fadd(acc[t], macc[t]));
}

// Up to DIRECT activation rows (a decode step or batch): each block's weights unpacked as they come, read once from
// memory. The rows are prefetched AHEAD_BLOCKS blocks ahead of their use (into the next group's rows near a group's
// end), and the next group's scales (and minimums), one contiguous run, spread over the group; the scales are put
// in lanes a chunk of G blocks at a time, as the blocks come (all at a group's start they were 32 KB for a 1B
// model's 8,192-wide rows, and held the products of its down projection to 60 % of the memory's rate).
template <typename L, int DIRECT, bool ASYM, typename Emit>
inline void q4_direct(const uint8_t* w, int64_t row_bytes, const uint16_t* sc, const uint16_t* mn, int64_t nb,
                      int64_t n0, int64_t n1, const int8_t* qx, const float* dx, const float* sx, int64_t T, int64_t K,
                      const uint8_t* zeros, Emit emit) {
  constexpr int G = L::G;
  constexpr int64_t AHEAD_BLOCKS = 32;
  alignas(64) float S[G * G], M[G * G], out[DIRECT * G];
  for (int64_t n = n0; n < n1; n += G) {
    const int rows = static_cast<int>(std::min<int64_t>(G, n1 - n));
    const uint8_t* r[G];
    for (int i = 0; i < G; ++i) r[i] = i < rows ? w + (n + i) * row_bytes : zeros;
    const bool pf = prefetching() && n + G < n1;
    const char* next_sc = reinterpret_cast<const char*>(sc + (n + G) * nb);
    const char* next_mn = ASYM ? reinterpret_cast<const char*>(mn + (n + G) * nb) : nullptr;
    const int64_t next_bytes = std::min<int64_t>(G, n1 - n - G) * nb * 2;
    const auto unpack = [&](int64_t b, typename L::I* u) {
      if (pf && b % 4 == 0) {  // a line holds four blocks' nibbles, 32 blocks' scales
        const int64_t tb = b + AHEAD_BLOCKS;
        const uint8_t* base =
            tb < nb ? w + n * row_bytes + tb * (BLOCK / 2) : w + (n + G) * row_bytes + (tb - nb) * (BLOCK / 2);
        for (int i = 0; i < G; ++i) redline_kernels::prefetch(base + i * row_bytes);
        for (int64_t o = b / 4 * 128; o < b / 4 * 128 + 128 && o < next_bytes; o += 64) {
          redline_kernels::prefetch(next_sc + o);
          if (ASYM) redline_kernels::prefetch(next_mn + o);
        }
      }
      if (b % G == 0) {  // this chunk's scales
        const int64_t count = std::min<int64_t>(G, nb - b);
        q4_scales<L, ASYM>(sc + n * nb + b, ASYM ? mn + n * nb + b : nullptr, nb, count, rows, S, M);
      }
      q4_interleave<L>(r, b * (BLOCK / 2), u);
    };
    q4_tiles<DIRECT>(T, [&](int64_t t0, auto tt) {
      constexpr int TT = decltype(tt)::value;
      q4_group_tile<L, TT>(unpack, S, M, G, nb, qx + t0 * K, dx + t0 * nb, sx + t0 * nb, K, out);
      for (int t = 0; t < TT; ++t)
        for (int i = 0; i < rows; ++i) emit(t0 + t, n + i, out[t * G + i]);
    });
  }
}

// More rows (a prompt): each group unpacked once into this thread's buffer, then read once per tile of TILE rows.
template <typename L, int TILE, bool ASYM, typename Emit>
inline void q4_buffered(const uint8_t* w, int64_t row_bytes, const uint16_t* sc, const uint16_t* mn, int64_t nb,
                        int64_t n0, int64_t n1, const int8_t* qx, const float* dx, const float* sx, int64_t T,
                        int64_t K, const uint8_t* zeros, Emit emit) {
  constexpr int G = L::G;
  thread_local std::vector<float> SM;
  thread_local std::vector<uint8_t> U;
  SM.resize(static_cast<size_t>(2 * nb * G));
  U.resize(static_cast<size_t>(nb * 8 * G * 4));
  float* S = SM.data();
  float* M = S + nb * G;
  uint8_t* ub = U.data();
  alignas(64) float out[TILE * G];
  for (int64_t n = n0; n < n1; n += G) {
    const int rows = static_cast<int>(std::min<int64_t>(G, n1 - n));
    const uint8_t* r[G];
    for (int i = 0; i < G; ++i) r[i] = i < rows ? w + (n + i) * row_bytes : zeros;
    q4_scales<L, ASYM>(sc + n * nb, ASYM ? mn + n * nb : nullptr, nb, nb, rows, S, M);
    for (int64_t b = 0; b < nb; ++b) {
      typename L::I u[8];
      q4_interleave<L>(r, b * (BLOCK / 2), u);
      for (int g = 0; g < 8; ++g) L::store(ub + (b * 8 + g) * G * 4, u[g]);
    }
    const auto load = [&](int64_t b, typename L::I* u) {
      for (int g = 0; g < 8; ++g) u[g] = L::load(ub + (b * 8 + g) * G * 4);
    };
    q4_tiles<TILE>(T, [&](int64_t t0, auto tt) {
      constexpr int TT = decltype(tt)::value;
      q4_group_tile<L, TT>(load, S, M, nb, nb, qx + t0 * K, dx + t0 * nb, sx + t0 * nb, K, out);
      for (int t = 0; t < TT; ++t)
        for (int i = 0; i < rows; ++i) emit(t0 + t, n + i, out[t * G + i]);
    });
  }
}

template <bool ASYM, typename Emit>
inline void q4_span(const uint8_t* w, int64_t row_bytes, const uint16_t* sc, const uint16_t* mn, int64_t nb, int64_t n0,
                    int64_t n1, const int8_t* qx, const float* dx, const float* sx, int64_t T, int64_t K, Emit emit) {
  const uint8_t* zeros = q4_zero_row(nb);
#if defined(REDLINE_AVX512_VNNI)
  // A decode step reads eight rows at a time here too: sixteen streams of rows from memory were up to 1.19x slower
  // a step on the 1B-shaped model (one loaded model, the row-at-a-time kernel this replaced, eight rows and sixteen
  // switched every eight steps, 6 rounds in each of 3 processes: 15.6, 16.1 and 18.3 ms; on some runs of this
  // machine sixteen led, 11.4 against 12.4), where eight stayed within 1.04x of the old kernel; on the starter both
  // take 0.77-0.79x its time. A prompt, bound by its arithmetic, takes sixteen (REDLINE_WIDE_TILES=0: eight, for
  // measuring; the same bits either way).
  if (T <= 4) return q4_direct<Lanes8, 4, ASYM>(w, row_bytes, sc, mn, nb, n0, n1, qx, dx, sx, T, K, zeros, emit);
  if (wide_tiles())
    return q4_buffered<Lanes16, 8, ASYM>(w, row_bytes, sc, mn, nb, n0, n1, qx, dx, sx, T, K, zeros, emit);
  q4_buffered<Lanes8, 4, ASYM>(w, row_bytes, sc, mn, nb, n0, n1, qx, dx, sx, T, K, zeros, emit);
#else
  if (T <= 2) return q4_direct<Lanes8, 2, ASYM>(w, row_bytes, sc, mn, nb, n0, n1, qx, dx, sx, T, K, zeros, emit);
  q4_buffered<Lanes8, 4, ASYM>(w, row_bytes, sc, mn, nb, n0, n1, qx, dx, sx, T, K, zeros, emit);
#endif
}
#else
// 4-bit rows (`row_bytes` apart; scales, and mins for Q4_1, `nb` a row) eight at a time (q4_tile8), the activation
// rows in tiles of up to four.
template <bool ASYM, typename Emit>
inline void q4_span(const uint8_t* w, int64_t row_bytes, const uint16_t* sc, const uint16_t* mn, int64_t nb, int64_t n0,
                    int64_t n1, const int8_t* qx, const float* dx, const float* sx, int64_t T, int64_t K, Emit emit) {
  const uint8_t* zeros = q4_zero_row(nb);
  float out[4 * 8];
  for (int64_t n = n0; n < n1; n += 8) {
    const int rows = static_cast<int>(std::min<int64_t>(8, n1 - n));
    const uint8_t* wr[8];
    for (int r = 0; r < 8; ++r) wr[r] = r < rows ? w + (n + r) * row_bytes : zeros;
    const bool pf = T == 1 && prefetching();  // prefetches past the last row are dropped, harmless
    q4_tiles<4>(T, [&](int64_t t0, auto tt) {
      constexpr int TT = decltype(tt)::value;
      q4_tile8<ASYM, TT>(wr, sc + n * nb, ASYM ? mn + n * nb : nullptr, nb, rows, qx + t0 * K, dx + t0 * nb,
                         sx + t0 * nb, K, out, pf, w + (n + 8) * row_bytes, row_bytes);
      for (int t = 0; t < TT; ++t)
        for (int r = 0; r < rows; ++r) emit(t0 + t, n + r, out[t * 8 + r]);
    });
  }
}
#endif

}  // namespace redline_kernels
