"""Presets in the window: Model → Presets (filled each time it opens), Manage presets…, and applying one
(its settings replace the window's; the model reloads only when the change needs it)."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import QObject


class PresetsController(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.window = window

    def apply(self, name: str) -> None:
        w = self.window
        preset = w.presets.get(name) if w.presets is not None else None
        if preset is None:
            w.banner.show_message(
                f"The preset “{name}” is gone (its file was removed or is unreadable).",
                "warning",
                [("Configure model…", w.open_wizard)],
            )
            self.refresh()
            return
        new = dataclasses.replace(w.settings, **preset.values)
        w.statusBar().showMessage(f"Preset “{name}”: {preset.describe()}", 5000)
        w.apply_settings(new, force_reload=w.loaded is None or w.settings.needs_reload(new))

    def fill_menu(self) -> None:
        w = self.window
        menu = w.presets_menu
        menu.clear()
        presets = w.presets.presets() if w.presets is not None else []
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
        manage.setEnabled(w.presets is not None)
        manage.triggered.connect(lambda _c=False: self.manage())

    def manage(self):
        from redline.ui.presets_dialog import PresetsDialog

        dialog = PresetsDialog(self.window.presets, self.window)
        dialog.changed.connect(self.refresh)
        dialog.load_requested.connect(self.apply)
        dialog.open()
        return dialog

    def refresh(self) -> None:
        """The settings panel's preset list follows the presets on disk."""
        w = self.window
        if w.presets is not None:
            w.settings_panel.set_presets(w.presets.presets())
