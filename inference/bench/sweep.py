"""The batch sweep: latency against throughput as the batch grows (seed: "latency vs throughput").

Two ways to run a batch, and the row says which one ran:

- ``transformers``: transformers' continuous batching (``model.generate_batch``,
  paged KV cache, requests refilled as others finish). Per-request timestamps
  come from transformers itself.
- ``padded``: one batched ``generate()`` with left padding, the same generation
  config as the single-prompt path (``hf.generation_config``). Per-request
  finish times come from a streamer that timestamps every step.

``auto`` tries continuous batching and falls back to padded ``generate()`` when
it is missing or fails, with the reason in the row's notes. Speculative
decoding and prompt lookup run one sequence at a time in transformers, so a
sweep needs a naive, kv or static configuration.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from ..backends.local import LoadedModel
from ..decoding.hf import CancelCriteria, generation_config
from ..decoding.options import SamplingSettings, eos_token_ids
from ..decoding.timing import sync
from ..errors import UnsupportedConfiguration
from ..memory.measured import PeakMemory
from ..memory.oom import free_memory, is_oom
from ..stats import percentile
from .results import SweepRow

if TYPE_CHECKING:
    from .configs import BenchConfig
    from .results import SweepRow

MODES = ("auto", "transformers", "padded")
CB_PAGE_SIZE = 64  # tokens per page of the continuous-batching cache


class _StepClock:
    """Streamer that timestamps each decode step of a batched generate()."""

    def __init__(self, device: str, start: float):
        self.device, self.start = device, start
        self.steps: list[tuple[float, list[int]]] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        sync(self.device)
        self.steps.append((time.perf_counter() - self.start, [int(t) for t in value.reshape(-1).tolist()]))

    def end(self) -> None:
        pass


def _padded(target: LoadedModel, prompts: list[list[int]], cfg, should_cancel) -> dict:
    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: transformers loads on the engine's thread, never at import
    from transformers import StoppingCriteriaList

    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long, device=target.model.device)
    mask = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long, device=target.model.device
    )
    eos = set(eos_token_ids(cfg))
    sync(target.device)
    start = time.perf_counter()
    clock = _StepClock(target.device, start)
    with torch.inference_mode():
        target.model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=cfg,
            streamer=clock,
            stopping_criteria=StoppingCriteriaList([CancelCriteria(should_cancel)]),
        )
    sync(target.device)
    wall = time.perf_counter() - start
    latency, ttft, tokens = [], [], 0
    for b in range(len(prompts)):
        done_at, count = None, 0
        for t, step in clock.steps:
            count += 1
            if step[b] in eos:
                done_at = t
                break
        latency.append((done_at if done_at is not None else (clock.steps[-1][0] if clock.steps else wall)) * 1000)
        ttft.append(clock.steps[0][0] * 1000 if clock.steps else None)
        tokens += count
    return {"wall": wall, "latency": latency, "ttft": ttft, "tokens": tokens}


def _continuous(target: LoadedModel, prompts: list[list[int]], cfg) -> dict:
    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: transformers loads on the engine's thread, never at import
    from transformers import ContinuousBatchingConfig

    # Left to itself, transformers sizes the paged cache from free memory (90 % of it; on a CPU that is
    # gigabytes of RAM), which would swamp the peak-memory figure. Size it for this batch instead.
    longest = max(len(p) for p in prompts) + cfg.max_new_tokens
    cb = ContinuousBatchingConfig(
        page_size=CB_PAGE_SIZE,
        num_blocks=len(prompts) * -(-longest // CB_PAGE_SIZE) + 1,
        max_batch_tokens=max(256, sum(len(p) for p in prompts) + len(prompts)),
    )
    sync(target.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate_batch(
            prompts, generation_config=cfg, continuous_batching_config=cb, record_timestamps=True, progress_bar=False
        )
    sync(target.device)
    wall = time.perf_counter() - start
    latency, ttft, tokens = [], [], 0
    for req in out.values():
        if getattr(req, "error", None):
            raise RuntimeError(f"continuous batching request failed: {req.error}")
        stamps = req.timestamps or []
        tokens += len(req.generated_tokens)
        latency.append(((stamps[-1] if stamps else start + wall) - start) * 1000)
        ttft.append((stamps[0] - start) * 1000 if stamps else None)
    if len(out) != len(prompts):
        raise RuntimeError(f"continuous batching returned {len(out)} of {len(prompts)} requests")
    return {"wall": wall, "latency": latency, "ttft": ttft, "tokens": tokens}


def run_sweep(
    target: LoadedModel,
    config: "BenchConfig",
    prompts: Sequence[list[int]],
    batch_sizes: Sequence[int],
    new_tokens: int,
    warmup: int,
    samples: int,
    seed: int,
    mode: str = "auto",
    progress: Optional[Callable[[float, str], None]] = None,
    should_cancel: Optional[Callable[[], bool]] = None,
    on_row: Optional[Callable[["SweepRow"], None]] = None,
    fixed_length: bool = True,
) -> "list[SweepRow]":
    """Run ``config`` at each batch size; one SweepRow per size, each also handed to ``on_row`` when done."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    if mode not in MODES:
        raise UnsupportedConfiguration(f"Unknown batch mode {mode!r}.", f"Choose one of: {', '.join(MODES)}.")
    if config.strategy in ("speculative", "prompt-lookup"):
        raise UnsupportedConfiguration(
            f"The batch sweep cannot run {config.strategy}: transformers runs it one sequence at a time.",
            "Sweep a naive, kv or static configuration.",
        )
    progress = progress or (lambda f, p: None)
    should_cancel = should_cancel or (lambda: False)
    options = config.options()
    cfg = generation_config(
        target,
        SamplingSettings(
            max_new_tokens=new_tokens, temperature=0.0, seed=seed, min_new_tokens=new_tokens if fixed_length else None
        ),
        options,
        new_tokens,
    )
    has_continuous = callable(getattr(target.model, "generate_batch", None))
    use = "transformers" if mode in ("auto", "transformers") and has_continuous else "padded"
    if mode == "transformers" and not has_continuous:
        raise UnsupportedConfiguration(
            "This transformers version has no continuous batching (generate_batch).", "Use --batch-mode padded."
        )
    rows: list[SweepRow] = []
    units = max(1, len(batch_sizes) * (warmup + samples))
    done = 0
    fallback_note = None
    for size in batch_sizes:
        row = SweepRow(batch_size=size, mode=use)
        batch = [list(prompts[i % len(prompts)]) for i in range(size)]
        if use == "transformers" and config.strategy != "kv":
            row.notes.append(
                "continuous batching uses its own paged KV cache; the strategy's cache setting does not apply"
            )
        walls, throughputs, lat, ttfts, peaks, tokens = [], [], [], [], [], []
        for n in range(warmup + samples):
            if should_cancel():
                row.status = "cancelled"
                break
            progress(
                done / units,
                f"batch {size}: {'warm-up' if n < warmup else 'sample'} {(n if n < warmup else n - warmup) + 1}",
            )
            torch.manual_seed(seed)
            try:
                with PeakMemory(target.device) as peak:
                    if row.mode == "transformers":
                        try:
                            m = _continuous(target, batch, cfg)
                        except Exception as exc:
                            if mode == "transformers" or is_oom(exc):
                                raise
                            # auto: fall back for this and every later batch size, and say why
                            fallback_note = (
                                f"continuous batching failed ({type(exc).__name__}: {exc}); "
                                "fell back to padded generate()"
                            )
                            use = row.mode = "padded"
                            row.notes.append(fallback_note)
                            m = _padded(target, batch, cfg, should_cancel)
                    else:
                        m = _padded(target, batch, cfg, should_cancel)
            except Exception as exc:
                free_memory(target.device)
                row.status = "oom" if is_oom(exc) else "error"
                row.error = f"Out of memory at batch size {size}." if is_oom(exc) else f"{type(exc).__name__}: {exc}"
                break
            done += 1
            if n < warmup:
                continue
            walls.append(m["wall"])
            throughputs.append(m["tokens"] / m["wall"] if m["wall"] > 0 else 0.0)
            lat.extend(m["latency"])
            ttfts.extend(t for t in m["ttft"] if t is not None)
            peaks.append(peak.peak_bytes)
            tokens.append(m["tokens"])
        row.samples = len(walls)
        if walls:
            row.wall_s = statistics.median(walls)
            row.throughput_tokens_per_s = statistics.median(throughputs)
            row.latency_ms_p50, row.latency_ms_p95 = percentile(lat, 0.5), percentile(lat, 0.95)
            row.ttft_ms_p50 = percentile(ttfts, 0.5)
            row.peak_memory_bytes = max(peaks)
            row.new_tokens = int(statistics.median(tokens))
        rows.append(row)
        if on_row is not None:
            on_row(row)
        if row.status == "cancelled":
            break
    return rows
