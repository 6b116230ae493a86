"""The layer contracts are checked by `make test`; this proves they actually catch a violation."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def copy_tree(tmp_path: Path) -> Path:
    """A copy of the checkout's packages in a folder named ``redline`` (the checkout root is the package)."""
    pkg = tmp_path / "redline"
    for name in ("app", "ui", "inference", "assets"):
        shutil.copytree(ROOT / name, pkg / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("__init__.py", "__main__.py", "pyproject.toml"):
        shutil.copy(ROOT / name, pkg / name)
    return pkg


def lint(pkg: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(exe), "--config", str(pkg / "pyproject.toml"), "--no-cache"],
        cwd=pkg.parent,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(pkg.parent), "PATH": ""},
    )


def test_contract_breaks_when_engine_imports_qt(tmp_path):
    pkg = copy_tree(tmp_path)
    assert lint(pkg).returncode == 0, lint(pkg).stdout
    (pkg / "inference" / "sneaky.py").write_text("import PySide6\n")
    broken = lint(pkg)
    assert broken.returncode != 0
    assert "redline.inference.sneaky -> PySide6" in broken.stdout


def test_contract_breaks_when_ui_reaches_past_the_public_surface(tmp_path):
    pkg = copy_tree(tmp_path)
    (pkg / "ui" / "sneaky.py").write_text("from redline.inference.decoding.fastpath import FastDecoder\n")
    broken = lint(pkg)
    assert broken.returncode != 0
    assert "redline.ui.sneaky -> redline.inference.decoding.fastpath" in broken.stdout


def test_contract_breaks_when_the_engine_reaches_up_into_the_service(tmp_path):
    """The batcher, requests and their preparation are the engine's: nothing in it may import the service."""
    pkg = copy_tree(tmp_path)
    (pkg / "inference" / "generation" / "sneaky.py").write_text("from redline.inference.service import scheduler\n")
    broken = lint(pkg)
    assert broken.returncode != 0
    assert "redline.inference.generation.sneaky -> redline.inference.service" in broken.stdout


def test_the_public_surface_imports_neither_torch_nor_transformers():
    """The window imports the engine's surface on the UI thread; torch must load on the engine's thread."""
    code = (
        "import sys, redline.inference, redline.ui.window.main_window, redline.app.gui; "
        "print(sorted(m for m in ('torch', 'transformers', 'bitsandbytes') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_ui_and_app_cite_no_document_outside_the_repository():
    """User-facing text and comments say what a thing is, not where some document outside the repository
    described it ("the seed document", "seed §5.1", "the design notes")."""
    import re

    cited = re.compile(r"seed (document|doc\b|§)|§\s*\d|design notes", re.IGNORECASE)
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in ("ui", "app")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if cited.search(line)
    ]
    assert hits == []
