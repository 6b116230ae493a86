"""A stand-in engine that streams words slowly and never imports torch: for tests that must catch the app
mid-reply (SIGKILL) deterministically. It follows the Engine interface the window's tasks use."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from redline.inference.events import GenerationResult, StatsEvent, TokenEvent
from redline.inference.loading.precision import parse_precision


def word(i: int) -> str:
    return f"word{i} "


@dataclass
class _Loaded:
    name: str
    precision: object
    device: str = "cpu"
    memory_bytes: int = 0
    load_seconds: float = 0.0
    notes: list = field(default_factory=list)


class SlowEngine:
    def __init__(self, interval_s: float = 0.05, tokens: int = 2000):
        self.device = "cpu"
        self.interval_s = interval_s
        self.tokens = tokens
        self.target = None
        self.draft = None
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def load(self, model, precision, progress=None, opt_in=None):
        self._cancel.clear()
        self.target = _Loaded(f"slow-{model}", precision if hasattr(precision, "label") else parse_precision("fp32"))
        return self.target

    def load_draft(self, *args, **kwargs):  # pragma: no cover - not used
        raise NotImplementedError

    def unload_draft(self) -> None:
        self.draft = None

    def unload(self) -> None:
        self.target = None

    def chat(
        self, messages, sampling, options, on_event=None, context=None, request_cancelled=None
    ) -> GenerationResult:
        self._cancel.clear()
        start = time.perf_counter()
        text, finish = "", "length"
        for i in range(min(self.tokens, sampling.max_new_tokens)):
            if self._cancel.is_set() or (request_cancelled is not None and request_cancelled()):
                finish = "cancelled"
                break
            time.sleep(self.interval_s)
            text += word(i)
            if on_event:
                on_event(TokenEvent(i, i, word(i), time.perf_counter() - start))
                on_event(StatsEvent(i + 1, time.perf_counter() - start, 1 / self.interval_s, None))
        n = len(text.split())
        return GenerationResult(
            text=text,
            token_ids=list(range(n)),
            prompt_tokens=1,
            new_tokens=n,
            finish_reason=finish,
            strategy=options.strategy,
            precision="fp32",
            tokens_per_s=1 / self.interval_s,
            total_s=time.perf_counter() - start,
        )
