"""How Redline's kernel library is compiled: one recipe for the wheel (``setup.py``), the desktop bundle
(``packaging/redline.spec``) and the first-use build of a source checkout (``library.py``).

A plain shared library with a C ABI (``abi.h``): the sources include no torch or Python headers, so any C++17
compiler builds it in a few seconds per variant, and the binary keeps working across torch upgrades. One build per
*variant*, each for one family of CPUs; ``library.py`` picks, at run time, the best variant this CPU runs:

==============  ==========================================  ===================================================
variant         CPUs                                        compiled with (GCC / Clang)
==============  ==========================================  ===================================================
``avx512-vnni`` ``avx2`` + AVX512-VNNI and AVX512-VL (Intel  ``avx2``'s + ``-mavx512f -mavx512bw -mavx512vl
                Ice Lake / Sapphire Rapids+, AMD Zen 4+)    -mavx512vnni``
``avx2-vnni``   ``avx2`` + AVX-VNNI (Intel Alder Lake+,     ``avx2``'s + ``-mavxvnni``
                AMD Zen 5+)
``avx2``        x86-64 with AVX2, FMA and F16C (Intel       ``-mavx2 -mfma -mf16c``
                Haswell 2013+, AMD Zen / Excavator+)
``generic``     any x86-64 (SSE2)                           ``-march=x86-64`` (the compiler's own vectors)
``neon-dotprod``ARM64 with the dot-product instructions     ``-march=armv8.2-a+dotprod``
                (Apple M1+, Graviton2+, Cortex-A76+, …)
``neon``        any ARM64 (Raspberry Pi 4, Cortex-A72, …)   ``-march=armv8-a``
==============  ==========================================  ===================================================

This module imports nothing outside the standard library (``setup.py`` loads it by path, before anything is
installed). ``-ffp-contract=off`` everywhere: no multiply and add is fused unless the source asks for it, so the
quantisers round exactly as ``block_quant.py`` does and every build computes in the order the source says.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
SOURCES = ("cpu_kernels.cpp", "decode_step.cpp")
HEADERS = ("abi.h", "vec.h", "simd.h", "arch/avx512.h", "paged_attention.h")
# Bumped with abi.h's REDLINE_ABI_VERSION.
ABI_VERSION = 1

VARIANTS = {
    "x86_64": ("avx512-vnni", "avx2-vnni", "avx2", "generic"),
    "aarch64": ("neon-dotprod", "neon"),
}

# GCC and Clang: the common flags, then each variant's. -fvisibility=hidden: only the redline_* functions are exported.
COMMON = ["-O3", "-std=c++17", "-ffp-contract=off", "-fPIC", "-fvisibility=hidden", "-fno-math-errno"]
VARIANT_FLAGS = {
    "avx2": ["-mavx2", "-mfma", "-mf16c", "-DREDLINE_AVX2"],
    # The same AVX2 source with one instruction for the byte products (vec.h i32_dot4); the EVEX form also gives the
    # compiler 32 vector registers for the tiles.
    "avx2-vnni": ["-mavx2", "-mfma", "-mf16c", "-mavxvnni", "-DREDLINE_AVX2", "-DREDLINE_AVX_VNNI"],
    "avx512-vnni": [
        "-mavx2",
        "-mfma",
        "-mf16c",
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512vnni",
        "-DREDLINE_AVX2",
        "-DREDLINE_AVX512_VNNI",
    ],
    "generic": ["-march=x86-64", "-mtune=generic"],
    "neon-dotprod": ["-march=armv8.2-a+dotprod", "-DREDLINE_NEON", "-DREDLINE_DOTPROD"],
    "neon": ["-march=armv8-a", "-DREDLINE_NEON"],
}
# MSVC (cl.exe) or clang-cl on Windows: written for the wheel build there, not run on this project's machines.
# /fp:precise contracts nothing since Visual Studio 2022 17.0 (clang-cl: -ffp-contract=off, passed through /clang:).
MSVC_COMMON = ["/nologo", "/O2", "/std:c++17", "/EHsc", "/fp:precise", "/openmp", "/LD"]
MSVC_VARIANT_FLAGS = {
    "avx2": ["/arch:AVX2", "/DREDLINE_AVX2"],
    "avx2-vnni": ["/arch:AVX2", "/DREDLINE_AVX2", "/DREDLINE_AVX_VNNI"],
    "avx512-vnni": ["/arch:AVX512", "/DREDLINE_AVX2", "/DREDLINE_AVX512_VNNI"],
    "generic": [],
    "neon-dotprod": [],
    "neon": [],
}


def machine() -> str:
    """x86_64, aarch64, or what platform.machine() says, normalised."""
    m = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(m, m)


def library_name(variant: str, system: Optional[str] = None) -> str:
    system = system or sys.platform
    suffix = ".dll" if system.startswith("win") else ".dylib" if system == "darwin" else ".so"
    return f"redline_kernels_{variant}{suffix}"


def source_text() -> str:
    return "\n".join((HERE / name).read_text(encoding="utf-8") for name in SOURCES + HEADERS)


def find_compiler(target: Optional[str] = None) -> Optional[str]:
    """The C++ compiler to use: $CXX, else c++ / g++ / clang++ on PATH (for ``target`` aarch64 on an x86-64 host,
    aarch64-linux-gnu-g++)."""
    if target == "aarch64" and machine() != "aarch64":
        return shutil.which("aarch64-linux-gnu-g++")
    env = os.environ.get("CXX")
    if env:
        return shutil.which(env.split()[0]) and env
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return name
    return None


def is_msvc(compiler: str) -> bool:
    return Path(compiler.split()[0]).stem.lower() in ("cl", "clang-cl")


def flags(variant: str, compiler: str, openmp: bool = True) -> list[str]:
    if is_msvc(compiler):
        extra = ["/clang:-ffp-contract=off"] if "clang-cl" in compiler.lower() else []
        return MSVC_COMMON + MSVC_VARIANT_FLAGS[variant] + extra
    out = COMMON + VARIANT_FLAGS[variant]
    if openmp:
        out += ["-Xpreprocessor", "-fopenmp"] if sys.platform == "darwin" else ["-fopenmp"]
    return out


def link_flags(compiler: str, openmp: bool = True) -> list[str]:
    if is_msvc(compiler):
        return []
    if sys.platform == "darwin":  # Apple's clang has no OpenMP runtime of its own: Homebrew's libomp
        return ["-dynamiclib", "-undefined", "error"] + (["-lomp"] if openmp else [])
    # libstdc++ linked as the system has it (it is in every manylinux policy); the one newer symbol GCC 12's headers
    # call is defined in cpu_kernels.cpp. -Bsymbolic: our own symbols bind inside the library.
    return ["-shared", "-Wl,-Bsymbolic", "-Wl,-rpath,$ORIGIN"] + (["-fopenmp"] if openmp else [])


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str) -> tuple[str, ...]:
    """The compiler's first ``--version`` line (a subprocess: asked once per compiler, not once per variant, as
    looking for a cached build of each of four variants at start-up would)."""
    try:
        out = subprocess.run([*compiler.split(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(out.splitlines()[:1])


def build_key(variant: str, compiler: str) -> str:
    """What a first-use build in the cache is keyed by: the sources, flags, compiler and ABI (not torch: the
    library does not use it)."""
    version = compiler_version(compiler)
    text = "\n".join([source_text(), variant, compiler, *version, " ".join(flags(variant, compiler)), str(ABI_VERSION)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def compile_library(
    variant: str,
    out: Path,
    compiler: Optional[str] = None,
    extra_flags: Sequence[str] = (),
    source_dir: Path = HERE,
    timeout: float = 600,
) -> Path:
    """Compile ``variant`` into ``out`` (a shared library). Raises RuntimeError with the compiler's last lines."""
    target = "aarch64" if variant.startswith("neon") else "x86_64"
    compiler = compiler or find_compiler(target)
    if compiler is None:
        raise RuntimeError("no C++ compiler found to build them (install g++ or clang)")
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    sources = [str(source_dir / name) for name in SOURCES]
    if is_msvc(compiler):
        cmd = [
            *compiler.split(),
            *flags(variant, compiler),
            *extra_flags,
            *sources,
            f"/Fe:{tmp}",
            f"/Fo:{tmp.parent}\\",
        ]
    else:
        cmd = [
            *compiler.split(),
            *flags(variant, compiler),
            *extra_flags,
            *sources,
            "-o",
            str(tmp),
            *link_flags(compiler),
        ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(out.parent))
    if proc.returncode != 0 or not tmp.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{' '.join(cmd[:2])} … failed: " + " | ".join(tail))
    os.replace(tmp, out)  # atomic: a process loading the library never sees half a file
    return out


