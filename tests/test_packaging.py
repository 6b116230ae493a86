"""The shipped forms work: the wheel installed (not editable) into a fresh venv, and the desktop metadata."""
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINUX = ROOT / "packaging" / "linux"
APP_ID = "io.github.redline_app.Redline"


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """Build the wheel and install it alone into a fresh venv whose dependencies come from this one."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(ROOT)],
                   check=True, capture_output=True)
    wheel = next((tmp / "dist").glob("redline-*.whl"))
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # Dependencies (torch etc.) come from the test's own environment, but not its editable Redline.
    new_site = Path(subprocess.check_output([str(py), "-c", "import site; print(site.getsitepackages()[0])"],
                                            text=True).strip())
    (new_site / "redline_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   capture_output=True)
    return env_dir, wheel


def run_installed(env_dir, *args, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["QT_QPA_PLATFORM"] = "offscreen"
    return subprocess.run([str(env_dir / "bin" / "redline"), *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_wheel_contains_package_data(installed_wheel):
    import zipfile
    names = zipfile.ZipFile(installed_wheel[1]).namelist()
    assert "redline_assets/icons/redline.svg" in names
    for pkg in ("app", "ui", "inference"):
        assert f"{pkg}/__init__.py" in names
    # every subpackage in the source tree made it into the wheel
    for init in ROOT.glob("*/**/__init__.py"):
        rel = init.relative_to(ROOT)
        if rel.parts[0] in ("app", "ui", "inference"):
            assert str(rel) in names, rel


def test_installed_version_runs_outside_the_source_tree(installed_wheel, tmp_path):
    env_dir, _ = installed_wheel
    proc = run_installed(env_dir, "--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("redline ")
    where = subprocess.check_output([str(env_dir / "bin" / "python"), "-c",
                                     "import app, redline_assets; print(app.__file__, redline_assets.__file__)"],
                                    text=True, cwd=tmp_path)
    assert str(ROOT) not in where  # really the installed copy, not the checkout


def test_desktop_file_validates():
    desktop = LINUX / f"{APP_ID}.desktop"
    text = desktop.read_text()
    assert f"Icon={APP_ID}" in text and "Exec=redline" in text
    tool = shutil.which("desktop-file-validate")
    if tool is None:
        pytest.skip("desktop-file-validate is not installed (CI installs desktop-file-utils)")
    proc = subprocess.run([tool, str(desktop)], capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout


def test_metainfo_validates():
    tool = shutil.which("appstreamcli")
    if tool is None:
        pytest.skip("appstreamcli is not installed (CI installs appstream)")
    proc = subprocess.run([tool, "validate", "--no-net", str(LINUX / f"{APP_ID}.metainfo.xml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_icons_render_in_all_sizes(tmp_path):
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
