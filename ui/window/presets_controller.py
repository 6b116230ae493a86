"""Presets in the window: Model → Presets (filled each time it opens), Manage presets…, and applying one
(its settings replace the window's; the model reloads only when the change needs it)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from PySide6.QtCore import QObject

from ..presets_dialog import PresetsDialog


class PresetsController(QObject):
    """``presets``: the preset store (or None); ``settings``: the SettingsHolder; ``apply_settings(new,
    force_reload)`` and ``is_loaded()``: the model controller's; ``banner``, ``status``: where it speaks;
    ``settings_panel``: its preset list follows the store; ``open_wizard``: the banner's way on."""

    def __init__(
        self,
        presets,
        settings,
        apply_settings: Callable,
        is_loaded: Callable[[], bool],
        banner,
        status,
        settings_panel,
        open_wizard: Callable,
        dialog_parent=None,
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self.presets, self._settings, self._apply, self._is_loaded = presets, settings, apply_settings, is_loaded
        self.banner, self.status, self.settings_panel, self.open_wizard = banner, status, settings_panel, open_wizard
        self.dialog_parent = dialog_parent
        self.menu = None  # Model → Presets, once the menus exist

    def apply(self, name: str) -> None:
        preset = self.presets.get(name) if self.presets is not None else None
        if preset is None:
            self.banner.show_message(
                f"The preset “{name}” is gone (its file was removed or is unreadable).",
                "warning",
                [("Configure model…", self.open_wizard)],
            )
            self.refresh()
            return
        current = self._settings.value
        new = dataclasses.replace(current, **preset.values)
        self.status.say(f"Preset “{name}”: {preset.describe()}", 5000)
        self._apply(new, force_reload=not self._is_loaded() or current.needs_reload(new))

    def fill_menu(self) -> None:
        menu = self.menu
        if menu is None:
            return
        menu.clear()
        presets = self.presets.presets() if self.presets is not None else []
        for p in presets:
            action = menu.addAction(p.name)
            action.setToolTip(p.describe())
            action.setStatusTip(p.describe())
            action.triggered.connect(lambda _c=False, n=p.name: self.apply(n))
        if not presets:
            empty = menu.addAction("(no presets yet: save one at the end of Configure model…)")
            empty.setEnabled(False)
        menu.addSeparator()
        manage = menu.addAction("&Manage presets…")
        manage.setEnabled(self.presets is not None)
        manage.triggered.connect(lambda _c=False: self.manage())

    def manage(self):

        dialog = PresetsDialog(self.presets, self.dialog_parent)
        dialog.changed.connect(self.refresh)
        dialog.load_requested.connect(self.apply)
        dialog.open()
        return dialog

    def refresh(self) -> None:
        """The settings panel's preset list follows the presets on disk."""
        if self.presets is not None:
            self.settings_panel.set_presets(self.presets.presets())
