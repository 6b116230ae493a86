"""The window's server: Server → Serve the model over the OpenAI API (and the status bar's switch) puts the
chat's own engine service behind ``redline.inference.ApiServer``, so API clients and the chat share one model,
their replies decoded together. The status bar shows the address, the requests in flight and the tokens/s
the server writes; an address other than loopback needs an API key, and the window says the model is then
reachable from the network.

The server runs on a thread of its own (uvicorn's loop); starting and stopping it run off the UI thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from PySide6.QtCore import QObject, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
)
from qasync import asyncSlot

from ...inference import ApiServer, RedlineError, ServerConfig, is_loopback
from ..bridge import yield_to_the_ui

STATUS_MS = 1000
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="redline-server-control")


def off_ui_thread(fn, *args):
    """Await ``fn(*args)`` run on a plain thread (qasync's default executor runs QThreads, which must not
    outlive the app)."""

    return asyncio.get_running_loop().run_in_executor(_POOL, fn, *args)


class ServerController(QObject):
    """``service``: the chat's engine service; ``settings``: the SettingsHolder (address, port, origins);
    ``server_keys``: the API keys; ``banner`` / ``notices``: where it says what went wrong or what is exposed;
    ``status_bar``: where its switch sits; ``dialog_parent``: the settings dialog's parent."""

    def __init__(self, service, settings, server_keys, banner, notices, status_bar, dialog_parent=None, parent=None):
        super().__init__(parent)
        self.service, self._settings, self.server_keys = service, settings, server_keys
        self.banner, self.notices, self.dialog_parent = banner, notices, dialog_parent
        self.serve_action = None  # the Server menu's checkable action, once the menus exist
        self.server: Optional[ApiServer] = None
        self.busy = False  # starting or stopping
        self.last_error: Optional[str] = None
        self.timer = QTimer(self)
        self.timer.setInterval(STATUS_MS)
        self.timer.timeout.connect(self.show_status)
        self.button = QToolButton()  # the status bar's switch
        self.button.setObjectName("serverSwitch")
        self.button.setText("Server: off")
        self.button.setCheckable(True)
        self.button.setToolTip("Serve the model over an OpenAI-compatible API (Server menu)")
        self.button.clicked.connect(lambda checked: self.set_serving(checked))
        status_bar.addPermanentWidget(self.button)

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.running

    def config(self) -> ServerConfig:
        s = self._settings.value
        keys = self.server_keys
        key = keys.own_key() if keys is not None else None
        return ServerConfig(
            host=s.server_host,
            port=s.server_port,
            api_key=key or None,
            cors_origins=list(s.server_cors),
            strategy="fast",
        )

    # -- on and off ---------------------------------------------------------------------------------------
    @asyncSlot(bool)
    async def set_serving(self, on: bool) -> Optional[str]:
        """Start (True) or stop (False) the server; the address once it listens, or None."""
        if self.busy:
            self._sync_switch()
            return None
        self.busy = True
        self.last_error = None
        try:
            if on and not self.running:
                self.button.setText("Server: starting…")
                config = self.config()
                server = ApiServer(self.service, config, on_thread_start=yield_to_the_ui)
                try:
                    await off_ui_thread(server.start)
                except RedlineError as exc:
                    self.last_error = str(exc)
                    self.banner.show_message(
                        f"The server did not start: {exc}", "error", [("Server settings…", self.edit_settings)]
                    )
                    return None
                self.server = server
                self.timer.start()
                if config.exposed:
                    self.notices.add(
                        f"The model is reachable from the network at {server.address}: anyone who can reach this "
                        "machine and has the API key can use it. Server → Stop serving ends that.",
                        "warning",
                    )
                return server.address
            if not on and self.server is not None:
                server, self.server = self.server, None
                self.timer.stop()
                self.button.setText("Server: stopping…")
                await off_ui_thread(server.stop, 5.0)
            return None
        finally:
            self.busy = False
            self._sync_switch()
            self.show_status()

    def _sync_switch(self) -> None:
        self.button.setChecked(self.running)
        if self.serve_action is not None:
            self.serve_action.setChecked(self.running)

    def show_status(self) -> None:
        if not self.running:
            self.button.setText("Server: off")
            self.button.setProperty("exposed", False)
            return
        st = self.server.status()
        reach = " · reachable from the network" if st["exposed"] else ""
        self.button.setText(f"Server: {st['address']} · {st['active']} active · {st['tokens_per_s']:.1f} tok/s{reach}")
        self.button.setProperty("exposed", bool(st["exposed"]))

    def copy_address(self) -> None:

        if self.running:
            QGuiApplication.clipboard().setText(self.server.address)

    # -- settings -----------------------------------------------------------------------------------------
    def edit_settings(self) -> Optional[QDialog]:
        dialog = ServerSettingsDialog(self._settings.value, self.server_keys, self.dialog_parent)
        dialog.accepted.connect(lambda: self._apply(dialog))
        dialog.open()
        return dialog

    def _apply(self, dialog: "ServerSettingsDialog") -> None:
        host, port, key, cors = dialog.values()
        if self.server_keys is not None:
            self.server_keys.set_own_key(key or None)
        self._settings.set(
            dataclasses.replace(self._settings.value, server_host=host, server_port=port, server_cors=tuple(cors))
        )
        if self.running:  # the new address or key takes effect now
            self._restart()

    @asyncSlot()
    async def _restart(self) -> None:
        await self.set_serving(False)
        await self.set_serving(True)

    def shutdown(self) -> None:
        self.timer.stop()
        if self.server is not None:
            self.server.stop(2.0)
            self.server = None


