"""The speed lab's export: the run shown as CSV, JSON or Markdown (``inference.bench.export`` writes the text), or
the charts as a PNG; the row of buttons under the lab, each asking where to save."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QMessageBox, QPushButton, QWidget

from ...inference import BenchReport, RedlineError, to_csv, to_json, to_markdown

FORMATS = (("CSV", "csv"), ("JSON", "json"), ("Markdown", "markdown"), ("PNG", "png"))
_EXTENSIONS = {"csv": "csv", "json": "json", "markdown": "md", "png": "png"}


def export(fmt: str, path: Path, report: Optional[BenchReport], charts: QWidget) -> Path:
    """Write ``report`` as csv, json or markdown, or ``charts`` as png, to ``path``."""
    path = Path(path)
    if fmt == "png":
        if not charts.grab().save(str(path)):
            raise OSError(f"Could not write {path}.")
        return path
    if report is None:
        raise RedlineError("There is no finished run to export.", "Run the lab or open a past run first.")
    text = {"csv": to_csv, "json": to_json, "markdown": to_markdown}[fmt](report)
    path.write_text(text, encoding="utf-8")
    return path


def export_row(write: Callable[[str, Path], Path], say: Callable[[str], None], parent: QWidget) -> QHBoxLayout:
    """The "Export:" row: a button per format, each asking for a file, then ``write(fmt, path)``; ``say``: status."""

    def ask(fmt: str) -> None:
        ext = _EXTENSIONS[fmt]
        path, _ = QFileDialog.getSaveFileName(parent, f"Export {fmt}", f"speedlab.{ext}", f"*.{ext}")
        if not path:
            return
        try:
            write(fmt, Path(path))
            say(f"Exported {path}.")
        except (RedlineError, OSError) as exc:
            QMessageBox.warning(parent, "Export", str(exc))

    row = QHBoxLayout()
    row.addWidget(QLabel("Export:"))
    for label, fmt in FORMATS:
        b = QPushButton(label)
        b.clicked.connect(lambda _=False, f=fmt: ask(f))
        row.addWidget(b)
    row.addStretch(1)
    return row
