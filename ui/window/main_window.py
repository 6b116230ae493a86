"""The main window: conversations, chat, live gauges, settings — assembled from the parts in this package.

Everything that touches the model runs on the engine thread (``EngineClient``); the window only reacts to
what comes back. Its parts, each a module of ``redline.ui.window``:

- ``layout``: the widgets and where they sit; ``menus``: the menu bar and the Esc shortcut;
- ``model_controller``: loading (with the opt-in question and the load bar), unloading, reloading when the
  settings change, the status bar's line;
- ``reply_controller``: sending, regenerating, editing and stopping replies, each reply's own state, and
  the database writes while a reply is written;
- ``conversations``: which conversation is open, new chats, deletions, the system prompt;
- ``presets_controller``: Model → Presets and Manage presets…; ``export``: File → Export;
- ``help_actions``: Help → Keyboard shortcuts and About;
- ``server_controller``: Server → Serve the model (the OpenAI-compatible server over the chat's engine), its
  settings and the status bar's switch; ``connect_dialog``: Model → Connect to a server….

This class is what app/, the tests and the tools use: its signals and methods (``start``, ``send``,
``load_model``, ``apply_settings``, ``shutdown``, …), its widgets (``input``, ``chat_view``, ``banner``,
``notices``, …)
and its state (``loaded``, ``loading``, ``generation``, ``conversation_id``, …), which the parts hold.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QMainWindow, QWidget

from redline.ui.about import AboutInfo
from redline.ui.engine_client import EngineClient, ModelInfo
from redline.ui.memory_sampler import MemorySampler
from redline.ui.protocols import ConversationStore, PresetStoreLike, ServerKeyStore, TrustDecisions
from redline.ui.style import app_icon, stylesheet
from redline.ui.window import export as export_conversation
from redline.ui.window.conversations import ConversationController
from redline.ui.window.help_actions import HelpActions
from redline.ui.window.layout import build_layout
from redline.ui.window.menus import build_menus
from redline.ui.window.model_controller import ModelController
from redline.ui.window.presets_controller import PresetsController
from redline.ui.window.reply_controller import Reply, ReplyController
from redline.ui.window.server_controller import ServerController
from redline.ui.worker import EngineThread


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
        startup_notices: Sequence[str] = (),
        presets: Optional[PresetStoreLike] = None,
        about: Optional[AboutInfo] = None,
        trust: Optional[TrustDecisions] = None,
        server_keys: Optional[ServerKeyStore] = None,
    ):
        super().__init__()
        self.setWindowTitle("Redline")
        self.setWindowIcon(app_icon())
        self.about_info = about or AboutInfo(version="unknown", licence="unknown")
        self.resize(1280, 800)
        self.setStyleSheet(stylesheet())
        self.engine = engine
        self.client = EngineClient(engine, self)
        self.store = store
        self.settings = settings
        self._save_settings = save_settings
        self.presets = presets
        self.trust = trust
        self.server_keys = server_keys  # API keys: of servers the chat connects to, and of the window's server
        self.wizard = None
        self.has_shut_down = False
        self._engine_stopped = True

        self.models = ModelController(self)
        self.replies = ReplyController(self)
        self.chats = ConversationController(self)
        self.preset_actions = PresetsController(self)
        self.help = HelpActions(self)
        self.server = ServerController(self)
        build_layout(self)
        self.server.build_status_widgets()
        build_menus(self)
        self.sampler = MemorySampler(self)
        self.sampler.sampled.connect(self.gauges.set_memory)
        self.chats.open_latest()
        self.update_controls()
        self.preset_actions.refresh()
        for text in startup_notices:  # e.g. the settings file or the database was unreadable: kept until dismissed
            self.notices.add(text, "warning")
        self.input.setFocus()

    # -- state the parts hold ---------------------------------------------------------
    @property
    def loaded(self) -> Optional[ModelInfo]:
        return self.models.loaded

    @property
    def loading(self) -> bool:
        return self.models.loading

    @property
    def last_load_error(self) -> Optional[str]:
        return self.models.last_load_error

    @property
    def generation(self) -> Optional[Reply]:
        """The reply being written, or None."""
        return self.replies.current

    @property
    def last_result(self):
        return self.replies.last_result

    @property
    def editing_message_id(self) -> Optional[int]:
        return self.replies.editing_message_id

    @property
    def conversation_id(self) -> Optional[int]:
        return self.chats.conversation_id

    @property
    def about_dialog(self):
        return self.help.about_dialog

    def update_controls(self) -> None:
        """Send and Stop, and the chat's placeholder line, follow the model and the replies."""
        generating = self.replies.busy_in(self.conversation_id)  # this chat's reply; others may run too
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

    # -- settings -----------------------------------------------------------------------
    def set_settings(self, new) -> None:
        """Use and save ``new``; the settings panel shows it. (Whether to reload is the caller's question.)"""
        self.settings = new
        self._save_settings(new)
        self.settings_panel.set_settings(new)

    def settings_values(self) -> dict:
        return dataclasses.asdict(self.settings)

    def show_settings(self) -> None:
        self.settings_panel.set_settings(self.settings)
        self.settings_dock.show()
        self.settings_dock.raise_()

    def apply_settings(self, new, force_reload: bool = False) -> None:
        self.models.apply_settings(new, force_reload)

    def configure(self, values: dict):
        """Apply settings chosen elsewhere (the wizard, a preset) and load; awaitable: ModelInfo or None."""
        return self.models.configure(values)

    # -- the model --------------------------------------------------------------------------
    def start(self, model: Optional[str] = None) -> None:
        """Called once the window is shown: load the configured model, or offer the starter."""
        self.models.start(model)

    def use_starter(self) -> None:
        self.models.use_starter()

    def load_model(self):
        """Load the configured model; awaitable: the ModelInfo, or None (``last_load_error`` says why)."""
        return self.models.load_model()

    def unload_model(self):
        """Free the model's memory; the settings keep it, so Reload brings it back."""
        return self.models.unload_model()

    def cancel_load(self) -> None:
        self.models.cancel_load()

    def connect_to_server(self):
        """Model → Connect to a server…: the dialog (it lists the server's models)."""
        return self.models.connect_dialog()

    def set_serving(self, on: bool):
        """Server → Serve the model: start or stop the OpenAI-compatible server; awaitable (the address)."""
        return self.server.set_serving(on)

    def open_wizard(self):
        """Open the configuration wizard (window-modal; it never blocks the event loop)."""
        from redline.ui.wizard import ConfigWizard

        if self.wizard is not None and self.wizard.isVisible():
            self.wizard.raise_()
            return self.wizard
        self.wizard = ConfigWizard(self.client, self, self.presets, self)
        self.wizard.preset_saved.connect(lambda _name: self.preset_actions.refresh())
        self.wizard.open()
        return self.wizard

    # -- presets ------------------------------------------------------------------------------
    def apply_preset(self, name: str) -> None:
        self.preset_actions.apply(name)

    def manage_presets(self):
        return self.preset_actions.manage()

    # -- conversations --------------------------------------------------------------------------
    def new_chat(self) -> None:
        self.chats.new_chat()

    def open_conversation(self, conversation_id: int) -> None:
        self.chats.open(conversation_id)

    def export(self, kind: str) -> None:
        export_conversation.export(self, kind)

    def export_to(self, path: str, kind: str) -> None:
        export_conversation.export_to(self, path, kind)

    # -- replies ----------------------------------------------------------------------------------
    def send(self):
        """Send what the input holds; awaitable (the reply's end is also ``reply_finished``)."""
        return self.replies.send()

    def regenerate(self, message_id: int):
        return self.replies.regenerate(message_id)

    def edit_message(self, message_id: int) -> None:
        self.replies.edit_message(message_id)

    def stop(self) -> None:
        """Stop the reply of the chat on screen (replies in other chats go on)."""
        self.replies.stop_in(self.conversation_id)

    def escape(self) -> None:
        """Esc: stop this chat's reply, else cancel loading, else leave editing."""
        if self.replies.busy_in(self.conversation_id):
            self.stop()
        elif self.loading:
            self.cancel_load()
        elif self.editing_message_id is not None:
            self.replies.end_edit()
            self.input.clear()

    # -- panels and help ------------------------------------------------------------------------
    def add_panel(self, widget: QWidget, title: str) -> None:
        """Later panels (the speed lab) are added next to the chat."""
        self.tabs.addTab(widget, title)

    def show_about(self):
        return self.help.show_about()

    # -- closing ------------------------------------------------------------------------------------
    def closeEvent(self, event):  # noqa: N802
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self, timeout_ms: int = 1500) -> bool:
        """Stop generation, keep the partial reply, stop the threads. True if the engine stopped in time.

        Called by closing the window and again by the app as it exits: the second call answers what the first
        found, so the app can still leave at once if the engine did not stop (a step that could not be cut)."""
        if self.has_shut_down:
            return self._engine_stopped
        self.has_shut_down = True
        self.server.shutdown()  # API clients first: their requests stop with the server
        self.replies.shutdown()
        if self.loading:
            self.client.cancel(self.models._load_future)
        self.sampler.shutdown(500)
        self._engine_stopped = self.engine.shutdown(timeout_ms)
        return self._engine_stopped
