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
//
// A plain C ABI (abi.h), like cpu_kernels.cpp: redline_step_plan resolves a model's weights to pointers once,
// redline_decode_step runs a step on them; torch_ops.py registers both as torch operators (redline::step_plan,
// redline::decode_step, redline::drop_plan, redline::step_profile).
#include "abi.h"
#include "paged_attention.h"
#include "simd.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <unordered_map>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace redline_kernels {
namespace {

// An opt-in profile of the step's stages (redline::step_profile, tools/experiments/step_profile.py): wall time between
// the barriers, read on thread 0, so a stage's time includes waiting for the slowest thread.
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

}  // namespace
}  // namespace redline_kernels

// A tensor as wrappers.py describes it to redline_step_plan: its data, element type (abi.h's DType), shape and
// strides (up to two dimensions: weights, scales, norms, biases) and whether it is contiguous.
struct redline_tensor {
  const void* data;
  int64_t dtype, ndim, numel, contiguous;
  int64_t sizes[2], strides[2];
};

namespace redline_kernels {
namespace {

int64_t element_size(int64_t dtype) {
  switch (dtype) {
    case F32: case I32: return 4;
    case BF16: case F16: return 2;
    case I8: case U8: return 1;
    case I64: return 8;
    default: return 0;
  }
}

bool same_sizes(const redline_tensor& a, const redline_tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int64_t i = 0; i < a.ndim && i < 2; ++i)
    if (a.sizes[i] != b.sizes[i]) return false;
  return true;
}

Product product_of(const redline_tensor& w, const redline_tensor& s, const redline_tensor& m, const redline_tensor& b,
                   int64_t K, const char* what) {
  check(w.ndim == 2 && w.strides[1] == 1, "redline::decode_step: ", what, " weight must be 2-D with rows");
  Product p;
  p.N = w.sizes[0];
  p.w = static_cast<const uint8_t*>(w.data);
  switch (w.dtype) {
    case F32:
    case BF16:
      p.kind = w.dtype == F32 ? Kind::F32 : Kind::BF16;
      p.K = w.sizes[1];
      p.row_bytes = w.strides[0] * element_size(w.dtype);
      check(p.K % 8 == 0, "redline::decode_step: ", what, " has ", p.K, " inputs, not a multiple of 8");
      break;
    case I8:
    case U8:
      check(w.contiguous && s.dtype == F16 && s.contiguous, "redline::decode_step: ", what,
            " blocks must be contiguous with fp16 scales");
      p.kind = w.dtype == I8 ? Kind::Q8 : (m.numel > 0 ? Kind::Q4_ASYM : Kind::Q4);
      p.K = w.dtype == I8 ? w.sizes[1] : 2 * w.sizes[1];
      p.row_bytes = w.sizes[1];
      check(s.ndim == 2 && s.sizes[0] == p.N && s.sizes[1] * BLOCK == p.K, "redline::decode_step: ", what,
            " scales do not match");
      p.sc = static_cast<const uint16_t*>(s.data);
      if (p.kind == Kind::Q4_ASYM) {
        check(m.dtype == F16 && m.contiguous && same_sizes(m, s), "redline::decode_step: ", what,
              " mins must be contiguous fp16 shaped as the scales");
        p.mn = static_cast<const uint16_t*>(m.data);
      }
      break;
    default:
      check(false, "redline::decode_step: ", what, " weight of type ", dtype_name(w.dtype), " is not supported");
  }
  check(p.K == K, "redline::decode_step: ", what, " takes ", p.K, " inputs, the step gives it ", K);
  if (b.numel > 0) {
    check(b.dtype == F32 && b.contiguous && b.numel == p.N, "redline::decode_step: ", what, " bias must be fp32 [",
          p.N, "]");
    p.bias = static_cast<const float*>(b.data);
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
             int64_t D, int64_t page, float scale, int64_t logit_rows, float* logits, int threads) {
  const int64_t QKV = (H + 2 * Hkv) * D, I = layers.empty() ? 0 : layers[0].down.K, group = H / Hkv;
  const int64_t kmax = std::max({Hd, H * D, I});
  int64_t longest = 1;
  for (int64_t t = 0; t < T; ++t) longest = std::max(longest, pos[t] + 1);
  const int nthreads = std::max(1, threads);
  std::vector<float> h(T * Hd), qkv(T * QKV), qr(T * H * D), attn(T * H * D), gu(T * 2 * I), act(T * I);
  std::vector<int8_t> qbuf(T * kmax);
  std::vector<float> dbuf(T * kmax / BLOCK + 1), sbuf(T * kmax / BLOCK + 1);
  std::vector<float> scores(static_cast<size_t>(nthreads) * group * longest), scratch(static_cast<size_t>(nthreads) * D);
  // Attention work: one unit per row and KV head, or, past SPLIT_KEYS positions, one per part of the keys (merged
  // afterwards), so one long sequence keeps every thread busy. The split depends on the row alone: a sequence
  // gets the same numbers alone or in a batch. A split row and KV head's parts lie together in `parts` (merge_parts
  // reads them a stride apart); `merges` lists each such group as its first part.
  std::vector<int64_t> splits(T), first_part(T * Hkv);  // each row's parts; each split group's first part's place
  std::vector<Unit> units, merges;
  int64_t part_floats = 0, most_parts = 1;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = pos[t] + 1;
    const int64_t S = splittable(group, D) ? std::max<int64_t>(1, (n + SPLIT_KEYS - 1) / SPLIT_KEYS) : 1;
    splits[t] = S;
    most_parts = std::max(most_parts, S);
    if (S > 1)
      for (int64_t g = 0; g < Hkv; ++g) {
        first_part[t * Hkv + g] = part_floats;
        merges.push_back(Unit{t, g, 0, n, S, part_floats});
        part_floats += S * group * (D + 2);
      }
  }
  // Listed by KV head and part, then row: a prompt's rows (in a chunk, or beside streaming replies) read the same
  // keys, which the same thread then finds in its cache for the next row instead of reading them again from memory
  // (row by row, each thread read the whole layer's cache for each of its rows: a second prompt row at 1,500
  // positions added 1.5 ms of attention to the starter's step, the first 2.1). Each unit's sums are its own, so
  // the order changes no number.
  for (int64_t g = 0; g < Hkv; ++g)
    for (int64_t p = 0; p < most_parts; ++p)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = pos[t] + 1, S = splits[t];
        if (p < S)
          units.push_back(Unit{t, g, n * p / S, n * (p + 1) / S, S, first_part[t * Hkv + g] + p * group * (D + 2)});
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
          store_key(src, c, s, D, kv.at(kv.k, t, g, p));
          store_row(row + (H + Hkv) * D + g * D, D, kv.at(kv.v, t, g, p));
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
          const Unit& u = merges[i / group];  // the first part of a split group
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

// The weights of one model as the step reads them, checked and resolved to pointers once (redline_step_plan),
// so a step does not convert and check some 600 tensors on every call (measured: 0.9 ms of a 8.6 ms q4 step).
// The tensors themselves are kept alive by wrappers.py for as long as the plan exists.
struct Plan {
  int64_t users = 0;     // steps running on it (under g_plans_mutex)
  bool dropped = false;  // dropped while a step ran: the last one deletes it
  std::vector<LayerWeights> layers;
  const float* final_norm = nullptr;
  float final_eps = 0.f;
  Product head;
  int64_t H = 0, Hkv = 0, Hd = 0, D = 0;
};
SpinLock g_plans_mutex;
std::unordered_map<int64_t, Plan*> g_plans;
int64_t g_next_plan = 1;

}  // namespace
}  // namespace redline_kernels

