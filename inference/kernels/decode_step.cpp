// A whole forward pass of a Llama-shaped decoder in one operator call, `redline::decode_step`: for T rows (one
// new token of each of B sequences, or several positions of one sequence in a prefill) every layer's RMSNorm,
// fused q/k/v product, optional q/k norms, rotary embedding, paged KV-cache write, attention, output product,
// RMSNorm, fused gate/up product, SiLU·up and down product, then the final norm and the output head.
//
// Why one call: the per-operator step (cpu_kernels.cpp, called from inference/decoding/fastpath.py) pays per
// layer about ten dispatches from Python, ten starts of a parallel region and a dozen tensor allocations — on
// the starter (30 layers) about a third of a q4 decode step. Here the threads stay in one OpenMP region for
// the whole pass and meet at a barrier between stages, as llama.cpp's threads do in its graph loop; all
// scratch memory is allocated once per call.
//
// The arithmetic is the per-operator kernels' (the same inline row products, quantiser, norms and attention),
// and every row's result is independent of the other rows, so a sequence decodes the same alone or in a batch.
#include <ATen/ATen.h>
#include <omp.h>
#include <torch/library.h>

#include "paged_attention.h"
#include "simd.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

using namespace redline_kernels;

// An opt-in profile of the step's stages (redline::step_profile, tools/step_profile.py): wall time between the
// barriers, read on thread 0, so a stage's time includes waiting for the slowest thread.
constexpr int STAGES = 11;  // norm, qkv, rotary + cache write, attention, quantise, o, norm, gate_up, silu, down, head
std::atomic<bool> g_profiling{false};
double g_stage_seconds[STAGES] = {};
int64_t g_profiled_steps = 0;

enum class Kind { F32, BF16, Q8, Q4, Q4_ASYM };

// One product's weight as the kernels read it: fp32 or bf16 rows [N, K], or GGUF blocks (inference/loading/
// block_quant.py), plus an optional fp32 bias [N].
struct Product {
  Kind kind = Kind::F32;
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
  const uint16_t* sc = nullptr;
  const uint16_t* mn = nullptr;
  const float* bias = nullptr;
  int64_t N = 0, K = 0;
  bool quantised() const { return kind == Kind::Q8 || kind == Kind::Q4 || kind == Kind::Q4_ASYM; }
};

Product product_of(const at::Tensor& w, const at::Tensor& s, const at::Tensor& m, const at::Tensor& b, int64_t K,
                   const char* what) {
  TORCH_CHECK(w.dim() == 2 && w.stride(1) == 1, "redline::decode_step: ", what, " weight must be 2-D with rows");
  Product p;
  p.N = w.size(0);
  p.w = static_cast<const uint8_t*>(w.data_ptr());
  switch (w.scalar_type()) {
    case at::kFloat:
    case at::kBFloat16:
      p.kind = w.scalar_type() == at::kFloat ? Kind::F32 : Kind::BF16;
      p.K = w.size(1);
      p.row_bytes = w.stride(0) * w.element_size();
      TORCH_CHECK(p.K % 8 == 0, "redline::decode_step: ", what, " has ", p.K, " inputs, not a multiple of 8");
      break;
    case at::kChar:
    case at::kByte:
      TORCH_CHECK(w.is_contiguous() && s.scalar_type() == at::kHalf && s.is_contiguous(),
                  "redline::decode_step: ", what, " blocks must be contiguous with fp16 scales");
      p.kind = w.scalar_type() == at::kChar ? Kind::Q8 : (m.numel() > 0 ? Kind::Q4_ASYM : Kind::Q4);
      p.K = w.scalar_type() == at::kChar ? w.size(1) : 2 * w.size(1);
      p.row_bytes = w.size(1);
      TORCH_CHECK(s.size(0) == p.N && s.size(1) * BLOCK == p.K, "redline::decode_step: ", what, " scales do not match");
      p.sc = reinterpret_cast<const uint16_t*>(s.data_ptr<at::Half>());
      if (p.kind == Kind::Q4_ASYM) {
        TORCH_CHECK(m.scalar_type() == at::kHalf && m.is_contiguous() && m.sizes() == s.sizes());
        p.mn = reinterpret_cast<const uint16_t*>(m.data_ptr<at::Half>());
      }
      break;
    default:
      TORCH_CHECK(false, "redline::decode_step: ", what, " weight of type ", w.scalar_type(), " is not supported");
  }
  TORCH_CHECK(p.K == K, "redline::decode_step: ", what, " takes ", p.K, " inputs, the step gives it ", K);
  if (b.numel() > 0) {
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.is_contiguous() && b.numel() == p.N,
                "redline::decode_step: ", what, " bias must be fp32 [", p.N, "]");
    p.bias = b.data_ptr<float>();
  }
  return p;
}

