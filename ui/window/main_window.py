"""The main window: conversations, chat, live gauges, settings — assembled from the parts in this package.

Everything that touches the model goes through one ``EngineBridge`` (``ui/bridge.py``: one channel per request);
the window only reacts to what comes back. Its parts, each a module of ``redline.ui.window``, each handed the
few collaborators it uses (never the window):

- ``layout``: the widgets and where they sit; ``menus``: the menu bar and the Esc shortcut;
- ``model_controller``: loading (with the opt-in question and the load bar), unloading, reloading when the
  settings change, the status bar's line; the configuration wizard's host;
- ``reply_controller``: sending, regenerating, editing and stopping replies, shown from each conversation's
  ``ChatSession`` (``ui/chat_session.py``), which holds the reply's state and writes the database;
- ``conversations``: which conversation is open, new chats, deletions, the system prompt;
- ``attachments``: files attached to the next message (the paperclip, a drop, a paste), read off the UI thread,
  shown as chips with what each costs;
- ``presets_controller``: Model → Presets and Manage presets…; ``export``: File → Export;
- ``help_actions``: Help → Keyboard shortcuts and About;
- ``tools_controller``: the Tools switch of each conversation, what the tools cost, replies through the tool loop
  and their calls asked about in the transcript (with ``ui/tools/``: the servers, the loop's thread, Settings → Tools);
- ``server_controller``: Server → Serve the model (the OpenAI-compatible server over the chat's engine), its
  settings and the status bar's switch; ``connect_dialog``: Model → Connect to a server….

What app/, the tests and the tools use of the window itself: its signals (``model_loaded``, ``reply_finished``,
``load_progress``, ``model_unloaded``), its widgets (``input``, ``chat_view``, ``banner``, ``notices``, …), its
parts (``models``, ``replies``, ``chats``, ``server``, ``preset_actions``, ``help``), the state they hold
(``loaded``, ``loading``, ``generation``, ``conversation_id``, …) and the few actions that span parts
(``start``, ``send``, ``stop``, ``escape``, ``load_model``, ``unload_model``, ``apply_settings``, ``show_settings``,
``open_wizard``, ``new_chat``, ``open_conversation``, ``set_serving``, ``shutdown``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from PySide6.QtWidgets import QLabel, QMainWindow, QWidget

from ..about import AboutInfo
from ..bridge import EngineBridge
from ..memory_sampler import MemorySampler
from ..protocols import ConversationStore, PresetStoreLike, ServerKeyStore, TrustDecisions
from ..style import app_icon, apply_theme
from ..tools.service import ToolsService
from ..tools.settings_page import ToolsSettings
from ..wizard import ConfigWizard
from .attachments import AttachmentsController
from .conversations import ConversationController
from .help_actions import HelpActions
from .layout import build_layout
from .look import Look
from .menus import build_menus
from .model_controller import ModelController
from .parts import Composer, SettingsHolder, StatusLine
from .presets_controller import PresetsController
from .reply_controller import ReplyController
from .server_controller import ServerController
from .tools_controller import ToolsController


class MainWindow(QMainWindow):
    def __init__(
        self,
        engine: EngineBridge,
        store: ConversationStore,
        settings: Any,
        save_settings: Callable[[Any], None],
        startup_notices: Sequence[str] = (),
        presets: Optional[PresetStoreLike] = None,
        about: Optional[AboutInfo] = None,
        trust: Optional[TrustDecisions] = None,
        server_keys: Optional[ServerKeyStore] = None,
        mcp_path: Optional[Path] = None,
        approvals_path: Optional[Path] = None,
    ):
        """``mcp_path``: the mcp.json whose servers the chats may use; ``approvals_path``: where the answers to tool
        calls are kept (both in the config folder, handed in by the application; None: no servers, answers kept in
        memory)."""
        super().__init__()
        self.setWindowTitle("Redline")
        self.setWindowIcon(app_icon())
        self.resize(1280, 760)
        apply_theme(self, getattr(settings, "theme", "system"))  # before the widgets: they are drawn in its colours
        self.engine = engine  # the bridge to the engine service
        self.store = store
        self.settings_holder = SettingsHolder(settings, save_settings, self)
        self.presets = presets
        self.trust = trust
        self.server_keys = server_keys  # API keys: of servers the chat connects to, and of the window's server
        self.wizard = None
        self.has_shut_down = False
        self._engine_stopped = True

        build_layout(self, store, settings)
        self.status = StatusLine(self.statusBar(), self.model_label)
        self.kernels_label = QLabel("")  # shown once, when Redline's CPU kernels cannot run here
        self.kernels_label.setObjectName("kernelsNote")
        self.kernels_label.hide()
        self.statusBar().addPermanentWidget(self.kernels_label)
        self.sampler = MemorySampler(self)
        self.sampler.sampled.connect(self.gauges.set_memory)
        self.chats = ConversationController(
            store, self.conversations, self.chat_view, self.system_prompt, self.input, self
        )
        self.models = ModelController(
            engine,
            self.settings_holder,
            self.banner,
            self.load_bar,
            self.gauges,
            self.sampler,
            self.status,
            replies_stop=lambda note: self.replies.stop_all(note),
            show_settings=self.show_settings,
            open_wizard=self.open_wizard,
            trust=trust,
            server_keys=server_keys,
            presets=presets,
            dialog_parent=self,
            parent=self,
        )
        self.tool_service = ToolsService(mcp_path, approvals_path, lambda: self.settings_holder.value, self)
        self.tools = ToolsController(
            self.tool_service,
            engine,
            store,
            self.chats,
            self.chat_view,
            self.tools_button,
            self.tools_note,
            self.settings_holder,
            self.models,
            self.banner,
            self,
        )
        self.tools_settings = ToolsSettings(self.tool_service, self.settings_holder)
        self.settings_dialog.add_page(self.tools_settings, "Tools")
        composer = Composer(self.input, self.edit_bar, self.send_button, self.stop_button)
        self.attachments = AttachmentsController(
            engine,
            store,
            self.models,
            self.chats,
            self.input,
            self.attachment_chips,
            self.attach_button,
            self.banner,
            drop_on=self.tabs.widget(0),  # the chat page: files dropped anywhere on it are attached
            dialog_parent=self,
            parent=self,
        )
        self.replies = ReplyController(
            store,
            engine,
            self.chats,
            self.chat_view,
            composer,
            self.gauges,
            self.sampler,
            self.banner,
            self.settings_holder,
            self.models,
            self.show_settings,
            self,
            attachments=self.attachments,
            tools=self.tools,
        )
        self.preset_actions = PresetsController(
            presets,
            self.settings_holder,
            self.models.apply_settings,
            lambda: self.models.loaded is not None,
            self.banner,
            self.status,
            self.settings_panel,
            self.open_wizard,
            dialog_parent=self,
            parent=self,
        )
        self.help = HelpActions(
            self, about or AboutInfo(version="unknown", licence="unknown"), engine, lambda: self.models.kernels
        )
        self.server = ServerController(
            engine.service, self.settings_holder, server_keys, self.banner, self.notices, self.statusBar(), self, self
        )
        self.server_button = self.server.button
        # The window's signals are its parts'.
        self.model_loaded = self.models.model_loaded  # the engine's LoadReport
        self.model_unloaded = self.models.model_unloaded
        self.load_progress = self.models.load_progress  # fraction, phase (the wizard's load page follows it)
        self.reply_finished = self.replies.reply_finished  # GenerationResult, or None when the reply failed
        self.models.state_changed.connect(self.replies.update_controls)
        self.models.kernels_known.connect(self._show_kernels)
        self.settings_holder.changed.connect(self.settings_panel.set_settings)
        self.settings_panel.applied.connect(self.models.apply_settings)
        self.settings_panel.wizard_requested.connect(self.open_wizard)
        self.look = Look(self, self)  # the theme, the gauges' panel and the empty chat follow the state
        self.chats.opened.connect(lambda _cid: self.tabs.setCurrentIndex(0))  # a chat opened: show it
        self.chat_view.example_chosen.connect(self._send_example)
        build_menus(self)
        self.chats.open_latest()
        self.replies.update_controls()
        self.preset_actions.refresh()
        for text in startup_notices:  # e.g. the settings file or the database was unreadable: kept until dismissed
            self.notices.add(text, "warning")
        self.input.setFocus()

    # -- state the parts hold ---------------------------------------------------------
    @property
    def settings(self):
        return self.settings_holder.value

    @property
    def loaded(self):
        """The engine's LoadReport for the model loaded, or None."""
        return self.models.loaded

    @property
    def loading(self) -> bool:
        return self.models.loading

    @property
    def last_load_error(self) -> Optional[str]:
        return self.models.last_load_error

    @property
    def generation(self):
        """The reply being written (in the chat on screen, else any), or None."""
        return self.replies.current

    @property
    def last_result(self):
        return self.replies.last_result

    @property
    def conversation_id(self) -> Optional[int]:
        return self.chats.conversation_id

    @property
    def about_dialog(self):
        return self.help.about_dialog

    # -- what spans the parts ----------------------------------------------------------------
    def start(self, model: Optional[str] = None) -> None:
        """Called once the window is shown: load the configured model, or offer the starter."""
        self.models.start(model)

    def send(self):
        """Send what the input holds; awaitable (the reply's end is also ``reply_finished``)."""
        return self.replies.send()

    def stop(self) -> None:
        """Stop the reply of the chat on screen (replies in other chats go on)."""
        self.replies.stop_in(self.conversation_id)

    def escape(self) -> None:
        """Esc: stop this chat's reply (or drop what waits behind its stop), else cancel loading, else leave
        editing."""
        if self.replies.escape():
            return
        if self.loading:
            self.models.cancel_load()
        elif self.replies.editing_message_id is not None:
            self.replies.end_edit()
            self.input.clear()
            self.attachments.clear()  # the edited message's files, put back as chips

    def load_model(self):
        """Load (or reload) the configured model; awaitable: the LoadReport, or None (``last_load_error``)."""
        return self.models.load_model()

    def unload_model(self):
        """Free the model's memory; the settings keep it, so Reload brings it back."""
        return self.models.unload_model()

    def apply_settings(self, new, force_reload: bool = False) -> None:
        """Use ``new`` (saved); reload the model when the change needs it."""
        self.models.apply_settings(new, force_reload)

    def show_settings(self) -> None:
        self.settings_panel.set_settings(self.settings)
        self.settings_dialog.open_here()

    def show_tools_settings(self) -> None:
        """Settings → Tools."""
        self.settings_dialog.show_page("Tools")

    def toggle_settings(self) -> None:
        """Ctrl+, (also from inside the dialog): open the settings, or close them."""
        if self.settings_dialog.isVisible():
            self.settings_dialog.close()
        else:
            self.show_settings()

    def _send_example(self, text: str) -> None:
        self.input.setPlainText(text)
        self.send()

    def open_wizard(self):
        """Open the configuration wizard (window-modal; it never blocks the event loop)."""

        if self.wizard is not None and self.wizard.isVisible():
            self.wizard.raise_()
            return self.wizard
        self.wizard = ConfigWizard(self.engine, self.models, self.presets, self)
        self.wizard.preset_saved.connect(lambda _name: self.preset_actions.refresh())
        self.wizard.open()
        return self.wizard

    def new_chat(self) -> None:
        self.chats.new_chat()

    def open_conversation(self, conversation_id: int) -> None:
        self.chats.open(conversation_id)

    def set_serving(self, on: bool):
        """Server → Serve the model: start or stop the OpenAI-compatible server; awaitable (the address)."""
        return self.server.set_serving(on)

    def add_panel(self, widget: QWidget, title: str) -> None:
        """Later panels (the speed lab) are added next to the chat."""
        self.tabs.addTab(widget, title)

    def _show_kernels(self, report) -> None:
        """Redline's CPU kernels cannot run here: said once, in the status bar (the whole sentence on hover and
        in Help → About)."""
        if report.on:
            self.kernels_label.hide()
            return
        slower = ""
        if report.with_tokens_per_s and report.without_tokens_per_s:
            slower = f" (≈ {report.without_tokens_per_s:.0f} instead of ≈ {report.with_tokens_per_s:.0f} tok/s)"
        self.kernels_label.setText(f"CPU kernels off: slower{slower}")
        self.kernels_label.setToolTip(report.sentence())
        self.kernels_label.show()
        self.status.say(report.sentence(), 15_000)

    # -- closing ------------------------------------------------------------------------------------
    def closeEvent(self, event):  # noqa: N802
        # Off the screen at once: the engine may take a moment to end the step under way (tools/benchmarks/
        # quit_time.py --mid-reply: 0.3-1.9 s at a load average of 12 on 2 cores, its thread niced and starved).
        self.hide()
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
        self.replies.shutdown()  # each reply's request is cancelled, with the note that Redline was closed
        self.tools.shutdown()  # a tool call waiting for an answer is denied; the MCP servers stop (a few s at most)
        self.attachments.shutdown()  # a file being read is not waited for
        self.models.shutdown()
        self.sampler.shutdown(500)
        self._engine_stopped = self.engine.shutdown(timeout_ms)
        self.engine.flush()  # what the engine sent while it stopped: the stopped replies' results
        self.replies.close_sessions()  # saved with those results (or, had the engine not stopped, what came)
        return self._engine_stopped
