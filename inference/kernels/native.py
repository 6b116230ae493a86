"""Loading Redline's native CPU kernels: a plain C ABI library (``abi.h``) called through ctypes and registered as
the torch operators ``redline::*`` (``torch.library.custom_op``, with fake implementations so torch.compile can
trace a step that calls them).

Where the library comes from, first found wins:

1. **shipped**: built when the wheel or the desktop bundle was made, next to this module (``prebuilt/``, found
   through importlib.resources). Nothing is compiled on the user's machine.
2. **the per-machine cache** (``<cache>/kernels/<key>/``): a source checkout's own build from an earlier start.
3. **built now** (a source checkout without a shipped library): one plain compiler call per variant, a few tens of
   seconds once, then (2). Needs a C++ compiler; not ninja, not torch's or Python's headers.

The library depends on no torch symbol, so it outlives a torch upgrade. One build per CPU family (*variant*,
``build.py``): the best one this CPU runs is chosen at run time from its flags (AVX2+FMA+F16C, else the portable
x86-64 build; NEON with or without the dot-product instructions on ARM64). Anything else — another CPU,
no library and no compiler, a failed build, ``REDLINE_NATIVE_KERNELS=0`` — leaves ``native()`` returning None
with the reason in ``status()``, and the decode step uses torch's own operators instead: slower, never wrong.
``REDLINE_KERNELS_VARIANT`` forces a variant (tests: the portable build on an AVX2 machine).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from importlib.resources import files
from pathlib import Path
from typing import Optional

from redline.inference.kernels import build as recipe
from redline.inference.paths import cache_dir

SOURCES = recipe.SOURCES
HEADERS = recipe.HEADERS
PREBUILT = "prebuilt"  # the package folder the wheel and the bundle carry the libraries in
_lock = threading.Lock()
_state: dict = {
    "loaded": False,
    "reason": "not loaded yet",
    "build_seconds": None,
    "from_cache": None,
    "variant": None,
    "source": None,
    "path": None,
    "load_ms": None,
}
_lib = None  # the ctypes.CDLL once loaded
_ops = None  # the Kernels namespace native() returns


# -- which CPU, which variant ------------------------------------------------------------------------------
def _cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux names them (x86 'flags', ARM 'Features'); empty where unknown."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith(("flags", "Features")):
                        return set(line.split(":", 1)[1].split())
        except OSError:
            return set()
        return set()
    if sys.platform == "darwin":
        import subprocess

        def sysctl(name: str) -> bool:
            try:
                out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout
                return out.strip() == "1"
            except (OSError, subprocess.SubprocessError):
                return False

        if recipe.machine() == "aarch64":
            return {"asimd"} | ({"asimddp"} if sysctl("hw.optional.arm.FEAT_DotProd") else set())
        return {f for f, key in (("avx2", "hw.optional.avx2_0"), ("fma", "hw.optional.fma")) if sysctl(key)} | (
            {"f16c"} if sysctl("hw.optional.avx1_0") else set()
        )
    if sys.platform.startswith("win"):
        try:
            present = ctypes.windll.kernel32.IsProcessorFeaturePresent  # type: ignore[attr-defined]
        except (AttributeError, OSError):
            return set()
        flags = set()
        if present(40):  # PF_AVX2_INSTRUCTIONS_AVAILABLE (AVX2 CPUs all have FMA and F16C)
            flags |= {"avx2", "fma", "f16c"}
        if present(43):  # PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE
            flags |= {"asimd", "asimddp"}
        return flags
    return set()


def variants_here() -> list[str]:
    """The variants this CPU runs, best first (forced with REDLINE_KERNELS_VARIANT)."""
    forced = os.environ.get("REDLINE_KERNELS_VARIANT", "").strip()
    machine = recipe.machine()
    known = recipe.VARIANTS.get(machine, ())
    if forced:
        return [forced] if forced in known else []
    flags = _cpu_flags()
    if machine == "x86_64":
        if not {"avx2", "fma", "f16c"} <= flags:
            return ["generic"]
        # VNNI (one instruction for the byte products of q8 and q4) where the CPU has it, in either encoding.
        return (
            (["avx512-vnni"] if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags else [])
            + (["avx2-vnni"] if "avx_vnni" in flags else [])
            + ["avx2", "generic"]
        )
    if machine == "aarch64":
        # NEON (asimd) is part of every ARMv8-A CPU; the dot products are ARMv8.2's optional 'asimddp'.
        return (["neon-dotprod"] if "asimddp" in flags else []) + ["neon"]
    return []


def cpu_supports_kernels() -> Optional[str]:
    """None if this CPU runs one of the kernels' builds, else why not."""
    forced = os.environ.get("REDLINE_KERNELS_VARIANT", "").strip()
    if forced and not variants_here():
        return f"REDLINE_KERNELS_VARIANT={forced} is not a build for this CPU ({recipe.machine()})"
    if not variants_here():
        return f"the native kernels are built for x86-64 and ARM64 CPUs; this CPU is {recipe.machine() or 'unknown'}"
    return None


