"""`redline --smoke-test`: start the real window without a model, check it, and exit.

For installed wheels and frozen bundles, where a missing package file or Qt plugin only shows at run
time. It builds the real main window and the About dialog (offscreen unless QT_QPA_PLATFORM says
otherwise), shows them, lets Qt process events briefly, and checks the window icon, the stylesheet and
the version. It never loads a model, never imports torch, and never touches the user's data: the
conversation store is a temporary file and the settings are the defaults, neither read nor written.
Prints one JSON object; exit status 0 when every check passed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil
from PySide6.QtWidgets import QApplication

from ..ui.about import AboutDialog
from ..ui.bridge import EngineBridge
from ..ui.window.main_window import MainWindow
from . import __version__
from .gui import about_info, configure_application
from .settings import Settings
from .store import Store

EVENT_PROCESSING_S = 0.5  # long enough for the first paint and the memory sampler's first reading
EXPOSE_TIMEOUT_S = 10.0


def _process_events_for(app, seconds: float, until=None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        app.processEvents()
        if until is not None and until():
            return
        time.sleep(0.01)


def run_smoke_test() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    app = QApplication.instance() or QApplication(sys.argv[:1])
    configure_application(app)
    with tempfile.TemporaryDirectory(prefix="redline-smoke-") as tmp:
        store = Store(Path(tmp) / "conversations.sqlite3")
        info = about_info(store, settings_file="(defaults: the smoke test reads no settings)")
        # No engine task is ever submitted, so the worker never creates the engine or imports torch.
        window = MainWindow(EngineBridge(), store, Settings(), lambda _settings: None, about=info)
        window.show()
        handle = window.windowHandle()
        _process_events_for(app, EXPOSE_TIMEOUT_S, until=lambda: handle is not None and handle.isExposed())
        shown_after_s = time.time() - psutil.Process().create_time()
        about = AboutDialog(info, window)
        about.show()
        _process_events_for(app, EVENT_PROCESSING_S)
        checks = {
            "window_visible": window.isVisible(),
            "window_exposed": handle is not None and handle.isExposed(),
            "window_icon": not window.windowIcon().isNull(),
            "application_icon": not app.windowIcon().isNull(),
            "stylesheet": "QMainWindow" in window.styleSheet(),
            "about_version": about.value("Version") == __version__,
            "torch_not_imported": "torch" not in sys.modules,
        }
        about.close()
        window.shutdown()
        window.deleteLater()
        store.close()
        _process_events_for(app, 0.05)
    report = {
        "ok": all(checks.values()),
        "checks": checks,
        "version": __version__,
        "platform": app.platformName(),
        "window_shown_after_s": round(shown_after_s, 2),
    }
    print(json.dumps(report))
    return 0 if report["ok"] else 1
