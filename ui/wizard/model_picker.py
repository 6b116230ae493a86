"""Choosing a model: the starter, a recent model, a folder, a .gguf file or a hub id; and the check that
follows a choice (on the engine thread, once the user stops typing). The model and draft pages use both."""

from __future__ import annotations

import os
import re
from typing import Optional

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QWidget,
)

from ..signals import emit
from .tips import with_tip

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelPicker(QWidget):
    """Starter, a recent model, a folder, a .gguf file or a hub id; ``spec()`` is what to pass as the model."""

    changed = Signal()

    def __init__(self, recent: list[str], parent=None):
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        self.group = QButtonGroup(self)
        self.radios = {}
        for row, (key, text) in enumerate(
            (
                ("starter", "Built-in &starter model (SmolLM2-135M-Instruct)"),
                ("recent", "&Recent model:"),
                ("folder", "Local &folder:"),
                ("gguf", "&GGUF file:"),
                ("hub", "&Hub id:"),
            )
        ):
            radio = with_tip(QRadioButton(text), key)
            self.group.addButton(radio, row)
            self.radios[key] = radio
            grid.addWidget(radio, row, 0)
        self.recent = with_tip(QComboBox(), "recent")
        self.recent.addItems(recent)
        if not recent:
            self.recent.setPlaceholderText("(none yet)")
            self.radios["recent"].setEnabled(False)
        grid.addWidget(self.recent, 1, 1, 1, 2)
        self.folder = with_tip(QLineEdit(), "folder")
        self.folder.setPlaceholderText("a folder with config.json")
        self.folder_button = with_tip(QPushButton("Browse…"), "browse_folder")
        grid.addWidget(self.folder, 2, 1)
        grid.addWidget(self.folder_button, 2, 2)
        self.gguf = with_tip(QLineEdit(), "gguf")
        self.gguf.setPlaceholderText("a .gguf file")
        self.gguf_button = with_tip(QPushButton("Browse…"), "browse_gguf")
        grid.addWidget(self.gguf, 3, 1)
        grid.addWidget(self.gguf_button, 3, 2)
        self.hub = with_tip(QLineEdit(), "hub")
        self.hub.setPlaceholderText("owner/name, e.g. HuggingFaceTB/SmolLM2-360M-Instruct")
        grid.addWidget(self.hub, 4, 1, 1, 2)
        grid.setColumnStretch(1, 1)
        self.radios["starter"].setChecked(True)

        self.group.idToggled.connect(lambda _id, on: on and emit(self.changed))
        self.recent.currentTextChanged.connect(lambda _t: self._edited("recent"))
        for key, edit in (("folder", self.folder), ("gguf", self.gguf), ("hub", self.hub)):
            edit.textEdited.connect(lambda _t, k=key: self._edited(k))
        self.folder_button.clicked.connect(self._browse_folder)
        self.gguf_button.clicked.connect(self._browse_gguf)

    def _edited(self, key: str) -> None:
        if self.radios[key].isChecked():
            emit(self.changed)
        elif self.radios[key].isEnabled():
            self.radios[key].setChecked(True)  # emits changed

    def _browse_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a model folder (with config.json)")
        if path:
            self.folder.setText(path)
            self._edited("folder")

    def _browse_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF file", "", "GGUF files (*.gguf)")
        if path:
            self.gguf.setText(path)
            self._edited("gguf")

    def kind(self) -> str:
        return next(k for k, r in self.radios.items() if r.isChecked())

    def spec(self) -> str:
        kind = self.kind()
        return {
            "starter": "starter",
            "recent": self.recent.currentText(),
            "folder": self.folder.text(),
            "gguf": self.gguf.text(),
            "hub": self.hub.text(),
        }[kind].strip()

    def set_spec(self, spec: Optional[str]) -> None:
        """Show ``spec`` under the choice it belongs to."""
        if not spec or spec.strip().lower() == "starter":
            self.radios["starter"].setChecked(True)
            return
        path = os.path.expanduser(spec)
        if spec.lower().endswith(".gguf"):
            self.gguf.setText(spec)
            self.radios["gguf"].setChecked(True)
        elif os.path.isdir(path) or not _HUB_ID.match(spec):
            self.folder.setText(spec)
            self.radios["folder"].setChecked(True)
        else:
            self.hub.setText(spec)
            self.radios["hub"].setChecked(True)


class CheckedPicker:
    """A picker whose choice is checked on the engine thread shortly after it changes."""

    def _setup_check(self, picker: ModelPicker, status: QLabel) -> None:
        self._picker, self._status = picker, status
        self._token = 0
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(400)  # wait for the user to stop typing
        self._timer.timeout.connect(self.check)
        picker.changed.connect(self._schedule)

    def _schedule(self) -> None:
        self._token += 1  # any answer in flight is now stale
        self._on_invalidated()
        self._timer.start()

    def _on_invalidated(self) -> None:
        pass
