"""The model in the window: loading (with the load bar, cancellable), asking before a model's own code or
pickle weights run (and remembering the answer), unloading, reloading when settings change, and the
status bar's line about what is loaded.

Precision and strategy ``auto`` are resolved just before loading (``inference.jobs.auto_job``, the same
``resolve_auto`` as ``redline chat``): the fastest configuration that fits for the settings' priority. The
status bar says what was chosen and why; replies use the chosen strategy (``strategy()``).

Loading is the engine's one load (``EngineService.load`` through the bridge: its ``LoadReport``); this only
reacts to its progress and outcome. It is also the configuration wizard's host: ``settings``,
``settings_values()``, ``configure(values)``, ``last_load_error``, ``cancel_load()`` and ``load_progress``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QMessageBox
from qasync import asyncSlot

from ...inference import (
    Cancelled,
    LoadReport,
    NeedsOptIn,
    Progress,
    auto_job,
    is_server_url,
    kernels_job,
    kv_form_job,
    prefix_cache_job,
)
from ..bridge import TaskFailed
from ..chat_session import LOAD_NOTE, UNLOAD_NOTE
from ..signals import emit
from .connect_dialog import ConnectDialog
from .parts import SettingsHolder, StatusLine
from .reply_controller import STILL_LOADING

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
    model_loaded = Signal(object)  # the engine's LoadReport
    model_unloaded = Signal()
    load_progress = Signal(float, str)  # fraction, phase (the wizard's load page follows it)
    state_changed = Signal()  # loaded, loading or unloading changed
    kernels_known = Signal(object)  # a KernelsReport: whether Redline's CPU kernels run here, and what it costs

    def __init__(
        self,
        bridge,
        settings: SettingsHolder,
        banner,
        load_bar,
        gauges,
        sampler,
        status: StatusLine,
        replies_stop: Callable[[str], None],
        show_settings: Callable[[], None],
        open_wizard: Callable[[], Any],
        trust=None,
        server_keys=None,
        presets=None,
        dialog_parent=None,
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self.bridge, self._settings, self.banner, self.load_bar = bridge, settings, banner, load_bar
        self.gauges, self.sampler, self.status = gauges, sampler, status
        self._stop_replies, self.show_settings, self.open_wizard = replies_stop, show_settings, open_wizard
        self.trust, self.server_keys, self.presets, self.dialog_parent = trust, server_keys, presets, dialog_parent
        self.loaded: Optional[LoadReport] = None
        self.loading = False
        self.unloading = False
        self.closing = False  # the window is shutting down: outcomes arriving now change nothing on screen
        self._load = None  # the load now running: its channel (the load bar's Cancel cancels it)
        self.last_load_error: Optional[str] = None  # why the last load_model() returned None
        self.auto_choice = None  # redline.inference.AutoChoice: how auto was resolved for the model loaded
        self.auto_note: Optional[str] = None  # the status bar's line about it
        self.kernels = None  # the last KernelsReport
        load_bar.cancel_requested.connect(self.cancel_load)

    # -- the settings (the wizard reads them here) ---------------------------------------------------
    @property
    def settings(self):
        return self._settings.value

    def settings_values(self) -> dict:
        return dataclasses.asdict(self._settings.value)

    def strategy(self) -> str:
        """The strategy replies use: the setting, or what auto chose for the model loaded."""
        s = self.settings.strategy
        if s != AUTO:
            return s
        return self.auto_choice.strategy if self.auto_choice is not None else "kv"

    async def _resolve_auto(self, s, precision: Optional[str] = None):
        """Resolve auto on the engine thread; a failure falls back to the device's default with kv, said so."""
        try:
            choice = await self.bridge.run(
                auto_job(
                    s.model,
                    precision or s.precision,
                    s.strategy,
                    s.priority,
                    s.context_length,
                    getattr(s, "kv_cache", "bf16"),
                )
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
        label = self.status.model_label
        if self.loaded is None:
            label.setText("Loading…" if self.loading else "No model loaded")
            self.status.set_note("")  # about a model no longer loaded
            return
        if not self.loaded.measured_here:  # a model on a server
            label.setText(f"{self.loaded.name} · on the server (its memory, its decoding)")
            self.status.set_note("")
            return
        draft = f" · draft {self.loaded.draft_name}" if self.loaded.draft_name else ""
        label.setText(f"{self.loaded.name} · {self.loaded.precision} · {self.loaded.device} · {self.strategy()}{draft}")
        self.status.set_note(self.auto_line() or "")

    def auto_line(self) -> Optional[str]:
        """The status bar's line about ``auto`` for the settings in use now, or None where nothing is auto. After
        Settings → Strategy → Apply pins a strategy other than the one auto chose (no reload: the precision stays),
        the line auto wrote at the load no longer holds: it says what runs now and why."""
        s, choice = self.settings, self.auto_choice
        if not self.auto_note or AUTO not in (s.precision, s.strategy):
            return None
        if choice is not None and s.strategy != AUTO and choice.strategy != s.strategy and choice.precision:
            return (
                f"{s.strategy} · {choice.precision} — strategy {s.strategy} as set in Settings; precision "
                f"{choice.precision} as auto chose it at the load"
            )
        return self.auto_note

    def _refresh(self) -> None:
        self.show_status()
        emit(self.state_changed)

    # -- which model ------------------------------------------------------------------
    def start(self, model: Optional[str] = None) -> None:
        """Called once the window is shown: load the configured model, or offer the starter."""
        if model:
            self._settings.set(dataclasses.replace(self.settings, model=model))
        if self.settings.model:
            self.load_model()
        else:
            self.banner.show_message(
                STARTER_OFFER,
                "info",
                [
                    ("Use the starter model", self.use_starter),
                    ("Choose another…", self.show_settings),
                    ("Configure model…", self.open_wizard),
                ],
            )

    def use_starter(self) -> None:
        self.apply_settings(dataclasses.replace(self.settings, model="starter"), force_reload=True)

    def apply_settings(self, new, force_reload: bool = False) -> None:
        old = self.settings
        reload = force_reload or self.loaded is None or old.needs_reload(new)
        self._settings.set(new)
        self.show_status()
        if self._cache_size(old) != self._cache_size(new) and not (reload and new.model):
            self.apply_prefix_cache()  # at once, for the model loaded (a load applies it anyway)
        if reload and new.model:
            self.load_model()
        elif new.strategy == AUTO and (old.strategy != AUTO or old.priority != new.priority):
            self._resolve_strategy()

    @asyncSlot()
    async def _resolve_strategy(self) -> None:
        """Strategy auto without a reload: the fastest strategy for the precision loaded now."""
        if self.loaded is None:
            return
        s = self.settings
        precision = s.precision
        if precision == AUTO:
            chosen = self.auto_choice.precision if self.auto_choice is not None else None
            precision = chosen or self.loaded.precision
        await self._resolve_auto(s, precision=precision)
        self.show_status()

    @staticmethod
    def _cache_size(settings) -> int:
        return int(getattr(settings, "prefix_cache_bytes", 256_000_000))

    def apply_prefix_cache(self):
        """Hand the prefix cache's size (Settings → Prefix cache) to the engine: the limits the next load gives the
        model, and the model loaded now. Its channel (a job, in order with the rest)."""
        return self.bridge.run(prefix_cache_job(self._cache_size(self.settings)), label="the prefix cache's size")

    def configure(self, values: dict):
        """Apply settings chosen elsewhere (the wizard, a preset) and load; awaitable: LoadReport or None."""
        self._settings.set(dataclasses.replace(self.settings, **values))
        return self.load_model()

    # -- loading and unloading --------------------------------------------------------
    def _end_held_back(self) -> None:
        """The load ended: a banner that held a message back until it did is stale now."""

        if self.banner.label.text() == STILL_LOADING:
            self.banner.hide()

    @asyncSlot()
    async def load_model(self) -> Optional[LoadReport]:
        """Load the configured model; the LoadReport, or None (``last_load_error`` says why)."""
        s = self.settings
        if not s.model:
            return None
        self.last_load_error = None
        self._stop_replies(LOAD_NOTE)  # a load takes the engine: replies being written stop, each saying so
        self.banner.hide()
        self.loading = True
        self.loaded = None
        self.load_bar.set_progress(0.0, f"Loading {s.model}…")
        self.load_bar.show()
        self.sampler.set_fast(True)
        self._refresh()
        opt_in = None
        if self.trust is not None:
            trust = self.trust
            opt_in = lambda exc: trust.is_trusted(exc.folder, exc.kind, exc.fingerprint)  # noqa: E731
        remote = is_server_url(s.model)
        api_key = self.server_keys.get(s.model) if (self.server_keys is not None and remote) else None
        precision = s.precision
        self.auto_choice = self.auto_note = None
        if AUTO in (s.precision, s.strategy) and not remote:  # a server's model: its precision is the server's
            self.load_bar.set_progress(0.0, f"Choosing a configuration for {s.model}…")
            choice = await self._resolve_auto(s)
            if self.closing:
                return None
            if choice is not None and choice.precision and s.precision == AUTO:
                precision = choice.precision
        draft = s.draft_model if s.strategy == "speculative" else None
        ask_opt_in = None
        self.apply_prefix_cache()  # before the load, in order: the model it loads gets this size
        # and this KV cache's form (Settings → KV cache; 8 bits where auto found only that makes the context fit)
        kv = self.auto_choice.kv if self.auto_choice is not None else getattr(s, "kv_cache", "bf16")
        self.bridge.run(kv_form_job(kv), label="the KV cache's form")
        try:
            self._load = self.bridge.load(
                s.model, precision, draft, s.draft_precision, opt_in, api_key, context=s.context_length
            )
            self._load.events.connect(self._on_load_progress)
            info = await self._load
        except TaskFailed as exc:
            if self.closing:
                return None
            original = exc.original
            self.last_load_error = str(exc)
            if isinstance(original, NeedsOptIn) and self.trust is not None:
                ask_opt_in = original  # asked below, once the load bar is gone
            elif isinstance(original, Cancelled):
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
            if not self.closing:
                self.loading = False
                self._load = None
                self.load_bar.hide()
                self.sampler.set_fast(False)
                self._end_held_back()
                self._refresh()
        if ask_opt_in is not None:
            if confirm_opt_in(self.dialog_parent, ask_opt_in):
                self.trust.remember(ask_opt_in.folder, ask_opt_in.kind, ask_opt_in.fingerprint, ask_opt_in.files)
                return await self.load_model()
            self.banner.show_message(
                f"The model was not loaded: {self.last_load_error}",
                "warning",
                [("Open settings", self.show_settings), ("Use the starter model", self.use_starter)],
            )
            return None
        self.loaded = info
        self.gauges.set_kv_cache(None)  # a new model: nothing of the last one's cache is kept
        if not info.measured_here:  # a model on a server
            self.sampler.set_device("cpu")  # this app's own memory, beside the note that the model's is the server's
            self.gauges.set_remote(info.name)
            self.gauges.set_device(f"on the server · {info.name}, connected in {info.load_seconds:.1f} s")
        else:
            self.gauges.set_remote(None)
            self.sampler.set_device(info.device)
            self.gauges.set_device(
                f"{info.device} · {info.name} ({info.precision}), loaded in {info.load_seconds:.1f} s"
            )
        self._refresh()
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
        if self.presets is not None and not remote:
            self.presets.remember_model(s.model)
        emit(self.model_loaded, info)
        if info.measured_here and not info.device.startswith("cuda"):
            self._check_kernels(s.model, info.precision)
        return info

    @asyncSlot()
    async def _check_kernels(self, model: str, precision: str) -> None:
        """Whether Redline's CPU kernels run here (asked on the engine thread: it needs torch); said once."""
        if self.kernels is not None:
            return
        try:
            report = await self.bridge.run(kernels_job(model, precision if precision in ("q8", "q4", "bf16") else None))
        except TaskFailed:
            return  # a report only
        if self.closing:
            return
        self.kernels = report
        emit(self.kernels_known, report)

    @asyncSlot()
    async def unload_model(self) -> None:
        """Free the model's memory; the settings keep it, so Reload brings it back."""
        if self.loading:
            return
        self._stop_replies(UNLOAD_NOTE)
        self.unloading = True
        self._refresh()
        try:
            await self.bridge.unload()
        except TaskFailed as exc:  # pragma: no cover - unload does not raise in practice
            self.banner.show_message(f"Unloading failed: {exc}", "error")
            return
        finally:
            self.unloading = False
        if self.closing:
            return
        self.loaded = None
        engine = self.bridge.engine
        self.sampler.set_device("cpu" if engine is None else engine.device)
        self.gauges.set_device("no model loaded")
        self.gauges.set_kv_cache(None)
        self._refresh()
        emit(self.model_unloaded)

    def connect_dialog(self):
        """Model → Connect to a server…"""

        current = self.settings.model if is_server_url(self.settings.model) else None
        dialog = ConnectDialog(current, self.server_keys, self.connect_to, self.dialog_parent)
        dialog.open()
        return dialog

    def connect_to(self, base_url: str, model_id: str, api_key: Optional[str]):
        """Chat with ``model_id`` on the server at ``base_url``; awaitable like load_model. The key is saved
        privately (never in the settings)."""
        if self.server_keys is not None:
            self.server_keys.set(base_url, api_key)
        self._settings.set(dataclasses.replace(self.settings, model=f"{base_url}#{model_id}"))
        return self.load_model()

    def cancel_load(self) -> None:
        if self.loading and self._load is not None:
            self._load.cancel()
            self.load_bar.set_progress(self.load_bar.bar.value() / 1000, "Cancelling…")

    def shutdown(self) -> None:
        self.closing = True
        if self._load is not None:
            self._load.cancel()

    def _on_load_progress(self, events: list) -> None:
        for ev in events:
            if isinstance(ev, Progress) and self.loading:
                self.load_bar.set_progress(ev.fraction, ev.phase)
                emit(self.load_progress, ev.fraction, ev.phase)


__all__ = ["AUTO", "ModelController", "STARTER_OFFER", "UNLOAD_NOTE", "confirm_opt_in"]
