"""Replies whose target runs them elsewhere (a model on a server: ``Capabilities.concurrency == "threads"``) run on
threads of their own, several at once: the server batches them, so the scheduler must not run them one at a
time. The scheduler hands each such generation here and waits for these threads only before a job that
needs the engine alone (a load, the speed lab)."""

from __future__ import annotations

import threading
from typing import Callable

from redline.inference.events import Started

MAX_THREADED = 16  # replies in flight to one server at once; more wait in the queue


class ReplyThreads:
    def __init__(self, on_change: Callable[[], None], limit: int = MAX_THREADED):
        self.limit = limit
        self._on_change = on_change  # wakes the scheduler when a reply ends
        self._lock = threading.Lock()
        self._active: dict[int, object] = {}  # handle id → handle

    def __len__(self) -> int:
        with self._lock:
            return len(self._active)

    def has_room(self) -> bool:
        return len(self) < self.limit

    def start(self, handle, request, submitted: float, engine) -> None:
        """Run the generation ``request`` (its ``handle``) on ``engine``'s target, on a thread of its own."""
        target = engine.target
        with self._lock:
            self._active[handle.id] = handle

        def run():
            try:
                handle.emit(Started(note=f"sent to {getattr(target, 'server', target.name)}"))
                handle.finish(engine.run(request, handle, submitted))
            except Exception as exc:  # its failure is its own
                handle.fail(exc)
            finally:
                with self._lock:
                    self._active.pop(handle.id, None)
                self._on_change()

        threading.Thread(target=run, name=f"redline-reply-{handle.id}", daemon=True).start()

    def cancel_all(self) -> None:
        with self._lock:
            handles = list(self._active.values())
        for handle in handles:
            handle.cancel()
