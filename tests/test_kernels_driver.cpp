// A test driver for Redline's kernel library through its C ABI alone (inference/kernels/cpu/abi.h), without Python or
// torch, so it runs where only the library does: every function on inputs from a fixed pseudo-random sequence,
// every output written bit for bit to a file. tests/test_kernels_arm64.py builds it for x86-64 (against the avx2 and
// portable builds) and for ARM64 (against the neon and neon-dotprod builds, run under qemu-aarch64) and compares the
// files: the ARM64 builds must give what the x86-64 AVX2 build gives, which the Python tests hold to torch.
//
//   driver LIBRARY OUT_FILE
//
// Built with -ffp-contract=off like the library, so its own few float operations round the same on every CPU.
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct redline_tensor {
  const void* data;
  int64_t dtype, ndim, numel, contiguous;
  int64_t sizes[2], strides[2];
};
enum { F32 = 0, BF16 = 1, F16 = 2, I8 = 3, U8 = 4 };

static void* lib;
template <typename F>
static F fn(const char* name) {
  void* p = dlsym(lib, name);
  if (!p) {
    std::fprintf(stderr, "missing %s\n", name);
    std::exit(2);
  }
  return reinterpret_cast<F>(p);
}

static FILE* out;
static int64_t records = 0;
static void emit(const std::string& label, const void* data, size_t bytes) {  // label length, label, size, bytes
  const uint32_t n = static_cast<uint32_t>(label.size());
  const uint64_t b = bytes;
  std::fwrite(&n, 4, 1, out);
  std::fwrite(label.data(), 1, n, out);
  std::fwrite(&b, 8, 1, out);
  std::fwrite(data, 1, bytes, out);
  ++records;
}
template <typename T>
static void emit(const std::string& label, const std::vector<T>& v) {
  emit(label, v.data(), v.size() * sizeof(T));
}

static uint64_t state = 0x9E3779B97F4A7C15ull;
static float uniform(float scale) {  // in [-scale, scale): exact up to the one multiply
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  return (u * 2.0f - 1.0f) * scale;
}
static std::vector<float> randv(size_t n, float scale) {
  std::vector<float> v(n);
  for (auto& x : v) x = uniform(scale);
  return v;
}
static uint16_t to_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>((u + ((u >> 16) & 1) + 0x7FFF) >> 16);
}
static std::vector<uint16_t> bf16v(const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = to_bf16(v[i]);
  return r;
}
static std::string str(int64_t v) { return std::to_string(v); }
static void ok(int rc, const char* what) {
  if (rc) {
    using E = const char* (*)();
    std::fprintf(stderr, "%s failed: %s\n", what, fn<E>("redline_last_error")());
    std::exit(3);
  }
}

static const int THREADS = 2;

