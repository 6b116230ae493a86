"""The desktop app's entry: settings and store from disk, the engine thread, the window, qasync's loop."""
from __future__ import annotations

import asyncio
import os
import sys
from typing import Optional

from app.settings import load_settings, save_settings
from app.store import Store, open_store


def build_window(model: Optional[str] = None, store: Optional[Store] = None, engine_factory=None):
    """Create the window (without showing it). Tests use this with their own store and engine.

    Without a store, the conversation database is opened with ``open_store``: a corrupt or locked
    database never stops the window from opening; the window says what happened."""
    from ui.main_window import MainWindow
    from ui.worker import EngineThread

    settings, warning = load_settings()
    store_warning = None
    if store is None:
        store, store_warning = open_store()
    notice = " ".join(w for w in (warning, store_warning) if w) or None
    engine = EngineThread(engine_factory)
    window = MainWindow(engine, store, settings, save_settings, notice)
    return window


def run_gui(model: Optional[str] = None, engine_factory=None) -> int:
    from PySide6.QtWidgets import QApplication
    import qasync

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Redline")
    app.setApplicationDisplayName("Redline")
    app.setDesktopFileName("redline")
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    window = build_window(model, engine_factory=engine_factory)
    store = window.store
    window.show()
    window.start(model)
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    with loop:
        loop.run_until_complete(closed.wait())
    stopped = window.shutdown()
    store.close()
    if not stopped:
        # The engine did not stop within the time allowed (a step longer than that, or a load that
        # cannot be interrupted). The reply is saved; leave now instead of freezing on exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