// The input rows of a product: fp32 [T, K] for dense weights, int8 blocks (q, d, s per block) for quantised ones.
struct Acts {
  const float* x;
  const int8_t* q;
  const float* d;
  const float* s;
};

inline void emit(const Product& p, float* y, int64_t n, float v, bool add) {  // y[n] (+)= product + bias
  v += p.bias ? p.bias[n] : 0.f;
  y[n] = add ? y[n] + v : v;
}

template <typename W>
void dense_range(const Product& p, const float* x, int64_t T, int64_t n0, int64_t n1, float* y, int64_t ys, bool add) {
  const int64_t stride = p.row_bytes / static_cast<int64_t>(sizeof(W)), K = p.K;
  const W* base = reinterpret_cast<const W*>(p.w);
  const auto put = [&](int64_t t, int64_t n, float v) { emit(p, y + t * ys, n, v, add); };
  if constexpr (std::is_same_v<W, uint16_t>) {
    if (K % 16 == 0) {
      thread_local std::vector<float> xp;  // this thread's copy of the activations in permute16's order
      xp.resize(T * K);
      permute16(x, T, K, xp.data());
      return dense_span<W, true>(base, stride, n0, n1, xp.data(), T, K, put);
    }
  }
  dense_span<W, false>(base, stride, n0, n1, x, T, K, put);
}

// Output columns n0..n1 of y [T, ys] = x @ Wᵀ (+ bias), added to y when `add` (the residual stream).
void product_range(const Product& p, const Acts& a, int64_t T, int64_t n0, int64_t n1, float* y, int64_t ys, bool add) {
  if (n0 >= n1) return;
  if (p.kind == Kind::F32) return dense_range<float>(p, a.x, T, n0, n1, y, ys, add);
  if (p.kind == Kind::BF16) return dense_range<uint16_t>(p, a.x, T, n0, n1, y, ys, add);
  const int64_t K = p.K, nb = K / BLOCK;
  const auto put = [&](int64_t t, int64_t n, float v) { emit(p, y + t * ys, n, v, add); };
  if (p.kind == Kind::Q4) return q4_span<false>(p.w, p.row_bytes, p.sc, nullptr, nb, n0, n1, a.q, a.d, a.s, T, K, put);
  if (p.kind == Kind::Q4_ASYM) return q4_span<true>(p.w, p.row_bytes, p.sc, p.mn, nb, n0, n1, a.q, a.d, a.s, T, K, put);
  q8_span(reinterpret_cast<const int8_t*>(p.w), p.row_bytes, p.sc, nb, n0, n1, a.q, a.d, T, K, put);
}

// Attention over keys lo..hi of row t's KV head kvh: the whole row (parts == 1) or one of `parts` parts whose
// unnormalised result goes to the part buffer at `part`.
struct Unit {
  int64_t t, kvh, lo, hi, parts, part;
};
constexpr int64_t SPLIT_KEYS = 512;

struct LayerWeights {
  const float *ln1, *ln2, *q_norm, *k_norm;  // q_norm / k_norm null when the model has none
  float eps1, eps2, q_eps, k_eps;
  Product qkv, o, gate_up, down;
};

