"""Model → Connect to a server…: a model behind an OpenAI-compatible server (vLLM, llama.cpp's server,
SGLang, TGI, Ollama, another Redline) becomes the chat's model. The dialog lists the server's models
(off the UI thread); the API key, if any, is saved in a private file, never in the settings."""

from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
)
from qasync import asyncSlot

from ...inference import DEFAULT_PORT, RedlineError, is_server_url, list_server_models, parse_server_spec
from .server_controller import off_ui_thread

DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}/v1"  # another Redline's server (`redline serve`) on this machine


class ConnectDialog(QDialog):
    """``current``: the server the chat is connected to now (its spec), or None; ``connect_to(base, model_id, key)``
    connects the chat (``ModelController.connect_to``)."""

    def __init__(self, current: Optional[str], server_keys, connect_to: Callable, parent=None):
        super().__init__(parent)
        self._connect_to = connect_to
        self.setWindowTitle("Connect to a server")
        self.resize(520, 420)
        layout = QVBoxLayout(self)
        intro = QLabel(
            "Chat with a model served by vLLM, llama.cpp's server, SGLang, TGI, Ollama or another Redline: give the "
            "server's OpenAI-compatible address (it usually ends in /v1). Replies, gauges, the speed lab and export "
            "work as with a local model; the memory is the server's."
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        base = parse_server_spec(current)[0] if current and is_server_url(current) else DEFAULT_URL
        form = QFormLayout()
        row = QHBoxLayout()
        self.url_edit = QLineEdit(base)
        self.list_button = QPushButton("List models")
        self.list_button.clicked.connect(self.list_models)
        row.addWidget(self.url_edit, 1)
        row.addWidget(self.list_button)
        form.addRow("Server address", row)
        keys = server_keys
        self.key_edit = QLineEdit((keys.get(base) if keys is not None and base else None) or "")
        self.key_edit.setEchoMode(QLineEdit.Password)
        self.key_edit.setPlaceholderText("none")
        form.addRow("API key", self.key_edit)
        layout.addLayout(form)
        self.models_list = QListWidget()
        self.models_list.itemDoubleClicked.connect(lambda _item: self.connect())
        self.models_list.currentItemChanged.connect(lambda *_: self._update())
        layout.addWidget(self.models_list, 1)
        self.status_label = QLabel("")
        self.status_label.setWordWrap(True)
        layout.addWidget(self.status_label)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Cancel)
        self.connect_button = self.buttons.addButton("Connect", QDialogButtonBox.AcceptRole)
        self.connect_button.setEnabled(False)
        self.buttons.accepted.connect(self.connect)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.models: list[dict] = []

    def _update(self) -> None:
        self.connect_button.setEnabled(self.models_list.currentItem() is not None)

    @asyncSlot()
    async def list_models(self) -> Optional[list]:
        url, key = self.url_edit.text().strip(), self.key_edit.text().strip() or None
        self.models_list.clear()
        self._update()
        try:
            base, _ = parse_server_spec(url)
        except RedlineError as exc:
            self.status_label.setText(str(exc))
            return None
        self.status_label.setText(f"Asking {base} for its models…")
        self.list_button.setEnabled(False)
        try:
            self.models = await off_ui_thread(list_server_models, base, key)
        except RedlineError as exc:
            self.status_label.setText(str(exc))
            return None
        finally:
            self.list_button.setEnabled(True)
        for info in self.models:
            context = info.get("max_model_len") or info.get("context_length")
            text = info["id"] + (f"  ({context:,} tokens of context)" if isinstance(context, int) else "")
            item = QListWidgetItem(text)
            item.model_id = info["id"]
            self.models_list.addItem(item)
        if self.models:
            self.models_list.setCurrentRow(0)
            self.status_label.setText(f"{len(self.models)} model(s) on {base}. Pick one and connect.")
        else:
            self.status_label.setText(f"The server at {base} lists no models.")
        return self.models

    def connect(self) -> None:
        item = self.models_list.currentItem()
        if item is None:
            return
        base, _ = parse_server_spec(self.url_edit.text().strip())
        self.accept()
        self._connect_to(base, item.model_id, self.key_edit.text().strip() or None)
