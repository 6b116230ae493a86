"""The desktop app's entry: settings and store from disk, the bridge to the engine, the window, qasync's loop."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Optional

import qasync
from PySide6.QtWidgets import QApplication

from ..inference import models_dir
from ..ui.about import AboutInfo
from ..ui.bridge import EngineBridge
from ..ui.garbage import UiGarbageCollector
from ..ui.lazy_panel import LazyPanel
from ..ui.style import app_icon
from ..ui.window.main_window import MainWindow
from . import __license__, __version__
from .cli_tools import approvals_path, default_mcp_path
from .presets import PresetStore
from .private_files import data_dir
from .server_keys import ServerKeys
from .settings import load_settings, save_settings, settings_path
from .store import Store, open_store
from .trust_store import TrustStore

APP_ID = "io.github.redline_app.Redline"  # reverse-DNS id: the .desktop file and AppStream metadata use it


def configure_application(app) -> None:
    """Name, icon and desktop-file id of the QApplication (Wayland matches the window to the .desktop file)."""

    app.setApplicationName("Redline")
    app.setApplicationDisplayName("Redline")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName(APP_ID)
    app.setWindowIcon(app_icon())


def about_info(store: Store, settings_file=None):
    """What Help → About shows about this installation: version, licence, where its files are."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import constants as hf_constants

    return AboutInfo(
        version=__version__,
        licence=__license__,
        paths=(
            ("Conversations", str(store.path)),
            ("Settings", str(settings_file or settings_path())),
            ("Converted models", str(models_dir(create=False))),
            ("Hugging Face cache", str(hf_constants.HF_HUB_CACHE)),
        ),
    )


def build_window(
    model: Optional[str] = None,
    store: Optional[Store] = None,
    engine_factory=None,
    presets: Optional[PresetStore] = None,
):
    """Create the window (without showing it). Tests use this with their own store and engine.

    Without a store, the conversation database is opened with ``open_store``: a corrupt or locked
    database never stops the window from opening; the window says what happened."""

    settings, warning = load_settings()
    store_warning = None
    if store is None:
        store, store_warning = open_store()
    engine = EngineBridge(
        engine_factory, max_active=settings.max_active_replies, max_queued=settings.max_queued_requests
    )
    window = MainWindow(
        engine,
        store,
        settings,
        save_settings,
        [w for w in (warning, store_warning) if w],
        presets or PresetStore(),
        about=about_info(store),
        trust=TrustStore(),
        server_keys=ServerKeys(),
        mcp_path=default_mcp_path(),  # the MCP servers the chats may use (Settings → Tools edits it)
        approvals_path=approvals_path(),  # the user's answers to tool calls ("Always allow", each server's trust)
    )
    add_speed_lab(window, engine)
    return window


def add_speed_lab(window, engine) -> None:
    """The speed lab shares the chat's engine; built when its tab is first opened. Its Model field starts as
    the chat's model (a server's address when the chat is connected to one) and follows each load."""

    def build():
        # lazy: speedlab imports pyqtgraph (the charts' library loads when a chart is first shown)
        from ..ui.speedlab import SpeedLabPanel

        # lazy: speedlab imports pyqtgraph (the charts' library loads when a chart is first shown)
        from ..ui.speedlab.link import follow_speed_lab

        presets = window.presets
        panel = SpeedLabPanel(
            engine,
            runs_dir=data_dir() / "speedlab-runs",
            model=window.settings.model or "starter",
            server_keys=ServerKeys(),
            presets=(lambda: presets.presets()) if presets is not None else None,
        )
        follow_speed_lab(window, panel)  # the window's speed gauges follow the lab while it runs
        window.model_loaded.connect(lambda _report: panel.follow_model(window.settings.model))
        return panel

    window.add_panel(LazyPanel(build), "Speed lab")


def run_gui(model: Optional[str] = None, engine_factory=None) -> int:

    app = QApplication.instance() or QApplication(sys.argv[:1])
    configure_application(app)
    collector = UiGarbageCollector(app)  # Qt objects in Python's garbage are destroyed on this thread only
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    window = build_window(model, engine_factory=engine_factory)
    window.show()
    window.start(model)
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    with loop:
        loop.run_until_complete(closed.wait())
    collector.stop()
    return finish_quit(window)


def finish_quit(window) -> int:
    """After the window has closed: stop the engine (closing did; this asks what it found), close the store, and
    leave at once.

    Everything is saved by then (the replies with their figures, the settings when they changed, the store closed),
    so the process ends with ``os._exit``: Python's own finalisation would collect and tear down every module
    (torch, transformers: millions of objects), which took 3.4-5.7 s on a 2-core machine with the starter loaded
    and nothing running (``tools/benchmarks/quit_time.py``), while the window was already gone."""

    window.shutdown()
    window.store.close()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Had the engine not stopped in time (a step longer than that, or a load that cannot be interrupted), the
    # reply is saved all the same: leaving now instead of freezing on exit.
    os._exit(0)
    return 0  # pragma: no cover - os._exit does not return (tests replace it)
