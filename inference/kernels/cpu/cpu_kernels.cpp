// Redline's CPU kernels, one operator per call, as a plain C ABI (abi.h): wrappers.py calls them through ctypes and
// registers them as the torch operators redline::linear_bf16, linear_q8, linear_q4, rms_norm, silu_mul, attend,
// quantize_q8 and quantize_q4. Built for x86-64 with AVX2, FMA and F16C, for other x86-64 CPUs (portable), and for
// ARM64 NEON (vec.h); library.py picks the build this CPU runs.
//
// Why: at batch 1 a decode step reads every weight once, so speed is bytes per weight and how well the
// matrix-vector products stream them. torch's bf16 GEMV on AVX2 is a scalar fallback, and its int8/int4
// weight-only kernels want other layouts. These kernels read the layouts Redline keeps:
//   - bf16 weights [N, K] (the model's own tensors, not copied);
//   - block-quantised weights in GGUF's Q8_0 / Q4_0 / Q4_1 layout (inference/kernels/block_quant.py);
// and fuse what a decode step does between the products (RMSNorm, SiLU·up, rotary + KV-cache write +
// attention over a paged cache), so a step is a few operator calls per layer instead of dozens.
// Activations are fp32. For the quantised layouts the activations are quantised to int8 per block of 32
// (as llama.cpp does) and the products are integer dot products (maddubs, or SDOT on ARM).
//
// Shapes and types are checked by the Python side (wrappers.py) before a call; the caller allocates every output.
#include "abi.h"
#include "paged_attention.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#if defined(REDLINE_AVX2)
#if defined(REDLINE_AVX512_VNNI)
#define REDLINE_VARIANT "avx512-vnni"
#elif defined(REDLINE_AVX_VNNI)
#define REDLINE_VARIANT "avx2-vnni"
#else
#define REDLINE_VARIANT "avx2"
#endif
#elif defined(REDLINE_NEON) && defined(REDLINE_DOTPROD)
#define REDLINE_VARIANT "neon-dotprod"
#elif defined(REDLINE_NEON)
#define REDLINE_VARIANT "neon"
#else
#define REDLINE_VARIANT "generic"
#endif

#if defined(__GLIBCXX__) && !defined(_WIN32) && !defined(__APPLE__)
// GCC 11+'s headers make std::vector's allocation call this (new in libstdc++ 3.4.29, glibc 2.34's generation);
// defined here, the library needs nothing newer from libstdc++ than GCC 5's (GLIBCXX_3.4.21), so it loads on the
// older distributions a manylinux wheel promises. The same behaviour: allocating too much throws std::bad_alloc.
namespace std {
void __throw_bad_array_new_length() { throw std::bad_alloc(); }
}  // namespace std
#endif

