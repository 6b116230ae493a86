"""Progress reporting and cancellation for long operations (fetch, convert, load).

transformers draws its own tqdm bars while it converts and loads weights. We
route those bars into our callback (mapped onto a sub-range of 0..1) through
transformers' tqdm hook, which also gives us a place to honour cancellation in
the middle of a load.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Optional

from tqdm.auto import tqdm as base_tqdm

from .errors import Cancelled

ProgressFn = Callable[[float, str], None]
CancelFn = Callable[[], bool]

_hook_lock = threading.Lock()


def noop_progress(fraction: float, phase: str) -> None:  # pragma: no cover - trivial
    pass


def check_cancel(should_cancel: Optional[CancelFn]) -> None:
    if should_cancel is not None and should_cancel():
        raise Cancelled("Cancelled by the user.")


@contextlib.contextmanager
def transformers_progress(
    progress: ProgressFn, lo: float, hi: float, phase: str, should_cancel: Optional[CancelFn] = None
):
    """Map transformers' tqdm bars onto ``progress`` in [lo, hi]; raise Cancelled on request."""
    # lazy: transformers loads on the engine's thread, never at import
    from transformers.utils import logging as hf_logging

    class _Reporting(base_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True  # our own callback replaces the terminal bar
            super().__init__(*args, **kwargs)
            self._total = kwargs.get("total") or (len(args[0]) if args and hasattr(args[0], "__len__") else None)
            self._done = 0
            self._desc = kwargs.get("desc") or phase

        def __iter__(self):
            for item in self.iterable:
                yield item
                self.update(1)

        def update(self, n=1):
            check_cancel(should_cancel)
            self._done += n or 0
            if self._total:
                frac = min(1.0, self._done / self._total)
                progress(lo + (hi - lo) * frac, phase if self._desc == phase else f"{phase}: {self._desc}")
            return True

    def hook(factory, args, kwargs):
        return _Reporting(*args, **kwargs)

    with _hook_lock:
        previous = hf_logging.set_tqdm_hook(hook)
        try:
            yield
        finally:
            hf_logging.set_tqdm_hook(previous)