def why_not_here() -> Optional[str]:
    if os.environ.get("REDLINE_NATIVE_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return "turned off (REDLINE_NATIVE_KERNELS=0)"
    return cpu_supports_kernels()


# -- where the library is -------------------------------------------------------------------------------------
def shipped_library(variant: str) -> Optional[Path]:
    """The library built into the wheel or the bundle, next to this module; None in a source checkout."""
    try:
        path = Path(str(files("redline.inference.kernels") / PREBUILT / recipe.library_name(variant)))
    except (ModuleNotFoundError, TypeError, ValueError):
        return None
    return path if path.is_file() else None


_keys: dict = {}


def _key(variant: str, compiler: str) -> str:
    """build.build_key, remembered (it asks the compiler its version: a subprocess, too slow to repeat)."""
    if (variant, compiler) not in _keys:
        _keys[(variant, compiler)] = recipe.build_key(variant, compiler)
    return _keys[(variant, compiler)]


def build_folder(variant: Optional[str] = None, compiler: Optional[str] = None) -> Path:
    variant = variant or (variants_here() or ["generic"])[0]
    compiler = compiler or recipe.find_compiler() or "none"
    return cache_dir() / "kernels" / _key(variant, compiler)


def cached_library(variant: str) -> Optional[Path]:
    compiler = recipe.find_compiler()
    if compiler is None:
        return None
    path = build_folder(variant, compiler) / recipe.library_name(variant)
    return path if path.is_file() else None


def build_key() -> str:
    variant = (variants_here() or ["generic"])[0]
    return _key(variant, recipe.find_compiler() or "none")


def missing_build_tools() -> Optional[str]:
    """None if this machine has what a first-use build needs (a C++ compiler), else what is missing."""
    if recipe.find_compiler() is None:
        return "no C++ compiler found to build them (install g++ or clang)"
    return None


def _found() -> Optional[tuple[str, Path, str]]:
    """(variant, path, 'shipped' | 'cache') of the first library there is for this CPU, without building."""
    for variant in variants_here():
        path = shipped_library(variant)
        if path is not None:
            return variant, path, "shipped"
    for variant in variants_here():
        path = cached_library(variant)
        if path is not None:
            return variant, path, "cache"
    return None


# -- state ------------------------------------------------------------------------------------------------------
def status() -> dict:
    """Whether the kernels are loaded, which variant from where (shipped / cache / built), why not, how long the
    build took (None unless built in this process) and how long loading took."""
    return dict(_state)


def will_run() -> Optional[str]:
    """None if the kernels are loaded or will load when first asked for; else why not. Cheap: it builds nothing
    (the estimator and the speed model ask it on any thread, to predict the path that will really run)."""
    if _state["loaded"]:
        return None
    if _state.get("failed"):
        return _state["reason"]
    reason = why_not_here()
    if reason is not None:
        return reason
    if _found() is not None:
        return None
    return missing_build_tools()


def buildable_here() -> bool:
    """The kernels must load here: a CPU they are built for, not turned off, and a shipped library or a compiler
    to build one. A failure on such a machine is a bug (the tests fail on it rather than skip)."""
    return why_not_here() is None and (_found() is not None or missing_build_tools() is None)


def summary() -> dict:
    """A short account for people (the status bar, Help → About, ``redline bench``, ``redline estimate``):
    ``on``; ``text``, one sentence; and when off, ``why`` and ``fix``. Builds nothing."""
    if _state["loaded"]:
        where = {"shipped": "shipped with Redline", "cache": "built on this machine", "built": "built on this machine"}
        text = f"Redline's CPU kernels on ({_state['variant']}, {where.get(_state['source'], _state['source'])})"
        return {"on": True, "variant": _state["variant"], "source": _state["source"], "text": text}
    why = will_run()
    if why is None:
        return {"on": True, "variant": None, "source": None, "text": "Redline's CPU kernels will load at first use"}
    if "REDLINE_NATIVE_KERNELS=0" in why:
        fix = "unset REDLINE_NATIVE_KERNELS"
    elif "compiler" in why:
        fix = "install a Redline wheel or the desktop bundle (they carry the kernels built), or install g++ or clang"
    elif "building them failed" in why or "loading" in why:
        fix = "reinstall Redline; if it persists, report it with `redline --version` and this message"
    else:
        fix = "none: torch's operators run on this CPU"
    return {"on": False, "why": why, "fix": fix, "text": f"Redline's CPU kernels off: {why}"}


# -- loading --------------------------------------------------------------------------------------------------
def native():
    """The kernels (a namespace of operators, see ``Kernels``) when the library is loaded (loading or building it
    the first time), else None."""
    if _state["loaded"]:
        return _ops
    if _state.get("failed"):
        return None
    return ensure_built()


def ensure_built():
    """Load the kernels: the shipped library, else this machine's cached build, else build one (once)."""
    with _lock:
        if _state["loaded"]:
            return _ops
        if _state.get("failed"):
            return None
        reason = why_not_here()
        if reason is None:
            try:
                _load_or_build()
                register_ops()
                register_fakes()
                _state.update(loaded=True, reason=None)
                return _ops
            except Exception as exc:  # a failed build or load means the torch operators, never a broken reply
                last = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ""
                reason = f"building them failed ({type(exc).__name__}: {last})"
        _state.update(failed=True, reason=reason)
        return None


def _load_or_build() -> None:
    import torch  # noqa: F401 - loaded before the clock starts: the figure is the library's own load

    found = _found()
    started = time.perf_counter()
    if found is None:
        missing = missing_build_tools()
        if missing is not None:
            raise RuntimeError(missing)
        compiler = recipe.find_compiler()
        found = _build_best(compiler)
        _state.update(build_seconds=round(time.perf_counter() - started, 1), from_cache=False)
        started = time.perf_counter()
    else:
        _state.update(from_cache=found[2] == "cache", build_seconds=None)
    variant, path, source = found
    _open(path, variant)
    _state.update(
        variant=variant, source=source, path=str(path), load_ms=round((time.perf_counter() - started) * 1e3, 1)
    )


def _build_best(compiler: str) -> tuple[str, Path, str]:
    """Build the best variant this CPU runs that the compiler can build: an older compiler without, say,
    -mavxvnni (GCC before 11) gets the plain AVX2 build rather than none. Raises the first failure if none builds."""
    first = None
    for variant in variants_here():
        path = build_folder(variant, compiler) / recipe.library_name(variant)
        try:
            recipe.compile_library(variant, path, compiler)
            return variant, path, "built"
        except RuntimeError as exc:
            first = first or exc
    raise first or RuntimeError("no variant to build")


def library_for(variant: str, extra_flags: tuple = ()) -> "Kernels":
    """Another build of the kernels beside the one loaded (tests compare them): the shipped library, else this
    machine's cached or new build of ``variant`` (``extra_flags``: e.g. the portable build with fused
    multiply-adds). Not registered as torch operators."""
    import torch  # noqa: F401

    path = None if extra_flags else shipped_library(variant)
    if path is None:
        compiler = recipe.find_compiler()
        if compiler is None:
            raise RuntimeError(missing_build_tools())
        key = _key(variant, compiler) + ("-" + "".join(f.strip("-") for f in extra_flags) if extra_flags else "")
        path = cache_dir() / "kernels" / key / recipe.library_name(variant)
        if not path.is_file():
            recipe.compile_library(variant, path, compiler, extra_flags=extra_flags)
    return Kernels(_checked(path, variant))


def _checked(path: Path, variant: str):
    lib = ctypes.CDLL(str(path))
    version = lib.redline_abi_version()
    if version != recipe.ABI_VERSION:
        raise RuntimeError(f"{path.name} has ABI version {version}, this Redline needs {recipe.ABI_VERSION}")
    lib.redline_variant.restype = ctypes.c_char_p
    built_as = lib.redline_variant().decode()
    if built_as != variant:
        raise RuntimeError(f"{path.name} is the {built_as} build, not {variant}")
    _declare(lib)
    return lib


def _open(path: Path, variant: str) -> None:
    global _lib, _ops
    lib = _checked(path, variant)
    _lib = lib
    _ops = Kernels(lib)


# -- the C functions --------------------------------------------------------------------------------------------
_P, _I, _D, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int


class _Tensor(ctypes.Structure):  # decode_step.cpp's redline_tensor
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int64),
        ("ndim", ctypes.c_int64),
        ("numel", ctypes.c_int64),
        ("contiguous", ctypes.c_int64),
        ("sizes", ctypes.c_int64 * 2),
        ("strides", ctypes.c_int64 * 2),
    ]


