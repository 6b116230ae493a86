"""Builds Redline's native CPU kernels into the wheel (everything else about the package is in pyproject.toml).

``python -m build --wheel`` compiles inference/kernels/cpu/ once per CPU variant of this machine's architecture
(``inference/kernels/cpu/build.py``: avx512-vnni, avx2-vnni, avx2 and generic on x86-64, neon-dotprod and neon on
ARM64) into ``redline/inference/kernels/cpu/prebuilt/``, with the OpenMP runtime they link (GCC's libgomp.so.1)
beside them, so an installed Redline never compiles anything. The wheel is tagged ``py3-none-<platform>`` (the
library uses no Python API, so one wheel serves every Python 3.11+); on Linux the platform is
``manylinux_2_N_<arch>``, N the newest glibc symbol version the carried libraries ask for (what ``auditwheel show``
reports: ``make wheel`` runs it where it is installed). Not ``auditwheel repair``: it would rename libgomp, and
torch's copy and ours would then be two OpenMP thread pools (build.py's ``bundle_openmp_runtime`` says why that is
slower).

An editable install (``pip install -e .``, what ``make`` does) builds nothing: a source checkout builds its
kernels on first use instead (inference/kernels/cpu/library.py).

Environment:
  REDLINE_KERNEL_VARIANTS   variants to build (comma-separated; default: this machine's, all of them; "none" for
                            a wheel without kernels)
  REDLINE_REQUIRE_KERNELS   1: a failed compile fails the build (``make wheel`` and the packaging test set it);
                            otherwise the wheel is built without kernels, with a warning, and falls back to a
                            first-use build or torch's operators
  REDLINE_KERNEL_CACHE      a folder of earlier builds keyed as library.py keys a checkout's own (the tests point it
                            at the per-machine cache, so the packaging test compiles nothing the checkout built)
  CXX                       the compiler (default: c++, g++ or clang++; MSVC's cl on Windows, see build.py)
"""

import importlib.util
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
KERNELS = ROOT / "inference" / "kernels" / "cpu"
_built = {}  # "folder": where build_py put the libraries (the wheel's tag reads them)


def _recipe():
    spec = importlib.util.spec_from_file_location("redline_kernel_build", KERNELS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithKernels(build_py):
    """build_py, then the kernel libraries into the build tree's redline/inference/kernels/cpu/prebuilt/."""

    def find_package_modules(self, package, package_dir):
        # The repository root is the package `redline`, so this script sits in it: not a module of the package.
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not (package == "redline" and m[1] == "setup")]

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        recipe = _recipe()
        wanted = os.environ.get("REDLINE_KERNEL_VARIANTS", ",".join(recipe.VARIANTS.get(recipe.machine(), ())))
        variants = [v for v in wanted.split(",") if v and v != "none"]
        out = Path(self.build_lib) / "redline" / "inference" / "kernels" / "cpu" / "prebuilt"
        strict = os.environ.get("REDLINE_REQUIRE_KERNELS", "").strip() in ("1", "true", "yes")

        cache = os.environ.get("REDLINE_KERNEL_CACHE", "").strip()

        def one(variant):
            target = out / recipe.library_name(variant)
            compiler = recipe.find_compiler("aarch64" if variant.startswith("neon") else "x86_64")
            if not cache or compiler is None:
                return recipe.compile_library(variant, target, source_dir=KERNELS)
            # The same key as a source checkout's first-use build (library.py): same sources, flags and compiler,
            # so the same bytes; built once per machine for the tests' wheels and the checkout alike.
            cached = Path(cache) / recipe.build_key(variant, compiler) / recipe.library_name(variant)
            if not cached.is_file():
                recipe.compile_library(variant, cached, compiler, source_dir=KERNELS)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cached, target)
            return target

        with ThreadPoolExecutor(max_workers=max(1, min(len(variants), os.cpu_count() or 1))) as pool:
            futures = {variant: pool.submit(one, variant) for variant in variants}
        built = []
        for variant, future in futures.items():
            try:
                built.append(future.result())
                print(f"redline: built the {variant} kernels: {built[-1]}")
            except Exception as exc:
                if strict:
                    raise SystemExit(f"redline: building the {variant} kernels failed: {exc}") from exc
                print(
                    f"redline: WARNING: the {variant} kernels were not built ({exc}); this wheel will build them "
                    "on first use where a compiler is, else use torch's operators",
                    file=sys.stderr,
                )
        if built:
            _built["folder"] = out
            runtime = recipe.bundle_openmp_runtime(out)
            if runtime is not None:
                print(f"redline: bundled the OpenMP runtime: {runtime}")


class PlatformDistribution(Distribution):
    """A wheel with a compiled library is platform-specific (root_is_pure false)."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildWithKernels}
try:
    from setuptools.command.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """Tagged py3-none-<platform>: the library is plain C, tied to the CPU and OS, not to a Python version."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            folder = _built.get("folder")
            if plat.startswith("linux_") and folder is not None:
                glibc = _recipe().glibc_needed(folder)
                if glibc is not None:  # PEP 600: runs on any Linux with this glibc or newer
                    plat = f"manylinux_{glibc[0]}_{glibc[1]}_{plat[len('linux_') :]}"
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # setuptools < 70.1 (pyproject.toml requires newer)
    pass

setup(cmdclass=cmdclass, distclass=PlatformDistribution)
