"""No file of the package's code is over 650 lines (issue 45): a file that long holds several concepts, and is split
into parts with names that say what they hold (as ui/window/ and ui/speedlab/ are)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("app", "ui", "inference")
MAX_LINES = 650


def line_count(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for _ in fh)


def too_long(root: Path) -> dict[str, int]:
    """Each .py file under the folders with more than MAX_LINES lines, by its path from ``root``."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            n = line_count(path)
            if n > MAX_LINES:
                found[path.relative_to(root).as_posix()] = n
    return found


def test_no_file_in_app_ui_or_inference_is_over_650_lines():
    found = too_long(ROOT)
    assert not found, "Split these into parts with names that say what they hold: " + ", ".join(
        f"{p} ({n} lines)" for p, n in found.items()
    )


def test_the_check_finds_a_long_file(tmp_path):
    """The check can fail: a 651-line file in a copy of the layout is found, a 650-line one is not."""
    for folder in FOLDERS:
        (tmp_path / folder / "part").mkdir(parents=True)
    (tmp_path / "ui" / "part" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "inference" / "part" / "fits.py").write_text("x = 1\n" * MAX_LINES)
    assert too_long(tmp_path) == {"ui/part/long.py": MAX_LINES + 1}
