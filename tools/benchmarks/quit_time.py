"""How long quitting takes: the real app on a fresh profile loads a model, sits idle, then quits as Ctrl+Q does
(the window closes, then the app finishes as ``run_gui`` does). Prints the time from the close to the process's
exit, and where it went (the window's shutdown step by step, the interpreter's exit).

    QT_QPA_PLATFORM=offscreen .venv/bin/python tools/quit_time.py [--model starter] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import asyncio, json, os, sys, time
import qasync
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from redline.app.gui import build_window, finish_quit

app = QApplication(sys.argv[:1])
loop = qasync.QEventLoop(app)
asyncio.set_event_loop(loop)
window = build_window()
marks = []

def mark(what):
    marks.append((what, time.monotonic()))

for name in ("server", "replies", "models", "sampler"):
    part = getattr(window, name)
    original = part.shutdown
    def timed(*a, _o=original, _n=name, **k):
        out = _o(*a, **k)
        mark(_n + " stopped")
        return out
    part.shutdown = timed
engine_shutdown = window.engine.shutdown
def engine_timed(*a, **k):
    out = engine_shutdown(*a, **k)
    mark("engine stopped")
    return out
window.engine.shutdown = engine_timed
window.show()
closed = asyncio.Event()
app.setQuitOnLastWindowClosed(False)

def close():
    mark("close")
    print("CLOSE", time.time(), flush=True)
    window.close()
    mark("window closed")
    closed.set()

window.model_loaded.connect(lambda _r: QTimer.singleShot(int(os.environ["IDLE_MS"]), close))
window.start(os.environ["MODEL"])
with loop:
    loop.run_until_complete(closed.wait())
t0 = marks[0][1]
print("MARKS", json.dumps([(w, round(t - t0, 3)) for w, t in marks]), flush=True)
print("EXITING", time.time(), flush=True)
sys.exit(finish_quit(window))  # the app's own way out: what follows it is what the process takes to end
"""


def one(model: str, idle_ms: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XDG_DATA_HOME=f"{tmp}/data", XDG_CONFIG_HOME=f"{tmp}/config", MODEL=model)
        env["IDLE_MS"] = str(idle_ms)
        env.setdefault("QT_QPA_PLATFORM", "offscreen")
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD], cwd=ROOT.parent, env=env, stdout=subprocess.PIPE, text=True
        )
        close_at = exiting_at = None
        marks = []
        for line in proc.stdout:
            if line.startswith("CLOSE"):
                close_at = float(line.split()[1])
            elif line.startswith("EXITING"):
                exiting_at = float(line.split()[1])
            elif line.startswith("MARKS"):
                marks = line.partition(" ")[2].strip()
        proc.wait()
        gone = time.time()
    if close_at is None:
        raise SystemExit(f"the app exited ({proc.returncode}) before it quit; is {model!r} available?")
    return {
        "total_s": round(gone - close_at, 3),
        "after_the_window_s": round(gone - exiting_at, 3) if exiting_at else None,
        "marks": marks,
        "rc": proc.returncode,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle-ms", type=int, default=3000, help="how long the app sits idle after the load")
    args = ap.parse_args()
    for i in range(args.runs):
        r = one(args.model, args.idle_ms)
        print(
            f"run {i + 1}: quit in {r['total_s']:.2f} s (after the window's shutdown {r['after_the_window_s']} s), "
            f"exit code {r['rc']}; steps from the close: {r['marks']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
