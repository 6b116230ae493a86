"""Finding, building and loading Redline's native CPU kernel library: a plain C ABI library (``abi.h``, ``abi.py``)
called through ctypes (``wrappers.py``) and registered as the torch operators ``redline::*`` (``torch_ops.py``,
with fake implementations so torch.compile can trace a step that calls them).

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
with the reason in ``status()``, and the CPU's operators are torch's own (``backend.py`` registers none, so the
device table keeps ``reference.py``'s): slower, never wrong. ``REDLINE_KERNELS_VARIANT`` forces a variant (tests:
the portable build on an AVX2 machine).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from importlib.resources import files
from pathlib import Path
from typing import Optional

from ...paths import cache_dir
from . import build as recipe
from .abi import open_library
from .wrappers import Kernels

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
        path = Path(str(files("redline.inference.kernels.cpu") / PREBUILT / recipe.library_name(variant)))
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


_answers: dict = {}  # will_run's answer for each setting of the variables it reads


def will_run() -> Optional[str]:
    """None if the kernels are loaded or will load when first asked for; else why not. Cheap: it builds nothing
    (the estimator and the speed model ask it on any thread, to predict the path that will really run), and its
    answer is kept per setting of the variables it reads: the estimator asks it for every layer of every
    precision (12,700 times for one ``redline estimate``), and finding the library anew took 0.35 ms each time."""
    if _state["loaded"]:
        return None
    if _state.get("failed"):
        return _state["reason"]
    key = tuple(os.environ.get(k) for k in ("REDLINE_NATIVE_KERNELS", "REDLINE_KERNELS_VARIANT", "CXX", "PATH"))
    if key not in _answers:
        _answers[key] = _will_run_now()
    return _answers[key]


def _will_run_now() -> Optional[str]:
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


def library_for(variant: str, extra_flags: tuple = ()) -> Kernels:
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
    return Kernels(open_library(path, variant))


def _open(path: Path, variant: str) -> None:
    global _lib, _ops
    lib = open_library(path, variant)
    _lib = lib
    _ops = Kernels(lib)


# -- the torch operators ----------------------------------------------------------------------------------------
def register_ops() -> None:
    """``torch.ops.redline.*``: the same functions as torch operators, with their fake implementations (what
    torch.compile's graph calls, and what callers outside this package may use); ``torch_ops.py``. Idempotent."""
    if _state.get("ops") or _ops is None:
        return
    # lazy: torch_ops imports torch (torch loads on the engine's thread, never at import)
    from . import torch_ops

    torch_ops.register(_ops)
    _state.update(ops=True, fakes=True)
