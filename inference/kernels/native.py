"""Building and loading the native CPU kernels (``*.cpp`` and ``simd.h``) with torch's C++ extension tooling.

Built once per machine and kept in Redline's cache, keyed by the source, torch's version, the Python
version and the compiler flags; a later start only loads the shared library (milliseconds). Used only
where they can run: an x86-64 CPU with AVX2, FMA and F16C, a C++ compiler and ninja at build time.
Anything else — another CPU, no compiler, a failed build, ``REDLINE_NATIVE_KERNELS=0`` — leaves
``native()`` returning None with the reason in ``status()``, and the decode step uses torch's own
operators instead: slower, never wrong.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import threading
import time
from importlib.resources import files
from pathlib import Path
from typing import Optional

from redline.inference.paths import cache_dir

# The translation units and the header they share; all of them are part of the build key.
SOURCES = ("cpu_kernels.cpp", "decode_step.cpp")
HEADERS = ("simd.h", "paged_attention.h")
# -ffp-contract=off: no fused multiply-adds where a multiply and an add are written, so the quantisers round
# exactly as block_quant.py does.
# -std=c++20: torch 2.14's headers refuse anything older (``#error C++20 or later``); older torch builds with it too.
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-std=c++20", "-ffp-contract=off"]
_lock = threading.Lock()
_state: dict = {"loaded": False, "reason": "not built yet", "build_seconds": None, "from_cache": None}


def _source_text(name: str) -> str:
    return (files("redline.inference.kernels") / name).read_text(encoding="utf-8")


def cpu_supports_kernels() -> Optional[str]:
    """None if this CPU can run the kernels, else why not."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"the native kernels are written for x86-64 (AVX2); this CPU is {platform.machine()}"
    if sys.platform.startswith("linux"):
        try:
            flags = set()
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("flags"):
                        flags = set(line.split(":", 1)[1].split())
                        break
        except OSError:
            flags = set()
        missing = [f for f in ("avx2", "fma", "f16c") if f not in flags]
        if flags and missing:
            return f"this CPU lacks {', '.join(missing)}"
        return None
    import torch

    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "this CPU has no AVX2"
    return None


def build_key() -> str:
    import torch

    sources = [_source_text(name) for name in SOURCES + HEADERS]
    text = "\n".join([*sources, torch.__version__, sys.version, " ".join(FLAGS), platform.machine()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_folder() -> Path:
    return cache_dir() / "kernels" / build_key()


def status() -> dict:
    """Whether the kernels are loaded, why not, and how long the build took (None when loaded from cache)."""
    return dict(_state)


def native():
    """``torch.ops.redline`` when the native kernels are loaded (building them the first time), else None."""
    if _state["loaded"]:
        import torch

        return torch.ops.redline
    if _state.get("failed"):
        return None
    return ensure_built()


def ensure_built():
    """Load the kernels, building them first if this machine has none cached (tens of seconds, once)."""
    import torch

    with _lock:
        if _state["loaded"]:
            return torch.ops.redline
        if _state.get("failed"):
            return None
        reason = why_not_here()
        if reason is None:
            try:
                _load_or_build()
                _state.update(loaded=True, reason=None)
                register_fakes()
                return torch.ops.redline
            except Exception as exc:  # a failed build means the torch operators, never a broken reply
                reason = f"building them failed ({type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]})"
        _state.update(failed=True, reason=reason)
        return None


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
    if _library_path(build_folder(), f"redline_kernels_{build_key()}") is not None:
        return None
    return missing_build_tools()


def missing_build_tools() -> Optional[str]:
    """None if this machine has what a build needs (a C++ compiler and ninja), else what is missing."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        return "no C++ compiler found to build them (install g++ or clang)"
    if shutil.which("ninja") is None:
        return "ninja is not installed (needed to build them)"
    return None


def buildable_here() -> bool:
    """The kernels can be built and must work here: an x86-64 CPU with AVX2, a compiler and ninja, not turned
    off. A failed build on such a machine is a bug (the tests fail on it rather than skip)."""
    return why_not_here() is None and missing_build_tools() is None


def why_not_here() -> Optional[str]:
    if os.environ.get("REDLINE_NATIVE_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return "turned off (REDLINE_NATIVE_KERNELS=0)"
    reason = cpu_supports_kernels()
    if reason:
        return reason
    if getattr(sys, "frozen", False):
        return "the desktop bundle carries no compiler headers"
    return None


def _library_path(folder: Path, name: str) -> Optional[Path]:
    for suffix in (".so", ".pyd", ".dylib"):
        path = folder / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def _load_or_build() -> None:
    import torch

    folder = build_folder()
    name = f"redline_kernels_{build_key()}"
    lib = _library_path(folder, name)
    if lib is not None:
        torch.ops.load_library(str(lib))
        _state.update(from_cache=True, build_seconds=None)
        return
    missing = missing_build_tools()
    if missing is not None:
        raise RuntimeError(missing)
    from torch.utils.cpp_extension import load, verify_ninja_availability

    verify_ninja_availability()
    folder.mkdir(parents=True, exist_ok=True)
    for file in SOURCES + HEADERS:
        (folder / file).write_text(_source_text(file), encoding="utf-8")
    started = time.perf_counter()
    load(
        name=name,
        sources=[str(folder / file) for file in SOURCES],
        extra_cflags=FLAGS,
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        is_python_module=False,
        verbose=False,
    )
    _state.update(from_cache=False, build_seconds=round(time.perf_counter() - started, 1))


def register_fakes() -> None:
    """Shapes of the native operators' outputs, so torch.compile can trace a step that calls them."""
    import torch

    if _state.get("fakes"):
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
