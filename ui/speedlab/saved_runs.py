"""The speed lab's saved runs: each finished run is a JSON file in a folder the caller hands in; the "Past runs"
tab lists them, newest first, and reopens one — or several, compared in one table."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ...inference import BenchReport, RedlineError, list_reports, load_report, save_report


class SavedRuns(QWidget):
    """``runs_dir``: the folder (None: runs are not kept); ``show(reports)``: what opening shows them with;
    ``say(text)``: the lab's status line."""

    def __init__(
        self,
        runs_dir: Optional[Path],
        show: Callable[[list[BenchReport]], None],
        say: Callable[[str], None],
        parent=None,
    ):
        super().__init__(parent)
        self.runs_dir = Path(runs_dir) if runs_dir else None
        self._show, self._say = show, say
        self.history = QListWidget()
        self.history.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.history.itemDoubleClicked.connect(lambda _item: self.open_selected())
        open_button = QPushButton("Open")
        open_button.clicked.connect(self.open_selected)
        compare_button = QPushButton("Compare selected")
        compare_button.clicked.connect(self.open_selected)
        hl = QVBoxLayout(self)
        hl.addWidget(QLabel("Past runs (select several to compare them in one table)"))
        hl.addWidget(self.history, 1)
        hb = QHBoxLayout()
        hb.addWidget(open_button)
        hb.addWidget(compare_button)
        hb.addStretch(1)
        hl.addLayout(hb)

    def save(self, report: BenchReport) -> str:
        """Keep ``report``; the sentence that says where (or why not), "" when runs are not kept."""
        if self.runs_dir is None:
            return ""
        try:
            saved = f" Saved as {save_report(report, self.runs_dir).name}."
        except OSError as exc:
            saved = f" Could not save the run: {exc}."
        self.refresh()
        return saved

    def refresh(self) -> None:
        self.history.clear()
        if self.runs_dir is None:
            return
        for path in list_reports(self.runs_dir):
            try:
                rep = load_report(path)
            except RedlineError:
                continue  # a foreign or damaged file is skipped, not deleted
            ok = sum(r.status == "ok" for r in rep.results)
            item = QListWidgetItem(
                f"{rep.started_at.replace('T', ' ')} — {rep.model} on {rep.device}: "
                f"{ok}/{len(rep.results)} configurations" + (" (cancelled)" if rep.cancelled else "")
            )
            item.setData(Qt.UserRole, str(path))
            self.history.addItem(item)

    def open_selected(self) -> bool:
        """Show the selected runs (or the current one); True if any was shown."""
        items = self.history.selectedItems() or ([self.history.currentItem()] if self.history.currentItem() else [])
        reports = []
        for item in items:
            try:
                reports.append(load_report(Path(item.data(Qt.UserRole))))
            except RedlineError as exc:
                self._say(str(exc))
        if reports:
            self._show(reports)
        return bool(reports)