namespace redline_kernels {

thread_local char g_last_error[1024];
void set_last_error(const char* message) {
  std::strncpy(g_last_error, message, sizeof g_last_error - 1);
  g_last_error[sizeof g_last_error - 1] = 0;
}

namespace {

struct QuantisedActivations {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  QuantisedActivations(const float* x, int64_t T, int64_t K, int threads)
      : q(T * K), d(T * (K / BLOCK)), s(T * (K / BLOCK)) {
    quantize_rows(x, T, K, q.data(), d.data(), s.data(), threads);
  }
};

// y = x @ w.T for block-quantised weights, R weight rows at a time against each activation row.
template <int BITS, bool ASYM>
void block_linear(const QuantisedActivations& a, const void* w, int64_t wstride, const uint16_t* sc, const uint16_t* mn,
                  int64_t N, int64_t K, int64_t T, float* y, int threads) {
  constexpr int R = 4;
  const int64_t nb = K / BLOCK;
  const int8_t* qx = a.q.data();
  const float* dx = a.d.data();
  const float* sx = a.s.data();
  const auto* wb = static_cast<const uint8_t*>(w);
  parallel_for(0, (N + R - 1) / R, 8, threads, [&](int64_t g0, int64_t g1) {
    const int64_t n0 = g0 * R, n1 = std::min(N, g1 * R);
    const auto put = [&](int64_t t, int64_t n, float v) { y[t * N + n] = v; };
    if constexpr (BITS == 4)
      q4_span<ASYM>(wb, wstride, sc, mn, nb, n0, n1, qx, dx, sx, T, K, put);
    else
      q8_span(reinterpret_cast<const int8_t*>(wb), wstride, sc, nb, n0, n1, qx, dx, T, K, put);
  });
}

// One decode step of attention for B sequences over a paged KV cache:
//   qkv [B, (H + 2·Hkv)·D] (after the q/k norms, before rotary), cos/sin [S_max, D], pools [P, Hkv, page, D],
//   pages [B, max_pages] int32 (each sequence's pages in order), pos [B] int64 (position of the new token).
// Applies the rotary embedding (rotate-half convention) to q and k, writes k and v at pos, and returns softmax(q·Kᵀ
// /√D)·V over positions 0..pos for each head (grouped-query: H / Hkv query heads share a KV head). [B, H·D]
template <typename C>
void attend_impl(const float* qkv, const float* cos, const float* sin, C* kp, C* vp, const int32_t* pages,
                 int64_t max_pages, const int64_t* pos, int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t page,
                 float scale, float* out, int threads) {
  const int64_t row = (H + 2 * Hkv) * D, group = H / Hkv;
  const PagedPools<C> kv{kp, vp, pages, max_pages, Hkv, page, D};
  std::vector<float> qr(B * H * D);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = pos[b];
    const float* q = qkv + b * row;
    const float* k = q + H * D;
    const float* v = k + Hkv * D;
    for (int64_t h = 0; h < H; ++h) rotate_half(q + h * D, cos + p * D, sin + p * D, D, qr.data() + (b * H + h) * D);
    for (int64_t h = 0; h < Hkv; ++h) {
      store_key(k + h * D, cos + p * D, sin + p * D, D, kv.at(kp, b, h, p));
      store_row(v + h * D, D, kv.at(vp, b, h, p));
    }
  }
  parallel_for(0, B * Hkv, 1, threads, [&](int64_t i0, int64_t i1) {
    std::vector<float> sc;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / Hkv, first = b * H + (i % Hkv) * group, n = pos[b] + 1;
      sc.resize(group * n);
      attend_group(group, qr.data() + first * D, kv, b, i % Hkv, n, scale, sc.data(), out + first * D);
    }
  });
}

// -- quantising weights at load time (one pass per row, in parallel); the same arithmetic, rounding and fp16
// conversion as block_quant.py's quantize_q8 / quantize_q4, which tests hold these to ----------------------
template <typename W>
inline float weight_at(const W* w, int64_t i);
template <> inline float weight_at<float>(const float* w, int64_t i) { return w[i]; }
template <> inline float weight_at<bf16>(const bf16* w, int64_t i) { return static_cast<float>(w[i]); }

template <typename W>
void quantize_q8_impl(const W* w, int64_t N, int64_t K, int8_t* q, uint16_t* sc, int threads) {
  const int64_t nb = K / BLOCK;
  parallel_for(0, N, 16, threads, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t o = n * K + b * BLOCK;
        float amax = 0.f;
        for (int64_t j = 0; j < BLOCK; ++j) amax = std::max(amax, std::fabs(weight_at(w, o + j)));
        const float d = amax / 127.f;
        const float inv = d > 0 ? 1.f / d : 0.f;
        for (int64_t j = 0; j < BLOCK; ++j) {
          const float r = std::nearbyint(weight_at(w, o + j) * inv);
          q[o + j] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, r)));
        }
        sc[n * nb + b] = f32_to_f16(d);
      }
  });
}