// Each thread's share of n items, in whole units (so a share starts on a group of rows).
inline void share(int64_t n, int64_t unit, int tid, int nt, int64_t& a, int64_t& b) {
  const int64_t groups = (n + unit - 1) / unit;
  a = std::min(n, groups * tid / nt * unit);
  b = std::min(n, groups * (tid + 1) / nt * unit);
}

template <typename C>
void forward(float* x, int64_t T, int64_t Hd, const std::vector<LayerWeights>& layers, const float* final_norm,
             float final_eps, const Product& head, const float* cos, const float* sin, C* k_all, C* v_all,
             int64_t layer_elems, const int32_t* pages, int64_t max_pages, const int64_t* pos, int64_t H, int64_t Hkv,
             int64_t D, int64_t page, float scale, int64_t logit_rows, float* logits) {
  const int64_t QKV = (H + 2 * Hkv) * D, I = layers.empty() ? 0 : layers[0].down.K, group = H / Hkv;
  const int64_t kmax = std::max({Hd, H * D, I});
  int64_t longest = 1;
  for (int64_t t = 0; t < T; ++t) longest = std::max(longest, pos[t] + 1);
  const int nthreads = std::max(1, at::get_num_threads());
  std::vector<float> h(T * Hd), qkv(T * QKV), qr(T * H * D), attn(T * H * D), gu(T * 2 * I), act(T * I);
  std::vector<int8_t> qbuf(T * kmax);
  std::vector<float> dbuf(T * kmax / BLOCK + 1), sbuf(T * kmax / BLOCK + 1);
  std::vector<float> scores(static_cast<size_t>(nthreads) * group * longest), scratch(static_cast<size_t>(nthreads) * D);
  // Attention work: one unit per row and KV head, or, past SPLIT_KEYS positions, one per part of the keys (merged
  // afterwards), so one long sequence keeps every thread busy. The split depends on the row alone: a sequence
  // gets the same numbers alone or in a batch.
  std::vector<Unit> units;
  std::vector<int64_t> merges;  // index of each split group's first part
  int64_t part_floats = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = pos[t] + 1;
    const int64_t S = splittable(group, D) ? std::max<int64_t>(1, (n + SPLIT_KEYS - 1) / SPLIT_KEYS) : 1;
    for (int64_t g = 0; g < Hkv; ++g) {
      if (S > 1) merges.push_back(static_cast<int64_t>(units.size()));
      for (int64_t p = 0; p < S; ++p) {
        units.push_back(Unit{t, g, n * p / S, n * (p + 1) / S, S, part_floats});
        if (S > 1) part_floats += group * (D + 2);
      }
    }
  }
  std::vector<float> parts(static_cast<size_t>(part_floats));

#pragma omp parallel num_threads(nthreads)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    float* sc = scores.data() + tid * group * longest;
    float* tmp = scratch.data() + tid * D;
    int64_t a = 0, b = 0;
    const bool profiling = g_profiling.load(std::memory_order_relaxed) && tid == 0;
    double mark = profiling ? omp_get_wtime() : 0.0;
    const auto stage = [&](int i) {
      if (!profiling) return;
      const double now = omp_get_wtime();
      g_stage_seconds[i] += now - mark;
      mark = now;
    };
    // Rows r0.. of src [*, K] quantised into the shared int8 buffer (row t of the product at t·K).
    const auto quantise_blocks = [&](const float* src, int64_t rows, int64_t K) {
      share(rows * (K / BLOCK), 1, tid, nt, a, b);
      for (int64_t i = a; i < b; ++i) quantize_block(src + i * BLOCK, qbuf.data() + i * BLOCK, &dbuf[i], &sbuf[i]);
    };
    const auto norm_rows = [&](const float* w, float eps, int64_t r0, bool quantise) {
      share(T - r0, 1, tid, nt, a, b);
      for (int64_t t = r0 + a; t < r0 + b; ++t) {
        rms_norm_row(x + t * Hd, w, eps, Hd, h.data() + t * Hd);
        if (quantise)
          for (int64_t i = 0; i < Hd / BLOCK; ++i) {
            const int64_t blk = (t - r0) * (Hd / BLOCK) + i;
            quantize_block(h.data() + t * Hd + i * BLOCK, qbuf.data() + blk * BLOCK, &dbuf[blk], &sbuf[blk]);
          }
      }
    };
    const auto product = [&](const Product& p, const float* in, int64_t rows, float* y, bool add) {
      share(p.N, 4, tid, nt, a, b);
      product_range(p, Acts{in, qbuf.data(), dbuf.data(), sbuf.data()}, rows, a, b, y, p.N, add);
    };

    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerWeights& L = layers[l];
      const PagedPools<C> kv{k_all + l * layer_elems, v_all + l * layer_elems, pages, max_pages, Hkv, page, D};
      norm_rows(L.ln1, L.eps1, 0, L.qkv.quantised());
