"""Run the real app (window, engine thread, store) in a child process with the slow stand-in engine and send
one message. Used by the SIGKILL test: the parent kills this process mid-reply. The profile comes from
XDG_DATA_HOME / XDG_CONFIG_HOME in the environment."""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    import qasync
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication
    from slow_engine import SlowEngine

    from redline.app.gui import build_window

    app = QApplication(sys.argv[:1])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    import os

    prefill_s = float(os.environ.get("REDLINE_TEST_PREFILL_S", "0"))
    window = build_window(engine_factory=lambda: SlowEngine(prefill_s=prefill_s))
    window.show()
    quit_after = int(os.environ.get("REDLINE_TEST_QUIT_AFTER_MS", "0"))

    def send_when_loaded(_info):
        window.input.setPlainText(sys.argv[1] if len(sys.argv) > 1 else "Tell me everything.")
        window.send()
        print("sent", flush=True)

    window.model_loaded.connect(lambda info: QTimer.singleShot(0, lambda: send_when_loaded(info)))
    if quit_after:  # as Ctrl+Q does: the window closes, then the app finishes as run_gui does
        from redline.app.gui import finish_quit

        closed = asyncio.Event()
        app.setQuitOnLastWindowClosed(False)
        window.model_loaded.connect(lambda _info: QTimer.singleShot(quit_after, lambda: (window.close(), closed.set())))
        window.start()
        with loop:
            loop.run_until_complete(closed.wait())
        return finish_quit(window)
    window.start()
    with loop:
        loop.run_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