template <typename W>
void quantize_q4_impl(const W* w, int64_t N, int64_t K, bool symmetric, uint8_t* packed, uint16_t* sc, uint16_t* mn,
                      int threads) {
  const int64_t nb = K / BLOCK;
  parallel_for(0, N, 16, threads, [&](int64_t n0, int64_t n1) {
    uint8_t q[BLOCK];
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t o = n * K + b * BLOCK;
        if (symmetric) {
          float amax = -1.f, mx = 0.f;
          for (int64_t j = 0; j < BLOCK; ++j) {
            const float v = weight_at(w, o + j);
            if (std::fabs(v) > amax) { amax = std::fabs(v); mx = v; }
          }
          const float d = mx / -8.f;
          const float inv = d != 0 ? 1.f / d : 0.f;
          for (int64_t j = 0; j < BLOCK; ++j)
            q[j] = static_cast<uint8_t>(std::min(15.f, std::max(0.f, std::floor(weight_at(w, o + j) * inv + 8.5f))));
          sc[n * nb + b] = f32_to_f16(d);
        } else {
          float lo = INFINITY, hi = -INFINITY;
          for (int64_t j = 0; j < BLOCK; ++j) {
            const float v = weight_at(w, o + j);
            lo = std::min(lo, v);
            hi = std::max(hi, v);
          }
          const float d = (hi - lo) / 15.f;
          const float inv = d > 0 ? 1.f / d : 0.f;
          for (int64_t j = 0; j < BLOCK; ++j)
            q[j] = static_cast<uint8_t>(std::min(15.f, std::max(0.f, std::floor((weight_at(w, o + j) - lo) * inv + 0.5f))));
          sc[n * nb + b] = f32_to_f16(d);
          mn[n * nb + b] = f32_to_f16(lo);
        }
        uint8_t* dst = packed + n * (K / 2) + b * (BLOCK / 2);
        for (int64_t j = 0; j < BLOCK / 2; ++j) dst[j] = static_cast<uint8_t>(q[j] | (q[j + BLOCK / 2] << 4));
      }
  });
}

}  // namespace
}  // namespace redline_kernels

using namespace redline_kernels;

REDLINE_API int redline_abi_version() { return REDLINE_ABI_VERSION; }
REDLINE_API const char* redline_variant() { return REDLINE_VARIANT; }
REDLINE_API const char* redline_last_error() { return g_last_error; }

// y [T, N] = x [T, K] @ w.T for bf16 weights [N, K] (rows `ws` elements apart), fp32 activations. K % 8 == 0.
REDLINE_API int redline_linear_bf16(const float* x, int64_t T, int64_t K, const uint16_t* w, int64_t N, int64_t ws,
                                    float* y, int threads) {
  return guarded([&] {
    check(K % 8 == 0, "redline::linear_bf16: ", K, " inputs, not a multiple of 8");
    const auto rows = [&](auto p16, const float* xs) {
      parallel_for(0, (N + 3) / 4, T == 1 ? 4 : 8, threads, [&](int64_t g0, int64_t g1) {
        dense_span<uint16_t, decltype(p16)::value>(w, ws, 4 * g0, std::min(N, 4 * g1), xs, T, K,
                                                   [&](int64_t t, int64_t n, float v) { y[t * N + n] = v; });
      });
    };
    if (K % 16 == 0) {  // the activations once in permute16's order, read by every thread
      std::vector<float> permuted(T * K);
      permute16(x, T, K, permuted.data());
      rows(std::true_type{}, permuted.data());
    } else {
      rows(std::false_type{}, x);
    }
  });
}

// y [T, N] = x @ w.T for int8 blocks (Q8_0): w int8 [N, K], scales fp16 [N, K/32].
REDLINE_API int redline_linear_q8(const float* x, int64_t T, int64_t K, const int8_t* w, const uint16_t* scales,
                                  int64_t N, float* y, int threads) {
  return guarded([&] {
    check(K % BLOCK == 0, "redline::linear_q8: ", K, " inputs, not a multiple of 32");
    const QuantisedActivations a(x, T, K, threads);
    block_linear<8, false>(a, w, K, scales, nullptr, N, K, T, y, threads);
  });
}

// y [T, N] = x @ w.T for int4 blocks: w uint8 [N, K/2] (GGUF nibble order), scales fp16 [N, K/32], and mins fp16
// [N, K/32] (Q4_1: scale·q + min) or null (Q4_0: scale·(q − 8)).
REDLINE_API int redline_linear_q4(const float* x, int64_t T, int64_t K, const uint8_t* w, const uint16_t* scales,
                                  const uint16_t* mins, int64_t N, float* y, int threads) {
  return guarded([&] {
    check(K % BLOCK == 0, "redline::linear_q4: ", K, " inputs, not a multiple of 32");
    const QuantisedActivations a(x, T, K, threads);
    if (mins)
      block_linear<4, true>(a, w, K / 2, scales, mins, N, K, T, y, threads);
    else
      block_linear<4, false>(a, w, K / 2, scales, nullptr, N, K, T, y, threads);
  });
}

