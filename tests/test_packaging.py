"""The shipped forms work: the wheel installed (not editable) into a fresh venv, and the desktop metadata."""

import json
import os
import re
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from redline.inference.kernels.cpu import build as kernel_build

ROOT = Path(__file__).resolve().parent.parent
LINUX = ROOT / "packaging" / "linux"
APP_ID = "io.github.redline_app.Redline"
# Builds the sdist and the wheel and installs them: part of `make test`, not of `make test-fast`.
pytestmark = pytest.mark.packaging


def _build(tmp: Path) -> tuple[Path, Path]:
    """``python -m build``: the sdist, then the wheel built *from that sdist* (so the sdist must be complete).

    No build isolation: setuptools comes from this environment, so the test needs no network.
    """
    out = tmp / "dist"
    # The kernels must build into the wheel wherever they can (a compiler and a CPU they are built for): a failed
    # compile fails the build rather than leaving a wheel without them.
    env = dict(os.environ)
    if kernel_build.find_compiler() is not None and kernel_build.VARIANTS.get(kernel_build.machine()):
        env["REDLINE_REQUIRE_KERNELS"] = "1"
        # The libraries the checkout built (same key, same bytes) rather than compiling them again.
        from redline.inference.paths import cache_dir

        env["REDLINE_KERNEL_CACHE"] = str(cache_dir() / "kernels")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return next(out.glob("redline-*.whl")), next(out.glob("redline-*.tar.gz"))


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """Build the wheel and install it alone into a fresh venv whose dependencies come from this one."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel, sdist = _build(tmp)
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # Without PYTHONPATH: a checkout on it (and the redline.egg-info the sdist build leaves there) would make
    # pip think Redline is installed already.
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # Install first: once the .pth below is in place, pip would see this environment's (editable) Redline
    # and call the requirement satisfied.
    proc = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        env=clean_env,
    )
    assert proc.returncode == 0 and (env_dir / "bin" / "redline").exists(), proc.stdout + proc.stderr
    # Dependencies (torch etc.) come from the test's own environment. A path line in a .pth does not run
    # that directory's own .pth files, so this environment's editable Redline stays invisible.
    new_site = Path(
        subprocess.check_output(
            [str(py), "-c", "import site; print(site.getsitepackages()[0])"], text=True, env=clean_env
        ).strip()
    )
    (new_site / "redline_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return env_dir, wheel, sdist


def run_installed(env_dir, *args, cwd, timeout=300):
    """Run the installed ``redline`` outside the checkout, on a throwaway profile (data and config)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["QT_QPA_PLATFORM"] = "offscreen"
    env["HF_HUB_OFFLINE"] = "1"
    env["XDG_DATA_HOME"] = str(cwd / "data")
    env["XDG_CONFIG_HOME"] = str(cwd / "config")
    return subprocess.run(
        [str(env_dir / "bin" / "redline"), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def _asset_files() -> list[str]:
    return sorted(
        str(p.relative_to(ROOT / "assets"))
        for p in (ROOT / "assets").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def test_wheel_contains_package_data(installed_wheel):
    import tarfile
    import zipfile

    _, wheel, sdist = installed_wheel
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("icons/redline.svg", "style/redline.qss"):
        assert f"redline/assets/{needed}" in names
    # Everything under assets/ ships: a new kind of file there must be added to package-data.
    missing = [f for f in _asset_files() if f"redline/assets/{f}" not in names]
    assert not missing, f"not in the wheel (extend [tool.setuptools.package-data]): {missing}"
    # Every module of the source tree made it into the wheel, under redline/ (a new subpackage that
    # pyproject.toml does not list would be missing here).
    for pkg in ("app", "ui", "inference", "assets"):
        for module in (ROOT / pkg).rglob("*.py"):
            rel = module.relative_to(ROOT)
            assert f"redline/{rel}" in names, f"{rel} is not in the wheel (list its package in pyproject.toml)"
    assert "redline/__init__.py" in names and "redline/__main__.py" in names
    # One import root: nothing but redline/ and its dist-info; the tests and tools stay out of the wheel.
    tops = {name.split("/")[0] for name in names}
    assert tops == {"redline", f"{wheel.name.split('-')[0]}-{_project_version()}.dist-info"}, tops
    assert not [n for n in names if n.startswith(("redline/tests/", "redline/tools/", "redline/packaging/"))]
    # The sdist carries what `make install-desktop` and `make dist` need, and the tests.
    top = sdist.name[: -len(".tar.gz")]
    in_sdist = tarfile.open(sdist).getnames()
    for needed in (
        "Makefile",
        f"packaging/linux/{APP_ID}.desktop",
        f"packaging/linux/{APP_ID}.metainfo.xml",
        "packaging/linux/render_icons.py",
        "packaging/redline.spec",
        "tests/test_packaging.py",
    ):
        assert f"{top}/{needed}" in in_sdist, needed


def _bare_path(env_dir: Path, tmp: Path) -> str:
    """A PATH with the venv's scripts and the basic tools, and no compiler, no ninja: what a plain desktop has."""
    tools = tmp / "bare-bin"
    tools.mkdir(exist_ok=True)
    for name in ("sh", "ls", "cat", "uname"):
        found = shutil.which(name)
        if found and not (tools / name).exists():
            (tools / name).symlink_to(found)
    return os.pathsep.join([str(env_dir / "bin"), str(tools)])


LOAD_KERNELS = """
import json, shutil, time
import torch
t0 = time.perf_counter()
from redline.inference.kernels import reference
from redline.inference.kernels.cpu import library as native
t1 = time.perf_counter()
ops = native.native()
first_ms, import_ms = (time.perf_counter() - t1) * 1e3, (t1 - t0) * 1e3
status = native.status()
torch.manual_seed(0)
x, w = torch.randn(3, 256), (torch.randn(96, 256) * 0.05).bfloat16()
err = ((ops.linear_bf16(x, w) - reference.linear(x, w.float())).abs().max()).item() if ops else None
print(json.dumps({"status": status, "first_ms": first_ms, "import_ms": import_ms, "err": err, "module": native.__file__,
                  "tools": {t: shutil.which(t) for t in ("c++", "g++", "gcc", "clang++", "cc", "ninja")}}))
"""


def test_wheel_carries_the_kernels_built(installed_wheel):
    """The wheel holds every variant of this machine's architecture and the OpenMP runtime they link, and is tagged
    for the platform (manylinux on Linux), not py3-none-any."""
    import zipfile

    _, wheel, _ = installed_wheel
    variants = kernel_build.VARIANTS.get(kernel_build.machine())
    if not variants or kernel_build.find_compiler() is None:
        pytest.skip("no kernels for this CPU or no compiler: the wheel is built without them")
    names = zipfile.ZipFile(wheel).namelist()
    prebuilt = "redline/inference/kernels/cpu/prebuilt/"
    for variant in variants:
        assert prebuilt + kernel_build.library_name(variant) in names, (variant, [n for n in names if prebuilt in n])
    tag = wheel.name[: -len(".whl")].split("-", 2)[2]
    assert tag.startswith("py3-none-") and not tag.endswith("-any"), wheel.name
    # and the sources, headers included (arch/avx512.h): what a first-use build compiles where a variant is missing
    for name in (*kernel_build.SOURCES, *kernel_build.HEADERS):
        assert "redline/inference/kernels/cpu/" + name in names, name
    if sys.platform.startswith("linux"):
        assert prebuilt + "libgomp.so.1" in names
        assert tag.split("-")[2].startswith("manylinux_2_"), wheel.name


def test_installed_kernels_load_shipped_without_a_compiler(installed_wheel, tmp_path):
    """The installed wheel, on a PATH with no compiler and no ninja and an empty cache: the kernels load from the
    wheel's prebuilt/ (nothing compiled), compute, and the library loads in under 100 ms."""
    env_dir = installed_wheel[0]
    if native_variant_expected() is None:
        pytest.skip("no kernels for this CPU or no compiler: the wheel is built without them")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CXX", "CC", "REDLINE_KERNELS_VARIANT")}
    env.update(PATH=_bare_path(env_dir, tmp_path), REDLINE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", LOAD_KERNELS],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not any(out["tools"].values()), out["tools"]  # really no compiler or ninja on this PATH
    assert str(ROOT) not in out["module"]  # the installed copy
    status = out["status"]
    assert status["loaded"] and status["source"] == "shipped", status
    assert "/prebuilt/" in status["path"].replace(os.sep, "/") and status["build_seconds"] is None, status
    assert status["variant"] == native_variant_expected(), status
    assert out["err"] is not None and out["err"] < 1e-3, out
    # The library's own load (find, open, check its ABI): the first start's cost of the kernels, a budget of 100 ms
    # (0.5 ms on a quiet machine, 27 ms at a load average of 12). native() as a whole adds the registration of the
    # torch operators: printed, not asserted (30 ms quiet, 250 ms at load 12: the scheduler's, not the kernels').
    assert status["load_ms"] < 100, status
    print(
        f"kernels from the wheel: library {status['load_ms']} ms, native() with the torch operators' registration "
        f"{out['first_ms']:.1f} ms (after {out['import_ms']:.0f} ms of imports)"
    )
    assert not (tmp_path / "cache" / "kernels").exists()  # nothing built on the user's machine


def native_variant_expected():
    """The variant this CPU should load from a wheel with kernels, or None where the wheel has none."""
    from redline.inference.kernels.cpu import library as native

    if kernel_build.find_compiler() is None or native.why_not_here() is not None:
        return None
    return (native.variants_here() or [None])[0]


def test_installed_version_runs_outside_the_source_tree(installed_wheel, tmp_path):
    env_dir = installed_wheel[0]
    proc = run_installed(env_dir, "--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"redline {_project_version()}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.check_output(
        [
            str(env_dir / "bin" / "python"),
            "-c",
            "import redline.app, redline.assets, redline.ui; "
            "print(redline.app.__file__, redline.assets.__file__, redline.ui.__file__)",
        ],
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert str(ROOT) not in where  # really the installed copy, not the checkout
    # `python -m redline` is the same program as the `redline` script.
    proc = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "redline", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == f"redline {_project_version()}", proc.stderr


def test_wheel_installs_one_top_level_package(installed_wheel):
    """The wheel's RECORD: one import package, `redline`, its dist-info and the `redline` script: nothing
    named `app`, `ui` or `inference` to collide with other software or the user's own code."""
    import zipfile

    _, wheel, _ = installed_wheel
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        installed = {line.split(",")[0] for line in zf.read(record).decode().splitlines() if line}
        top_level = (
            zf.read(record.replace("RECORD", "top_level.txt")).decode().split()
            if record.replace("RECORD", "top_level.txt") in zf.namelist()
            else None
        )
        entry_points = zf.read(record.replace("RECORD", "entry_points.txt")).decode()
    assert {p.split("/")[0] for p in installed} == {"redline", record.split("/")[0]}
    if top_level is not None:
        assert top_level == ["redline"]
    assert "redline = redline.app.cli:main" in entry_points


def test_installed_gui_starts_headless(installed_wheel, tmp_path):
    """The real window from the installed wheel: icon, stylesheet and About dialog found as package data."""
    proc = run_installed(installed_wheel[0], "--smoke-test", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] and all(report["checks"].values()), report
    assert report["checks"]["torch_not_imported"]
    # The smoke test leaves the profile alone: no conversation database, no settings file.
    assert not (tmp_path / "data" / "redline").exists()
    assert not (tmp_path / "config" / "redline").exists()


@pytest.mark.starter
def test_installed_estimate_starter(installed_wheel, tmp_path, starter_dir):
    env_dir = installed_wheel[0]
    proc = run_installed(env_dir, "estimate", "starter", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(proc.stdout)
    assert record["model"] == "SmolLM2-135M-Instruct" and record["estimates"], proc.stdout


def _project_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.MULTILINE).group(1)


def test_desktop_file_validates():
    desktop = LINUX / f"{APP_ID}.desktop"
    text = desktop.read_text()
    assert f"Icon={APP_ID}" in text and "Exec=redline" in text
    tool = shutil.which("desktop-file-validate")
    if tool is None:
        pytest.skip("desktop-file-validate is not installed (CI installs desktop-file-utils)")
    proc = subprocess.run([tool, str(desktop)], capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout


def test_metainfo_screenshots_exist_in_the_repository():
    text = (LINUX / f"{APP_ID}.metainfo.xml").read_text()
    images = re.findall(r"<image>[^<]*/main/([^<]+)</image>", text)
    assert images, "the AppStream metadata names no screenshot"
    for rel in images:
        assert (ROOT / rel).is_file(), f"{rel} (named in the metainfo) is not in the repository"
    assert re.search(r'<release version="{}"'.format(re.escape(_project_version())), text), (
        "the metainfo has no release entry for the project's version"
    )


def test_metainfo_validates():
    tool = shutil.which("appstreamcli")
    if tool is None:
        pytest.skip("appstreamcli is not installed (CI installs appstream)")
    proc = subprocess.run(
        [tool, "validate", "--no-net", str(LINUX / f"{APP_ID}.metainfo.xml")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_icons_render_in_all_sizes(qapp, tmp_path):  # qapp: a QApplication, not the script's QGuiApplication
    sys.path.insert(0, str(LINUX))
    try:
        from render_icons import SIZES, render
    finally:
        sys.path.remove(str(LINUX))
    written = render(tmp_path)
    from PySide6.QtGui import QImage

    for size in SIZES:
        img = QImage(str(tmp_path / "hicolor" / f"{size}x{size}" / "apps" / f"{APP_ID}.png"))
        assert img.width() == size and img.height() == size
        assert img.pixelColor(size // 2, size // 2).alpha() > 0  # not blank
    assert len(written) == len(SIZES) + 1