using namespace redline_kernels;

// `layers` 20 tensors per layer: ln1, ln2, q_norm, k_norm (empty if none), then for qkv, o, gate_up, down: weight,
// scales, mins, bias (empty where absent); `head`: final norm, weight, scales, mins, bias; `eps`: eps1, eps2, q_eps,
// k_eps per layer, then the final norm's. Writes the plan's id for redline_decode_step; redline_drop_plan forgets it.
REDLINE_API int redline_step_plan(const redline_tensor* layer_tensors, int64_t n_layer_tensors,
                                  const redline_tensor* head_tensors, int64_t n_head_tensors, const double* eps,
                                  int64_t n_eps, int64_t H, int64_t Hkv, int64_t D, int64_t* plan_id) {
  return guarded([&] {
    constexpr int64_t PER_LAYER = 20;
    check(n_layer_tensors % PER_LAYER == 0 && n_head_tensors == 5, "redline::step_plan: bad weight lists");
    const int64_t n_layers = n_layer_tensors / PER_LAYER;
    check(n_layers > 0, "redline::step_plan: no layers");
    check(n_eps == 4 * n_layers + 1, "redline::step_plan: ", n_eps, " eps values for ", n_layers, " layers");
    check(H > 0 && Hkv > 0 && H % Hkv == 0 && D % 8 == 0, "redline::step_plan: bad head counts or size");
    std::unique_ptr<Plan> plan(new Plan);
    const int64_t Hd = layer_tensors[0].numel;
    check(Hd % 8 == 0, "redline::step_plan: hidden size ", Hd, " is not a multiple of 8");
    const auto f32 = [&](const redline_tensor& t, int64_t n, const char* what) -> const float* {
      if (t.numel == 0) return nullptr;
      check(t.dtype == F32 && t.contiguous && t.numel == n, "redline::step_plan: ", what, " must be fp32 [", n, "]");
      return static_cast<const float*>(t.data);
    };
    plan->layers.resize(n_layers);
    for (int64_t l = 0; l < n_layers; ++l) {
      const redline_tensor* w = layer_tensors + l * PER_LAYER;
      LayerWeights& L = plan->layers[l];
      L.ln1 = f32(w[0], Hd, "ln1");
      L.ln2 = f32(w[1], Hd, "ln2");
      L.q_norm = f32(w[2], D, "q_norm");
      L.k_norm = f32(w[3], D, "k_norm");
      check(L.ln1 && L.ln2, "redline::step_plan: layer norms are required");
      L.eps1 = static_cast<float>(eps[4 * l]);
      L.eps2 = static_cast<float>(eps[4 * l + 1]);
      L.q_eps = static_cast<float>(eps[4 * l + 2]);
      L.k_eps = static_cast<float>(eps[4 * l + 3]);
      L.qkv = product_of(w[4], w[5], w[6], w[7], Hd, "qkv");
      check(L.qkv.N == (H + 2 * Hkv) * D, "redline::step_plan: qkv gives ", L.qkv.N, " outputs");
      L.o = product_of(w[8], w[9], w[10], w[11], H * D, "o");
      check(L.o.N == Hd, "redline::step_plan: o gives ", L.o.N, " outputs, hidden is ", Hd);
      L.gate_up = product_of(w[12], w[13], w[14], w[15], Hd, "gate_up");
      check(L.gate_up.N % 2 == 0, "redline::step_plan: gate_up has an odd number of outputs");
      L.down = product_of(w[16], w[17], w[18], w[19], L.gate_up.N / 2, "down");
      check(L.down.N == Hd, "redline::step_plan: down gives ", L.down.N, " outputs, hidden is ", Hd);
      check(l == 0 || L.down.K == plan->layers[0].down.K, "redline::step_plan: layers differ in MLP width");
    }
    plan->final_norm = f32(head_tensors[0], Hd, "final norm");
    check(plan->final_norm != nullptr, "redline::step_plan: the final norm is required");
    plan->head = product_of(head_tensors[1], head_tensors[2], head_tensors[3], head_tensors[4], Hd, "head");
    plan->final_eps = static_cast<float>(eps[n_eps - 1]);
    plan->H = H, plan->Hkv = Hkv, plan->Hd = Hd, plan->D = D;
    Locked lock(g_plans_mutex);
    const int64_t id = g_next_plan++;
    g_plans[id] = plan.release();
    *plan_id = id;
  });
}

