"""The speed lab's outputs side by side: one column per configuration in a splitter the user can resize, each
with its live tokens/s while it streams and, once its row is done, what it measured beside what the speed
model predicted."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QScrollArea, QSplitter, QVBoxLayout, QWidget

MIN_COLUMN_WIDTH = 200


class OutputColumn(QWidget):
    def __init__(self, title: str, parent=None):
        super().__init__(parent)
        self.setObjectName("labColumn")
        self.setMinimumWidth(MIN_COLUMN_WIDTH)
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 2, 4, 2)
        v.setSpacing(2)
        self.title = QLabel(title)
        self.title.setObjectName("panelTitle")
        self.title.setWordWrap(True)
        self.title.setToolTip(title)
        self.speed = QLabel("waiting")
        self.speed.setObjectName("labColumnSpeed")
        self.speed.setToolTip("Live decode tokens/s (rolling over 1 s) while this configuration runs")
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        v.addWidget(self.title)
        v.addWidget(self.speed)
        v.addWidget(self.text, 1)
        self.live_tokens_per_s: Optional[float] = None
        self.phase = ""

    def append(self, text: str) -> None:
        self.text.moveCursor(QTextCursor.MoveOperation.End)
        self.text.insertPlainText(text)

    def running(self, phase: str) -> None:
        """The row runs (a server's reply streams no live speed of ours): say what it is doing, not "waiting"."""
        if self.live_tokens_per_s is None:
            self.speed.setText(f"running · {phase}" if phase else "running")

    def live(self, tokens_per_s: float, phase: str = "") -> None:
        self.live_tokens_per_s = tokens_per_s
        self.speed.setText(f"{tokens_per_s:.1f} tok/s live" + (f" · {phase}" if phase else ""))

    def finish(self, result) -> None:
        if result.status != "ok" or result.tokens_per_s is None:
            self.speed.setText(result.status)
            self.text.appendPlainText(f"\n[{result.status}] {result.error or ''}".rstrip())
            return
        text = f"{result.tokens_per_s:.1f} tok/s measured"
        if result.predicted_tokens_per_s is not None:
            text += f" · predicted {result.predicted_tokens_per_s:.1f}"
        self.speed.setText(text)


class OutputColumns(QScrollArea):
    """A horizontal splitter of columns inside a scroll area: wide enough to read, narrower ones scroll."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.splitter = QSplitter(Qt.Horizontal)
        self.splitter.setObjectName("labOutputs")
        self.splitter.setChildrenCollapsible(False)
        self.setWidget(self.splitter)
        self.columns: list[OutputColumn] = []

    def reset(self, titles: list[str]) -> None:
        for c in self.columns:
            c.setParent(None)
            c.deleteLater()
        self.columns = []
        for t in titles:
            col = OutputColumn(t)
            self.splitter.addWidget(col)
            self.columns.append(col)
        self.splitter.setSizes([max(MIN_COLUMN_WIDTH, self.viewport().width() // max(1, len(titles)))] * len(titles))

    def column(self, index: int) -> Optional[OutputColumn]:
        return self.columns[index] if 0 <= index < len(self.columns) else None

    def texts(self) -> list[str]:
        return [c.text.toPlainText() for c in self.columns]