#pragma omp barrier
      stage(0);
      product(L.qkv, h.data(), T, qkv.data(), false);
#pragma omp barrier
      stage(1);
      // q/k norms, rotary, and this position's keys and values into the cache.
      share(T * (H + Hkv), 1, tid, nt, a, b);
      for (int64_t i = a; i < b; ++i) {
        const int64_t t = i / (H + Hkv), j = i % (H + Hkv), p = pos[t];
        const float* row = qkv.data() + t * QKV;
        const float* c = cos + p * D;
        const float* s = sin + p * D;
        if (j < H) {
          const float* src = row + j * D;
          if (L.q_norm) rms_norm_row(src, L.q_norm, L.q_eps, D, tmp), src = tmp;
          rotate_half(src, c, s, D, qr.data() + (t * H + j) * D);
        } else {
          const int64_t g = j - H;
          const float* src = row + H * D + g * D;
          if (L.k_norm) rms_norm_row(src, L.k_norm, L.k_eps, D, tmp), src = tmp;
          rotate_half(src, c, s, D, kv.at(kv.k, t, g, p));
          const float* v = row + (H + Hkv) * D + g * D;
          C* vd = kv.at(kv.v, t, g, p);
          for (int64_t e = 0; e < D; ++e) vd[e] = static_cast<C>(v[e]);
        }
      }
#pragma omp barrier
      stage(2);
      share(static_cast<int64_t>(units.size()), 1, tid, nt, a, b);
      for (int64_t i = a; i < b; ++i) {
        const Unit& u = units[i];
        const int64_t first = u.t * H + u.kvh * group;  // the group's heads are adjacent
        if (u.parts == 1)
          attend_group(group, qr.data() + first * D, kv, u.t, u.kvh, u.hi, scale, sc, attn.data() + first * D);
        else
          attend_group_part(group, qr.data() + first * D, kv, u.t, u.kvh, u.lo, u.hi, scale, sc,
                            parts.data() + u.part);
      }
#pragma omp barrier
      if (!merges.empty()) {
        share(static_cast<int64_t>(merges.size()) * group, 1, tid, nt, a, b);
        for (int64_t i = a; i < b; ++i) {
          const Unit& u = units[merges[i / group]];  // the first part of a split group
          const int64_t g = i % group, head = u.t * H + u.kvh * group + g;
          merge_parts(parts.data() + u.part + g * (D + 2), u.parts, group * (D + 2), D, attn.data() + head * D);
        }
#pragma omp barrier
      }
      stage(3);
      if (L.o.quantised()) {
        quantise_blocks(attn.data(), T, H * D);
#pragma omp barrier
      }
      stage(4);
      product(L.o, attn.data(), T, x, true);
#pragma omp barrier
      stage(5);
      norm_rows(L.ln2, L.eps2, 0, L.gate_up.quantised());
#pragma omp barrier
      stage(6);
      product(L.gate_up, h.data(), T, gu.data(), false);