// -- between the products ---------------------------------------------------------------------------
REDLINE_API int redline_rms_norm(const float* x, int64_t rows, int64_t H, const float* weight, double eps, float* y) {
  return guarded([&] {
    check(H % 8 == 0, "redline::rms_norm: ", H, " features, not a multiple of 8");
    for (int64_t m = 0; m < rows; ++m) rms_norm_row(x + m * H, weight, static_cast<float>(eps), H, y + m * H);
  });
}

// [rows, 2I] → silu(gate) * up, [rows, I]
REDLINE_API int redline_silu_mul(const float* gate_up, int64_t rows, int64_t I, float* y) {
  return guarded([&] {
    for (int64_t m = 0; m < rows; ++m) silu_mul_span(gate_up + m * 2 * I, gate_up + m * 2 * I + I, I, y + m * I);
  });
}

// cache_dtype: F32 or BF16 (abi.h), pools [P, Hkv, page, D] contiguous; or I8, pools [P, Hkv, page, D + 2]
// (paged_attention.h's 8-bit rows).
REDLINE_API int redline_attend(const float* qkv, const float* cos, const float* sin, void* k_pool, void* v_pool,
                               int64_t cache_dtype, const int32_t* pages, int64_t max_pages, const int64_t* pos,
                               int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t page, double scale, float* out,
                               int threads) {
  return guarded([&] {
    check(D % 8 == 0 && H % Hkv == 0, "redline::attend: head size ", D, " must be a multiple of 8 and ", H,
          " heads a multiple of ", Hkv);
    if (cache_dtype == F32)
      attend_impl<float>(qkv, cos, sin, static_cast<float*>(k_pool), static_cast<float*>(v_pool), pages, max_pages,
                         pos, B, H, Hkv, D, page, static_cast<float>(scale), out, threads);
    else if (cache_dtype == BF16)
      attend_impl<bf16>(qkv, cos, sin, static_cast<bf16*>(k_pool), static_cast<bf16*>(v_pool), pages, max_pages, pos,
                        B, H, Hkv, D, page, static_cast<float>(scale), out, threads);
    else if (cache_dtype == I8 && D <= 1024)
      attend_impl<int8_t>(qkv, cos, sin, static_cast<int8_t*>(k_pool), static_cast<int8_t*>(v_pool), pages, max_pages,
                          pos, B, H, Hkv, D, page, static_cast<float>(scale), out, threads);
    else
      check(false, "redline::attend: the KV cache must be fp32, bf16 or int8 rows of up to 1,024 (and their scale)");
  });
}

// w [N, K] contiguous, fp32 or bf16 (w_dtype); q int8 [N, K], scales fp16 [N, K/32].
REDLINE_API int redline_quantize_q8(const void* w, int64_t w_dtype, int64_t N, int64_t K, int8_t* q, uint16_t* scales,
                                    int threads) {
  return guarded([&] {
    check(K % BLOCK == 0, "redline::quantize_q8: ", K, " inputs, not a multiple of 32");
    if (w_dtype == BF16) quantize_q8_impl(static_cast<const bf16*>(w), N, K, q, scales, threads);
    else quantize_q8_impl(static_cast<const float*>(w), N, K, q, scales, threads);
  });
}

// packed uint8 [N, K/2], scales fp16 [N, K/32], mins fp16 [N, K/32] (unused when symmetric).
REDLINE_API int redline_quantize_q4(const void* w, int64_t w_dtype, int64_t N, int64_t K, int symmetric,
                                    uint8_t* packed, uint16_t* scales, uint16_t* mins, int threads) {
  return guarded([&] {
    check(K % BLOCK == 0, "redline::quantize_q4: ", K, " inputs, not a multiple of 32");
    if (w_dtype == BF16)
      quantize_q4_impl(static_cast<const bf16*>(w), N, K, symmetric != 0, packed, scales, mins, threads);
    else
      quantize_q4_impl(static_cast<const float*>(w), N, K, symmetric != 0, packed, scales, mins, threads);
  });
}
