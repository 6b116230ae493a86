// Redline's CPU kernels (x86-64 with AVX2, FMA and F16C), registered as torch operators `redline::*`.
//
// Why: at batch 1 a decode step reads every weight once, so speed is bytes per weight and how well the
// matrix-vector products stream them. torch's bf16 GEMV on AVX2 is a scalar fallback, and its int8/int4
// weight-only kernels want other layouts. These kernels read the layouts Redline keeps:
//   - bf16 weights [N, K] (the model's own tensors, not copied);
//   - block-quantised weights in GGUF's Q8_0 / Q4_0 / Q4_1 layout (inference/loading/block_quant.py);
// and fuse what a decode step does between the products (RMSNorm, SiLU·up, rotary + KV-cache write +
// attention over a paged cache), so a step is a few operator calls per layer instead of dozens.
// Activations are fp32. For the quantised layouts the activations are quantised to int8 per block of 32
// (as llama.cpp does) and the products are integer dot products (maddubs).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include "paged_attention.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

namespace {

using namespace redline_kernels;

struct QuantisedActivations {
  at::Tensor q, d, s;
  QuantisedActivations(const at::Tensor& x, int64_t T, int64_t K) {
    q = at::empty({T, K}, x.options().dtype(at::kChar));
    d = at::empty({T, K / BLOCK}, x.options());
    s = at::empty({T, K / BLOCK}, x.options());
    quantize_rows(x.data_ptr<float>(), T, K, q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<float>());
  }
};

// y = x @ w.T for block-quantised weights, R weight rows at a time against each activation row.
template <int BITS, bool ASYM>
void block_linear(const QuantisedActivations& a, const void* w, int64_t wstride, const uint16_t* sc, const uint16_t* mn,
                  int64_t N, int64_t K, int64_t T, float* y) {
  constexpr int R = 4;
  const int64_t nb = K / BLOCK;
  const int8_t* qx = a.q.data_ptr<int8_t>();
  const float* dx = a.d.data_ptr<float>();
  const float* sx = a.s.data_ptr<float>();
  const auto* wb = static_cast<const uint8_t*>(w);
  at::parallel_for(0, (N + R - 1) / R, 8, [&](int64_t g0, int64_t g1) {
    const int64_t n0 = g0 * R, n1 = std::min(N, g1 * R);
    const auto put = [&](int64_t t, int64_t n, float v) { y[t * N + n] = v; };
    if constexpr (BITS == 4)
      q4_span<ASYM>(wb, wstride, sc, mn, nb, n0, n1, qx, dx, sx, T, K, put);
    else
      q8_span(reinterpret_cast<const int8_t*>(wb), wstride, sc, nb, n0, n1, qx, dx, T, K, put);
  });
}

at::Tensor as_rows(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.size(-1) == K, "redline kernels: input has ", x.size(-1), " features, the weight ", K);
  return x.to(at::kFloat).contiguous().view({-1, K});
}

std::vector<int64_t> out_shape(const at::Tensor& x, int64_t N) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  return shape;
}

// y = x @ w.T for int8 blocks (Q8_0): w int8 [N, K], scales fp16 [N, K/32].
at::Tensor linear_q8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales) {
  TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous() && scales.scalar_type() == at::kHalf);
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % BLOCK == 0);
  const auto x2 = as_rows(x, K);
  const int64_t T = x2.size(0);
  const QuantisedActivations a(x2, T, K);
  auto y = at::empty({T, N}, x2.options());
  block_linear<8, false>(a, w.data_ptr<int8_t>(), K, reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>()),
                         nullptr, N, K, T, y.data_ptr<float>());
  return y.view(out_shape(x, N));
}

// y = x @ w.T for int4 blocks: w uint8 [N, K/2] (GGUF nibble order), scales fp16 [N, K/32], and mins fp16
// [N, K/32] (Q4_1: scale·q + min) or an empty tensor (Q4_0: scale·(q − 8)).
at::Tensor linear_q4(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, const at::Tensor& mins) {
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && scales.scalar_type() == at::kHalf);
  const int64_t N = w.size(0), K = w.size(1) * 2;
  TORCH_CHECK(K % BLOCK == 0);
  const bool asym = mins.numel() > 0;
  const auto x2 = as_rows(x, K);
  const int64_t T = x2.size(0);
  const QuantisedActivations a(x2, T, K);
  auto y = at::empty({T, N}, x2.options());
  const auto* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  if (asym)
    block_linear<4, true>(a, w.data_ptr<uint8_t>(), K / 2, sp, reinterpret_cast<const uint16_t*>(mins.data_ptr<at::Half>()),
                          N, K, T, y.data_ptr<float>());
  else
    block_linear<4, false>(a, w.data_ptr<uint8_t>(), K / 2, sp, nullptr, N, K, T, y.data_ptr<float>());
  return y.view(out_shape(x, N));
}