_SIGNATURES = {
    "redline_linear_bf16": [_P, _I, _I, _P, _I, _I, _P, _INT],
    "redline_linear_q8": [_P, _I, _I, _P, _P, _I, _P, _INT],
    "redline_linear_q4": [_P, _I, _I, _P, _P, _P, _I, _P, _INT],
    "redline_rms_norm": [_P, _I, _I, _P, _D, _P],
    "redline_silu_mul": [_P, _I, _I, _P],
    "redline_attend": [_P, _P, _P, _P, _P, _I, _P, _I, _P, _I, _I, _I, _I, _I, _D, _P, _INT],
    "redline_quantize_q8": [_P, _I, _I, _I, _P, _P, _INT],
    "redline_quantize_q4": [_P, _I, _I, _I, _INT, _P, _P, _P, _INT],
    "redline_step_plan": [
        ctypes.POINTER(_Tensor),
        _I,
        ctypes.POINTER(_Tensor),
        _I,
        ctypes.POINTER(_D),
        _I,
        _I,
        _I,
        _I,
        ctypes.POINTER(_I),
    ],
    "redline_drop_plan": [_I],
    "redline_decode_step": [
        _P,
        _I,
        _I,
        _I,
        _I,
        _P,
        _P,
        _I,
        _P,
        _P,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _P,
        _I,
        _I,
        _P,
        _I,
        _D,
        _I,
        _P,
        _INT,
    ],
    "redline_step_profile": [_INT, ctypes.POINTER(_D)],
}


