"""What the wizard's pages show verdicts with: the colours for fits / close / does not fit, and label helpers."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

OK, BAD, CLOSE = "#1b7f3b", "#c0182b", "#b26a00"
PALE = {OK: "#e3f4e8", BAD: "#fdecee", CLOSE: "#fff3dc"}  # the fits column's backgrounds


def colored(label: QLabel, text: str, color: Optional[str] = None) -> None:
    label.setText(text)
    label.setStyleSheet(f"color: {color};" if color else "")


def wrap_label(text: str = "", name: Optional[str] = None) -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    if name:
        label.setObjectName(name)
    return label