class ServerSettingsDialog(QDialog):
    """Where the window's server listens, its API key and the browser origins it allows."""

    def __init__(self, settings, server_keys, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Server settings")
        s = settings
        keys = server_keys
        layout = QVBoxLayout(self)
        note = QLabel(
            "127.0.0.1 serves this machine only. Any other address (e.g. 0.0.0.0) makes the model reachable from "
            "the network and needs an API key, which clients send as 'Authorization: Bearer …'."
        )
        note.setWordWrap(True)
        layout.addWidget(note)
        form = QFormLayout()
        self.host_edit = QLineEdit(s.server_host)
        self.port_spin = QSpinBox(minimum=1, maximum=65535, value=s.server_port or 8642)
        self.key_edit = QLineEdit((keys.own_key() if keys is not None else None) or "")
        self.key_edit.setEchoMode(QLineEdit.Password)
        self.key_edit.setPlaceholderText("none (only allowed on 127.0.0.1)")
        self.cors_edit = QLineEdit(", ".join(s.server_cors))
        self.cors_edit.setPlaceholderText("none: browsers may not call it (e.g. http://localhost:3000)")
        form.addRow("Address", self.host_edit)
        form.addRow("Port", self.port_spin)
        form.addRow("API key", self.key_edit)
        form.addRow("Allowed origins (CORS)", self.cors_edit)
        layout.addLayout(form)
        self.error_label = QLabel("")
        self.error_label.setObjectName("formError")
        self.error_label.setWordWrap(True)
        layout.addWidget(self.error_label)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self._check)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def values(self) -> tuple[str, int, str, list[str]]:
        cors = [o.strip() for o in self.cors_edit.text().split(",") if o.strip()]
        return self.host_edit.text().strip(), self.port_spin.value(), self.key_edit.text().strip(), cors

    def _check(self) -> None:
        host, port, key, cors = self.values()
        try:
            ServerConfig(host=host, port=port, api_key=key or None, cors_origins=cors).validate()
        except RedlineError as exc:
            self.error_label.setText(str(exc))
            return
        if not is_loopback(host):
            self.error_label.setText("")
        self.accept()