// -- the per-operator functions -------------------------------------------------------------------------------
static void products() {
  using Bf16 = int (*)(const float*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, float*, int);
  using Q8 = int (*)(const float*, int64_t, int64_t, const int8_t*, const uint16_t*, int64_t, float*, int);
  using Q4 = int (*)(const float*, int64_t, int64_t, const uint8_t*, const uint16_t*, const uint16_t*, int64_t, float*,
                     int);
  using QQ8 = int (*)(const void*, int64_t, int64_t, int64_t, int8_t*, uint16_t*, int);
  using QQ4 = int (*)(const void*, int64_t, int64_t, int64_t, int, uint8_t*, uint16_t*, uint16_t*, int);
  auto bf16 = fn<Bf16>("redline_linear_bf16");
  auto q8 = fn<Q8>("redline_linear_q8");
  auto q4 = fn<Q4>("redline_linear_q4");
  auto qq8 = fn<QQ8>("redline_quantize_q8");
  auto qq4 = fn<QQ4>("redline_quantize_q4");
  const int64_t dense[][2] = {{98, 576}, {17, 64}, {33, 96}, {17, 40}, {9, 1536}};
  for (const auto& s : dense) {
    const int64_t N = s[0], K = s[1];
    const auto w = bf16v(randv(N * K, 0.05f));
    for (int64_t T : {1, 2, 3, 4, 5, 9, 40}) {
      const auto x = randv(T * K, 1.f);
      std::vector<float> y(T * N);
      ok(bf16(x.data(), T, K, w.data(), N, K, y.data(), THREADS), "linear_bf16");
      emit("bf16 " + str(N) + "x" + str(K) + " T" + str(T), y);
    }
  }
  const int64_t blocks[][2] = {{98, 576}, {13, 64}, {18, 1536}, {64, 96}};
  for (const auto& s : blocks) {
    const int64_t N = s[0], K = s[1], nb = K / 32;
    auto wf = randv(N * K, 0.05f);
    for (int i = 0; i < 32; ++i) wf[i] = 0.f;  // an all-zero block
    wf[K + 5] = wf[K + 7] = -0.2f;             // two values of the largest magnitude
    const auto wb = bf16v(wf);
    for (int dt : {F32, BF16}) {
      const void* src = dt == F32 ? static_cast<const void*>(wf.data()) : static_cast<const void*>(wb.data());
      const std::string tag = std::string(dt == F32 ? "f32 " : "bf16 ") + str(N) + "x" + str(K);
      std::vector<int8_t> q(N * K);
      std::vector<uint16_t> sc(N * nb), mn(N * nb), ssc(N * nb);
      std::vector<uint8_t> p4(N * K / 2), s4(N * K / 2);
      ok(qq8(src, dt, N, K, q.data(), sc.data(), THREADS), "quantize_q8");
      emit("quantize_q8 " + tag, q), emit("quantize_q8 scales " + tag, sc);
      for (int64_t T : {1, 2, 3, 4, 5, 8, 9, 20, 44}) {
        const auto x = randv(T * K, 1.f);
        std::vector<float> y(T * N);
        ok(q8(x.data(), T, K, q.data(), sc.data(), N, y.data(), THREADS), "linear_q8");
        emit("q8 " + tag + " T" + str(T), y);
      }
      ok(qq4(src, dt, N, K, 0, p4.data(), sc.data(), mn.data(), THREADS), "quantize_q4");
      ok(qq4(src, dt, N, K, 1, s4.data(), ssc.data(), nullptr, THREADS), "quantize_q4 symmetric");
      emit("quantize_q4 " + tag, p4), emit("quantize_q4 scales " + tag, sc), emit("quantize_q4 mins " + tag, mn);
      emit("quantize_q4s " + tag, s4), emit("quantize_q4s scales " + tag, ssc);
      for (int64_t T : {1, 2, 3, 4, 5, 8, 9, 20, 44}) {
        const auto x = randv(T * K, 1.f);
        std::vector<float> y(T * N), ys(T * N);
        ok(q4(x.data(), T, K, p4.data(), sc.data(), mn.data(), N, y.data(), THREADS), "linear_q4");
        ok(q4(x.data(), T, K, s4.data(), ssc.data(), nullptr, N, ys.data(), THREADS), "linear_q4 symmetric");
        emit("q4 " + tag + " T" + str(T), y), emit("q4s " + tag + " T" + str(T), ys);
      }
    }
  }
}

static void between() {
  using Norm = int (*)(const float*, int64_t, int64_t, const float*, double, float*);
  using Silu = int (*)(const float*, int64_t, int64_t, float*);
  const auto x = randv(3 * 576, 2.f), w = randv(576, 1.f);
  std::vector<float> y(3 * 576);
  ok(fn<Norm>("redline_rms_norm")(x.data(), 3, 576, w.data(), 1e-5, y.data()), "rms_norm");
  emit("rms_norm", y);
  for (int64_t I : {1536, 24, 20}) {
    const auto g = randv(2 * 2 * I, 6.f);
    std::vector<float> o(2 * I);
    ok(fn<Silu>("redline_silu_mul")(g.data(), 2, I, o.data()), "silu_mul");
    emit("silu_mul " + str(I), o);
  }
}

