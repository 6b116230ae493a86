"""Python's cyclic garbage collected on the UI thread only, on a timer.

Why: garbage can hold Qt objects (a chart's items, a widget caught in a cycle), and automatic collection runs on
whichever thread happens to allocate — usually the engine's, which allocates the most. A Qt object destroyed
there while the UI thread is inside Qt can deadlock both. pyqtgraph's ``GarbageCollector`` does the same for the
same reason; this one avoids importing pyqtgraph at start-up (the speed lab imports it when first opened).
Explicit collections the engine asks for (an unload) go through ``EngineThread``'s collector, also on this thread.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 1000


class UiGarbageCollector(QObject):
    """Turns automatic collection off and collects each generation past its threshold, every second."""

    def __init__(self, parent: QObject | None = None, interval_ms: int = INTERVAL_MS):
        super().__init__(parent)
        self.thresholds = gc.get_threshold()
        self.was_enabled = gc.isenabled()
        gc.disable()
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.check)
        self.timer.start(interval_ms)

    def check(self) -> None:
        counts = gc.get_count()
        for generation in range(3):  # a generation is collected only when the younger one was
            if counts[generation] <= self.thresholds[generation]:
                break
            gc.collect(generation)

    def stop(self) -> None:
        """Back to automatic collection (the app is quitting, or a test ends)."""
        self.timer.stop()
        if self.was_enabled:
            gc.enable()