// y = x @ w.T for bf16 weights [N, K], fp32 activations.
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.stride(1) == 1);
  const int64_t N = w.size(0), K = w.size(1), ws = w.stride(0);
  TORCH_CHECK(K % 8 == 0);
  const auto x2 = as_rows(x, K);
  const int64_t T = x2.size(0);
  auto y = at::empty({T, N}, x2.options());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const float* xp = x2.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const auto rows = [&](auto p16, const float* xs) {
    at::parallel_for(0, (N + 3) / 4, T == 1 ? 4 : 8, [&](int64_t g0, int64_t g1) {
      dense_span<uint16_t, decltype(p16)::value>(wp, ws, 4 * g0, std::min(N, 4 * g1), xs, T, K,
                                                 [&](int64_t t, int64_t n, float v) { yp[t * N + n] = v; });
    });
  };
  if (K % 16 == 0) {  // the activations once in permute16's order, read by every thread
    std::vector<float> permuted(T * K);
    permute16(xp, T, K, permuted.data());
    rows(std::true_type{}, permuted.data());
  } else {
    rows(std::false_type{}, xp);
  }
  return y.view(out_shape(x, N));
}

// -- between the products ---------------------------------------------------------------------------
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t H = x.size(-1);
  TORCH_CHECK(H % 8 == 0 && weight.scalar_type() == at::kFloat);
  const auto x2 = as_rows(x, H);
  auto y = at::empty_like(x2);
  const float* xp = x2.data_ptr<float>();
  const auto w = weight.contiguous();
  float* yp = y.data_ptr<float>();
  for (int64_t m = 0; m < x2.size(0); ++m) rms_norm_row(xp + m * H, w.data_ptr<float>(), static_cast<float>(eps), H, yp + m * H);
  return y.view(x.sizes());
}

at::Tensor silu_mul(const at::Tensor& gate_up) {  // [.., 2I] → silu(gate) * up, [.., I]
  const int64_t I2 = gate_up.size(-1), I = I2 / 2;
  const auto g = as_rows(gate_up, I2);
  auto y = at::empty({g.size(0), I}, g.options());
  const float* gp = g.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t m = 0; m < g.size(0); ++m) silu_mul_span(gp + m * I2, gp + m * I2 + I, I, yp + m * I);
  auto shape = out_shape(gate_up, I);
  return y.view(shape);
}

// One decode step of attention for B sequences over a paged KV cache:
//   qkv [B, (H + 2·Hkv)·D] (after the q/k norms, before rotary), cos/sin [S_max, D], pools [P, Hkv, page, D],
//   pages [B, max_pages] int32 (each sequence's pages in order), pos [B] int64 (position of the new token).
// Applies the rotary embedding (rotate-half convention) to q and k, writes k and v at pos, and returns softmax(q·Kᵀ
// /√D)·V over positions 0..pos for each head (grouped-query: H / Hkv query heads share a KV head). [B, H·D]
template <typename C>
void attend_impl(const float* qkv, const float* cos, const float* sin, C* kp, C* vp, const int32_t* pages,
                 int64_t max_pages, const int64_t* pos, int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t page,
                 float scale, float* out) {
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
      rotate_half(k + h * D, cos + p * D, sin + p * D, D, kv.at(kp, b, h, p));
      C* vd = kv.at(vp, b, h, p);
      for (int64_t i = 0; i < D; ++i) vd[i] = static_cast<C>(v[h * D + i]);
    }
  }
  at::parallel_for(0, B * Hkv, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> sc;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / Hkv, first = b * H + (i % Hkv) * group, n = pos[b] + 1;
      sc.resize(group * n);
      attend_group(group, qr.data() + first * D, kv, b, i % Hkv, n, scale, sc.data(), out + first * D);
    }
  });
}

at::Tensor attend(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_pool,
                  at::Tensor v_pool, const at::Tensor& pages, const at::Tensor& pos, int64_t H, int64_t Hkv, double scale) {
  const int64_t page = k_pool.size(2), D = k_pool.size(3), B = pos.size(0);
  TORCH_CHECK(D % 8 == 0 && D % 2 == 0 && H % Hkv == 0 && k_pool.is_contiguous() && v_pool.is_contiguous());
  TORCH_CHECK(pages.scalar_type() == at::kInt && pos.scalar_type() == at::kLong && cos.scalar_type() == at::kFloat);
  const auto q = as_rows(qkv, (H + 2 * Hkv) * D);
  const auto c = cos.contiguous(), s = sin.contiguous(), pg = pages.contiguous(), ps = pos.contiguous();
  auto out = at::empty({B, H * D}, q.options());
  if (k_pool.scalar_type() == at::kFloat)
    attend_impl<float>(q.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), k_pool.data_ptr<float>(),
                       v_pool.data_ptr<float>(), pg.data_ptr<int32_t>(), pg.size(1), ps.data_ptr<int64_t>(), B, H, Hkv,
                       D, page, static_cast<float>(scale), out.data_ptr<float>());
  else if (k_pool.scalar_type() == at::kBFloat16)
    attend_impl<at::BFloat16>(q.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(),
                              k_pool.data_ptr<at::BFloat16>(), v_pool.data_ptr<at::BFloat16>(), pg.data_ptr<int32_t>(),
                              pg.size(1), ps.data_ptr<int64_t>(), B, H, Hkv, D, page, static_cast<float>(scale),
                              out.data_ptr<float>());
  else
    TORCH_CHECK(false, "redline::attend: the KV cache must be fp32 or bf16");
  return out;
}