def _declare(lib) -> None:
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    lib.redline_last_error.restype = ctypes.c_char_p


def _dtype_codes():
    import torch

    return {
        torch.float32: 0,
        torch.bfloat16: 1,
        torch.float16: 2,
        torch.int8: 3,
        torch.uint8: 4,
        torch.int32: 5,
        torch.int64: 6,
    }


class Kernels:
    """The operators, called straight through ctypes in eager code (about what a torch extension's dispatch costs),
    and as the registered ``torch.ops.redline.*`` while torch.compile traces (so the graph holds the operator).
    Each checks what the C side cannot see (types, layouts) and raises RuntimeError as the operators did."""

    def __init__(self, lib):
        import torch

        self._lib = lib
        self._torch = torch
        self._codes = _dtype_codes()
        self._f32 = torch.float32
        self._threads = torch.get_num_threads
        self._compiling_fn = torch.compiler.is_compiling
        self._plans: dict[int, tuple] = {}  # plan id -> the tensors its pointers point into

    # helpers ----------------------------------------------------------------------------------------------------
    def _fail(self, rc: int) -> None:
        if rc:
            raise RuntimeError(self._lib.redline_last_error().decode(errors="replace"))

    def _rows(self, x, K: int, what: str):
        if x.shape[-1] != K:
            raise RuntimeError(f"redline kernels: input has {x.shape[-1]} features, the {what} {K}")
        torch = self._torch
        x2 = x if x.dtype == torch.float32 else x.to(torch.float32)
        return x2.contiguous().view(-1, K)

    @staticmethod
    def _compiling() -> bool:
        import torch

        return torch.compiler.is_compiling()

    # the operators ----------------------------------------------------------------------------------------------
    def linear_bf16(self, x, w):
        """y = x @ w.T for bf16 weights [N, K] with rows (stride(1) == 1), fp32 activations; y is fp32."""
        torch = self._torch
        if torch.compiler.is_compiling():
            return torch.ops.redline.linear_bf16(x, w)
        if w.dtype != torch.bfloat16 or w.dim() != 2 or w.stride(1) != 1:
            raise RuntimeError("redline::linear_bf16: the weight must be bf16 [N, K] with contiguous rows")
        N, K = w.shape
        x2 = self._rows(x, K, "weight")
        T = x2.shape[0]
        y = torch.empty((T, N), dtype=torch.float32)
        self._fail(
            self._lib.redline_linear_bf16(
                x2.data_ptr(), T, K, w.data_ptr(), N, w.stride(0), y.data_ptr(), torch.get_num_threads()
            )
        )
        return y.view(*x.shape[:-1], N)

    def linear_q8(self, x, w, scales):
        torch = self._torch
        if torch.compiler.is_compiling():
            return torch.ops.redline.linear_q8(x, w, scales)
        if (
            w.dtype != torch.int8
            or not w.is_contiguous()
            or scales.dtype != torch.float16
            or not scales.is_contiguous()
        ):
            raise RuntimeError("redline::linear_q8: int8 [N, K] blocks with contiguous fp16 scales")
        N, K = w.shape
        x2 = self._rows(x, K, "weight")
        T = x2.shape[0]
        y = torch.empty((T, N), dtype=torch.float32)
        self._fail(
            self._lib.redline_linear_q8(
                x2.data_ptr(), T, K, w.data_ptr(), scales.data_ptr(), N, y.data_ptr(), torch.get_num_threads()
            )
        )
        return y.view(*x.shape[:-1], N)

    def linear_q4(self, x, w, scales, mins):
        torch = self._torch
        if torch.compiler.is_compiling():
            return torch.ops.redline.linear_q4(x, w, scales, mins)
        if (
            w.dtype != torch.uint8
            or not w.is_contiguous()
            or scales.dtype != torch.float16
            or not scales.is_contiguous()
        ):
            raise RuntimeError("redline::linear_q4: uint8 [N, K/2] blocks with contiguous fp16 scales")
        if mins.numel() and (mins.dtype != torch.float16 or not mins.is_contiguous() or mins.shape != scales.shape):
            raise RuntimeError("redline::linear_q4: the mins must be contiguous fp16 shaped as the scales")
        N, K = w.shape[0], w.shape[1] * 2
        x2 = self._rows(x, K, "weight")
        T = x2.shape[0]
        y = torch.empty((T, N), dtype=torch.float32)
        self._fail(
            self._lib.redline_linear_q4(
                x2.data_ptr(),
                T,
                K,
                w.data_ptr(),
                scales.data_ptr(),
                mins.data_ptr() if mins.numel() else None,
                N,
                y.data_ptr(),
                torch.get_num_threads(),
            )
        )
        return y.view(*x.shape[:-1], N)

    def rms_norm(self, x, weight, eps: float):
        if self._compiling_fn():
            return self._torch.ops.redline.rms_norm(x, weight, eps)
        f32, H = self._f32, x.shape[-1]
        if weight.dtype is not f32 or weight.numel() != H:
            raise RuntimeError(f"redline::rms_norm: the weight must be fp32 [{H}]")
        if x.dtype is not f32 or not x.is_contiguous():
            x = x.to(f32).contiguous()
        w = weight if weight.is_contiguous() else weight.contiguous()
        y = self._torch.empty_like(x)
        rc = self._lib.redline_rms_norm(x.data_ptr(), x.numel() // H, H, w.data_ptr(), eps, y.data_ptr())
        if rc:
            self._fail(rc)
        return y

    def silu_mul(self, gate_up):
        if self._compiling_fn():
            return self._torch.ops.redline.silu_mul(gate_up)
        f32, I2 = self._f32, gate_up.shape[-1]
        g = gate_up if gate_up.dtype is f32 and gate_up.is_contiguous() else gate_up.to(f32).contiguous()
        rows = g.numel() // I2
        y = self._torch.empty((*g.shape[:-1], I2 // 2), dtype=f32)
        rc = self._lib.redline_silu_mul(g.data_ptr(), rows, I2 // 2, y.data_ptr())
        if rc:
            self._fail(rc)
        return y

    def attend(self, qkv, cos, sin, k_pool, v_pool, pages, pos, H: int, Hkv: int, scale: float):
        torch = self._torch
        if torch.compiler.is_compiling():
            return torch.ops.redline.attend(qkv, cos, sin, k_pool, v_pool, pages, pos, H, Hkv, scale)
        page, D, B = k_pool.shape[2], k_pool.shape[3], pos.shape[0]
        if not (k_pool.is_contiguous() and v_pool.is_contiguous() and k_pool.dtype == v_pool.dtype):
            raise RuntimeError("redline::attend: the KV pools must be contiguous and of one type")
        if pages.dtype != torch.int32 or pos.dtype != torch.int64 or cos.dtype != torch.float32:
            raise RuntimeError("redline::attend: pages int32, pos int64, cos/sin fp32")
        code = self._codes.get(k_pool.dtype, 7)
        if code not in (0, 1):
            raise RuntimeError("redline::attend: the KV cache must be fp32 or bf16")
        q = self._rows(qkv, (H + 2 * Hkv) * D, "heads")
        c, s, pg, ps = cos.contiguous(), sin.contiguous(), pages.contiguous(), pos.contiguous()
        out = torch.empty((B, H * D), dtype=torch.float32)
        self._fail(
            self._lib.redline_attend(
                q.data_ptr(),
                c.data_ptr(),
                s.data_ptr(),
                k_pool.data_ptr(),
                v_pool.data_ptr(),
                code,
                pg.data_ptr(),
                pg.shape[1],
                ps.data_ptr(),
                B,
                H,
                Hkv,
                D,
                page,
                scale,
                out.data_ptr(),
                torch.get_num_threads(),
            )
        )
        return out

    def quantize_q8(self, w_):
        torch = self._torch
        w = w_.contiguous() if w_.dtype == torch.bfloat16 else w_.to(torch.float32).contiguous()
        N, K = w.shape
        q = torch.empty((N, K), dtype=torch.int8)
        sc = torch.empty((N, K // 32), dtype=torch.float16)
        code = self._codes[w.dtype]
        self._fail(
            self._lib.redline_quantize_q8(
                w.data_ptr(), code, N, K, q.data_ptr(), sc.data_ptr(), torch.get_num_threads()
            )
        )
        return q, sc

    def quantize_q4(self, w_, symmetric: bool):
        torch = self._torch
        w = w_.contiguous() if w_.dtype == torch.bfloat16 else w_.to(torch.float32).contiguous()
        N, K = w.shape
        packed = torch.empty((N, K // 2), dtype=torch.uint8)
        sc = torch.empty((N, K // 32), dtype=torch.float16)
        mn = torch.empty((0,), dtype=torch.float16) if symmetric else torch.empty((N, K // 32), dtype=torch.float16)
        self._fail(
            self._lib.redline_quantize_q4(
                w.data_ptr(),
                self._codes[w.dtype],
                N,
                K,
                int(bool(symmetric)),
                packed.data_ptr(),
                sc.data_ptr(),
                mn.data_ptr() if not symmetric else None,
                torch.get_num_threads(),
            )
        )
        return packed, sc, mn

    # products bound once to their weight: everything about the weight resolved now, the least per call (the
    # per-operator step calls about six a layer) ---------------------------------------------------------------
    def _bound(self, op_name: str, fn, K: int, N: int, weight_args: tuple, op_args: tuple):
        torch, f32, empty, threads, compiling, fail = (
            self._torch,
            self._f32,
            self._torch.empty,
            self._threads,
            self._compiling_fn,
            self._fail,
        )

        def product(x):
            if compiling():
                return getattr(torch.ops.redline, op_name)(x, *op_args)
            if x.dtype is not f32 or not x.is_contiguous():
                x = x.to(f32).contiguous()
            if x.shape[-1] != K:
                raise RuntimeError(f"redline kernels: input has {x.shape[-1]} features, the weight {K}")
            T = x.numel() // K
            y = empty((T, N), dtype=f32)
            rc = fn(x.data_ptr(), T, K, *weight_args, y.data_ptr(), threads())
            if rc:
                fail(rc)
            return y if x.dim() == 2 else y.view(*x.shape[:-1], N)

        product.keep = op_args  # the tensors the pointers point into
        return product

    def bind_bf16(self, w):
        """``x ↦ x @ w.T`` for one bf16 weight [N, K] with rows; fp32 out."""
        if w.dtype != self._torch.bfloat16 or w.dim() != 2 or w.stride(1) != 1 or w.shape[1] % 8:
            raise RuntimeError("redline::linear_bf16: the weight must be bf16 [N, K] with rows, K a multiple of 8")
        N, K = w.shape
        return self._bound("linear_bf16", self._lib.redline_linear_bf16, K, N, (w.data_ptr(), N, w.stride(0)), (w,))

    def bind_q8(self, w, scales):
        if w.dtype != self._torch.int8 or not w.is_contiguous() or scales.dtype != self._torch.float16:
            raise RuntimeError("redline::linear_q8: int8 [N, K] blocks with fp16 scales")
        scales = scales.contiguous()
        N, K = w.shape
        return self._bound(
            "linear_q8", self._lib.redline_linear_q8, K, N, (w.data_ptr(), scales.data_ptr(), N), (w, scales)
        )

    def bind_q4(self, w, scales, mins):
        if w.dtype != self._torch.uint8 or not w.is_contiguous() or scales.dtype != self._torch.float16:
            raise RuntimeError("redline::linear_q4: uint8 [N, K/2] blocks with fp16 scales")
        scales, mins = scales.contiguous(), mins.contiguous()
        N, K = w.shape[0], w.shape[1] * 2
        mp = mins.data_ptr() if mins.numel() else None
        return self._bound(
            "linear_q4", self._lib.redline_linear_q4, K, N, (w.data_ptr(), scales.data_ptr(), mp, N), (w, scales, mins)
        )

    # the whole step -------------------------------------------------------------------------------------------
    def _describe(self, t) -> _Tensor:
        d = _Tensor()
        d.data = t.data_ptr() if t.numel() else None
        d.dtype = self._codes.get(t.dtype, 7)
        d.ndim = t.dim()
        d.numel = t.numel()
        d.contiguous = int(t.is_contiguous())
        for i in range(min(2, t.dim())):
            d.sizes[i] = t.shape[i]
            d.strides[i] = t.stride(i)
        return d

    def step_plan(self, layers, head, eps, H: int, Hkv: int, D: int) -> int:
        """Check and resolve one model's weights for ``decode_step`` (decode_step.cpp's ``redline_step_plan``);
        the plan keeps the tensors alive until ``drop_plan``."""
        layers, head = list(layers), list(head)
        ls = (_Tensor * max(1, len(layers)))(*[self._describe(t) for t in layers])
        hs = (_Tensor * max(1, len(head)))(*[self._describe(t) for t in head])
        es = (ctypes.c_double * max(1, len(eps)))(*[float(e) for e in eps])
        plan = ctypes.c_int64(0)
        self._fail(
            self._lib.redline_step_plan(ls, len(layers), hs, len(head), es, len(eps), H, Hkv, D, ctypes.byref(plan))
        )
        self._plans[plan.value] = (layers, head)
        return plan.value

    def drop_plan(self, plan: int) -> None:
        self._lib.redline_drop_plan(plan)
        self._plans.pop(plan, None)

    def decode_step(
        self, x, plan: int, vocab: int, cos, sin, k_pool, v_pool, pages, pos, scale: float, logit_rows: int
    ):
        torch = self._torch
        if torch.compiler.is_compiling():
            return torch.ops.redline.decode_step(
                x, plan, vocab, cos, sin, k_pool, v_pool, pages, pos, scale, logit_rows
            )
        x_ok = x.dim() == 2 and x.dtype == torch.float32
        xc = x.contiguous() if x_ok else x
        pools_ok = (
            k_pool.dim() == 5
            and k_pool.is_contiguous()
            and v_pool.is_contiguous()
            and k_pool.shape == v_pool.shape
            and k_pool.dtype == v_pool.dtype
        )
        types_ok = (
            pages.dtype == torch.int32
            and pos.dtype == torch.int64
            and cos.dtype == torch.float32
            and sin.dtype == torch.float32
        )
        kshape = tuple(k_pool.shape) if k_pool.dim() == 5 else (0, 0, 0, 1, 0)
        pg, ps = pages.contiguous(), pos.contiguous()
        c, s = cos.contiguous(), sin.contiguous()
        T = x.shape[0] if x.dim() >= 1 else 0
        logits = torch.empty((max(1, min(logit_rows, T)), vocab), dtype=torch.float32)
        self._fail(
            self._lib.redline_decode_step(
                xc.data_ptr(),
                T,
                x.shape[1] if x_ok else -1,
                plan,
                vocab,
                c.data_ptr(),
                s.data_ptr(),
                c.shape[0],
                k_pool.data_ptr(),
                v_pool.data_ptr(),
                self._codes.get(k_pool.dtype, 7),
                int(pools_ok),
                *kshape,
                int(types_ok),
                pg.data_ptr(),
                pg.shape[0] if pg.dim() == 2 else -1,
                pg.shape[1] if pg.dim() == 2 else 0,
                ps.data_ptr(),
                ps.numel(),
                scale,
                logit_rows,
                logits.data_ptr(),
                torch.get_num_threads(),
            )
        )
        return logits

    def step_profile(self, enable: bool):
        torch = self._torch
        out = torch.zeros(12, dtype=torch.float64)
        self._lib.redline_step_profile(int(bool(enable)), ctypes.cast(out.data_ptr(), ctypes.POINTER(ctypes.c_double)))
        return out


# -- the torch operators ----------------------------------------------------------------------------------------
def register_ops() -> None:
    """``torch.ops.redline.*``: the same functions as torch operators (what torch.compile's graph calls, and what
    callers outside this package may use); ``torch_ops.py``. Idempotent."""
    if _state.get("ops") or _ops is None:
        return
    from redline.inference.kernels import torch_ops

    torch_ops.register(_ops)
    _state["ops"] = True


def register_fakes() -> None:
    """Shapes of the native operators' outputs, so torch.compile can trace a step that calls them."""
    import torch

    if _state.get("fakes") or not _state.get("ops"):
        return

    def rows(x, n):
        return x.new_empty((*x.shape[:-1], n), dtype=torch.float32)

    torch.library.register_fake("redline::linear_bf16")(lambda x, w: rows(x, w.shape[0]))
    torch.library.register_fake("redline::linear_q8")(lambda x, w, s: rows(x, w.shape[0]))
    torch.library.register_fake("redline::linear_q4")(lambda x, w, s, m: rows(x, w.shape[0]))
    torch.library.register_fake("redline::rms_norm")(lambda x, w, eps: torch.empty_like(x))
    torch.library.register_fake("redline::silu_mul")(lambda g: g.new_empty((*g.shape[:-1], g.shape[-1] // 2)))
    torch.library.register_fake("redline::attend")(
        lambda qkv, cos, sin, kp, vp, pages, pos, h, hkv, scale: qkv.new_empty((pos.shape[0], h * kp.shape[-1]))
    )
    torch.library.register_fake("redline::decode_step")(
        lambda x, plan, vocab, cos, sin, kp, vp, pages, pos, scale, rows: x.new_empty((rows, vocab))
    )
    _state["fakes"] = True
