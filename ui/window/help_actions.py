"""Help → Keyboard shortcuts and Help → About (the About dialog opens at once; its GPU rows fill in when a
worker thread has read them, its CPU-kernels row when the engine's thread has answered ``kernels_job``)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QMessageBox
from qasync import asyncSlot

from redline.inference import kernels_job
from redline.ui.about import AboutDialog, probe_hardware
from redline.ui.bridge import TaskFailed

SHORTCUTS = (
    "Enter — send\nShift+Enter — new line\nEsc — stop the reply\n"
    "Ctrl+N — new chat\nCtrl+, — settings\nCtrl+Shift+M — configure model\n"
    "Ctrl+Q — quit"
)

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

    def shortcuts(self) -> None:
        QMessageBox.information(self.dialog_parent, "Keyboard shortcuts", SHORTCUTS)

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
