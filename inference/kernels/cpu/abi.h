// The library's C ABI: what wrappers.py calls through ctypes (abi.py declares it) and torch_ops.py registers as the
// torch operators redline::*.
// Plain C types only — data pointers, sizes, a thread count — so the binary depends on no torch, no Python and no
// C++ standard library of the caller, and keeps working across torch upgrades. Every function returns 0, or
// nonzero with the reason in redline_last_error() (this thread's last failure).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <type_traits>
#include <string>

#if defined(_WIN32)
#define REDLINE_API extern "C" __declspec(dllexport)
#else
#define REDLINE_API extern "C" __attribute__((visibility("default")))
#endif

// Bumped whenever a signature below (or in decode_step.cpp) changes: abi.py refuses a library of another version.
#define REDLINE_ABI_VERSION 1

namespace redline_kernels {

// Element types, as abi.py numbers them.
enum DType : int64_t { F32 = 0, BF16 = 1, F16 = 2, I8 = 3, U8 = 4, I32 = 5, I64 = 6, OTHER = 7 };
inline const char* dtype_name(int64_t d) {
  static const char* names[] = {"Float", "BFloat16", "Half", "Char", "Byte", "Int", "Long", "another type"};
  return d >= 0 && d <= OTHER ? names[d] : "another type";
}

// The thread's last error (set by guarded(), read by redline_last_error()).
void set_last_error(const char* message);

// A lock without the C++ runtime's std::mutex (whose error paths pull much of libstdc++ into a static link, and
// with it symbols of the newest glibc): the plans' table is touched once per step, never for long.
struct SpinLock {
  std::atomic_flag flag = ATOMIC_FLAG_INIT;
};
struct Locked {
  SpinLock& l;
  explicit Locked(SpinLock& lock) : l(lock) {
    while (l.flag.test_and_set(std::memory_order_acquire)) {
    }
  }
  ~Locked() { l.flag.clear(std::memory_order_release); }
};

struct Failure : std::exception {
  std::string what_;
  explicit Failure(std::string w) : what_(std::move(w)) {}
  const char* what() const noexcept override { return what_.c_str(); }
};

inline void append(std::string&) {}
template <typename T, typename... Rest>
inline void append(std::string& s, const T& v, const Rest&... rest) {
  if constexpr (std::is_arithmetic_v<T>) {
    if constexpr (std::is_floating_point_v<T>) s += std::to_string(v);
    else s += std::to_string(static_cast<long long>(v));
  } else {
    s += v;
  }
  append(s, rest...);
}

// As TORCH_CHECK: throws with the message (caught at the C boundary, see guarded()).
template <typename... Parts>
inline void check(bool ok, const Parts&... parts) {
  if (ok) return;
  std::string s;
  append(s, parts...);
  if (s.empty()) s = "redline kernels: an input failed a check";
  throw Failure(s);
}

// Runs f() and turns an exception into a return code and last_error().
template <typename F>
inline int guarded(const F& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    set_last_error(e.what());
  } catch (...) {
    set_last_error("redline kernels: unknown failure");
  }
  return 1;
}

}  // namespace redline_kernels
