"""A tab whose contents are built the first time it is shown.

The speed lab pulls in pyqtgraph and its charts; building it only when the user
opens the tab keeps the window's start-up fast.
"""

from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtWidgets import QVBoxLayout, QWidget


class LazyPanel(QWidget):
    def __init__(self, factory: Callable[[], QWidget], parent: Optional[QWidget] = None):
        super().__init__(parent)
        self._factory = factory
        self.inner: Optional[QWidget] = None
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)

    def ensure_built(self) -> QWidget:
        if self.inner is None:
            self.inner = self._factory()
            self._layout.addWidget(self.inner)
        return self.inner

    def showEvent(self, event):  # noqa: N802 - Qt override
        self.ensure_built()
        super().showEvent(event)