#pragma omp barrier
      stage(7);
      {  // SiLU·up, quantised block by block as it is made when the down product wants blocks
        const int64_t unit = L.down.quantised() ? BLOCK : I, per_row = I / unit;
        share(T * per_row, 1, tid, nt, a, b);
        for (int64_t i = a; i < b; ++i) {
          const int64_t t = i / per_row, e = (i % per_row) * unit;
          float* dst = act.data() + t * I + e;
          silu_mul_span(gu.data() + t * 2 * I + e, gu.data() + t * 2 * I + I + e, unit, dst);
          if (L.down.quantised()) quantize_block(dst, qbuf.data() + t * I + e, &dbuf[t * per_row + e / BLOCK],
                                                 &sbuf[t * per_row + e / BLOCK]);
        }
      }
#pragma omp barrier
      stage(8);
      product(L.down, act.data(), T, x, true);
#pragma omp barrier
      stage(9);
    }
    const int64_t r0 = T - logit_rows;
    norm_rows(final_norm, final_eps, r0, head.quantised());
#pragma omp barrier
    product(head, h.data() + r0 * Hd, logit_rows, logits, false);
#pragma omp barrier
    stage(10);
  }
  if (g_profiling.load(std::memory_order_relaxed)) ++g_profiled_steps;
}

// The weights of one model as the step reads them, checked and resolved to pointers once (redline::step_plan),
// so a step does not convert and check some 600 tensors on every call (measured: 0.9 ms of a 8.6 ms q4 step).
struct Plan {
  std::vector<at::Tensor> keep;  // what the pointers below point into
  std::vector<LayerWeights> layers;
  const float* final_norm = nullptr;
  float final_eps = 0.f;
  Product head;
  int64_t H = 0, Hkv = 0, Hd = 0, D = 0;
};
std::mutex g_plans_mutex;
std::unordered_map<int64_t, std::shared_ptr<const Plan>> g_plans;
int64_t g_next_plan = 1;

// `layers` 20 tensors per layer: ln1, ln2, q_norm, k_norm (empty if none), then for qkv, o, gate_up, down: weight,
// scales, mins, bias (empty where absent); `head`: final norm, weight, scales, mins, bias; `eps`: eps1, eps2, q_eps,
// k_eps per layer, then the final norm's. Returns the plan's id for decode_step; drop_plan forgets it.
int64_t step_plan(at::TensorList layer_tensors, at::TensorList head_tensors, c10::ArrayRef<double> eps, int64_t H,
                  int64_t Hkv, int64_t D) {
  constexpr size_t PER_LAYER = 20;
  TORCH_CHECK(layer_tensors.size() % PER_LAYER == 0 && head_tensors.size() == 5, "redline::step_plan: bad weight lists");
  const size_t n_layers = layer_tensors.size() / PER_LAYER;
  TORCH_CHECK(n_layers > 0, "redline::step_plan: no layers");
  TORCH_CHECK(eps.size() == 4 * n_layers + 1, "redline::step_plan: ", eps.size(), " eps values for ", n_layers, " layers");
  TORCH_CHECK(H > 0 && Hkv > 0 && H % Hkv == 0 && D % 8 == 0, "redline::step_plan: bad head counts or size");
  auto plan = std::make_shared<Plan>();
  const int64_t Hd = layer_tensors[0].numel();
  TORCH_CHECK(Hd % 8 == 0, "redline::step_plan: hidden size ", Hd, " is not a multiple of 8");
  const auto f32 = [&](const at::Tensor& t, int64_t n, const char* what) -> const float* {
    if (t.numel() == 0) return nullptr;
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n, "redline::step_plan: ", what,
                " must be fp32 [", n, "]");
    return t.data_ptr<float>();
  };
  plan->layers.resize(n_layers);
  for (size_t l = 0; l < n_layers; ++l) {
    const at::Tensor* w = layer_tensors.data() + l * PER_LAYER;
    LayerWeights& L = plan->layers[l];
    L.ln1 = f32(w[0], Hd, "ln1");
    L.ln2 = f32(w[1], Hd, "ln2");
    L.q_norm = f32(w[2], D, "q_norm");
    L.k_norm = f32(w[3], D, "k_norm");
    TORCH_CHECK(L.ln1 && L.ln2, "redline::step_plan: layer norms are required");
    L.eps1 = static_cast<float>(eps[4 * l]);
    L.eps2 = static_cast<float>(eps[4 * l + 1]);
    L.q_eps = static_cast<float>(eps[4 * l + 2]);
    L.k_eps = static_cast<float>(eps[4 * l + 3]);
    L.qkv = product_of(w[4], w[5], w[6], w[7], Hd, "qkv");
    TORCH_CHECK(L.qkv.N == (H + 2 * Hkv) * D, "redline::step_plan: qkv gives ", L.qkv.N, " outputs");
    L.o = product_of(w[8], w[9], w[10], w[11], H * D, "o");
    TORCH_CHECK(L.o.N == Hd, "redline::step_plan: o gives ", L.o.N, " outputs, hidden is ", Hd);
    L.gate_up = product_of(w[12], w[13], w[14], w[15], Hd, "gate_up");
    TORCH_CHECK(L.gate_up.N % 2 == 0, "redline::step_plan: gate_up has an odd number of outputs");
    L.down = product_of(w[16], w[17], w[18], w[19], L.gate_up.N / 2, "down");
    TORCH_CHECK(L.down.N == Hd, "redline::step_plan: down gives ", L.down.N, " outputs, hidden is ", Hd);
    TORCH_CHECK(l == 0 || L.down.K == plan->layers[0].down.K, "redline::step_plan: layers differ in MLP width");
  }
  plan->final_norm = f32(head_tensors[0], Hd, "final norm");
  TORCH_CHECK(plan->final_norm, "redline::step_plan: the final norm is required");
  plan->head = product_of(head_tensors[1], head_tensors[2], head_tensors[3], head_tensors[4], Hd, "head");
  plan->final_eps = static_cast<float>(eps.back());
  plan->H = H, plan->Hkv = Hkv, plan->Hd = Hd, plan->D = D;
  plan->keep.assign(layer_tensors.begin(), layer_tensors.end());
  plan->keep.insert(plan->keep.end(), head_tensors.begin(), head_tensors.end());
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  const int64_t id = g_next_plan++;
  g_plans[id] = std::move(plan);
  return id;
}

