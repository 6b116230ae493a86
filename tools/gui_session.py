"""What the tools that drive the real window need (the screenshot tools, the long-day benchmark): a throwaway
profile, a Qt app on qasync's loop, and ways to wait."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"


def use_profile(folder: Path) -> None:
    """Conversations, settings and prefix-cache pages in ``folder``, never the user's (a run starts cold and leaves
    the user's pages alone). Offscreen unless DISPLAY is set (e.g. under xvfb-run)."""
    os.environ["XDG_DATA_HOME"] = str(folder / "data")
    os.environ["XDG_CONFIG_HOME"] = str(folder / "config")
    os.environ["REDLINE_KV_PAGES_DIR"] = str(folder / "kv-pages")
    if not os.environ.get("DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def throwaway_profile(prefix: str) -> Path:
    """``use_profile`` in a temporary folder, learned corrections there too."""
    profile = Path(tempfile.mkdtemp(prefix=prefix))
    use_profile(profile)
    os.environ["REDLINE_DATA_DIR"] = str(profile / "redline-data")
    sys.path.insert(0, str(ROOT))
    return profile


def qt_app():
    import qasync
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    asyncio.set_event_loop(qasync.QEventLoop(app, already_running=True))
    return app


def wait_until(cond, timeout_s: float = 600.0, what: str = "the window", poll_ms: int = 50) -> None:
    """Run the Qt event loop until cond() holds (a nested loop, as pytest-qt's waitUntil does), checking it
    every ``poll_ms``."""
    from PySide6.QtCore import QEventLoop, QTimer

    deadline = time.monotonic() + timeout_s
    if cond():
        return
    nested = QEventLoop()
    timer = QTimer()
    timer.timeout.connect(lambda: (cond() or time.monotonic() > deadline) and nested.quit())
    timer.start(poll_ms)
    nested.exec()
    timer.stop()
    if not cond():
        raise TimeoutError(f"timed out waiting for {what}")


def settle(seconds: float) -> None:
    """Run the Qt event loop for ``seconds`` (let rendering and queued work finish)."""
    end = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= end)
