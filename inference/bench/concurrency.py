"""The concurrency sweep: several requests arriving a little apart, decoded together or one at a time.

For each number of concurrent requests, the requests arrive ``arrival_gap_s`` apart (the first at 0) and
each asks for ``new_tokens`` tokens (end-of-sequence suppressed, so lengths are fixed). Three ways to serve
them, measured on the loaded model in the same run:

- ``continuous``: Redline's batcher (``generation/batch.Batcher``, what the engine service runs): a request joins
  the running batch at the next decode step and leaves when it ends;
- ``one-at-a-time``: the same path with room for one request (each waits for the one before);
- ``transformers``: transformers' own continuous batching (``init_continuous_batching``, its paged cache)
  with the same arrivals, for comparison.

Per request: TTFT from its arrival (queueing and prefill included) and latency from arrival to its last token.
Per level: p50/p95 of both, total decode throughput (all new tokens after each request's first, over the
wall time from the first arrival to the last token) and the KV cache's peak size against what the tokens
held at that moment need.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from ..decoding.options import DecodeOptions, SamplingSettings
from ..errors import UnsupportedConfiguration
from ..generation.lifecycle import DirectSink
from ..generation.request import GenerationRequest
from ..memory.oom import free_memory, is_oom
from ..stats import percentile

if TYPE_CHECKING:  # a type only: the local model loads with the engine
    from ..backends.local import LoadedModel

MODES = ("continuous", "one-at-a-time", "transformers")


@dataclass
class ConcurrencyRow:
    concurrency: int
    mode: str
    status: str = "ok"
    error: Optional[str] = None
    arrival_gap_s: float = 0.0
    new_tokens: int = 0  # per request
    ttft_ms_p50: Optional[float] = None
    ttft_ms_p95: Optional[float] = None
    latency_ms_p50: Optional[float] = None
    latency_ms_p95: Optional[float] = None
    throughput_tokens_per_s: Optional[float] = None  # all decode tokens ÷ wall time
    wall_s: Optional[float] = None
    kv_peak_bytes: Optional[int] = None  # the KV cache's memory at its largest (pages written)
    kv_needed_bytes: Optional[int] = None  # what the tokens held at that moment need
    ttft_ms: list[float] = field(default_factory=list)  # per request, in arrival order
    latency_ms: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def kv_overhead(self) -> Optional[float]:
        if not self.kv_peak_bytes or not self.kv_needed_bytes:
            return None
        return self.kv_peak_bytes / self.kv_needed_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kv_overhead"] = self.kv_overhead
        return d


def schedule_ceiling(one_at_a_time: ConcurrencyRow) -> Optional[float]:
    """The most any way of serving these arrivals could gain over ``one_at_a_time`` (its row, same requests):
    no request can end before it arrives plus the time it takes alone (one at a time's, from when it got the
    engine to its last token), since a batched step is never faster for a sequence than a step of that
    sequence alone. So no wall time is under the latest of those ends — about the last arrival plus one
    request's own time — and the throughput ratio against one at a time is at most its wall time over that.
    The faster one request is alone, the lower this ceiling: it is a property of the arrivals and of the
    machine's speed, not of the batching."""
    r = one_at_a_time
    if r.status != "ok" or not r.latency_ms or not r.wall_s:
        return None
    gap = r.arrival_gap_s
    ends = [i * gap + ms / 1000 for i, ms in enumerate(r.latency_ms)]
    own = [end - max(i * gap, ends[i - 1] if i else 0.0) for i, end in enumerate(ends)]
    floor = max(i * gap + t for i, t in enumerate(own))
    return r.wall_s / floor if floor > 0 else None


def _fill(row: ConcurrencyRow, ttfts: list[float], latencies: list[float], tokens: int, wall: float) -> None:
    row.ttft_ms, row.latency_ms = ttfts, latencies
    row.ttft_ms_p50, row.ttft_ms_p95 = percentile(ttfts, 0.5), percentile(ttfts, 0.95)
    row.latency_ms_p50, row.latency_ms_p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
    row.wall_s = wall
    row.throughput_tokens_per_s = tokens / wall if wall > 0 else None


def _redline(
    target: LoadedModel,
    prompts: list[list[int]],
    new_tokens: int,
    gap: float,
    room: int,
    should_cancel: Callable[[], bool],
    row: ConcurrencyRow,
) -> None:

    # lazy: the batcher loads with the engine; the public surface imports this module (schedule_ceiling) at start-up
    from ..generation.batch import Batcher

    batcher = Batcher(target, room)
    kv = batcher.dec.kv
    per_token = batcher.kv_bytes_per_token()  # the cost module's, at the cache's own dtype
    sampling = SamplingSettings(max_new_tokens=new_tokens, temperature=0, min_new_tokens=new_tokens)
    start = time.perf_counter()
    arrivals = [start + i * gap for i in range(len(prompts))]
    handles: list[DirectSink] = []
    waiting = list(range(len(prompts)))
    peak = needed_at_peak = 0
    while (waiting or len(batcher)) and not should_cancel():
        now = time.perf_counter()
        while waiting and arrivals[waiting[0]] <= now and len(batcher) < room:
            i = waiting.pop(0)
            handle = DirectSink()
            handles.append(handle)
            batcher.add(
                handle,
                GenerationRequest(input_ids=prompts[i], sampling=sampling, options=DecodeOptions("fast")),
                arrivals[i],
            )
        if len(batcher):
            batcher.step()
            touched = kv.touched_bytes()  # what it takes of memory: the pool has room reserved beyond
            if touched >= peak:
                peak = touched
                needed_at_peak = max(needed_at_peak, per_token * sum(a.seq.position + 1 for a in batcher.active))
        elif waiting:
            time.sleep(max(0.0, min(0.01, arrivals[waiting[0]] - time.perf_counter())))
    results = [h.result for h in handles if h.result is not None]
    if len(results) < len(prompts):
        row.status = "cancelled"
        return
    ends = [arrivals[i] + r.total_s for i, r in enumerate(results)]
    tokens = sum(max(0, r.new_tokens - 1) for r in results)
    _fill(
        row,
        [r.submitted_ttft_ms for r in results],
        [(e - a) * 1000 for e, a in zip(ends, arrivals)],
        tokens,
        max(ends) - start,
    )
    row.kv_peak_bytes, row.kv_needed_bytes = peak, needed_at_peak or None


