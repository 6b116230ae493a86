"""The ARM64 builds of the kernels, checked on an x86-64 machine: cross-compiled (g++-aarch64-linux-gnu) and run under
qemu-aarch64 (correctness only, not speed) by a C++ driver that calls every function of the C ABI
(tests/test_kernels_driver.cpp) on fixed inputs. Its outputs must be, bit for bit, what the x86-64 AVX2 build gives
for the same inputs (which tests/test_kernels.py and test_whole_step.py hold to torch).

Needs: apt-get install g++-aarch64-linux-gnu qemu-user. Skipped where they are missing (.ci/run installs them; see
docs/install-and-packaging.md). The libraries and drivers are kept in the per-machine cache (keyed by sources, flags
and compiler, as library.py keys its builds), so only the first run compiles: about 2.5 minutes then on 2 busy cores,
then the qemu runs alone.
"""

import hashlib
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from redline.inference.kernels.cpu import build
from redline.inference.paths import cache_dir

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "test_kernels_driver.cpp"
SYSROOT = Path("/usr/aarch64-linux-gnu")
pytestmark = pytest.mark.slow
VARIANTS = ("avx2", "neon-dotprod", "neon")


def records(path: Path) -> dict:
    """The driver's file: label -> bytes, in order."""
    data, out, i = path.read_bytes(), {}, 0
    while i < len(data):
        n = int.from_bytes(data[i : i + 4], "little")
        label = data[i + 4 : i + 4 + n].decode()
        size = int.from_bytes(data[i + 4 + n : i + 12 + n], "little")
        out[label] = data[i + 12 + n : i + 12 + n + size]
        i += 12 + n + size
    return out


def driver(compiler: str, out: Path) -> Path:
    """The driver built with ``compiler``, from the per-machine cache when this source was built before."""
    key = hashlib.sha256((DRIVER.read_text() + compiler).encode()).hexdigest()[:16]
    cached = cache_dir() / "kernels" / f"driver-{key}" / out.name
    if not cached.is_file():
        cmd = [compiler, "-O2", "-std=c++17", "-ffp-contract=off", str(DRIVER), "-o", str(out), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, cached)
        cached.chmod(0o755)
    return cached


def library(variant: str, compiler: str) -> Path:
    """``variant`` built by ``compiler`` (build.py's recipe), from the per-machine cache when built before."""
    path = cache_dir() / "kernels" / f"test-{build.build_key(variant, compiler)}" / build.library_name(variant, "linux")
    if not path.is_file():
        build.compile_library(variant, path, compiler)
    return path


def run(cmd: list, out: Path) -> dict:
    proc = subprocess.run([*cmd, str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-2000:]
    return records(out)


@pytest.mark.skipif(build.machine() != "x86_64" or not sys.platform.startswith("linux"), reason="an x86-64 Linux host")
def test_arm64_builds_give_the_avx2_builds_bits(tmp_path):
    cross, qemu = (
        shutil.which("aarch64-linux-gnu-g++"),
        shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static"),
    )
    if cross is None or qemu is None or build.find_compiler() is None:
        pytest.skip("needs g++, g++-aarch64-linux-gnu and qemu-user (apt-get install g++-aarch64-linux-gnu qemu-user)")
    with ThreadPoolExecutor(max_workers=3) as pool:
        libs = {v: pool.submit(library, v, cross if v.startswith("neon") else build.find_compiler()) for v in VARIANTS}
        x86 = pool.submit(driver, build.find_compiler(), tmp_path / "driver-x86_64")
        arm = pool.submit(driver, cross, tmp_path / "driver-aarch64")
        libs = {v: f.result() for v, f in libs.items()}
        x86, arm = x86.result(), arm.result()
    want = run([str(x86), str(libs["avx2"])], tmp_path / "avx2.bin")
    assert len(want) > 1000
    # neon-dotprod on qemu's default CPU (it has the dot products); neon on a Cortex-A72, which lacks them, so a
    # stray dot-product instruction in that build would fault
    with ThreadPoolExecutor(max_workers=2) as pool:
        got = {
            "neon-dotprod": pool.submit(
                run, [qemu, "-L", str(SYSROOT), str(arm), str(libs["neon-dotprod"])], tmp_path / "dotprod.bin"
            ),
            "neon": pool.submit(
                run,
                [qemu, "-L", str(SYSROOT), "-cpu", "cortex-a72", str(arm), str(libs["neon"])],
                tmp_path / "neon.bin",
            ),
        }
        got = {v: f.result() for v, f in got.items()}
    for variant, records_ in got.items():
        assert records_.keys() == want.keys(), variant
        differ = [label for label in want if want[label] != records_[label]]
        assert not differ, f"{variant}: {len(differ)} of {len(want)} outputs differ from AVX2's, first {differ[:5]}"
