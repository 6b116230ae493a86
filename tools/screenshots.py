"""Save PNGs of the main window with the starter model: mid-reply, finished, and draft tokens tinted.

Run with `make screenshots`. Uses a throwaway profile (conversations and settings go to a
temporary folder) and the Qt offscreen platform unless DISPLAY is set (e.g. under xvfb-run).
"""
from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"


def main() -> int:
    profile = Path(tempfile.mkdtemp(prefix="redline-shots-"))
    os.environ["XDG_DATA_HOME"] = str(profile / "data")
    os.environ["XDG_CONFIG_HOME"] = str(profile / "config")
    if not os.environ.get("DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    sys.path.insert(0, str(ROOT))

    import qasync
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from app.gui import build_window
    from app.settings import Settings, save_settings

    app = QApplication(sys.argv[:1])
    loop = qasync.QEventLoop(app, already_running=True)
    asyncio.set_event_loop(loop)

    def wait_until(cond, timeout_s=600.0):
        """Run the Qt event loop until cond() holds (a nested loop, as pytest-qt's waitUntil does)."""
        deadline = time.monotonic() + timeout_s
        if cond():
            return
        nested = QEventLoop()
        timer = QTimer()

        def check():
            if cond() or time.monotonic() > deadline:
                nested.quit()

        timer.timeout.connect(check)
        timer.start(50)
        nested.exec()
        timer.stop()
        if not cond():
            raise TimeoutError("timed out waiting for the window")

    def settle(seconds=0.4):
        end = time.monotonic() + seconds
        wait_until(lambda: time.monotonic() >= end)

    def shot(window, name):
        OUT.mkdir(parents=True, exist_ok=True)
        window.chat_view.render_dirty()
        settle(0.2)
        path = OUT / name
        window.grab().save(str(path))
        print(f"saved {path.relative_to(ROOT)}")

    save_settings(Settings(model="starter", temperature=0, max_new_tokens=200))
    window = build_window()
    window.resize(1280, 800)
    window.show()
    loaded = []
    window.model_loaded.connect(loaded.append)
    finished = []
    window.reply_finished.connect(finished.append)
    window.start()
    wait_until(lambda: loaded or (window.banner.isVisible() and window.banner.kind == "error"))
    if not loaded:
        print(f"the starter did not load: {window.banner.label.text()}", file=sys.stderr)
        return 1

    window.input.setPlainText("What is the capital of France?")
    window.send()
    wait_until(lambda: finished)
    window.input.setPlainText("Write a Python function that checks whether a number is prime.")
    window.send()
    wait_until(lambda: window.generation is not None and len(window.generation.text) > 260)
    settle(0.6)
    shot(window, "chat-mid-reply.png")
    wait_until(lambda: len(finished) == 2)
    settle(1.0)
    shot(window, "chat-finished.png")

    # Prompt lookup copies tokens from the conversation: those are tinted like draft tokens.
    import dataclasses
    window.new_chat()
    window.apply_settings(dataclasses.replace(window.settings, strategy="prompt-lookup", max_new_tokens=120))
    window.input.setPlainText("Repeat this sentence exactly: The quick brown fox jumps over the lazy dog "
                              "near the river bank at dawn.")
    window.send()
    wait_until(lambda: len(finished) == 3)
    window.resize(1500, 800)
    window.show_settings()
    settle(1.0)
    shot(window, "chat-prompt-lookup-settings.png")
    window.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
