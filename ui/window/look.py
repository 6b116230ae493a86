"""What of the window's look follows its state: the theme (the setting; with "system", the desktop's colour scheme
as it changes), the gauges panel (collapsed until a model is loaded, then open, unless the user chose otherwise),
and the empty chat's example prompts (shown while a model is loaded)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from PySide6.QtCore import QObject
from PySide6.QtGui import QGuiApplication

from ..style import Theme, apply_theme


class Look(QObject):
    """``window``: the main window, its layout built and its model controller made."""

    def __init__(self, window, parent: Optional[QObject] = None):
        super().__init__(parent)
        self.window = window
        self.theme: Theme = apply_theme(window, self.choice)
        self._applied_choice = self.choice
        self.gauges_chosen: Optional[bool] = None  # shown or hidden by the user; None: follow the model
        window.settings_holder.changed.connect(self._settings_changed)
        window.settings_panel.theme_chosen.connect(self.set_theme)
        app = QGuiApplication.instance()
        if app is not None:
            app.styleHints().colorSchemeChanged.connect(self._scheme_changed)
        window.models.state_changed.connect(self.follow_model)
        self.follow_model()

    @property
    def choice(self) -> str:
        return getattr(self.window.settings, "theme", "system")

    # -- the theme -------------------------------------------------------------------------------------
    def set_theme(self, choice: str) -> None:
        """View → Theme or Settings → Theme: saved, and applied at once (no reload, nothing else changes)."""
        settings = self.window.settings
        if getattr(settings, "theme", None) != choice:
            self.window.settings_holder.set(dataclasses.replace(settings, theme=choice))  # applied when announced

    def apply(self) -> None:
        self._applied_choice = self.choice
        self.theme = apply_theme(self.window, self.choice)
        for action in getattr(self.window, "theme_actions", {}).values():
            action.setChecked(action.data() == self.choice)

    def _settings_changed(self, _settings) -> None:
        if self.choice != self._applied_choice:
            self.apply()

    def _scheme_changed(self, _scheme) -> None:
        if self.choice == "system":  # the desktop went light or dark: follow it
            self.apply()

    # -- the gauges and the empty chat -------------------------------------------------------------------
    def set_gauges(self, shown: bool, by_user: bool = True) -> None:
        if by_user:
            self.gauges_chosen = shown
        self.window.gauges.setVisible(shown)
        action = getattr(self.window, "gauges_action", None)
        if action is not None and action.isChecked() != shown:
            action.setChecked(shown)

    def follow_model(self) -> None:
        """A model loaded (or gone): the gauges open (unless the user closed them), the example prompts show."""
        loaded = self.window.models.loaded is not None
        self.set_gauges(loaded if self.gauges_chosen is None else self.gauges_chosen, by_user=False)
        self.window.chat_view.show_examples(loaded)
