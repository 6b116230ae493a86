"""Work off the UI thread for the model browser: a hub search, a repository's headers, a download, a delete.

Each job runs on a Python thread pool (``redline-browse-N``; a download on its own pool, so a search is not kept
waiting behind it) and its result comes back through a queued Qt signal, so the callbacks run on the UI thread.
A job's progress too. Jobs superseded by a newer one of the same kind (a second search typed before the first
answered) have their results dropped."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from PySide6.QtCore import QObject, Qt, Signal

from ..signals import emit


class BackgroundWork(QObject):
    finished = Signal(int, object, object)  # job id, result, error
    progressed = Signal(int, float, str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._pools = {
            "browse": ThreadPoolExecutor(max_workers=1, thread_name_prefix="redline-browse"),
            "fetch": ThreadPoolExecutor(max_workers=1, thread_name_prefix="redline-fetch"),
        }
        self._ids = itertools.count(1)
        self._jobs: dict[int, tuple[str, Callable, Callable, Optional[Callable]]] = {}
        self._latest: dict[str, int] = {}
        self.finished.connect(self._finished, Qt.QueuedConnection)
        self.progressed.connect(self._progressed, Qt.QueuedConnection)

    def run(
        self,
        kind: str,
        fn: Callable[..., Any],
        on_done: Callable[[Any], None],
        on_error: Callable[[BaseException], None],
        on_progress: Optional[Callable[[float, str], None]] = None,
        pool: str = "browse",
    ) -> int:
        """Run ``fn()`` (or ``fn(progress)`` when ``on_progress`` is given) off the UI thread."""
        job = next(self._ids)
        self._jobs[job] = (kind, on_done, on_error, on_progress)
        self._latest[kind] = job

        def work():
            try:
                if on_progress is not None:
                    result = fn(lambda fraction, phase: emit(self.progressed, job, float(fraction), str(phase)))
                else:
                    result = fn()
            except BaseException as exc:  # handed to the UI thread, which says it in one sentence
                emit(self.finished, job, None, exc)
                return
            emit(self.finished, job, result, None)

        self._pools[pool].submit(work)
        return job

    def busy(self, kind: str) -> bool:
        job = self._latest.get(kind)
        return job is not None and job in self._jobs

    def _finished(self, job: int, result, error) -> None:
        entry = self._jobs.pop(job, None)
        if entry is None:
            return
        kind, on_done, on_error, _ = entry
        if self._latest.get(kind) != job:
            return  # superseded
        if error is not None:
            on_error(error)
        else:
            on_done(result)

    def _progressed(self, job: int, fraction: float, phase: str) -> None:
        entry = self._jobs.get(job)
        if entry is not None and entry[3] is not None:
            entry[3](fraction, phase)

    def shutdown(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
