"""The layer contracts are checked by `make test`; this proves they actually catch a violation."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lint(root: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(exe), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, env={"PYTHONPATH": str(root), "PATH": ""})


def test_contract_breaks_when_engine_imports_qt(tmp_path):
    for name in ("app", "ui", "inference"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert lint(tmp_path).returncode == 0
    (tmp_path / "inference" / "sneaky.py").write_text("import PySide6\n")
    broken = lint(tmp_path)
    assert broken.returncode != 0
    assert "inference.sneaky -> PySide6" in broken.stdout
