"""The main window: conversations, chat, live gauges, settings.

Everything that touches the model runs on the engine thread (``EngineClient``);
this class only reacts to what comes back. The database is written from here,
on the UI thread, in small transactions: a user message when sent, an assistant
message as soon as its reply starts (marked partial), updated about once a
second while it grows, and finalised when it ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QDockWidget,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)
from qasync import asyncSlot

from redline.ui.about import AboutDialog, AboutInfo, probe_hardware
from redline.ui.chat_view import PAGE, ChatView, MessageWidget
from redline.ui.conversation_list import ConversationList
from redline.ui.engine_client import (
    EngineClient,
    EventChannel,
    LoadProgress,
    ModelInfo,
    TaskFailed,
    chat_task,
    load_task,
    unload_task,
)
from redline.ui.gauges import GaugesPanel
from redline.ui.markdown import append_reply
from redline.ui.memory_sampler import MemorySampler
from redline.ui.protocols import ConversationStore, PresetStoreLike, TrustDecisions
from redline.ui.settings_panel import SettingsPanel
from redline.ui.style import app_icon, stylesheet
from redline.ui.widgets import Banner, LoadBar, MessageInput
from redline.ui.worker import EngineThread

SAVE_INTERVAL_S = 1.0  # how often a growing reply is written to the database
STARTER_OFFER = (
    "No model is configured yet. Redline can use its built-in starter model, SmolLM2-135M-Instruct "
    "(about 100 MB to fetch the first time, then offline; it runs on a CPU)."
)

STILL_LOADING = "The model is still loading; your message stays in the box. Send it once loading ends."
NOT_LOADED = "No model is loaded. Load one first; your message stays in the box."


@dataclass
class _Generation:
    conversation_id: int
    message_id: int
    channel: EventChannel
    text: str = ""
    draft_spans: list = field(default_factory=list)
    widget: Optional[MessageWidget] = None
    last_token_time: Optional[float] = 0.0
    last_save: float = field(default_factory=time.monotonic)
    model: str = ""
    position: int = 0  # the reply's place in its conversation

    def append(self, delta: str, from_draft: bool) -> None:
        self.text = append_reply(self.text, self.draft_spans, delta, from_draft)


def stats_from_result(result, model: str, draft_spans: list) -> dict:
    keys = (
        "new_tokens",
        "prompt_tokens",
        "tokens_per_s",
        "ttft_ms",
        "p50_ms",
        "p95_ms",
        "strategy",
        "precision",
        "device",
        "finish_reason",
        "error",
        "draft_proposed",
        "draft_accepted",
        "acceptance_rate",
        "mean_accepted_length",
        "peak_memory_bytes",
        "total_s",
    )
    stats = {k: getattr(result, k) for k in keys}
    stats["model"] = model
    stats["draft_spans"] = draft_spans
    stats["notes"] = [n for n in result.notes if not n.startswith("Traceback")]
    return stats


_ABOUT_EXECUTOR: Optional[ThreadPoolExecutor] = None


def _about_executor() -> ThreadPoolExecutor:
    global _ABOUT_EXECUTOR
    if _ABOUT_EXECUTOR is None:
        _ABOUT_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="redline-about")
    return _ABOUT_EXECUTOR


def confirm_opt_in(parent, exc) -> bool:
    """Ask before running code from a model folder, naming exactly what would run (tests replace this)."""
    what = (
        "run this Python code shipped with the model"
        if exc.kind == "remote_code"
        else "unpickle these weight files (loaded with weights_only=True)"
    )
    files = "\n".join(f"  • {name}" for name in exc.files) or "  (none listed)"
    box = QMessageBox(
        QMessageBox.Warning,
        "Run code from this model?",
        f"{exc.message}\n\nTo load it, Redline would {what}:\n{files}\n\nin {exc.folder}\n\n"
        "Only do this if you trust where the model came from. Redline remembers your answer for "
        "this folder and asks again if any of these files change.",
        QMessageBox.Yes | QMessageBox.No,
        parent,
    )
    box.setDefaultButton(QMessageBox.No)
    return box.exec() == QMessageBox.Yes


class MainWindow(QMainWindow):
    model_loaded = Signal(object)  # ModelInfo
    reply_finished = Signal(object)  # GenerationResult, or None when the reply failed
    load_progress = Signal(float, str)  # fraction, phase (the wizard's load page follows it)
    model_unloaded = Signal()

    def __init__(
        self,
        engine: EngineThread,
        store: ConversationStore,
        settings: Any,
        save_settings: Callable[[Any], None],
        settings_warning: Optional[str] = None,
        presets: Optional[PresetStoreLike] = None,
        about: Optional[AboutInfo] = None,
        trust: Optional[TrustDecisions] = None,
    ):
        super().__init__()
        self.setWindowTitle("Redline")
        self.setWindowIcon(app_icon())
        self.about_info = about or AboutInfo(version="unknown", licence="unknown")
        self.about_dialog: Optional[AboutDialog] = None
        self.resize(1280, 800)
        self.setStyleSheet(stylesheet())
        self.engine = engine
        self.client = EngineClient(engine, self)
        self.store = store
        self.settings = settings
        self._save_settings = save_settings
        self.loaded: Optional[ModelInfo] = None
        self.loading = False
        self.generation: Optional[_Generation] = None
        self.conversation_id: Optional[int] = None
        self.editing_message_id: Optional[int] = None
        self.last_result = None
        self._closed = False
        self.presets = presets
        self.trust = trust
        self.last_load_error: Optional[str] = None
        self.wizard = None

        self._build()
        self.sampler = MemorySampler(self)
        self.sampler.sampled.connect(self.gauges.set_memory)
        self._open_latest_conversation()
        self._update_controls()
        self._refresh_presets()
        self._settings_warning = settings_warning
        if settings_warning:
            self.banner.show_message(settings_warning, "warning")
        self.input.setFocus()

    # -- layout -------------------------------------------------------------------
    def _build(self) -> None:
        self.conversations = ConversationList(self.store)
        self.conversations.selected.connect(self.open_conversation)
        self.conversations.new_requested.connect(self.new_chat)
        self.conversations.deleted.connect(self._on_deleted)

        chat = QWidget()
        v = QVBoxLayout(chat)
        v.setContentsMargins(8, 8, 8, 8)
        sys_row = QHBoxLayout()
        sys_row.addWidget(QLabel("System prompt:"))
        self.system_prompt = QLineEdit()
        self.system_prompt.setPlaceholderText("optional, for this conversation (e.g. “Answer briefly.”)")
        self.system_prompt.editingFinished.connect(self._save_system_prompt)
        sys_row.addWidget(self.system_prompt, 1)
        v.addLayout(sys_row)
        self.chat_view = ChatView()
        self.chat_view.regenerate_requested.connect(self.regenerate)
        self.chat_view.edit_requested.connect(self.edit_message)
        v.addWidget(self.chat_view, 1)
        self.edit_bar = QLabel(
            "Editing a message: Enter sends the new version (later messages are replaced); Esc cancels."
        )
        self.edit_bar.setObjectName("reloadNote")
        self.edit_bar.hide()
        v.addWidget(self.edit_bar)
        row = QHBoxLayout()
        self.input = MessageInput()
        self.input.submitted.connect(self.send)
        row.addWidget(self.input, 1)
        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setToolTip("Stop the reply (Esc); what was generated is kept")
        self.stop_button.clicked.connect(self.stop)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row.addLayout(buttons)
        v.addLayout(row)

        # A tab bar so later panels (the speed lab) sit next to the chat.
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(chat, "Chat")
        self.gauges = GaugesPanel()

        splitter = QSplitter(Qt.Horizontal)
        splitter.addWidget(self.conversations)
        splitter.addWidget(self.tabs)
        splitter.addWidget(self.gauges)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([220, 760, 290])

        top = QWidget()
        tv = QVBoxLayout(top)
        tv.setContentsMargins(6, 6, 6, 0)
        tv.setSpacing(4)
        self.banner = Banner()
        self.load_bar = LoadBar()
        self.load_bar.cancel_requested.connect(self.cancel_load)
        tv.addWidget(self.banner)
        tv.addWidget(self.load_bar)
        tv.addWidget(splitter, 1)
        self.setCentralWidget(top)

        self.settings_panel = SettingsPanel(self.settings)
        self.settings_panel.applied.connect(self.apply_settings)
        self.settings_panel.wizard_requested.connect(self.open_wizard)
        self.settings_dock = QDockWidget("Settings", self)
        self.settings_dock.setObjectName("settingsDock")
        self.settings_dock.setWidget(self.settings_panel)
        self.addDockWidget(Qt.RightDockWidgetArea, self.settings_dock)
        self.settings_dock.hide()

        self.model_label = QLabel("No model loaded")
        self.statusBar().addPermanentWidget(self.model_label)
        self._build_menus()

    def _build_menus(self) -> None:
        mb = self.menuBar()
        file_menu = mb.addMenu("&File")
        self.new_action = self._action(file_menu, "&New chat", self.new_chat, QKeySequence.New)
        file_menu.addSeparator()
        self._action(file_menu, "Export as &Markdown…", lambda: self.export("md"))
        self._action(file_menu, "Export as &JSON…", lambda: self.export("json"))
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", self.close, QKeySequence.Quit)
        self.model_menu = mb.addMenu("&Model")
        self.wizard_action = self._action(
            self.model_menu, "&Configure model…", self.open_wizard, QKeySequence("Ctrl+Shift+M")
        )
        self.presets_menu = self.model_menu.addMenu("&Presets")
        self.presets_menu.aboutToShow.connect(self._fill_presets_menu)
        self._fill_presets_menu()
        self.model_menu.addSeparator()
        self._action(self.model_menu, "&Settings…", self.show_settings, QKeySequence("Ctrl+,"))
        self._action(self.model_menu, "&Reload model", lambda: self.load_model())
        self._action(self.model_menu, "&Unload model (free its memory)", lambda: self.unload_model())
        self._action(self.model_menu, "Use the &starter model", self.use_starter)
        help_menu = mb.addMenu("&Help")
        self._action(help_menu, "&Keyboard shortcuts", self._shortcuts_help)
        help_menu.addSeparator()
        self.about_action = self._action(help_menu, "&About Redline", self.show_about)
        QShortcut(QKeySequence(Qt.Key_Escape), self, self.escape, context=Qt.WindowShortcut)

    def _action(self, menu, text, slot, shortcut=None) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(shortcut)
        action.triggered.connect(lambda _checked=False: slot())
        menu.addAction(action)
        return action

    def add_panel(self, widget: QWidget, title: str) -> None:
        """Later panels (the speed lab) are added next to the chat."""
        self.tabs.addTab(widget, title)

    def _shortcuts_help(self) -> None:
        QMessageBox.information(
            self,
            "Keyboard shortcuts",
            "Enter — send\nShift+Enter — new line\nEsc — stop the reply\n"
            "Ctrl+N — new chat\nCtrl+, — settings\nCtrl+Shift+M — configure model\n"
            "Ctrl+Q — quit",
        )

    @asyncSlot()
    async def show_about(self) -> None:
        """Opens the About dialog at once; the GPU rows fill in when a worker thread has read them."""
        if self.about_dialog is not None:
            self.about_dialog.raise_()
            self.about_dialog.activateWindow()
            return
        dialog = self.about_dialog = AboutDialog(self.about_info, self)
        dialog.finished.connect(self._about_closed)
        dialog.show()
        # probe_hardware imports torch (seconds on a cold start): on a plain worker thread, not this one.
        # (A Python thread pool rather than qasync's default QThread executor, which outlives the window.)
        try:
            hw = await asyncio.wrap_future(_about_executor().submit(probe_hardware))
        except Exception as exc:  # shown in the dialog as "unknown (why)", never guessed
            hw = exc
        if self.about_dialog is dialog:
            dialog.set_hardware(hw)

    def _about_closed(self, _result: int) -> None:
        if self.about_dialog is not None:
            self.about_dialog.deleteLater()
            self.about_dialog = None

    # -- state ----------------------------------------------------------------------
    def _update_controls(self) -> None:
        generating = self.generation is not None
        self.send_button.setEnabled(not generating)
        self.stop_button.setEnabled(generating)
        if self.loaded is None:
            self.chat_view.set_placeholder(
                "Loading the model…"
                if self.loading
                else "No model loaded. Choose one in Model → Configure model… or Model → Settings."
            )
        else:
            self.chat_view.set_placeholder(f"Chatting with {self.loaded.name}. Type a message below.")

    def _status(self) -> None:
        if self.loaded is None:
            self.model_label.setText("Loading…" if self.loading else "No model loaded")
            return
        draft = f" · draft {self.loaded.draft_name}" if self.loaded.draft_name else ""
        self.model_label.setText(
            f"{self.loaded.name} · {self.loaded.precision} · {self.loaded.device} · {self.settings.strategy}{draft}"
        )

    # -- model loading ------------------------------------------------------------
    def start(self, model: Optional[str] = None) -> None:
        """Called once the window is shown: load the configured model, or offer the starter."""
        if model:
            self.settings = dataclasses.replace(self.settings, model=model)
            self._save_settings(self.settings)
            self.settings_panel.set_settings(self.settings)
        if self.settings.model:
            self.load_model()
        else:
            prefix = f"{self._settings_warning} " if self._settings_warning else ""
            self.banner.show_message(
                prefix + STARTER_OFFER,
                "warning" if prefix else "info",
                [
                    ("Use the starter model", self.use_starter),
                    ("Choose another…", self.show_settings),
                    ("Configure model…", self.open_wizard),
                ],
            )

    def use_starter(self) -> None:
        self.apply_settings(dataclasses.replace(self.settings, model="starter"), force_reload=True)

    def show_settings(self) -> None:
        self.settings_panel.set_settings(self.settings)
        self.settings_dock.show()
        self.settings_dock.raise_()

    def apply_settings(self, new, force_reload: bool = False) -> None:
        reload = force_reload or self.loaded is None or self.settings.needs_reload(new)
        self.settings = new
        self._save_settings(new)
        self.settings_panel.set_settings(new)
        self._status()
        if reload and new.model:
            self.load_model()

    @asyncSlot()
    async def load_model(self) -> Optional[ModelInfo]:
        """Load the configured model; the ModelInfo, or None (``last_load_error`` says why)."""
        s = self.settings
        if not s.model:
            return None
        self.last_load_error = None
        if self.generation is not None:
            self.stop()
        self.banner.hide()
        self.loading = True
        self.loaded = None
        self.load_bar.set_progress(0.0, f"Loading {s.model}…")
        self.load_bar.show()
        self.sampler.set_fast(True)
        self._status()
        self._update_controls()
        is_trusted = None
        if self.trust is not None:
            trust = self.trust
            is_trusted = lambda exc: trust.is_trusted(exc.folder, exc.kind, exc.fingerprint)  # noqa: E731
        task = load_task(
            s.model, s.precision, s.draft_model, s.draft_precision, s.strategy == "speculative", is_trusted
        )
        ask_opt_in = None
        try:
            info = await self.client.run(task, self._on_load_progress)
        except TaskFailed as exc:
            if self._closed:
                return
            original = exc.original
            self.last_load_error = str(exc)
            if type(original).__name__ == "NeedsOptIn" and self.trust is not None:
                ask_opt_in = original  # asked below, once the load bar is gone
            elif type(original).__name__ == "Cancelled":
                self.last_load_error = "Loading was cancelled. No model is loaded."
                self.banner.show_message(
                    "Loading was cancelled. No model is loaded.", "warning", [("Load again", lambda: self.load_model())]
                )
            else:
                self.banner.show_message(
                    f"The model could not be loaded: {exc}",
                    "error",
                    [("Open settings", self.show_settings), ("Use the starter model", self.use_starter)],
                )
            if ask_opt_in is None:
                return None
        finally:
            if not self._closed:
                self.loading = False
                self.load_bar.hide()
                self.sampler.set_fast(False)
                self._status()
                self._update_controls()
        if ask_opt_in is not None:
            if confirm_opt_in(self, ask_opt_in):
                self.trust.remember(ask_opt_in.folder, ask_opt_in.kind, ask_opt_in.fingerprint, ask_opt_in.files)
                return await self.load_model()
            self.banner.show_message(
                f"The model was not loaded: {self.last_load_error}",
                "warning",
                [("Open settings", self.show_settings), ("Use the starter model", self.use_starter)],
            )
            return None
        self.loaded = info
        self.sampler.set_device(info.device)
        self.gauges.set_device(f"{info.device} · {info.name} ({info.precision}), loaded in {info.load_seconds:.1f} s")
        self._status()
        self._update_controls()
        if info.draft_error:
            self.banner.show_message(
                f"The draft model was not loaded: {info.draft_error} Replies use the "
                "target alone until you change the draft or the strategy.",
                "warning",
                [("Open settings", self.show_settings)],
            )
        elif self.settings.strategy == "speculative" and not info.draft_name:
            self.banner.show_message(
                "The speculative strategy needs a draft model. Choose one in Settings, "
                "or pick another strategy such as prompt-lookup.",
                "warning",
                [("Open settings", self.show_settings)],
            )
        if self.presets is not None:
            self.presets.remember_model(s.model)
        self.model_loaded.emit(info)
        return info

    @asyncSlot()
    async def unload_model(self) -> None:
        """Free the model's memory; the settings keep it, so Reload brings it back."""
        if self.loading:
            return
        if self.generation is not None:
            self.stop()
        try:
            await self.client.run(unload_task())
        except TaskFailed as exc:  # pragma: no cover - unload does not raise in practice
            self.banner.show_message(f"Unloading failed: {exc}", "error")
            return
        if self._closed:
            return
        self.loaded = None
        self.sampler.set_device("cpu" if self.engine.engine is None else self.engine.engine.device)
        self.gauges.set_device("no model loaded")
        self._status()
        self._update_controls()
        self.model_unloaded.emit()

    def _on_load_progress(self, obj) -> None:
        if isinstance(obj, LoadProgress):
            self.load_bar.set_progress(obj.fraction, obj.phase)
            self.load_progress.emit(obj.fraction, obj.phase)

    # -- the configuration wizard and presets ---------------------------------------
    def open_wizard(self):
        """Open the configuration wizard (window-modal; it never blocks the event loop)."""
        from redline.ui.wizard import ConfigWizard

        if self.wizard is not None and self.wizard.isVisible():
            self.wizard.raise_()
            return self.wizard
        self.wizard = ConfigWizard(self.client, self, self.presets, self)
        self.wizard.preset_saved.connect(lambda _name: self._refresh_presets())
        self.wizard.open()
        return self.wizard

    def settings_values(self) -> dict:
        return dataclasses.asdict(self.settings)

    def configure(self, values: dict):
        """Apply settings chosen elsewhere (the wizard, a preset) and load; awaitable: ModelInfo or None."""
        self.settings = dataclasses.replace(self.settings, **values)
        self._save_settings(self.settings)
        self.settings_panel.set_settings(self.settings)
        return self.load_model()

    def apply_preset(self, name: str) -> None:
        preset = self.presets.get(name) if self.presets is not None else None
        if preset is None:
            self.banner.show_message(
                f"The preset “{name}” is gone (its file was removed or is unreadable).",
                "warning",
                [("Configure model…", self.open_wizard)],
            )
            self._refresh_presets()
            return
        new = dataclasses.replace(self.settings, **preset.values)
        self.statusBar().showMessage(f"Preset “{name}”: {preset.describe()}", 5000)
        self.apply_settings(new, force_reload=self.loaded is None or self.settings.needs_reload(new))

    def _fill_presets_menu(self) -> None:
        menu = self.presets_menu
        menu.clear()
        presets = self.presets.presets() if self.presets is not None else []
        for p in presets:
            action = menu.addAction(p.name)
            action.setToolTip(p.describe())
            action.setStatusTip(p.describe())
            action.triggered.connect(lambda _c=False, n=p.name: self.apply_preset(n))
        if not presets:
            empty = menu.addAction("(no presets yet: save one at the end of Configure model…)")
            empty.setEnabled(False)
        menu.addSeparator()
        manage = menu.addAction("&Manage presets…")
        manage.setEnabled(self.presets is not None)
        manage.triggered.connect(lambda _c=False: self.manage_presets())

    def manage_presets(self):
        from .presets_dialog import PresetsDialog

        dialog = PresetsDialog(self.presets, self)
        dialog.changed.connect(self._refresh_presets)
        dialog.load_requested.connect(self.apply_preset)
        dialog.open()
        return dialog

    def _refresh_presets(self) -> None:
        if self.presets is not None:
            self.settings_panel.set_presets(self.presets.presets())

    def cancel_load(self) -> None:
        if self.loading:
            self.client.cancel()
            self.load_bar.set_progress(self.load_bar.bar.value() / 1000, "Cancelling…")

    # -- conversations ----------------------------------------------------------------
    def _open_latest_conversation(self) -> None:
        convs = self.store.conversations()
        if convs:
            self.open_conversation(convs[0].id)
        else:
            self.new_chat()

    def new_chat(self) -> None:
        self.conversation_id = None
        self.editing_message_id = None
        self.edit_bar.hide()
        self.system_prompt.setText("")
        self._rebuild_view()
        self.conversations.list.clearSelection()
        self.conversations.list.setCurrentItem(None)
        self.input.setFocus()

    def open_conversation(self, conversation_id: int) -> None:
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        self.conversation_id = conversation_id
        self.editing_message_id = None
        self.edit_bar.hide()
        self.system_prompt.setText(conv.system_prompt)
        if self.conversations.current_id() != conversation_id:
            self.conversations.select(conversation_id)
        self._rebuild_view()

    def _rebuild_view(self) -> None:
        """Show the open conversation: its newest page of messages; older pages load on scroll."""
        gen = self.generation
        if gen is not None:
            gen.widget = None
        if self.conversation_id is None:
            self.chat_view.clear()
            return
        cid = self.conversation_id
        page = self.store.messages(cid, limit=PAGE)
        earlier = self.store.message_count(cid, page[0].position) if page else 0
        self.chat_view.show_messages(
            page,
            earlier,
            lambda before, after, n: self.store.messages(cid, limit=n, before_position=before, after_position=after),
        )
        if gen is not None and gen.conversation_id == cid:
            w = self.chat_view.widget_for(gen.message_id)
            if w is not None:
                self._attach_stream(gen, w)

    def _attach_stream(self, gen: "_Generation", w: MessageWidget) -> None:
        w.streaming = True
        w.text = gen.text
        w.draft_spans = gen.draft_spans
        w.render()
        gen.widget = w

    def _showing(self, conversation_id: int) -> bool:
        return self.conversation_id == conversation_id

    def _show_reply(self, gen: "_Generation") -> None:
        if (
            self.generation is gen
            and self._showing(gen.conversation_id)
            and self.chat_view.widget_for(gen.message_id) is None
        ):
            self._attach_stream(
                gen, self.chat_view.add_message(gen.message_id, "assistant", "", None, True, gen.position)
            )

    def _stream_widget(self, gen: "_Generation") -> Optional[MessageWidget]:
        """The widget showing the growing reply, if it is built: scrolling far up drops it from the view's
        window, and scrolling back down builds it again from the store, so look it up when it is gone."""
        if gen.widget is not None and gen.widget in self.chat_view.widgets:
            return gen.widget
        gen.widget = None
        if self._showing(gen.conversation_id):
            w = self.chat_view.widget_for(gen.message_id)
            if w is not None:
                self._attach_stream(gen, w)
                return w
        return None

    def _on_deleted(self, conversation_id: int) -> None:
        if self.generation is not None and self.generation.conversation_id == conversation_id:
            self.stop()
        if self.conversation_id == conversation_id:
            self._open_latest_conversation()

    def _save_system_prompt(self) -> None:
        if self.conversation_id is not None:
            self.store.set_system_prompt(self.conversation_id, self.system_prompt.text())

    def export(self, kind: str) -> None:
        if self.conversation_id is None:
            self.banner.show_message("Open a conversation to export it.", "info")
            return
        conv = self.store.conversation(self.conversation_id)
        safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title).strip() or "conversation"
        flt = "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export conversation", f"{safe}.{kind}", flt)
        if path:
            self.export_to(path, kind)

    def export_to(self, path: str, kind: str) -> None:
        text = (self.store.export_markdown if kind == "md" else self.store.export_json)(self.conversation_id)
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            self.banner.show_message(f"Could not write {path}: {exc}. Choose another folder.", "error")
            return
        self.statusBar().showMessage(f"Exported to {path}", 5000)

    # -- chatting -----------------------------------------------------------------
    def escape(self) -> None:
        if self.generation is not None:
            self.stop()
        elif self.loading:
            self.cancel_load()
        elif self.editing_message_id is not None:
            self.editing_message_id = None
            self.edit_bar.hide()
            self.input.clear()

    def stop(self) -> None:
        if self.generation is not None:
            self.generation.channel.cancelled = True  # holds even if the reply has not started yet
            self.client.cancel()

    def edit_message(self, message_id: int) -> None:
        if self.generation is not None:
            return
        m = self.store.message(message_id)
        if m is None:
            return
        self.editing_message_id = message_id
        self.edit_bar.show()
        self.input.setPlainText(m.content)
        self.input.setFocus()

    @asyncSlot()
    async def send(self) -> None:
        text = self.input.message_text().strip()
        if not text or self.generation is not None:
            return
        if self.loaded is None:
            if self.loading:
                self.banner.show_message(STILL_LOADING, "info")
            else:
                self.banner.show_message(
                    NOT_LOADED,
                    "warning",
                    [("Use the starter model", self.use_starter), ("Open settings", self.show_settings)],
                )
            return
        if self.banner.label.text() in (STILL_LOADING, NOT_LOADED):
            self.banner.hide()  # the message it held back is going out now: the notice is stale
        if self.editing_message_id is not None:
            self.store.delete_from(self.editing_message_id)
            self.chat_view.remove_from(self.editing_message_id)
            self.editing_message_id = None
            self.edit_bar.hide()
        if self.conversation_id is None:
            title = text.splitlines()[0][:48]
            conv = self.store.create_conversation(title, self.system_prompt.text())
            self.conversation_id = conv.id
            self.conversations.select(conv.id)
        user = self.store.add_message(self.conversation_id, "user", text)
        self.chat_view.add_message(user.id, "user", text, position=user.position)
        self.input.clear()
        await self._generate(self.conversation_id)

    @asyncSlot(int)
    async def regenerate(self, message_id: int) -> None:
        if self.generation is not None or self.loaded is None:
            return
        m = self.store.message(message_id)
        if m is None or m.role != "assistant":
            return
        self.store.delete_from(message_id)
        if self._showing(m.conversation_id):
            self.chat_view.remove_from(message_id)
        await self._generate(m.conversation_id)

    async def _generate(self, conversation_id: int) -> None:
        conv = self.store.conversation(conversation_id)
        messages = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt.strip() else []
        messages += [{"role": m.role, "content": m.content} for m in self.store.messages(conversation_id) if m.content]
        s = self.settings
        placeholder = self.store.add_message(
            conversation_id,
            "assistant",
            "",
            partial=True,
            stats={"finish_reason": "interrupted", "model": self.loaded.name},
        )
        channel = EventChannel(self._on_events)
        gen = _Generation(
            conversation_id, placeholder.id, channel, model=self.loaded.name, position=placeholder.position
        )
        self.generation = gen
        if self._showing(conversation_id):
            # Only the new reply's widget is built; earlier ones stay as they are. In the next event-loop turn:
            # the user's message widget was just built in this one, and each costs a frame's worth of time.
            QTimer.singleShot(0, lambda: self._show_reply(gen))
        self.gauges.start_reply()
        self.sampler.set_fast(True)
        self._update_controls()
        sampling = dict(
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            repetition_penalty=s.repetition_penalty,
            seed=s.seed,
        )
        options = dict(strategy=s.strategy, num_draft_tokens=s.num_draft_tokens)
        result, error = None, None
        try:
            result = await self.client.run(chat_task(messages, sampling, options, s.context_length, channel))
        except TaskFailed as exc:
            error = str(exc)
        channel.drain()
        if self._closed:
            return
        self._finish(gen, result, error)

    def _on_events(self, events: list) -> None:
        gen = self.generation
        if gen is None:
            return
        latencies = []
        for ev in events:
            kind = type(ev).__name__
            if kind == "TokenEvent":
                gen.append(ev.text, ev.from_draft)
                if ev.token_id >= 0:
                    if gen.last_token_time is not None and ev.index > 0 and ev.time_s > gen.last_token_time:
                        latencies.append((ev.time_s - gen.last_token_time) * 1000)
                    gen.last_token_time = ev.time_s
            elif kind == "StatsEvent":
                self.gauges.live(ev.tokens_per_s_1s, ev.ttft_ms, ev.new_tokens)
        self.gauges.add_latencies(latencies)
        w = self._stream_widget(gen)
        if w is not None:
            w.text = gen.text
            w.draft_spans = gen.draft_spans
            w._dirty = True
        now = time.monotonic()
        if now - gen.last_save >= SAVE_INTERVAL_S:
            gen.last_save = now
            self.store.update_message(gen.message_id, gen.text, partial=True)

    def _finish(self, gen: _Generation, result, error: Optional[str]) -> None:
        self.generation = None
        self.sampler.set_fast(False)
        if result is not None:
            gen.text = result.text
            stats = stats_from_result(result, gen.model, gen.draft_spans)
            partial = result.finish_reason in ("cancelled", "error")
            if result.finish_reason == "error":
                error = result.error
            self.gauges.finish_reply(
                result.tokens_per_s, result.ttft_ms, result.new_tokens, result.p50_ms, result.p95_ms
            )
        else:
            stats = {"finish_reason": "error", "error": error, "model": gen.model, "draft_spans": gen.draft_spans}
            partial = True
        shown = self._stream_widget(gen)
        if gen.text:
            self.store.update_message(gen.message_id, gen.text, partial, stats)
            if (
                shown is None
                and self._showing(gen.conversation_id)
                and self.chat_view.showing_latest()
                and self.chat_view.widget_for(gen.message_id) is None
            ):
                # It ended before its widget was due to be built.
                shown = self.chat_view.add_message(gen.message_id, "assistant", gen.text, stats, partial, gen.position)
            if shown is not None:
                shown.streaming = False
                shown.set_content(gen.text, stats, partial)
                shown.render()
        else:  # nothing came out: an empty message would only be clutter
            self.store.delete_from(gen.message_id)
            if shown is not None:
                self.chat_view.remove_from(gen.message_id)
        gen.widget = None
        if error:
            self.banner.show_message(
                f"The reply failed: {error} Your conversation is kept.",
                "error",
                [("Open settings", self.show_settings)],
            )
        self.conversations.touch(gen.conversation_id)
        self.last_result = result
        self._update_controls()
        self.reply_finished.emit(result)

    # -- closing ------------------------------------------------------------------
    def closeEvent(self, event):  # noqa: N802
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self, timeout_ms: int = 1500) -> bool:
        """Stop generation, keep the partial reply, stop the threads. True if the engine stopped in time."""
        if self._closed:
            return True
        self._closed = True
        gen = self.generation
        if gen is not None:
            self.client.cancel()
            gen.channel.drain()
            self.store.update_message(
                gen.message_id,
                gen.text,
                True,
                {"finish_reason": "cancelled", "model": gen.model, "draft_spans": gen.draft_spans},
            )
            self.generation = None
        if self.loading:
            self.client.cancel()
        self.sampler.shutdown(500)
        return self.engine.shutdown(timeout_ms)