// -- quantising weights at load time (one pass per row, in parallel); the same arithmetic, rounding and fp16
// conversion as block_quant.py's quantize_q8 / quantize_q4, which tests hold these to ----------------------
inline uint16_t to_f16(float v) { return _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT); }

template <typename W>
inline float weight_at(const W* w, int64_t i);
template <> inline float weight_at<float>(const float* w, int64_t i) { return w[i]; }
template <> inline float weight_at<at::BFloat16>(const at::BFloat16* w, int64_t i) { return static_cast<float>(w[i]); }

template <typename W>
void quantize_q8_impl(const W* w, int64_t N, int64_t K, int8_t* q, uint16_t* sc) {
  const int64_t nb = K / BLOCK;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
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
        sc[n * nb + b] = to_f16(d);
      }
  });
}

template <typename W>
void quantize_q4_impl(const W* w, int64_t N, int64_t K, bool symmetric, uint8_t* packed, uint16_t* sc, uint16_t* mn) {
  const int64_t nb = K / BLOCK;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
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
          sc[n * nb + b] = to_f16(d);
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
          sc[n * nb + b] = to_f16(d);
          mn[n * nb + b] = to_f16(lo);
        }
        uint8_t* dst = packed + n * (K / 2) + b * (BLOCK / 2);
        for (int64_t j = 0; j < BLOCK / 2; ++j) dst[j] = static_cast<uint8_t>(q[j] | (q[j + BLOCK / 2] << 4));
      }
  });
}

std::tuple<at::Tensor, at::Tensor> quantize_q8(const at::Tensor& w_) {
  const auto w = w_.contiguous();
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % BLOCK == 0);
  auto q = at::empty({N, K}, w.options().dtype(at::kChar));
  auto sc = at::empty({N, K / BLOCK}, w.options().dtype(at::kHalf));
  auto* sp = reinterpret_cast<uint16_t*>(sc.data_ptr<at::Half>());
  if (w.scalar_type() == at::kBFloat16) quantize_q8_impl(w.data_ptr<at::BFloat16>(), N, K, q.data_ptr<int8_t>(), sp);
  else quantize_q8_impl(w.to(at::kFloat).data_ptr<float>(), N, K, q.data_ptr<int8_t>(), sp);
  return {q, sc};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_q4(const at::Tensor& w_, bool symmetric) {
  const auto w = w_.scalar_type() == at::kBFloat16 ? w_.contiguous() : w_.to(at::kFloat).contiguous();
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % BLOCK == 0);
  auto packed = at::empty({N, K / 2}, w.options().dtype(at::kByte));
  auto sc = at::empty({N, K / BLOCK}, w.options().dtype(at::kHalf));
  auto mn = symmetric ? at::empty({0}, sc.options()) : at::empty({N, K / BLOCK}, sc.options());
  auto* sp = reinterpret_cast<uint16_t*>(sc.data_ptr<at::Half>());
  auto* mp = symmetric ? nullptr : reinterpret_cast<uint16_t*>(mn.data_ptr<at::Half>());
  if (w.scalar_type() == at::kBFloat16)
    quantize_q4_impl(w.data_ptr<at::BFloat16>(), N, K, symmetric, packed.data_ptr<uint8_t>(), sp, mp);
  else
    quantize_q4_impl(w.data_ptr<float>(), N, K, symmetric, packed.data_ptr<uint8_t>(), sp, mp);
  return {packed, sc, mn};
}

}  // namespace

TORCH_LIBRARY(redline, m) {
  m.def("linear_bf16(Tensor x, Tensor w) -> Tensor");
  m.def("linear_q8(Tensor x, Tensor w, Tensor scales) -> Tensor");
  m.def("linear_q4(Tensor x, Tensor w, Tensor scales, Tensor mins) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("quantize_q8(Tensor w) -> (Tensor, Tensor)");
  m.def("quantize_q4(Tensor w, bool symmetric) -> (Tensor, Tensor, Tensor)");
  m.def(
      "attend(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor pages, Tensor pos, "
      "int H, int Hkv, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(redline, CPU, m) {
  m.impl("linear_bf16", &linear_bf16);
  m.impl("linear_q8", &linear_q8);
  m.impl("linear_q4", &linear_q4);
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_mul", &silu_mul);
  m.impl("attend", &attend);
  m.impl("quantize_q8", &quantize_q8);
  m.impl("quantize_q4", &quantize_q4);
}
