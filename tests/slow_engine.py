"""A stand-in engine that streams words slowly and never imports torch: for tests that must catch the app
mid-reply (SIGKILL, quitting, stopping during a long prefill) deterministically. It follows the Engine
interface the engine service and the window's tasks use."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from redline.inference.backends.base import Backend, Capabilities
from redline.inference.engine import LoadReport
from redline.inference.events import GenerationResult, Progress, StatsEvent, TokenEvent
from redline.inference.precision import parse_precision
from redline.inference.stats import decode_tokens_per_s, percentile, token_latencies_ms


def word(i: int) -> str:
    return f"word{i} "


@dataclass
class _Loaded(Backend):
    """A target that runs nothing itself (the SlowEngine runs its replies): the Backend interface's defaults, so
    the service sees one that runs every reply alone and keeps no KV cache."""

    name: str
    precision: object
    device: str = "cpu"
    memory_bytes: int = 0
    load_seconds: float = 0.0
    notes: list = field(default_factory=list)
    context_limit: int = 4096

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(("kv", "fast"), True, False, False, True, "batch")

    def reload_spec(self):
        return self.name, self.precision, None

    def generate(self, request, sink, submitted=None):
        raise AssertionError("the SlowEngine runs its replies")

    def release(self) -> None:
        pass


class SlowEngine:
    def __init__(self, interval_s: float = 0.05, tokens: int = 2000, prefill_s: float = 0.0):
        self.device = "cpu"
        self.interval_s = interval_s
        self.tokens = tokens
        self.prefill_s = prefill_s  # a long prompt: this long before the first token, stoppable meanwhile
        self.target = None
        self.draft = None

    def load(self, model, precision, progress=None, opt_in=None, should_cancel=None, **_):
        self.target = _Loaded(f"slow-{model}", precision if hasattr(precision, "label") else parse_precision("fp32"))
        return self.target

    def load_all(self, request, report, should_cancel=None):
        t = self.load(request.model, request.precision)
        report(Progress(1.0, "Loaded"))
        return LoadReport(t.name, "cpu", t.precision.label(), 0, 0.0, context_limit=t.context_limit)

    def run(self, request, sink, submitted=None) -> GenerationResult:
        stop = lambda: sink.cancelled  # noqa: E731
        began = time.perf_counter()
        result = self.chat(request.messages, request.sampling, request.options, sink.emit, should_cancel=stop)
        if submitted is not None:  # its wait in the queue, apart from its TTFT (counted from its own start)
            result.queued_ms = (began - submitted) * 1000
        return result

    def load_draft(self, *args, **kwargs):  # pragma: no cover - not used
        raise NotImplementedError

    def unload_draft(self) -> None:
        self.draft = None

    def unload(self) -> None:
        self.target = None

    def chat(self, messages, sampling, options, on_event=None, context=None, should_cancel=None) -> GenerationResult:
        start = time.perf_counter()
        stop = should_cancel or (lambda: False)
        text, finish = "", "length"
        times: list[float] = []
        while time.perf_counter() - start < self.prefill_s:  # "reading the prompt", checking the cancel
            if stop():
                finish = "cancelled"
                break
            time.sleep(0.01)
        for i in range(min(self.tokens, sampling.max_new_tokens) if finish == "length" else 0):
            if stop():
                finish = "cancelled"
                break
            time.sleep(self.interval_s)
            text += word(i)
            times.append(time.perf_counter() - start)
            if on_event:
                on_event(TokenEvent(i, i, word(i), time.perf_counter() - start))
                on_event(StatsEvent(i + 1, time.perf_counter() - start, 1 / self.interval_s, None))
        n = len(text.split())
        gaps = token_latencies_ms(times)  # the engine's definitions (redline.inference.stats), as fill_timing
        prompt = sum(len(str(m.get("content", "")).split()) for m in messages or []) + 3  # as measured: its words
        return GenerationResult(
            text=text,
            token_ids=list(range(n)),
            prompt_tokens=prompt,
            new_tokens=n,
            finish_reason=finish,
            strategy=options.strategy,
            precision="fp32",
            ttft_ms=times[0] * 1000 if times else None,
            per_token_ms=gaps,
            p50_ms=percentile(gaps, 0.5),
            p95_ms=percentile(gaps, 0.95),
            tokens_per_s=decode_tokens_per_s(times),
            total_s=time.perf_counter() - start,
            device="cpu",
        )
