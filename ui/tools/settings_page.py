"""Settings → Tools: the MCP servers of mcp.json, each with its status (not started, its tools, or the sentence that
says why it could not start) and its trust (ask each time, always allow, never allow: kept in the approvals file),
Edit mcp.json… and Start servers; Redline's own tools (calculate on or off, the files and folders read_file may
read); the most replies with tool calls one answer may take; the approvals' file and Forget. Each change applies at
once (the settings are saved as the rest of them are; no Apply)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from .mcp_editor import McpEditor
from .service import FAILED, ToolsService

TRUST = (("Ask each time", "ask"), ("Always allow", "always"), ("Never allow", "never"))


class ServerRow(QFrame):
    """One server: its name, how it is started or reached, its status, its trust."""

    def __init__(self, service: ToolsService, spec, parent=None):
        super().__init__(parent)
        self.setObjectName("toolServer")
        self.setFrameShape(QFrame.StyledPanel)
        self.service, self.name = service, spec.name
        grid = QGridLayout(self)
        grid.setContentsMargins(8, 6, 8, 6)
        grid.setHorizontalSpacing(8)
        grid.setVerticalSpacing(2)
        name = QLabel(spec.name)
        name.setObjectName("toolServerName")
        grid.addWidget(name, 0, 0)
        self.trust = QComboBox()
        for label, value in TRUST:
            self.trust.addItem(label, value)
        self.trust.setAccessibleName(f"Trust {spec.name}")
        self.trust.setToolTip(
            "Whether this server's tool calls run without asking (a tool's own Always allow wins); saved in the "
            "approvals file"
        )
        self.trust.activated.connect(lambda _i: service.set_trust(self.name, self.trust.currentData()))
        grid.addWidget(self.trust, 0, 1, Qt.AlignRight)
        command = QLabel(spec.describe())
        command.setObjectName("toolsNote")
        command.setWordWrap(True)
        command.setTextInteractionFlags(Qt.TextSelectableByMouse)
        grid.addWidget(command, 1, 0, 1, 2)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        grid.addWidget(self.status, 2, 0, 1, 2)
        grid.setColumnStretch(0, 1)
        self.refresh()

    def refresh(self) -> None:
        state, text = self.service.status(self.name)
        self.status.setText(text)
        self.status.setObjectName("toolError" if state == FAILED else "toolServerStatus")
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)
        self.trust.setCurrentIndex(max(0, self.trust.findData(self.service.policy.server_trust(self.name))))


class ToolsSettings(QWidget):
    """``service``: the window's ToolsService; ``settings``: the SettingsHolder (``value``, ``set``, ``changed``)."""

    def __init__(self, service: ToolsService, settings, parent=None):
        super().__init__(parent)
        self.setObjectName("toolsSettings")
        self.service, self.settings = service, settings
        self.rows: dict[str, ServerRow] = {}
        self.editor: Optional[McpEditor] = None
        outer = QVBoxLayout(self)
        outer.addWidget(self._title("MCP servers"))
        self.path_label = QLabel()
        self.path_label.setObjectName("toolsNote")
        self.path_label.setWordWrap(True)
        self.path_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        outer.addWidget(self.path_label)
        self.config_error = QLabel()
        self.config_error.setObjectName("toolError")
        self.config_error.setWordWrap(True)
        outer.addWidget(self.config_error)
        self.servers = QVBoxLayout()
        self.servers.setSpacing(6)
        outer.addLayout(self.servers)
        self.empty = QLabel("No servers are listed. Edit mcp.json… to add one (its command, or its address).")
        self.empty.setObjectName("toolsNote")
        self.empty.setWordWrap(True)
        outer.addWidget(self.empty)
        buttons = QHBoxLayout()
        self.edit_button = QPushButton("Edit mcp.json…")
        self.edit_button.setToolTip("The servers as JSON; checked before it is saved")
        self.edit_button.clicked.connect(self.edit)
        self.start_button = QPushButton("Start servers")
        self.start_button.setToolTip(
            "Start every server now and list its tools (they start by themselves when a chat "
            "with tools first needs them)"
        )
        self.start_button.clicked.connect(lambda: service.list_in_background(retry=True))
        buttons.addWidget(self.edit_button)
        buttons.addWidget(self.start_button)
        buttons.addStretch(1)
        outer.addLayout(buttons)

        outer.addWidget(self._title("Redline's own tools"))
        form = QFormLayout()
        self.calculator = QCheckBox("calculate: arithmetic, exactly")
        self.calculator.setToolTip("Numbers, + - * / // % **, parentheses, pi, e, sqrt, sin, log, factorial…")
        self.calculator.toggled.connect(lambda on: self._set(tools_calculator=on))
        form.addRow(self.calculator)
        self.read_paths = QListWidget()
        self.read_paths.setObjectName("toolReadPaths")
        self.read_paths.setMaximumHeight(90)
        self.read_paths.setToolTip("read_file reads these files, and the files in these folders; nothing else")
        form.addRow("read_file may read", self.read_paths)
        paths = QHBoxLayout()
        self.add_file = QPushButton("Add file…")
        self.add_file.clicked.connect(lambda: self._add_path(folder=False))
        self.add_folder = QPushButton("Add folder…")
        self.add_folder.clicked.connect(lambda: self._add_path(folder=True))
        self.remove_path = QPushButton("Remove")
        self.remove_path.clicked.connect(self._remove_path)
        for b in (self.add_file, self.add_folder, self.remove_path):
            paths.addWidget(b)
        paths.addStretch(1)
        form.addRow("", paths)
        self.max_rounds = QSpinBox()
        self.max_rounds.setRange(1, 100)
        self.max_rounds.setToolTip(
            "How many replies in a row may call tools before the loop stops (the last reply's calls then do not run)"
        )
        self.max_rounds.valueChanged.connect(lambda n: self._set(tools_max_rounds=n))
        form.addRow("Most tool calls per reply", self.max_rounds)
        outer.addLayout(form)

        outer.addWidget(self._title("Approvals"))
        self.approvals_label = QLabel()
        self.approvals_label.setObjectName("toolsNote")
        self.approvals_label.setWordWrap(True)
        self.approvals_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        outer.addWidget(self.approvals_label)
        self.policy_error = QLabel(service.policy_error or "")
        self.policy_error.setObjectName("toolError")
        self.policy_error.setWordWrap(True)
        self.policy_error.setVisible(bool(service.policy_error))
        outer.addWidget(self.policy_error)
        self.forget_button = QPushButton("Forget “Always allow”")
        self.forget_button.setToolTip("Every tool you allowed always (or never) is asked about again")
        self.forget_button.clicked.connect(self._forget)
        row = QHBoxLayout()
        row.addWidget(self.forget_button)
        row.addStretch(1)
        outer.addLayout(row)
        outer.addStretch(1)

        service.changed.connect(self.refresh)
        settings.changed.connect(lambda _s: self._fill())
        self._fill()
        self.refresh()

    @staticmethod
    def _title(text: str) -> QLabel:
        label = QLabel(text)
        label.setObjectName("toolsTitle")
        return label

    # -- what is shown ---------------------------------------------------------------------------------------------
    def showEvent(self, event):  # noqa: N802 - Qt override: an "Always allow" answered in a chat since
        self.refresh()
        super().showEvent(event)

    def refresh(self) -> None:
        s = self.service
        self.path_label.setText(f"Listed in {s.mcp_path}" if s.mcp_path else "No mcp.json is used in this window.")
        self.edit_button.setEnabled(s.mcp_path is not None)
        self.config_error.setText(s.config_error or "")
        self.config_error.setVisible(bool(s.config_error))
        if list(self.rows) != s.names:
            for row in self.rows.values():
                row.setParent(None)
                row.deleteLater()
            self.rows = {spec.name: ServerRow(s, spec, self) for spec in s.specs}
            for row in self.rows.values():
                self.servers.addWidget(row)
        for row in self.rows.values():
            row.refresh()
        self.empty.setVisible(not self.rows and not s.config_error)
        self.start_button.setEnabled(bool(self.rows))
        rules = {k: v for k, v in s.policy.tools.items()}
        where = f"kept in {s.approvals_path}" if s.approvals_path else "kept for this session only"
        always = sorted(n for n, v in rules.items() if v == "always")
        self.approvals_label.setText(
            f"Your answers are {where}. "
            + (f"Always allowed: {', '.join(always)}." if always else "No tool is always allowed.")
        )
        self.forget_button.setEnabled(bool(rules))

    def _fill(self) -> None:
        value = self.settings.value
        for w in (self.calculator, self.max_rounds):
            w.blockSignals(True)
        self.calculator.setChecked(bool(getattr(value, "tools_calculator", True)))
        self.max_rounds.setValue(int(getattr(value, "tools_max_rounds", 8)))
        for w in (self.calculator, self.max_rounds):
            w.blockSignals(False)
        self.read_paths.clear()
        self.read_paths.addItems(list(getattr(value, "tools_read_paths", ()) or ()))
        self.remove_path.setEnabled(self.read_paths.count() > 0)

    # -- changes -----------------------------------------------------------------------------------------------------
    def _set(self, **changes) -> None:
        value = self.settings.value
        if all(getattr(value, k, None) == v for k, v in changes.items()):
            return
        self.settings.set(dataclasses.replace(value, **changes))

    def _add_path(self, folder: bool) -> None:
        if folder:
            path = QFileDialog.getExistingDirectory(self, "A folder whose files read_file may read")
        else:
            path, _ = QFileDialog.getOpenFileName(self, "A file read_file may read")
        current = tuple(getattr(self.settings.value, "tools_read_paths", ()) or ())
        if path and path not in current:
            self._set(tools_read_paths=current + (path,))

    def _remove_path(self) -> None:
        item = self.read_paths.currentItem() or self.read_paths.item(self.read_paths.count() - 1)
        if item is None:
            return
        current = tuple(getattr(self.settings.value, "tools_read_paths", ()) or ())
        self._set(tools_read_paths=tuple(p for p in current if p != item.text()))

    def _forget(self) -> None:
        self.service.forget_tool_rules()
        self.refresh()

    def edit(self) -> Optional[McpEditor]:
        """Edit mcp.json…: the editor (window-modal); a saved file is read again and its servers started."""
        if self.service.mcp_path is None:
            return None
        self.editor = McpEditor(self.service.mcp_path, self)
        self.editor.saved.connect(self._saved)
        self.editor.open()
        return self.editor

    def _saved(self) -> None:
        self.service.load_config()
        if self.service.names:
            self.service.list_in_background(retry=True)