def _transformers(
    target: LoadedModel,
    prompts: list[list[int]],
    new_tokens: int,
    gap: float,
    should_cancel: Callable[[], bool],
    row: ConcurrencyRow,
) -> None:
    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: transformers loads on the engine's thread, never at import
    from transformers import ContinuousBatchingConfig

    sampling = SamplingSettings(max_new_tokens=new_tokens, temperature=0, min_new_tokens=new_tokens)
    # lazy: transformers' strategies load with the engine, not with the public surface
    from ..decoding.hf import generation_config

    cfg = generation_config(target, sampling, DecodeOptions("kv"), new_tokens)
    longest = max(len(p) for p in prompts) + new_tokens
    page = 64
    cb = ContinuousBatchingConfig(
        page_size=page,
        num_blocks=len(prompts) * -(-longest // page) + 1,
        max_batch_tokens=max(256, sum(len(p) for p in prompts) + len(prompts)),
    )
    manager = target.model.init_continuous_batching(generation_config=cfg, continuous_batching_config=cb)
    manager.start()
    try:
        start = time.perf_counter()
        arrivals = [start + i * gap for i in range(len(prompts))]
        ids: dict[str, int] = {}
        with torch.inference_mode():
            for i, p in enumerate(prompts):
                time.sleep(max(0.0, arrivals[i] - time.perf_counter()))
                rid = manager.add_request(p, request_id=f"r{i}", max_new_tokens=new_tokens, record_timestamps=True)
                ids[rid] = i
        done: dict[int, object] = {}
        deadline = time.perf_counter() + 600
        while len(done) < len(prompts) and time.perf_counter() < deadline and not should_cancel():
            out = manager.get_result(timeout=0.5)
            if out is not None and out.is_finished():
                done[ids[out.request_id]] = out
    finally:
        manager.stop(block=True)
        destroy = getattr(target.model, "destroy_cached_continuous_batching_manager", None)
        if callable(destroy):
            destroy()
    if len(done) < len(prompts):
        row.status = "cancelled"
        return
    ttfts, latencies, ends, tokens = [], [], [], 0
    for i in range(len(prompts)):
        stamps = getattr(done[i], "timestamps", None) or []
        if not stamps:
            raise RuntimeError("transformers' continuous batching recorded no token timestamps")
        ttfts.append((stamps[0] - arrivals[i]) * 1000)
        latencies.append((stamps[-1] - arrivals[i]) * 1000)
        ends.append(stamps[-1])
        tokens += max(0, len(done[i].generated_tokens) - 1)
    _fill(row, ttfts, latencies, tokens, max(ends) - start)


def run_concurrency(
    target: LoadedModel,
    prompts: Sequence[list[int]],
    levels: Sequence[int],
    new_tokens: int,
    arrival_gap_s: float = 0.5,
    modes: Sequence[str] = MODES,
    progress: Optional[Callable[[float, str], None]] = None,
    should_cancel: Optional[Callable[[], bool]] = None,
    on_row: Optional[Callable[[ConcurrencyRow], None]] = None,
) -> list[ConcurrencyRow]:
    """One row per level × mode; a failing mode becomes that row's error and the sweep goes on."""
    # lazy: fastpath imports torch (torch loads on the engine's thread, never at import)
    from ..decoding.fastpath import supports

    bad = [m for m in modes if m not in MODES]
    if bad:
        raise UnsupportedConfiguration(f"Unknown concurrency mode {bad[0]!r}.", f"Choose from {', '.join(MODES)}.")
    progress = progress or (lambda f, p: None)
    should_cancel = should_cancel or (lambda: False)
    reason = supports(target.model)
    rows = []
    units, done = max(1, len(levels) * len(modes)), 0
    for n in levels:
        batch = [list(prompts[i % len(prompts)]) for i in range(n)]
        for mode in modes:
            row = ConcurrencyRow(n, mode, arrival_gap_s=arrival_gap_s, new_tokens=new_tokens)
            progress(done / units, f"{n} concurrent, {mode}")
            if should_cancel():
                row.status = "cancelled"
            elif mode != "transformers" and reason:
                row.status, row.error = "error", f"the fast path cannot run this model ({reason})"
            else:
                try:
                    if mode == "transformers":
                        _transformers(target, batch, new_tokens, arrival_gap_s, should_cancel, row)
                    else:
                        _redline(
                            target,
                            batch,
                            new_tokens,
                            arrival_gap_s,
                            n if mode == "continuous" else 1,
                            should_cancel,
                            row,
                        )
                except Exception as exc:  # one failing mode must not lose the others' rows
                    free_memory(target.device)
                    row.status = "oom" if is_oom(exc) else "error"
                    row.error = f"{type(exc).__name__}: {exc}"
            done += 1
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows
