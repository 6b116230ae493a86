"""How long quitting takes: the real app on a fresh profile loads a model, sits idle (or, with --mid-reply, starts
a long reply and waits for its first tokens), then quits as Ctrl+Q does (the window closes, then the app finishes
as ``run_gui`` does). Prints the time from the close to the process's exit, and where it went (the window's
shutdown step by step, the interpreter's exit).

    QT_QPA_PLATFORM=offscreen .venv/bin/python tools/benchmarks/quit_time.py [--model starter] [--runs 3] [--mid-reply]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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
# Inside the engine's thread: the prefix cache written to disk at the end (its start and end), and the last step.
from redline.inference.backends.local import LoadedModel

_persist = LoadedModel.persist_prefix_cache
def persist_timed(self):
    mark("prefix cache: writing to disk")
    out = _persist(self)
    mark(f"prefix cache: {out} pages written")
    return out
LoadedModel.persist_prefix_cache = persist_timed
# The engine thread's steps (a step is not cut in the middle): the one under way at the close, and how long
# steps took before it, in wall time and in the thread's own CPU time (a busy machine starves a niced thread).
from redline.inference.service.scheduler import EngineService
steps = []
_step = EngineService._step
def step_timed(self):
    t0, c0 = time.monotonic(), time.thread_time()
    try:
        return _step(self)
    finally:
        steps.append((t0, time.monotonic(), time.thread_time() - c0))
EngineService._step = step_timed

_hide = window.hide
def hide_timed():
    _hide()
    mark("window off the screen")
window.hide = hide_timed
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

def loaded(_report):
    if not os.environ.get("MID_REPLY"):
        QTimer.singleShot(int(os.environ["IDLE_MS"]), close)
        return
    # Mid-reply: a long answer, closed once its first tokens have been shown for IDLE_MS.
    window.input.setPlainText("Write a long story about a lighthouse keeper, in ten chapters.")
    window.send()
    def started():
        if window.generation is not None and window.generation.new_tokens >= 4:
            QTimer.singleShot(int(os.environ["IDLE_MS"]), close)
        else:
            QTimer.singleShot(20, started)
    started()

window.model_loaded.connect(loaded)
window.start(os.environ["MODEL"])
with loop:
    loop.run_until_complete(closed.wait())
t0 = marks[0][1]
for a, b, cpu in steps:
    if a <= t0 < b:
        mark(f"the step under way at the close ended (it took {b - a:.3f} s, {cpu:.3f} s of CPU)")
        marks[-1] = (marks[-1][0], b)
last = [(b - a, cpu) for a, b, cpu in steps if b <= t0][-10:]
if last:
    wall = sorted(w for w, _ in last)[len(last) // 2]
    cpu = sorted(c for _, c in last)[len(last) // 2]
    mark(f"the {len(last)} steps before the close: median {wall * 1000:.0f} ms ({cpu * 1000:.0f} ms of CPU)")
    marks[-1] = (marks[-1][0], t0)
print("MARKS", json.dumps([(w, round(t - t0, 3)) for w, t in marks]), flush=True)
print("EXITING", time.time(), flush=True)
sys.exit(finish_quit(window))  # the app's own way out: what follows it is what the process takes to end
"""


def one(model: str, idle_ms: int, mid_reply: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XDG_DATA_HOME=f"{tmp}/data", XDG_CONFIG_HOME=f"{tmp}/config", MODEL=model)
        env["IDLE_MS"] = str(idle_ms)
        env["MID_REPLY"] = "1" if mid_reply else ""
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
    ap.add_argument("--mid-reply", action="store_true", help="quit while a long reply is being written")
    args = ap.parse_args()
    for i in range(args.runs):
        r = one(args.model, args.idle_ms, args.mid_reply)
        print(
            f"run {i + 1}: quit in {r['total_s']:.2f} s (after the window's shutdown {r['after_the_window_s']} s), "
            f"exit code {r['rc']}; steps from the close: {r['marks']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
