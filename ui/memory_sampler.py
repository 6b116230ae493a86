"""Reads memory figures on a thread of its own, so neither the UI nor the engine waits for NVML."""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, QThread, QTimer, Signal, Slot

from ..inference import memory_snapshot
from .signals import emit

FAST_MS = 400  # while generating or loading: more than twice a second
SLOW_MS = 2000


class _Sampler(QObject):
    sampled = Signal(object)

    def __init__(self):
        super().__init__()
        self.device = "cpu"
        self.timer = None

    @Slot()
    def start(self) -> None:
        self.timer = QTimer()  # no parent: deleted on this thread in cleanup(), where it was created
        self.timer.timeout.connect(self.sample)
        self.timer.start(SLOW_MS)
        self.sample()

    @Slot(str)
    def set_device(self, device: str) -> None:
        self.device = device
        self.sample()

    @Slot(bool)
    def set_fast(self, fast: bool) -> None:
        if self.timer is not None:
            self.timer.setInterval(FAST_MS if fast else SLOW_MS)
            if fast:
                self.sample()

    @Slot()
    def stop(self) -> None:
        if self.timer is not None:
            self.timer.stop()

    def cleanup(self) -> None:
        """Runs on the sampler thread as it finishes: Qt timers must be destroyed on their own thread."""
        if self.timer is not None:
            self.timer.stop()
            self.timer.deleteLater()
            self.timer = None

    @Slot()
    def sample(self) -> None:
        try:
            snap = memory_snapshot(self.device)
        except Exception as exc:  # reported as unreadable, never replaced by a guess
            snap = exc
        emit(self.sampled, snap)


class MemorySampler(QObject):
    sampled = Signal(object)  # MemorySnapshot, or the Exception that stopped the reading
    _set_device = Signal(str)
    _set_fast = Signal(bool)
    _stop = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self._thread = QThread()
        self._thread.setObjectName("redline-memory")
        self._sampler = _Sampler()
        self._sampler.moveToThread(self._thread)
        self._thread.started.connect(self._sampler.start)
        self._thread.finished.connect(self._sampler.cleanup, Qt.DirectConnection)
        self._sampler.sampled.connect(self.sampled)
        self._set_device.connect(self._sampler.set_device)
        self._set_fast.connect(self._sampler.set_fast)
        self._stop.connect(self._sampler.stop)
        self._thread.start()

    def set_device(self, device: str) -> None:
        emit(self._set_device, device)

    def set_fast(self, fast: bool) -> None:
        emit(self._set_fast, fast)

    def shutdown(self, timeout_ms: int = 1000) -> bool:
        emit(self._stop)
        self._thread.quit()
        return self._thread.wait(timeout_ms)