void drop_plan(int64_t id) {
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  g_plans.erase(id);
}

// x [T, hidden] fp32 (the embedded tokens; used as the residual stream and overwritten); `plan` from step_plan;
// k_pool / v_pool [layers, pages, Hkv, page, D]; pages [T, max_pages] int32 (the page table of each row's
// sequence); pos [T] int64. Returns the logits [logit_rows, vocab] of the last `logit_rows` rows.
at::Tensor decode_step(const at::Tensor& x_in, int64_t plan_id, int64_t vocab, const at::Tensor& cos,
                       const at::Tensor& sin, at::Tensor k_pool, at::Tensor v_pool, const at::Tensor& pages,
                       const at::Tensor& pos, double scale, int64_t logit_rows) {
  std::shared_ptr<const Plan> plan;
  {
    std::lock_guard<std::mutex> lock(g_plans_mutex);
    const auto it = g_plans.find(plan_id);
    TORCH_CHECK(it != g_plans.end(), "redline::decode_step: no step plan ", plan_id, " (dropped with its model?)");
    plan = it->second;
  }
  const int64_t H = plan->H, Hkv = plan->Hkv, Hd = plan->Hd;
  TORCH_CHECK(plan->head.N == vocab, "redline::decode_step: the plan's head gives ", plan->head.N, " logits, not ", vocab);
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && x_in.size(1) == Hd,
              "redline::decode_step: x must be fp32 [T, ", Hd, "]");
  TORCH_CHECK(k_pool.dim() == 5 && k_pool.is_contiguous() && v_pool.is_contiguous() &&
                  k_pool.sizes() == v_pool.sizes() && k_pool.scalar_type() == v_pool.scalar_type() &&
                  static_cast<size_t>(k_pool.size(0)) == plan->layers.size() && k_pool.size(2) == Hkv &&
                  k_pool.size(4) == plan->D,
              "redline::decode_step: KV pools must be contiguous [layers, pages, Hkv, page, D]");
  TORCH_CHECK(pages.scalar_type() == at::kInt && pos.scalar_type() == at::kLong && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat, "redline::decode_step: pages int32, pos int64, cos/sin fp32");
  const int64_t T = x_in.size(0), D = k_pool.size(4), page = k_pool.size(3);
  TORCH_CHECK(pos.numel() == T && pages.dim() == 2 && pages.size(0) == T, "redline::decode_step: one page row per row");
  TORCH_CHECK(logit_rows >= 1 && logit_rows <= T);
  const auto ps = pos.contiguous(), pg = pages.contiguous(), c = cos.contiguous(), s = sin.contiguous();
  const int64_t* pp = ps.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(pp[t] >= 0 && pp[t] < c.size(0) && pp[t] < pg.size(1) * page,
                "redline::decode_step: position ", pp[t], " is outside the rotary table or the row's pages");
  {
    const int32_t* pt = pg.data_ptr<int32_t>();
    for (int64_t i = 0; i < pg.numel(); ++i)
      TORCH_CHECK(pt[i] >= 0 && pt[i] < k_pool.size(1), "redline::decode_step: page ", pt[i], " is not in the pool");
  }

  auto x = x_in.contiguous().clone();  // the residual stream, overwritten layer by layer
  auto logits = at::empty({logit_rows, plan->head.N}, x.options());
  const int64_t layer_elems = k_pool.numel() / k_pool.size(0);
  const auto run = [&](auto* k, auto* v) {
    forward(x.data_ptr<float>(), T, Hd, plan->layers, plan->final_norm, plan->final_eps, plan->head, c.data_ptr<float>(),
            s.data_ptr<float>(), k, v, layer_elems, pg.data_ptr<int32_t>(), pg.size(1), pp, H, Hkv, D, page,
            static_cast<float>(scale), logit_rows, logits.data_ptr<float>());
  };
  if (k_pool.scalar_type() == at::kFloat)
    run(k_pool.data_ptr<float>(), v_pool.data_ptr<float>());
  else if (k_pool.scalar_type() == at::kBFloat16)
    run(k_pool.data_ptr<at::BFloat16>(), v_pool.data_ptr<at::BFloat16>());
  else
    TORCH_CHECK(false, "redline::decode_step: the KV cache must be fp32 or bf16");
  return logits;
}

