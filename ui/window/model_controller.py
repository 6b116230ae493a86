"""The model in the window: loading (with the load bar, cancellable), asking before a model's own code or
pickle weights run (and remembering the answer), unloading, reloading when settings change, and the
status bar's line about what is loaded.

Precision and strategy ``auto`` are resolved just before loading (``inference.jobs.auto_task``, the same
``resolve_auto`` as ``redline chat``): the fastest configuration that fits for the settings' priority. The
status bar says what was chosen and why; replies use the chosen strategy (``strategy()``).

Loading runs on the engine thread (``load_task``); this only reacts to its progress and outcome.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QMessageBox
from qasync import asyncSlot

from redline.inference import Cancelled, NeedsOptIn, is_server_url
from redline.ui.engine_client import LoadProgress, ModelInfo, TaskFailed, load_task, unload_task
from redline.inference import auto_task

AUTO = "auto"

STARTER_OFFER = (
    "No model is configured yet. Redline can use its built-in starter model, SmolLM2-135M-Instruct "
    "(about 100 MB to fetch the first time, then offline; it runs on a CPU)."
)


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


class ModelController(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.loaded: Optional[ModelInfo] = None
        self.loading = False
        self.unloading = False
        self._load_future = None  # the load now running: its own cancel (the load bar's button)
        self.last_load_error: Optional[str] = None  # why the last load_model() returned None
        self.auto_choice = None  # redline.inference.AutoChoice: how auto was resolved for the model loaded
        self.auto_note: Optional[str] = None  # the status bar's line about it

    def strategy(self) -> str:
        """The strategy replies use: the setting, or what auto chose for the model loaded."""
        s = self.window.settings.strategy
        if s != AUTO:
            return s
        return self.auto_choice.strategy if self.auto_choice is not None else "kv"

    async def _resolve_auto(self, s, precision: Optional[str] = None):
        """Resolve auto on the engine thread; a failure falls back to the device's default with kv, said so."""
        w = self.window
        try:
            choice = await w.client.run(
                auto_task(s.model, precision or s.precision, s.strategy, s.priority, s.context_length)
            )
        except TaskFailed as exc:
            self.auto_choice = None
            self.auto_note = f"auto could not be resolved ({exc}); using the default precision with kv"
            return None
        self.auto_choice = choice
        self.auto_note = choice.reason
        return choice

    # -- what the window shows about the model --------------------------------------
    def show_status(self) -> None:
        w = self.window
        if self.loaded is None:
            w.model_label.setText("Loading…" if self.loading else "No model loaded")
            return
        if self.loaded.device == "remote":
            w.model_label.setText(f"{self.loaded.name} · on the server (its memory, its decoding)")
            return
        draft = f" · draft {self.loaded.draft_name}" if self.loaded.draft_name else ""
        w.model_label.setText(
            f"{self.loaded.name} · {self.loaded.precision} · {self.loaded.device} · {self.strategy()}{draft}"
        )
        if self.auto_note and AUTO in (w.settings.precision, w.settings.strategy):
            w.statusBar().showMessage(self.auto_note)
        else:
            w.statusBar().clearMessage()

    def _refresh(self) -> None:
        self.show_status()
        self.window.update_controls()

    # -- which model ------------------------------------------------------------------
    def start(self, model: Optional[str] = None) -> None:
        """Called once the window is shown: load the configured model, or offer the starter."""
        w = self.window
        if model:
            w.set_settings(dataclasses.replace(w.settings, model=model))
        if w.settings.model:
            self.load_model()
        else:
            w.banner.show_message(
                STARTER_OFFER,
                "info",
                [
                    ("Use the starter model", self.use_starter),
                    ("Choose another…", w.show_settings),
                    ("Configure model…", w.open_wizard),
                ],
            )

    def use_starter(self) -> None:
        self.apply_settings(dataclasses.replace(self.window.settings, model="starter"), force_reload=True)

    def apply_settings(self, new, force_reload: bool = False) -> None:
        w = self.window
        old = w.settings
        reload = force_reload or self.loaded is None or old.needs_reload(new)
        w.set_settings(new)
        self.show_status()
        if reload and new.model:
            self.load_model()
        elif new.strategy == AUTO and (old.strategy != AUTO or old.priority != new.priority):
            self._resolve_strategy()

    @asyncSlot()
    async def _resolve_strategy(self) -> None:
        """Strategy auto without a reload: the fastest strategy for the precision loaded now."""
        if self.loaded is None:
            return
        s = self.window.settings
        precision = s.precision
        if precision == AUTO:
            chosen = self.auto_choice.precision if self.auto_choice is not None else None
            precision = chosen or self.loaded.precision
        await self._resolve_auto(s, precision=precision)
        self.show_status()

    def configure(self, values: dict):
        """Apply settings chosen elsewhere (the wizard, a preset) and load; awaitable: ModelInfo or None."""
        w = self.window
        w.set_settings(dataclasses.replace(w.settings, **values))
        return self.load_model()

    # -- loading and unloading --------------------------------------------------------
    @asyncSlot()
    async def load_model(self) -> Optional[ModelInfo]:
        """Load the configured model; the ModelInfo, or None (``last_load_error`` says why)."""
        w = self.window
        s = w.settings
        if not s.model:
            return None
        self.last_load_error = None
        w.replies.stop_all()
        w.banner.hide()
        self.loading = True
        self.loaded = None
        w.load_bar.set_progress(0.0, f"Loading {s.model}…")
        w.load_bar.show()
        w.sampler.set_fast(True)
        self._refresh()
        is_trusted = None
        if w.trust is not None:
            trust = w.trust
            is_trusted = lambda exc: trust.is_trusted(exc.folder, exc.kind, exc.fingerprint)  # noqa: E731
        remote = is_server_url(s.model)
        api_key = w.server_keys.get(s.model) if (w.server_keys is not None and remote) else None
        precision = s.precision
        self.auto_choice = self.auto_note = None
        if AUTO in (s.precision, s.strategy) and not remote:  # a server's model: its precision is the server's
            w.load_bar.set_progress(0.0, f"Choosing a configuration for {s.model}…")
            choice = await self._resolve_auto(s)
            if w.has_shut_down:
                return None
            if choice is not None and choice.precision and s.precision == AUTO:
                precision = choice.precision
        task = load_task(
            s.model, precision, s.draft_model, s.draft_precision, s.strategy == "speculative", is_trusted, api_key
        )
        ask_opt_in = None
        try:
            # A load takes the engine: replies still being written stop with a note saying so.
            self._load_future = w.client.run(task, self._on_load_progress, label="the model to load", interrupt=True)
            info = await self._load_future
        except TaskFailed as exc:
            if w.has_shut_down:
                return
            original = exc.original
            self.last_load_error = str(exc)
            if isinstance(original, NeedsOptIn) and w.trust is not None:
                ask_opt_in = original  # asked below, once the load bar is gone
            elif isinstance(original, Cancelled):
                self.last_load_error = "Loading was cancelled. No model is loaded."
                w.banner.show_message(
                    "Loading was cancelled. No model is loaded.", "warning", [("Load again", lambda: self.load_model())]
                )
            else:
                w.banner.show_message(
                    f"The model could not be loaded: {exc}",
                    "error",
                    [("Open settings", w.show_settings), ("Use the starter model", self.use_starter)],
                )
            if ask_opt_in is None:
                return None
        finally:
            if not w.has_shut_down:
                self.loading = False
                w.load_bar.hide()
                w.sampler.set_fast(False)
                self._refresh()
        if ask_opt_in is not None:
            if confirm_opt_in(w, ask_opt_in):
                w.trust.remember(ask_opt_in.folder, ask_opt_in.kind, ask_opt_in.fingerprint, ask_opt_in.files)
                return await self.load_model()
            w.banner.show_message(
                f"The model was not loaded: {self.last_load_error}",
                "warning",
                [("Open settings", w.show_settings), ("Use the starter model", self.use_starter)],
            )
            return None
        self.loaded = info
        if info.device == "remote":
            w.sampler.set_device("cpu")  # this app's own memory, beside the note that the model's is the server's
            w.gauges.set_remote(info.name)
            w.gauges.set_device(f"on the server · {info.name}, connected in {info.load_seconds:.1f} s")
        else:
            w.gauges.set_remote(None)
            w.sampler.set_device(info.device)
            w.gauges.set_device(f"{info.device} · {info.name} ({info.precision}), loaded in {info.load_seconds:.1f} s")
        self._refresh()
        if info.draft_error:
            w.banner.show_message(
                f"The draft model was not loaded: {info.draft_error} Replies use the "
                "target alone until you change the draft or the strategy.",
                "warning",
                [("Open settings", w.show_settings)],
            )
        elif w.settings.strategy == "speculative" and not info.draft_name:
            w.banner.show_message(
                "The speculative strategy needs a draft model. Choose one in Settings, "
                "or pick another strategy such as prompt-lookup.",
                "warning",
                [("Open settings", w.show_settings)],
            )
        if w.presets is not None and not is_server_url(s.model):
            w.presets.remember_model(s.model)
        w.model_loaded.emit(info)
        return info

    @asyncSlot()
    async def unload_model(self) -> None:
        """Free the model's memory; the settings keep it, so Reload brings it back."""
        w = self.window
        if self.loading:
            return
        w.replies.stop_all()
        self.unloading = True
        self._refresh()
        try:
            await w.client.run(unload_task(), label="the model to unload", interrupt=True)
        except TaskFailed as exc:  # pragma: no cover - unload does not raise in practice
            w.banner.show_message(f"Unloading failed: {exc}", "error")
            return
        finally:
            self.unloading = False
        if w.has_shut_down:
            return
        self.loaded = None
        w.sampler.set_device("cpu" if w.engine.engine is None else w.engine.engine.device)
        w.gauges.set_device("no model loaded")
        self._refresh()
        w.model_unloaded.emit()

    def connect_dialog(self):
        """Model → Connect to a server…"""
        from redline.ui.window.connect_dialog import ConnectDialog

        dialog = ConnectDialog(self.window)
        dialog.open()
        return dialog

    def connect_to(self, base_url: str, model_id: str, api_key: Optional[str]):
        """Chat with ``model_id`` on the server at ``base_url``; awaitable like load_model. The key is saved
        privately (never in the settings)."""
        w = self.window
        if w.server_keys is not None:
            w.server_keys.set(base_url, api_key)
        w.set_settings(dataclasses.replace(w.settings, model=f"{base_url}#{model_id}"))
        return self.load_model()

    def cancel_load(self) -> None:
        w = self.window
        if self.loading:
            w.client.cancel(self._load_future)
            w.load_bar.set_progress(w.load_bar.bar.value() / 1000, "Cancelling…")

    def _on_load_progress(self, obj) -> None:
        if isinstance(obj, LoadProgress):
            self.window.load_bar.set_progress(obj.fraction, obj.phase)
            self.window.load_progress.emit(obj.fraction, obj.phase)