def bundle_openmp_runtime(folder: Path, compiler: Optional[str] = None) -> Optional[Path]:
    """Copy the compiler's OpenMP runtime (GCC's libgomp.so.1) beside the libraries in ``folder`` (Linux), where
    their RUNPATH ($ORIGIN) finds it when no other libgomp.so.1 is loaded.

    Under its own name on purpose, where auditwheel would rename it (libgomp-<hash>.so.1): torch's Linux wheels
    load a libgomp.so.1 of their own, and the dynamic loader then hands the kernels that one, already loaded, so
    the kernels and torch share one OpenMP thread pool. A renamed copy is a second pool whose threads spin beside
    torch's: measured on the starter, decode 0.89x in q4 (interleaved rounds, docs/performance.md). The kernels
    need only OpenMP 4.0's entry points (GCC 4.9 and later), which every libgomp.so.1 torch ships has."""
    if not sys.platform.startswith("linux"):
        return None
    compiler = compiler or find_compiler()
    if compiler is None or is_msvc(compiler):
        return None
    try:
        found = subprocess.run(
            [*compiler.split(), "-print-file-name=libgomp.so.1"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not found or not Path(found).is_absolute() or not Path(found).is_file():
        return None
    out = Path(folder) / "libgomp.so.1"
    shutil.copyfile(Path(found).resolve(), out)
    return out


def glibc_needed(folder: Path) -> Optional[tuple[int, int]]:
    """The newest glibc symbol version (2, N) any library in ``folder`` asks for: what its manylinux tag
    (PEP 600, ``manylinux_2_N``) must say. Read from the version names in the files' dynamic string tables, as
    ``auditwheel show`` reads them (the two agree on this project's wheel); None where no file names one."""

    newest = None
    for path in sorted(Path(folder).glob("*.so*")):
        for major, minor in re.findall(rb"GLIBC_(\d+)\.(\d+)", path.read_bytes()):
            version = (int(major), int(minor))
            newest = version if newest is None or version > newest else newest
    return newest


def main(argv=None) -> int:
    """``python inference/kernels/cpu/build.py --out DIR [--variants avx2,generic]``: the libraries into DIR."""

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS.get(machine(), ())))
    ap.add_argument("--cxx", default=None)
    args = ap.parse_args(argv)
    for variant in filter(None, args.variants.split(",")):
        path = compile_library(variant, args.out / library_name(variant), args.cxx)
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
