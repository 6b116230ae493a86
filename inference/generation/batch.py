"""Continuous batching on the fast decode path: every fast-path generation runs here, a reply alone being a
batch of one.

Sequences join and leave between decode steps: each ``step()`` reads one chunk of one new request's
prompt (so a long prompt never stalls the others for long, and its cancel is seen between chunks), then
runs one decode step for every sequence already generating — one batched product per projection,
attention per sequence over its own pages of the KV cache. A sequence that ends (end of sequence, a
stop string, its length, a cancel) leaves at once and its pages are freed; the next request takes its
place at the next step. Each sequence keeps its own sampling, stopping, seed and event stream (its
``Generation``), so its output is what it would be alone.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections import deque
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable, Optional

from ..cost import kv_cache_bytes
from ..decoding.fast_loop import FastSequence, wants_compile
from ..estimate.fit import detect_target
from ..events import GenerationResult, PrefillProgress, Started
from ..kernels.cpu import library as native
from ..memory.measured import PeakMemory
from ..paths import kv_pages_dir
from .lifecycle import Generation, Sink
from .request import GenerationRequest, Prepared, prepare

PREFILL_CHUNK = 256  # most prompt tokens read per scheduler step (a prompt read with no reply streaming beside it)
MIN_PREFILL_CHUNK = 4  # fewest read alone: a chunk's fixed costs (a pass over every weight) would outweigh its tokens
# Fewest read in the same pass as the streaming replies' step (mixed), which makes that pass over the weights anyway:
# there a chunk's cost is its rows' attention over the prompt read so far, which at 1,800 positions made even four
# rows (the floor above) 10-15 ms beside a 4 ms step on the starter (tools/benchmarks/prefill_stall_bench.py, Zen 5).
MIN_MIXED_CHUNK = 1
KV_SHARE = 0.8  # of the memory free when the batch starts, what its KV cache may take (the rest stays headroom)
# While a prompt is read beside streaming replies, their longest gap between tokens may be this many of their
# normal steps (issue 27.5's bound is 3; the margin absorbs one chunk's overshoot and most of a shared machine's
# late wake-ups). 2.5 left the starter's p99 gap at 3.0-3.3 steps; 2.2, once Q8_0 prompt rows ran paired in 512-bit
# registers, at 2.7-3.1, and the 1B-shaped model's longest gap within 3 (2.93-2.96), with the newcomer's first token
# 1.06-1.14x later than at 2.5 and no later than at 2.5 before that kernel (tools/benchmarks/prefill_stall_bench.py,
# Zen 5; docs/concurrency.md).
GAP_STEPS = 2.2
# A prompt whose rest reads in this long (at the rate its chunks measured) is read whole even beside streaming
# replies: they see one gap this long at most, not a stutter, and splitting a short prompt costs a pass over
# the weights per chunk, which delayed its first token and cut the server's throughput at 4 clients to 0.89×
# (tools/benchmarks/bench_server.py). Long prompts are still paced.
WHOLE_PROMPT_S = 0.1
# The normal step is the median of this many steps with no prompt beside them: an average took in a late wake-up of
# the machine (0.2 of a 12 ms step among 3.5 ms ones raises it by half), and the whole read that followed would be
# paced to that inflated budget (the likely cause of one round's p99 gap of 7.5 steps in an A/B of the stall
# bench; not reproduced).
STEP_SAMPLES = 15


class PrefillPace:
    """How many prompt tokens the next chunk reads. Alone, PREFILL_CHUNK. Beside streaming replies, as many as
    keep their wait within GAP_STEPS of their normal decode step. A chunk's time is not linear in its length (a
    short chunk runs the matrix-vector kernels, a long one the matrix products; attention grows with the
    position), so the size is steered by what the last chunk measured rather than computed from a rate.
    ``fixed`` turns the steering off (the benchmark's baseline)."""

    def __init__(self, fixed: Optional[int] = None):
        self.fixed = fixed
        self.step_s: Optional[float] = None  # a decode step with no prompt beside it: the median of the last few
        self.steps: deque[float] = deque(maxlen=STEP_SAMPLES)
        self.size = 16.0  # the size to read beside streaming replies, steered from here (kept unrounded, so a chunk
        # of one row that is under budget by less than half still grows)
        self.waited = False  # whether a chunk read beside them was measured yet
        self.row_s: Optional[float] = None  # seconds a prompt token adds to a chunk, as the last chunks measured

    def next_chunk(
        self, others_streaming: bool, most: int = PREFILL_CHUNK, rest: Optional[int] = None, mixed: bool = False
    ) -> int:
        """``rest``: the prompt tokens still to read (None: unknown); ``mixed``: read in the streaming replies' pass."""
        if self.fixed is not None:
            return self.fixed
        if not others_streaming:
            return PREFILL_CHUNK
        if rest is not None and self.row_s is not None and rest * self.row_s <= WHOLE_PROMPT_S:
            return max(1, min(rest, most))
        if mixed and not self.waited:
            # The first mixed chunk is read before any is measured: small, then grown toward the budget (16 rows
            # were a 15 ms gap beside a 4 ms step on the starter in q8, Zen 5). Alone, a chunk costs a pass over
            # the weights, so the first there stays 16.
            return max(1, min(self.chunk, MIN_PREFILL_CHUNK, most))
        return max(1, min(self.chunk, most))

    @property
    def chunk(self) -> int:
        return int(self.size)

    @chunk.setter
    def chunk(self, rows: int) -> None:
        self.size = float(rows)

    def measured_step(self, seconds: float) -> None:
        self.steps.append(seconds)
        self.step_s = statistics.median(self.steps)

    def measured_rows(self, tokens: int, seconds: float) -> None:
        """A chunk of ``tokens`` prompt tokens took ``seconds`` of its own (a decode step beside it not counted)."""
        if tokens <= 0 or seconds <= 0:
            return
        rate = seconds / tokens
        self.row_s = rate if self.row_s is None else 0.5 * self.row_s + 0.5 * rate

    def measured_wait(self, tokens: int, waited: float, mixed: bool) -> None:
        """The streaming replies waited ``waited`` seconds for a chunk of ``tokens`` (and, ``mixed``, their own
        step in the same pass; otherwise their step comes after the chunk)."""
        if self.fixed is None:
            own = waited - (self.step_s or 0.0) if mixed else waited
            self.measured_rows(tokens, own)
        if self.fixed is not None or self.step_s is None or waited <= 0:
            return
        if not self.waited and mixed:
            self.chunk = tokens  # grown from the first mixed chunk (see next_chunk)
        self.waited = True
        budget = GAP_STEPS * self.step_s - (0 if mixed else self.step_s)
        # Toward the size that would have taken the budget, at most doubling or halving per chunk.
        base = self.size if int(self.size) == tokens else float(tokens)  # the unrounded size this chunk came from
        wanted = base * min(2.0, max(0.5, budget / waited))
        self.size = min(PREFILL_CHUNK, max(MIN_MIXED_CHUNK if mixed else MIN_PREFILL_CHUNK, wanted))


@dataclass
class _Active:
    gen: Generation
    seq: FastSequence
    alone: bool = True  # decoded with no other reply beside it from start to end
    split: bool = False  # its prompt is being read in paced chunks (its last one is paced too)

    @property
    def sink(self) -> Sink:
        return self.gen.sink


class Batcher:
    def __init__(
        self,
        target,
        max_active: int,
        kv_budget_tokens: Optional[int] = None,
        check_result: Optional[Callable[[GenerationResult, object], GenerationResult]] = None,
        prefix_cache_bytes: int = 0,
        prefill_chunk: Optional[int] = None,
        disk_pages_bytes: int = 0,
    ):
        # lazy: fastpath imports torch (torch loads on the engine's thread, never at import)
        from ..decoding.fastpath import get_decoder

        self.target = target
        self.max_active = max_active
        # A reply that ran alone is a fair sample of this machine's speed and memory: the engine's checks
        # (predicted vs measured, the per-machine corrections) see it as they see any other reply.
        self.check_result = check_result
        self.dec = get_decoder(target, 256)
        self.active: list[_Active] = []
        self.pace = PrefillPace(prefill_chunk)  # prefill_chunk: a fixed chunk size (None: steered)
        self.peak: Optional[PeakMemory] = None  # watches memory while the batch is not empty
        self.kv_budget_tokens = kv_budget_tokens or self._kv_budget()
        # Computed once, as the batcher starts on the weights loaded: what names this model's pages in memory and
        # on disk (files changed on disk while the model is loaded must not name pages of the old weights).
        self.namespace = cache_namespace(target, self.dec.kv.dtype)
        self.set_prefix_cache(prefix_cache_bytes)
        self.set_disk_pages(disk_pages_bytes)

    def set_prefix_cache(self, nbytes: int) -> None:
        """Keep up to ``nbytes`` of computed pages no reply uses, for later prompts that start the same way (0:
        off); never beyond the KV budget."""
        kv = self.dec.kv
        budget_pages = max(1, self.kv_budget_tokens // kv.page) if kv.paged else None
        pages = nbytes // max(1, kv.page_bytes) if kv.paged else (1 if nbytes > 0 else 0)
        if budget_pages is not None:
            pages = min(pages, budget_pages)
        kv.set_cache(self.namespace, pages, budget_pages)

    def set_disk_pages(self, nbytes: int) -> None:
        """Keep up to ``nbytes`` of prefix-cache pages on disk across restarts (0: none; ``disk_pages.py``), where
        reading a page beats computing it (``disk_pages_win``)."""
        kv = self.dec.kv
        reason = disk_pages_win(kv.paged, self.target.device)
        if nbytes <= 0 or reason is not None:
            if kv.disk is not None:
                kv.disk.flush()
            kv.disk = None
            return
        # lazy: disk_pages imports torch (torch loads on the engine's thread, never at import)
        from ..decoding.disk_pages import DiskPages

        if kv.disk is not None and kv.disk.namespace == self.namespace:
            kv.disk.limit_bytes = int(nbytes)
            return
        kv.disk = DiskPages(kv_pages_dir(), self.namespace, int(nbytes))

    def persist(self) -> int:
        """Write the prefix cache's pages to disk (the model unloads, Redline quits); pages handed over."""
        return self.dec.kv.persist()

    # -- what the KV cache can hold (the service's admission reads it through the backend's kv_room) -------
    def kv_bytes_per_token(self) -> int:

        kv = self.dec.kv
        return kv_cache_bytes(kv.layers, kv.kv_heads, kv.head_dim, 1, 1, kv.k.element_size(), form=kv.form)

    def _kv_budget(self) -> int:
        """Positions the KV cache may hold across requests: the estimator's KV bytes per token against the memory
        free now (``fit.detect_target``: free RAM, or the GPU's free memory), plus what the cache holds already;
        never more than ``max_active`` full contexts (more could never be used)."""

        free = detect_target(device=self.target.device).available_bytes
        tokens = int(free * KV_SHARE) // self.kv_bytes_per_token() + self.dec.kv.pages * self.dec.kv.page
        return max(1, min(tokens, self.max_active * self.target.context_limit))

    def tokens_reserved(self) -> int:
        return sum(a.gen.prepared.tokens for a in self.active)

    def prepare(self, request: GenerationRequest) -> Prepared:
        """The request's prompt and limits (raises, before anything runs, if the context cannot hold it). Whether
        the KV cache can hold it is the service's admission's call (``service/admission.py``, from ``kv_room``)."""
        target = self.target
        return prepare(target.tokenizer, target.context_limit, request, model=target.name)

    def __len__(self) -> int:
        return len(self.active)

    def add(
        self, sink: Sink, request: GenerationRequest, submitted: float, prepared: Optional[Prepared] = None
    ) -> None:
        """Start ``request``: its prompt, settings and stream. Raises (before anything runs) if it cannot."""
        prepared = prepared or self.prepare(request)
        gen = Generation(self.target, request, prepared, sink, submitted)
        cached = self.dec.kv.attach(sink.id, prepared.prompt) if request.options.reuse_prefix else 0
        gen.result.cached_tokens = cached
        gen.announce()
        self.dec.ensure_context(prepared.tokens)
        # Room for every running request to reach its limit (the admission check counted it), in one growth of the
        # pool now: a growth copies the pool, and grown as they went, a long prompt copied it every eighth of the
        # way (20-34 ms gaps beside a 4 ms step, tools/benchmarks/prefill_stall_bench.py) and a reply decoding alone
        # every 128 tokens (12 ms at 1,000 tokens, 20 ms at 1,900, beside a 4.7 ms step,
        # tools/experiments/decode_gaps.py).
        kv = self.dec.kv
        kv.make_room({a.seq.seq: a.gen.prepared.tokens for a in self.active} | {sink.id: prepared.tokens})
        # The prompt's pages are taken now too, while nothing else is in the step, and, beside a long one, the
        # streaming replies' pages for the tokens they make while it is read (a chunk is at least a token, so one
        # each a step): where the pool is at its budget, taking a page evicts a cached one (written to disk where
        # there is a store), which then happens here, not in a step the streaming replies wait for. Pages not
        # written when a request ends are freed.
        lengths = {sink.id: len(prepared.prompt)}
        rest = len(prepared.prompt) - cached
        if rest > PREFILL_CHUNK:
            for a in self.active:
                if not a.seq.prefilling and not a.seq.done:
                    lengths[a.seq.seq] = a.seq.position + 1 + min(rest, max(0, a.seq.max_new - a.seq.steps))
        for seq, length in lengths.items():
            kv.reserve(seq, length)
        if wants_compile(request.options.compile, self.target.device):
            self.dec.compile_in_background(1)  # batch-1 steps (one reply at a time) use it once it is ready
        seq = FastSequence(
            self.dec,
            sink.id,
            prepared.prompt,
            gen.cfg,
            gen.collector,
            gen.cancel,
            prepared.max_new,
            gen.generator(self.dec.device),
            gen.logits_processor,
            cached,
            request.logprobs,
        )
        self.active.append(_Active(gen, seq))
        if len(self.active) > 1:
            for other in self.active:
                other.alone = False
        if self.peak is None:
            self.peak = PeakMemory(self.target.device).__enter__()
        sink.emit(Started(batched=True, cached_tokens=cached))

    def run_one(self, sink: Sink, request: GenerationRequest, submitted: float, prepared: Optional[Prepared] = None):
        """A reply alone: a batch of one, stepped until it ends; its result (also handed to ``sink.finish``)."""
        self.add(sink, request, submitted, prepared)
        mine = self.active[-1]
        while mine in self.active:
            self.step()
        return mine.gen.result

    def step(self) -> None:
        """One prompt chunk for the oldest request still reading its prompt, then one token for every
        request generating. Ended requests leave with their results."""
        # lazy: torch loads on the engine's thread, never at import
        import torch

        with torch.inference_mode():
            reading = next((a for a in self.active if a.seq.prefilling and not a.seq.done), None)
            generating = [a for a in self.active if not a.seq.prefilling and not a.seq.done and not a.gen.failed]
            if reading is not None and generating and self.pace.fixed is None and self.dec.can_mix(len(generating) + 1):
                self._guarded([reading, *generating], lambda: self._mixed(reading, generating))
            else:
                if reading is not None:
                    self._guarded([reading], lambda: self._prefill(reading, bool(generating)))
                if generating:
                    started = time.perf_counter()
                    self._guarded(generating, lambda: self._decode(generating))
                    if reading is None:  # the logits were read: the step is done
                        self.pace.measured_step(time.perf_counter() - started)
        for a in [a for a in self.active if a.seq.done or a.gen.failed or (a.seq.prefilling and a.gen.cancel.check())]:
            self._retire(a)

    def _prefill(self, a: _Active, others_streaming: bool) -> None:
        if a.gen.cancel.check():
            return
        chunk = self.pace.next_chunk(others_streaming, rest=self._whole(a))
        started, before = time.perf_counter(), a.seq.prefilled
        a.seq.prefill(chunk)
        if others_streaming:
            if self.dec.device.type == "cuda":
                # lazy: torch loads on the engine's thread, never at import
                import torch

                torch.cuda.synchronize(self.dec.device)  # the chunk's time, not its launch's
            self.pace.measured_wait(a.seq.prefilled - before, time.perf_counter() - started, mixed=False)
        elif self.dec.device.type == "cpu":  # alone: the time is the chunk's own (a GPU's would be its launch's)
            self.pace.measured_rows(a.seq.prefilled - before, time.perf_counter() - started)
        a.split = a.split or a.seq.prefilling
        if len(a.seq.prompt) > chunk:
            a.sink.emit(PrefillProgress(a.seq.prefilled, len(a.seq.prompt)))

    @staticmethod
    def _whole(a: _Active) -> Optional[int]:
        """The prompt tokens ``a`` has to read, for the pace to read whole if they are few; None once its prompt
        is split, so a long prompt's last chunk keeps the pace too."""
        return None if a.split else len(a.seq.prompt) - a.seq.prefilled

    def _mixed(self, a: _Active, batch: list[_Active]) -> None:
        """A chunk of ``a``'s prompt and one token for every reply in ``batch``, in one pass over the weights."""
        # lazy: torch loads on the engine's thread, never at import
        import torch

        if a.gen.cancel.check():
            return self._decode(batch)
        seq = a.seq
        chunk = self.pace.next_chunk(True, most=_rows_beside(len(batch)), rest=self._whole(a), mixed=True)
        end = min(len(seq.prompt), seq.prefilled + chunk)
        ids = torch.tensor(seq.prompt[seq.prefilled : end], dtype=torch.long, device=self.dec.device)
        tokens = torch.cat([b.seq.next_token.view(1) for b in batch])
        started = time.perf_counter()
        first, logits = self.dec.mixed_step(
            ids,
            seq.prefilled,
            seq.seq,
            tokens,
            [b.seq.position for b in batch],
            [b.seq.seq for b in batch],
            chunk_logits=end == len(seq.prompt),
        )
        for i, b in enumerate(batch):
            b.seq.accept(logits[i])
        self.pace.measured_wait(end - seq.prefilled, time.perf_counter() - started, mixed=True)
        seq.read_to(end, first)
        a.split = a.split or seq.prefilling
        if len(seq.prompt) > chunk:
            a.sink.emit(PrefillProgress(seq.prefilled, len(seq.prompt)))

    def _decode(self, batch: list[_Active]) -> None:
        # lazy: torch loads on the engine's thread, never at import
        import torch

        tokens = torch.cat([a.seq.next_token.view(1) for a in batch])
        logits = self.dec.step(tokens, [a.seq.position for a in batch], [a.seq.seq for a in batch])
        for i, a in enumerate(batch):
            a.seq.accept(logits[i])

    def _guarded(self, batch: list[_Active], work) -> None:
        """Run ``work``; if it fails (out of memory mid-step, say), the requests of this step fail with the
        reason, the model stays loaded and the others go on."""
        try:
            work()
        except Exception as exc:
            for a in batch:
                a.gen.fail(exc)

    def _retire(self, a: _Active) -> None:
        self.active.remove(a)
        keep = a.gen.request.options.reuse_prefix and not a.gen.failed
        self.dec.kv.release(a.seq.seq, a.seq.written() if keep else None)
        r = a.gen.finish(self.peak)
        if not self.active and self.peak is not None:
            self.peak.__exit__(None, None, None)
            self.peak = None
        if a.alone and not a.gen.failed and a.gen.request.record and self.check_result is not None:
            try:
                r = self.check_result(r, a.gen.request.options)
            except Exception:  # a report only: it never keeps a reply from ending
                pass
        a.sink.finish(r)

    def fail_all(self, error: BaseException) -> None:
        """A fault of the batch itself: every reply in it fails with ``error`` (its pages freed); the batcher stays
        usable for the next request."""
        for a in list(self.active):
            self.active.remove(a)
            self.dec.kv.release(a.seq.seq)
            fail = getattr(a.sink, "fail", None)
            if fail is not None:
                fail(error)
            else:
                a.gen.fail(error)
                a.sink.finish(a.gen.finish())
        if self.peak is not None:
            self.peak.__exit__(None, None, None)
            self.peak = None

    def cancel_all(self, note: str) -> None:
        for a in self.active:
            a.gen.result.notes.append(note)
            a.gen.cancel.cancelled = True  # seen at its next step, whoever holds its handle


def _rows_beside(decoding: int) -> int:
    """The most prompt rows a mixed step can take beside ``decoding`` rows (the whole step's row limit)."""
    # lazy: ops imports torch (torch loads on the engine's thread, never at import)
    from ..kernels.ops import GEMM_ROWS

    return max(1, GEMM_ROWS - 1 - decoding)


def disk_pages_win(paged: bool, device) -> Optional[str]:
    """None where prefix-cache pages on disk are used, else why not. Measured (docs/performance.md, "Warm across
    restarts", tools/benchmarks/disk_pages_bench.py): on this CPU, the starter in bf16, reading a 2,048-token
    prompt's pages took 168 ms (page cache warm) / 294 ms (cold) against 20.9 s to compute them, so the CPU keeps
    them. On a GPU it does not yet: its KV cache has the same 64-token pages (kv_cache.py), and ``PagedKV`` writes
    and reads them there unchanged, but the win is unmeasured and by estimate small where it matters least (the
    starter: ~23 KB a token from an NVMe drive at ~3 GB/s is ~130k tokens/s, about what a GPU prefills a 135M
    model at)."""
    if str(device).split(":")[0] != "cpu":
        return "prefix-cache pages are kept on disk only on the CPU (on a GPU the win is not measured yet)"
    if not paged:
        return "this KV cache keeps one page per sequence (no prefix-cache pages to keep on disk)"
    return None


CACHE_NAMESPACE_VERSION = 2  # what the namespace covers; a change here makes every earlier page on disk miss
SAMPLE_BYTES = 64 * 1024  # of each model file's start and end, hashed into the namespace


def cache_namespace(target, kv_dtype) -> bytes:
    """What starts every page key of this model's prefix cache, in memory and on disk: the model's files (names,
    sizes, times and a sample of their bytes: the first and last 64 KiB), its precision, the KV cache's dtype,
    the device type, and the Redline and torch versions that computed the pages, so a page is only reused by the
    same model, loaded and computed the same way. A re-downloaded file (a new time) misses: safe."""

    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: disk_pages imports torch (torch loads on the engine's thread, never at import)
    from ..decoding.disk_pages import FORMAT_VERSION

    h = hashlib.blake2b(digest_size=16)
    h.update(f"redline-kv:{CACHE_NAMESPACE_VERSION}:{FORMAT_VERSION}:{_redline_version()}:{torch.__version__}".encode())
    folder = getattr(target, "folder", None)
    h.update(str(folder).encode())
    try:
        for f in sorted(folder.iterdir()) if folder is not None else []:
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
            if f.is_file():
                with open(f, "rb") as fh:
                    h.update(fh.read(SAMPLE_BYTES))
                    if st.st_size > 2 * SAMPLE_BYTES:
                        fh.seek(-SAMPLE_BYTES, 2)
                        h.update(fh.read(SAMPLE_BYTES))
    except OSError:
        h.update(b"<unreadable>")  # still a key of its own; a later load that can read the files misses
    h.update(target.precision.label().encode())
    h.update(str(kv_dtype).encode())
    h.update(str(getattr(target, "device", "")).split(":")[0].encode())
    # The code that computes the pages: the fast path's Python and the native kernels' build (its path names the
    # build's key: sources, flags, compiler), so pages of an older build miss rather than differ by a rounding.
    # lazy: fastpath imports torch (torch loads on the engine's thread, never at import)
    from ..decoding import fastpath

    kernels = native.status()
    h.update(f"{kernels.get('variant')}:{kernels.get('path')}".encode())
    try:
        h.update(Path(fastpath.__file__).read_bytes())
    except OSError:
        pass
    return h.digest()


def _redline_version() -> str:

    try:
        return version("redline")
    except PackageNotFoundError:
        return "source"
