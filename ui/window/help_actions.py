"""Help → Keyboard shortcuts and Help → About (the About dialog opens at once; its GPU rows fill in when a
worker thread has read them, its CPU-kernels row when the engine's thread has answered ``kernels_job``).

The shortcuts are read from the window's actions (every key the window answers is one, ``menus.py``) and the
message box's own keys (``MessageInput.KEYS``), so the list cannot drift from what the keys do."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from PySide6.QtCore import QObject
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QHeaderView, QTableWidget, QTableWidgetItem, QVBoxLayout
from qasync import asyncSlot

from ...inference import kernels_job
from ..about import AboutDialog, probe_hardware
from ..bridge import TaskFailed
from ..widgets import MessageInput


def shortcut_rows(window) -> list[tuple[str, str, str]]:
    """(keys, what they do, where) for every action of the window that has a key, menu by menu, then the message
    box's own keys."""
    rows: list[tuple[str, str, str]] = []
    seen = set()

    def walk(menu, where: str) -> None:
        for action in menu.actions():
            if action.menu() is not None:
                walk(action.menu(), f"{where} → {action.menu().title().replace('&', '')}")
            elif action.shortcuts() and id(action) not in seen:
                seen.add(id(action))
                keys = ", ".join(k.toString(QKeySequence.NativeText) for k in action.shortcuts())
                rows.append((keys, action.text().replace("&", "").rstrip("…"), where))

    for top in window.menuBar().actions():
        if top.menu() is not None:
            walk(top.menu(), top.menu().title().replace("&", ""))
    for action in window.actions():  # any key not in a menu
        if action.shortcuts() and id(action) not in seen:
            seen.add(id(action))
            keys = ", ".join(k.toString(QKeySequence.NativeText) for k in action.shortcuts())
            rows.append((keys, action.text().replace("&", ""), "window"))
    rows += [(key, does, "message box") for key, does in MessageInput.KEYS]
    return rows


class ShortcutsDialog(QDialog):
    def __init__(self, rows: list[tuple[str, str, str]], parent=None):
        super().__init__(parent)
        self.setObjectName("shortcutsDialog")
        self.setWindowTitle("Keyboard shortcuts")
        layout = QVBoxLayout(self)
        self.table = QTableWidget(len(rows), 3)
        self.table.setHorizontalHeaderLabels(("Key", "Does", "Where"))
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSelectionMode(QTableWidget.NoSelection)
        self.table.setShowGrid(False)
        for i, row in enumerate(rows):
            for j, text in enumerate(row):
                self.table.setItem(i, j, QTableWidgetItem(text))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeToContents)
        layout.addWidget(self.table)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.resize(640, min(720, 80 + 30 * len(rows)))


_ABOUT_EXECUTOR: Optional[ThreadPoolExecutor] = None


def _about_executor() -> ThreadPoolExecutor:
    global _ABOUT_EXECUTOR
    if _ABOUT_EXECUTOR is None:
        _ABOUT_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="redline-about")
    return _ABOUT_EXECUTOR


class HelpActions(QObject):
    """``parent``: the dialogs' parent widget; ``about_info``: what the app knows about itself; ``bridge``: for the
    kernels question; ``kernels()``: the KernelsReport the model controller already has, or None."""

    def __init__(self, parent, about_info, bridge, kernels=lambda: None):
        super().__init__(parent)
        self.dialog_parent, self.about_info, self.bridge, self._kernels = parent, about_info, bridge, kernels
        self.about_dialog: Optional[AboutDialog] = None
        self.shortcuts_dialog: Optional[ShortcutsDialog] = None

    def shortcuts(self) -> ShortcutsDialog:
        """Help → Keyboard shortcuts: the list, made from the window's actions when it opens."""
        if self.shortcuts_dialog is not None:
            self.shortcuts_dialog.close()
            self.shortcuts_dialog.deleteLater()
        self.shortcuts_dialog = ShortcutsDialog(shortcut_rows(self.dialog_parent), self.dialog_parent)
        self.shortcuts_dialog.show()
        return self.shortcuts_dialog

    @asyncSlot()
    async def show_about(self) -> None:
        """Opens the About dialog at once; the GPU rows fill in when a worker thread has read them."""
        if self.about_dialog is not None:
            self.about_dialog.raise_()
            self.about_dialog.activateWindow()
            return
        dialog = self.about_dialog = AboutDialog(self.about_info, self.dialog_parent)
        dialog.finished.connect(self._about_closed)
        dialog.show()
        self._fill_kernels(dialog)
        # probe_hardware imports torch (seconds on a cold start): on a plain worker thread, not this one.
        # (A Python thread pool rather than qasync's default QThread executor, which outlives the window.)
        try:
            hw = await asyncio.wrap_future(_about_executor().submit(probe_hardware))
        except Exception as exc:  # shown in the dialog as "unknown (why)", never guessed
            hw = exc
        if self.about_dialog is dialog:
            dialog.set_hardware(hw)

    @asyncSlot()
    async def _fill_kernels(self, dialog: AboutDialog) -> None:
        """Whether Redline's CPU kernels run here: asked on the engine's thread (it needs torch)."""
        report = self._kernels()
        if report is None:
            try:
                report = await self.bridge.run(kernels_job())
            except TaskFailed as exc:
                report = exc
        if self.about_dialog is dialog:
            dialog.set_kernels(report)

    def _about_closed(self, _result: int) -> None:
        if self.about_dialog is not None:
            self.about_dialog.deleteLater()
            self.about_dialog = None
