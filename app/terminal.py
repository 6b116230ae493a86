"""Terminal helpers: a progress bar on stderr that redraws in place."""

from __future__ import annotations

import sys
import time


class TerminalProgress:
    def __init__(self, stream=None, width: int = 30):
        # sys.stderr is looked up now, not when this module was imported: it may have been replaced since.
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.last_draw = 0.0
        self.last_phase = ""
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def __call__(self, fraction: float, phase: str) -> None:
        now = time.monotonic()
        if not self.tty:
            if phase.split(":")[0] != self.last_phase.split(":")[0]:
                print(f"[{fraction * 100:3.0f}%] {phase}", file=self.stream, flush=True)
            self.last_phase = phase
            return
        if now - self.last_draw < 0.1 and fraction < 1.0 and phase == self.last_phase:
            return
        self.last_draw, self.last_phase = now, phase
        filled = int(self.width * max(0.0, min(1.0, fraction)))
        bar = "#" * filled + "-" * (self.width - filled)
        print(f"\r[{bar}] {fraction * 100:3.0f}% {phase[:60]:<60}", end="", file=self.stream, flush=True)
        if fraction >= 1.0:
            print(file=self.stream, flush=True)

    def done(self) -> None:
        if self.tty and self.last_phase:
            print(file=self.stream, flush=True)
