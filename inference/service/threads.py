"""Replies from a remote model run on threads of their own, several at once: the server batches them, so the
engine's scheduler must not run them one at a time. The scheduler hands each such generation here
(``EngineService._step``) and waits for these threads only before a job that needs the engine alone (a load,
the speed lab)."""

from __future__ import annotations

import threading
from typing import Callable

from redline.inference.service.requests import Started

MAX_REMOTE = 16  # replies in flight to one server at once; more wait in the queue


class RemoteRuns:
    def __init__(self, on_change: Callable[[], None], limit: int = MAX_REMOTE):
        self.limit = limit
        self._on_change = on_change  # wakes the scheduler when a reply ends
        self._lock = threading.Lock()
        self._active: dict[int, object] = {}  # handle id → handle

    def __len__(self) -> int:
        with self._lock:
            return len(self._active)

    def has_room(self) -> bool:
        return len(self) < self.limit

    def start(self, job, engine) -> None:
        """Run the generation ``job`` (the scheduler's _Job) against ``engine``'s remote target, on a thread."""
        handle, request = job.handle, job.request
        target = engine.target
        with self._lock:
            self._active[handle.id] = handle

        def run():
            try:
                handle.emit(Started(note=f"sent to {target.server}"))
                if request.messages is None:
                    from redline.inference.errors import UnsupportedConfiguration

                    raise UnsupportedConfiguration(
                        "A model on a server takes chat messages, not token ids.", "Send messages."
                    )
                result = target.chat(request.messages, request.sampling, handle.emit, lambda: handle.cancelled)
                handle.finish(result)
            except Exception as exc:  # its failure is its own
                handle.fail(exc)
            finally:
                with self._lock:
                    self._active.pop(handle.id, None)
                self._on_change()

        threading.Thread(target=run, name=f"redline-remote-{handle.id}", daemon=True).start()

    def cancel_all(self, note: str = "") -> None:
        with self._lock:
            handles = list(self._active.values())
        for handle in handles:
            handle.cancel()
