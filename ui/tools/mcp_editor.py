"""Settings → Tools → Edit mcp.json…: the file as plain text. Save checks it as Redline reads it (the same checks as
``read_mcp_config``) and, if it cannot be used, says why in one sentence under the text and writes nothing; a good
file is written whole (a new file renamed over the old one), readable by this user alone (0600)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout

from ...inference import McpConfigError, parse_mcp_config
from ..signals import emit

TEMPLATE = """{
  "mcpServers": {
    "example": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"], "disabled": true}
  }
}
"""


def write_private_text(path: Path, text: str) -> None:
    """``text`` written to ``path`` atomically, 0600, its folder made 0700 if it is new."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".mcp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temp, 0o600)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


class McpEditor(QDialog):
    saved = Signal()  # a good file was written

    def __init__(self, path: Path, parent=None):
        super().__init__(parent)
        self.setObjectName("mcpEditor")
        self.setWindowTitle("Edit mcp.json")
        self.path = Path(path)
        layout = QVBoxLayout(self)
        where = QLabel(f"{self.path}  —  the format of Claude Desktop and LM Studio (docs/chat.md)")
        where.setObjectName("toolsNote")
        where.setWordWrap(True)
        layout.addWidget(where)
        self.editor = QPlainTextEdit()
        self.editor.setObjectName("mcpText")
        self.editor.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.editor.setLineWrapMode(QPlainTextEdit.NoWrap)
        unreadable = ""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = TEMPLATE
        except (OSError, UnicodeDecodeError) as exc:
            text, unreadable = "", f"{self.path} could not be read ({exc}); Save replaces it."
        self.editor.setPlainText(text)
        layout.addWidget(self.editor, 1)
        self.error = QLabel()
        self.error.setObjectName("toolError")
        self.error.setWordWrap(True)
        self.error.hide()
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.save)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.buttons = buttons
        self.resize(640, 420)
        self._say(unreadable)

    def _say(self, text: str) -> None:
        self.error.setText(text)
        self.error.setVisible(bool(text))

    def save(self) -> bool:
        """Write the file if Redline can use it; else say why (the file is left as it was)."""
        text = self.editor.toPlainText()
        try:
            parse_mcp_config(text, str(self.path))
        except McpConfigError as exc:
            self._say(str(exc))
            return False
        try:
            write_private_text(self.path, text if text.endswith("\n") else text + "\n")
        except OSError as exc:
            self._say(f"{self.path} could not be written ({exc.strerror or exc}).")
            return False
        self._say("")
        emit(self.saved)
        self.accept()
        return True
