"""The model browser's dialog: "Find a model" and "On this machine" as two tabs. ``chosen`` carries what to load
(model, precision, strategy: the configuration predicted for a fetched variant; "auto" for a library entry).
Opened by the wizard's model page and by Model → Find a model… (``open_model_browser``)."""

from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTabWidget, QVBoxLayout

from ..signals import emit
from .find_page import FindModelPage
from .library_page import LibraryPage


class ModelsDialog(QDialog):
    chosen = Signal(str, str, str)  # model, precision, strategy

    def __init__(
        self,
        parent=None,
        priority: str = "balanced",
        recent: Optional[list[str]] = None,
        machine: Optional[Callable] = None,
        confirm: Optional[Callable[[str], bool]] = None,
        loaded: tuple[str, ...] = (),
    ):
        super().__init__(parent)
        self.setWindowTitle("Find a model")
        self.resize(980, 680)
        v = QVBoxLayout(self)
        self.tabs = QTabWidget()
        self.find = FindModelPage(priority, machine)
        self.library = LibraryPage(recent or [], confirm, loaded=loaded)
        self.tabs.addTab(self.find, "Find a model")
        self.tabs.addTab(self.library, "On this machine")
        v.addWidget(self.tabs)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        v.addWidget(buttons)
        self.find.fetched.connect(self._fetched)
        self.library.chosen.connect(lambda model: self._choose(model, "auto", "auto"))
        self.tabs.currentChanged.connect(lambda i: i == 1 and self.library.refresh(""))

    def _fetched(self, got) -> None:
        self._choose(got.model, got.precision, got.strategy or "auto")

    def _choose(self, model: str, precision: str, strategy: str) -> None:
        emit(self.chosen, model, precision, strategy)
        self.accept()

    def done(self, result: int) -> None:  # noqa: D401 - Qt's name
        self.find.shutdown()
        self.library.shutdown()
        super().done(result)


def open_model_browser(window) -> ModelsDialog:
    """Model → Find a model…: the dialog, window-modal; a fetched variant (or a library entry) loads in the
    configuration that was predicted for it."""
    settings = window.models.settings
    recent = window.presets.recent_models() if getattr(window, "presets", None) else []
    report = window.models.loaded  # the model loaded here (not one on a server) reads "loaded now" in the library
    loaded = (settings.model, report.name) if report is not None and report.measured_here else ()
    dialog = ModelsDialog(window, getattr(settings, "priority", "balanced"), recent, loaded=loaded)

    def load(model: str, precision: str, strategy: str) -> None:
        window.models.configure({"model": model, "precision": precision, "strategy": strategy})

    dialog.chosen.connect(load)
    dialog.open()
    return dialog