// Turn the stage profile on or off; returns the seconds per stage summed since the last call and, last, the
// number of steps they cover (then starts again from zero).
at::Tensor step_profile(bool enable) {
  auto out = at::empty({STAGES + 1}, at::kDouble);
  double* o = out.data_ptr<double>();
  for (int i = 0; i < STAGES; ++i) {
    o[i] = g_stage_seconds[i];
    g_stage_seconds[i] = 0.0;
  }
  o[STAGES] = static_cast<double>(g_profiled_steps);
  g_profiled_steps = 0;
  g_profiling.store(enable);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(redline, m) {
  m.def("step_plan(Tensor[] layers, Tensor[] head, float[] eps, int H, int Hkv, int D) -> int");
  m.def("drop_plan(int plan) -> ()");
  m.def(
      "decode_step(Tensor x, int plan, int vocab, Tensor cos, Tensor sin, Tensor(a!) k_pool, Tensor(b!) v_pool, "
      "Tensor pages, Tensor pos, float scale, int logit_rows) -> Tensor");
  m.def("step_profile(bool enable) -> Tensor");
}

TORCH_LIBRARY_IMPL(redline, CPU, m) {
  m.impl("decode_step", &decode_step);
  m.impl("step_plan", &step_plan);
}

// No tensor arguments, so no dispatch key to pick an implementation by: registered for every backend.
TORCH_LIBRARY_IMPL(redline, CompositeExplicitAutograd, m) {
  m.impl("step_profile", &step_profile);
  m.impl("drop_plan", &drop_plan);
}