static void attention() {
  using Attend = int (*)(const float*, const float*, const float*, void*, void*, int64_t, const int32_t*, int64_t,
                         const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, double, float*, int);
  auto attend = fn<Attend>("redline_attend");
  const int64_t configs[][3] = {{9, 3, 64}, {8, 1, 64}, {16, 2, 128}, {4, 4, 32}, {18, 2, 64}};
  for (int dt : {F32, BF16, I8}) {  // I8: the 8-bit cache's rows, D int8 and an fp16 scale (--kv q8)
    for (const auto& c : configs) {
      const int64_t H = c[0], Hkv = c[1], D = c[2], page = 16, P = 40, B = 2, max_pages = 16;
      const size_t pool = P * Hkv * page * D;
      std::vector<float> kf(pool), vf(pool);
      std::vector<uint16_t> kb(pool), vb(pool);
      std::vector<int8_t> kq(P * Hkv * page * (D + 2)), vq(P * Hkv * page * (D + 2));
      const auto cos = randv(300 * D, 1.f), sin = randv(300 * D, 1.f);
      std::vector<int32_t> pages(B * max_pages);
      for (int64_t i = 0; i < B * max_pages; ++i) pages[i] = static_cast<int32_t>((i * 7 + 3) % P);  // out of order
      const std::string tag =
          std::string(dt == F32 ? "f32 " : dt == BF16 ? "bf16 " : "q8 ") + str(H) + "/" + str(Hkv) + "/" + str(D);
      for (int64_t t = 0; t < 45; ++t) {
        const auto qkv = randv(B * (H + 2 * Hkv) * D, 1.f);
        const int64_t pos[2] = {t, t + 3};
        std::vector<float> o(B * H * D);
        void* k = dt == F32 ? static_cast<void*>(kf.data()) : dt == BF16 ? static_cast<void*>(kb.data()) : kq.data();
        void* v = dt == F32 ? static_cast<void*>(vf.data()) : dt == BF16 ? static_cast<void*>(vb.data()) : vq.data();
        ok(attend(qkv.data(), cos.data(), sin.data(), k, v, dt, pages.data(), max_pages, pos, B, H, Hkv, D, page,
                  1.0 / std::sqrt(static_cast<double>(D)), o.data(), THREADS),
           "attend");
        emit("attend " + tag + " t" + str(t), o);
      }
      if (dt == F32) emit("k pool " + tag, kf), emit("v pool " + tag, vf);
      else if (dt == BF16) emit("k pool " + tag, kb), emit("v pool " + tag, vb);
      else emit("k pool " + tag, kq), emit("v pool " + tag, vq);
    }
  }
}