REDLINE_API int redline_drop_plan(int64_t id) {
  Locked lock(g_plans_mutex);
  const auto it = g_plans.find(id);
  if (it == g_plans.end()) return 0;
  Plan* plan = it->second;
  g_plans.erase(it);
  if (plan->users == 0) delete plan;
  else plan->dropped = true;
  return 0;
}

// x [T, hidden] fp32 (the embedded tokens; copied, not changed); `plan` from redline_step_plan; k_pool / v_pool
// [layers, pages, Hkv, page, D] of cache_dtype (F32 or BF16; I8: [.., D + 2], paged_attention.h's 8-bit rows); pages [T, max_pages] int32 (the page table of each
// row's sequence); pos [T] int64. Writes the logits [logit_rows, vocab] of the last `logit_rows` rows.
// wrappers.py checks the types and layouts it can see (passing x_cols = -1, pools_ok = 0 or types_ok = 0 when
// they are wrong); the checks against the plan, the positions and the page table are here.
REDLINE_API int redline_decode_step(const float* x_in, int64_t T, int64_t x_cols, int64_t plan_id, int64_t vocab,
                                    const float* cos, const float* sin, int64_t table_rows, void* k_pool, void* v_pool,
                                    int64_t cache_dtype, int64_t pools_ok, int64_t pool_layers, int64_t pool_pages,
                                    int64_t pool_hkv, int64_t page, int64_t pool_d, int64_t types_ok,
                                    const int32_t* pages, int64_t page_rows, int64_t max_pages, const int64_t* pos,
                                    int64_t n_pos, double scale, int64_t logit_rows, float* logits, int threads) {
  return guarded([&] {
    Plan* plan = nullptr;
    {
      Locked lock(g_plans_mutex);
      const auto it = g_plans.find(plan_id);
      check(it != g_plans.end(), "redline::decode_step: no step plan ", plan_id, " (dropped with its model?)");
      plan = it->second;
      ++plan->users;
    }
    struct Release {  // a plan dropped during the step goes when the step ends
      Plan* p;
      ~Release() {
        Locked lock(g_plans_mutex);
        if (--p->users == 0 && p->dropped) delete p;
      }
    } release{plan};
    const int64_t H = plan->H, Hkv = plan->Hkv, Hd = plan->Hd;
    check(plan->head.N == vocab, "redline::decode_step: the plan's head gives ", plan->head.N, " logits, not ", vocab);
    check(x_cols == Hd, "redline::decode_step: x must be fp32 [T, ", Hd, "]");
    const int64_t D = plan->D, row = cache_dtype == I8 ? D + 2 : D;  // 8 bits: D int8 and an fp16 scale a row
    check(pools_ok && static_cast<size_t>(pool_layers) == plan->layers.size() && pool_hkv == Hkv && pool_d == row,
          "redline::decode_step: KV pools must be contiguous [layers, pages, Hkv, page, ", row, "]");
    check(cache_dtype != I8 || D <= 1024, "redline::decode_step: an 8-bit KV cache takes heads of up to 1,024");
    check(types_ok != 0, "redline::decode_step: pages int32, pos int64, cos/sin fp32");
    check(n_pos == T && page_rows == T, "redline::decode_step: one page row per row");
    check(logit_rows >= 1 && logit_rows <= T, "redline::decode_step: logit_rows must be 1..", T);
    for (int64_t t = 0; t < T; ++t)
      check(pos[t] >= 0 && pos[t] < table_rows && pos[t] < max_pages * page, "redline::decode_step: position ", pos[t],
            " is outside the rotary table or the row's pages");
    for (int64_t i = 0; i < T * max_pages; ++i)
      check(pages[i] >= 0 && pages[i] < pool_pages, "redline::decode_step: page ", pages[i], " is not in the pool");
    check(cache_dtype == F32 || cache_dtype == BF16 || cache_dtype == I8,
          "redline::decode_step: the KV cache must be fp32, bf16 or int8 (8-bit rows)");

    std::vector<float> x(x_in, x_in + T * Hd);  // the residual stream, overwritten layer by layer
    const int64_t layer_elems = pool_pages * Hkv * page * row;
    const auto run = [&](auto* k, auto* v) {
      forward(x.data(), T, Hd, plan->layers, plan->final_norm, plan->final_eps, plan->head, cos, sin, k, v, layer_elems,
              pages, max_pages, pos, H, Hkv, D, page, static_cast<float>(scale), logit_rows, logits, threads);
    };
    if (cache_dtype == F32)
      run(static_cast<float*>(k_pool), static_cast<float*>(v_pool));
    else if (cache_dtype == I8)
      run(static_cast<int8_t*>(k_pool), static_cast<int8_t*>(v_pool));
    else
      run(static_cast<bf16*>(k_pool), static_cast<bf16*>(v_pool));
  });
}

// Turn the stage profile on or off; writes the seconds per stage summed since the last call and, last, the number
// of steps they cover (out: 12 doubles), then starts again from zero.
REDLINE_API int redline_step_profile(int enable, double* out) {
  for (int i = 0; i < STAGES; ++i) {
    out[i] = g_stage_seconds[i];
    g_stage_seconds[i] = 0.0;
  }
  out[STAGES] = static_cast<double>(g_profiled_steps);
  g_profiled_steps = 0;
  g_profiling.store(enable != 0);
  return 0;
}