// -- the whole step: a random two-layer Llama-shaped model in each weight layout -------------------------------
struct Owned {  // a tensor's bytes and its description
  std::vector<uint8_t> bytes;
  redline_tensor t{};
};
static Owned tensor_of(int64_t dtype, int64_t rows, int64_t cols, const std::vector<uint8_t>& bytes) {
  Owned o;
  o.bytes = bytes;
  o.t.dtype = dtype;
  o.t.ndim = cols ? 2 : (rows ? 1 : 1);
  o.t.sizes[0] = rows, o.t.sizes[1] = cols;
  o.t.strides[0] = cols ? cols : 1, o.t.strides[1] = 1;
  o.t.numel = cols ? rows * cols : rows;
  o.t.contiguous = 1;
  return o;
}
template <typename T>
static std::vector<uint8_t> raw(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
static Owned empty_tensor() { return tensor_of(F32, 0, 0, {}); }

// weight, scales, mins, bias of one product [N, K] in `layout`: f32, bf16, q8, q4, q4s
static void product(const std::string& layout, int64_t N, int64_t K, bool bias, std::vector<Owned>& out) {
  using QQ8 = int (*)(const void*, int64_t, int64_t, int64_t, int8_t*, uint16_t*, int);
  using QQ4 = int (*)(const void*, int64_t, int64_t, int64_t, int, uint8_t*, uint16_t*, uint16_t*, int);
  const auto w = randv(N * K, 0.2f);
  const int64_t nb = K / 32;
  if (layout == "f32") {
    out.push_back(tensor_of(F32, N, K, raw(w))), out.push_back(empty_tensor()), out.push_back(empty_tensor());
  } else if (layout == "bf16") {
    out.push_back(tensor_of(BF16, N, K, raw(bf16v(w)))), out.push_back(empty_tensor()), out.push_back(empty_tensor());
  } else if (layout == "q8") {
    std::vector<int8_t> q(N * K);
    std::vector<uint16_t> sc(N * nb);
    ok(fn<QQ8>("redline_quantize_q8")(w.data(), F32, N, K, q.data(), sc.data(), THREADS), "quantize_q8");
    out.push_back(tensor_of(I8, N, K, raw(q))), out.push_back(tensor_of(F16, N, nb, raw(sc)));
    out.push_back(empty_tensor());
  } else {
    const bool sym = layout == "q4s";
    std::vector<uint8_t> q(N * K / 2);
    std::vector<uint16_t> sc(N * nb), mn(N * nb);
    ok(fn<QQ4>("redline_quantize_q4")(w.data(), F32, N, K, sym, q.data(), sc.data(), sym ? nullptr : mn.data(),
                                      THREADS),
       "quantize_q4");
    out.push_back(tensor_of(U8, N, K / 2, raw(q))), out.push_back(tensor_of(F16, N, nb, raw(sc)));
    out.push_back(sym ? empty_tensor() : tensor_of(F16, N, nb, raw(mn)));
  }
  out.push_back(bias ? tensor_of(F32, N, 0, raw(randv(N, 0.1f))) : empty_tensor());
}

static void whole_step(const std::string& layout, int64_t Hd, int64_t H, int64_t Hkv, int64_t D, int64_t I,
                       bool biases, bool qk_norms, int64_t prompt, int64_t steps, int64_t B) {
  using Plan = int (*)(const redline_tensor*, int64_t, const redline_tensor*, int64_t, const double*, int64_t, int64_t,
                       int64_t, int64_t, int64_t*);
  using Step = int (*)(const float*, int64_t, int64_t, int64_t, int64_t, const float*, const float*, int64_t, void*,
                       void*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                       int64_t, int64_t, const int64_t*, int64_t, double, int64_t, float*, int);
  using Drop = int (*)(int64_t);
  const int64_t layers = 2, vocab = 300, page = 64, pages_per_seq = (prompt + steps + page) / page + 1;
  const int64_t P = pages_per_seq * B, S = pages_per_seq * page;
  std::vector<Owned> lw, hw;
  std::vector<double> eps;
  for (int64_t l = 0; l < layers; ++l) {
    lw.push_back(tensor_of(F32, Hd, 0, raw(randv(Hd, 1.f))));
    lw.push_back(tensor_of(F32, Hd, 0, raw(randv(Hd, 1.f))));
    lw.push_back(qk_norms ? tensor_of(F32, D, 0, raw(randv(D, 1.f))) : empty_tensor());
    lw.push_back(qk_norms ? tensor_of(F32, D, 0, raw(randv(D, 1.f))) : empty_tensor());
    product(layout, (H + 2 * Hkv) * D, Hd, biases, lw);
    product(layout, Hd, H * D, false, lw);
    product(layout, 2 * I, Hd, false, lw);
    product(layout, Hd, I, false, lw);
    eps.insert(eps.end(), {1e-5, 1e-6, 1e-6, 1e-6});
  }
  hw.push_back(tensor_of(F32, Hd, 0, raw(randv(Hd, 1.f))));
  product(layout, vocab, Hd, false, hw);
  eps.push_back(1e-5);
  std::vector<redline_tensor> ld, hd;
  for (auto& o : lw) o.t.data = o.bytes.empty() ? nullptr : o.bytes.data(), ld.push_back(o.t);
  for (auto& o : hw) o.t.data = o.bytes.empty() ? nullptr : o.bytes.data(), hd.push_back(o.t);
  int64_t id = 0;
  ok(fn<Plan>("redline_step_plan")(ld.data(), ld.size(), hd.data(), hd.size(), eps.data(), eps.size(), H, Hkv, D, &id),
     "step_plan");
  // rotary tables of random values (not cos/sin: the C library's may differ in the last bit between CPUs)
  const auto cos = randv(S * D, 1.f), sin = randv(S * D, 1.f);
  const size_t pool = layers * P * Hkv * page * D;
  for (int cache : {F32, BF16}) {
    if (cache == BF16 && layout == "f32") continue;
    std::vector<float> kf(cache == F32 ? pool : 0), vf(cache == F32 ? pool : 0);
    std::vector<uint16_t> kb(cache == BF16 ? pool : 0), vb(cache == BF16 ? pool : 0);
    void* k = cache == F32 ? static_cast<void*>(kf.data()) : static_cast<void*>(kb.data());
    void* v = cache == F32 ? static_cast<void*>(vf.data()) : static_cast<void*>(vb.data());
    std::vector<int32_t> table(B * pages_per_seq);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < pages_per_seq; ++i) table[b * pages_per_seq + i] = static_cast<int32_t>(i * B + b);
    const std::string tag = layout + (biases ? "+bias" : "") + (qk_norms ? "+qknorm" : "") + " Hd" + str(Hd) + " p" +
                            str(prompt) + (cache == F32 ? " f32 cache" : " bf16 cache");
    const auto run = [&](const std::vector<float>& x, int64_t T, const std::vector<int32_t>& pg,
                         const std::vector<int64_t>& pos, int64_t logit_rows, const std::string& what) {
      std::vector<float> logits(logit_rows * vocab);
      ok(fn<Step>("redline_decode_step")(x.data(), T, Hd, id, vocab, cos.data(), sin.data(), S, k, v, cache, 1, layers,
                                         P, Hkv, page, D, 1, pg.data(), T, pages_per_seq, pos.data(), T,
                                         1.0 / std::sqrt(static_cast<double>(D)), logit_rows, logits.data(), THREADS),
         "decode_step");
      emit("step " + tag + " " + what, logits);
    };
    // each sequence's prompt in chunks of up to 128 rows, the last row's logits
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = prompt + 3 * b;
      for (int64_t p0 = 0; p0 < n; p0 += 128) {
        const int64_t T = std::min<int64_t>(128, n - p0);
        std::vector<int32_t> pg;
        std::vector<int64_t> pos;
        for (int64_t t = 0; t < T; ++t) {
          pg.insert(pg.end(), table.begin() + b * pages_per_seq, table.begin() + (b + 1) * pages_per_seq);
          pos.push_back(p0 + t);
        }
        run(randv(T * Hd, 1.f), T, pg, pos, 1, "prefill " + str(b) + " from " + str(p0));
      }
    }
    // then B sequences a step at a time, together
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<int32_t> pg;
      std::vector<int64_t> pos;
      for (int64_t b = 0; b < B; ++b) {
        pg.insert(pg.end(), table.begin() + b * pages_per_seq, table.begin() + (b + 1) * pages_per_seq);
        pos.push_back(prompt + 3 * b + s);
      }
      run(randv(B * Hd, 1.f), B, pg, pos, B, "decode " + str(s));
    }
  }
  fn<Drop>("redline_drop_plan")(id);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s LIBRARY OUT_FILE\n", argv[0]);
    return 2;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  out = std::fopen(argv[2], "wb");
  if (!out) return 2;
  using Str = const char* (*)();
  std::printf("variant %s\n", fn<Str>("redline_variant")());
  products();
  between();
  attention();
  for (const char* layout : {"f32", "bf16", "q8", "q4", "q4s"}) {
    whole_step(layout, 64, 4, 2, 16, 160, false, false, 70, 12, 3);  // Llama-shaped; a prompt crosses a page
    whole_step(layout, 64, 4, 2, 16, 160, true, false, 7, 6, 5);    // Qwen2: biases on q/k/v; a batch of five
    whole_step(layout, 64, 4, 2, 16, 160, false, true, 20, 6, 2);   // Qwen3: q/k norms
  }
  whole_step("f32", 128, 4, 2, 64, 128, false, false, 900, 3, 2);   // past 512 positions: keys split and merged
  whole_step("bf16", 128, 4, 2, 64, 128, false, false, 900, 3, 2);
  std::fclose(out);
  std::printf("%lld records\n", static_cast<long long>(records));
  return 0;
}
