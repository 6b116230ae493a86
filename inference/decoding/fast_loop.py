"""The ``fast`` strategy's loop, in gpt-fast's shape: prefill once, then one token per step from the fast
decoder's paged cache (``fastpath.py``), with the same sampling transformations generate() applies
(transformers' own logits processors) and the same streaming contract.

A ``FastSequence`` is one sequence's state: its prompt, how much of it is prefilled, its sampling,
stopping and streaming. The batcher (``generation/batch.py``) drives them, one or several at once (continuous
batching: each decode step runs every active sequence's token).
"""

from __future__ import annotations

from typing import Optional

from .hf import CancelCriteria
from .logprobs import distribution, pack
from .options import eos_token_ids


def logits_processors(cfg):
    """The same sampling transformations generate() applies, from transformers' public classes."""
    # lazy: transformers loads on the engine's thread, never at import
    from transformers import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    procs = LogitsProcessorList()
    if cfg.repetition_penalty is not None and cfg.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(cfg.repetition_penalty))
    if cfg.do_sample:
        if cfg.temperature is not None and cfg.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(cfg.temperature))
        if cfg.top_k is not None and cfg.top_k != 0:
            procs.append(TopKLogitsWarper(cfg.top_k))
        if cfg.top_p is not None and cfg.top_p < 1.0:
            procs.append(TopPLogitsWarper(cfg.top_p))
    return procs


class FastSequence:
    """One sequence on the fast decoder. The token history, the end-of-sequence ids and the sampling live
    on the model's device: the one host synchronisation per token is reading the new id to stream it. The
    history grows only when a logits processor reads it (greedy and plain sampling never do)."""

    def __init__(
        self,
        dec,
        seq: int,
        prompt: list[int],
        cfg,
        collector,
        cancel: CancelCriteria,
        max_new: int,
        generator=None,
        extra_processor=None,
        cached: int = 0,
        top_logprobs: Optional[int] = None,
    ):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        self.dec, self.seq, self.prompt, self.cfg = dec, seq, prompt, cfg
        self.collector, self.cancel, self.max_new = collector, cancel, max_new
        self.generator = generator  # per-sequence randomness, so a seed repeats whatever else runs beside it
        self.procs = logits_processors(cfg)
        if extra_processor is not None:  # e.g. a grammar that constrains the output
            # First, as generate() places a caller's processors before its sampling warpers: a grammar's mask
            # applied after top-p could leave no token at all.
            self.procs.insert(0, extra_processor)
        self.eos = eos_token_ids(cfg)
        self.eos_ids = torch.tensor(self.eos, dtype=torch.long, device=dec.device) if self.eos else None
        self.min_new = cfg.min_new_tokens or 0
        self.history = torch.tensor([prompt], dtype=torch.long, device=dec.device)
        self.prefilled = cached  # prompt positions in the cache (from the prefix cache: not read again)
        self.cached = cached
        self.top_logprobs = top_logprobs  # None: no log-probabilities (nothing computed for them)
        self.steps = 0  # new tokens chosen
        self.next_token = None  # the token the next decode step feeds (a one-element tensor on the device)
        self.done = False
        collector.put(self.history)  # generate() hands the streamer the prompt first; keep the same contract

    @property
    def position(self) -> int:
        """Where the next token goes in the cache."""
        return len(self.prompt) + self.steps - 1

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt)

    def prefill(self, chunk: Optional[int] = None) -> None:
        """Read the next ``chunk`` prompt tokens (all of them by default); after the last, choose the first
        new token."""
        # lazy: torch loads on the engine's thread, never at import
        import torch

        end = len(self.prompt) if chunk is None else min(len(self.prompt), self.prefilled + chunk)
        tokens = torch.tensor(self.prompt[self.prefilled : end], dtype=torch.long, device=self.dec.device)
        logits = self.dec.prefill(tokens, self.prefilled, self.seq)
        self.prefilled = end
        if not self.prefilling:
            self.accept(logits)

    def read_to(self, end: int, logits) -> None:
        """The prompt was read up to ``end`` elsewhere (a mixed step): ``logits`` are its last row's."""
        self.prefilled = end
        if not self.prefilling:
            self.accept(logits)

    def written(self) -> list[int]:
        """The tokens whose keys and values this sequence has written to the cache, positions 0.. in order: the
        prompt read so far, then each new token once the next step has fed it (what the prefix cache may keep)."""
        if self.prefilling:
            return self.prompt[: self.prefilled]
        return self.prompt + self.collector.ids[: max(0, self.steps - 1)]

    def sample(self, scores):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        if self.cfg.do_sample:
            return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=self.generator)[0]
        return torch.argmax(scores, dim=-1)

    def accept(self, logits) -> None:
        """Choose the next token from ``logits`` (fp32, [vocab]), stream it, and decide whether to go on."""
        # lazy: torch loads on the engine's thread, never at import
        import torch

        # Log-probabilities (asked only): of the model's raw logits, before the mask below and the processors.
        raw = distribution(logits) if self.top_logprobs is not None else None
        scores = logits[None]
        if self.steps < self.min_new and self.eos_ids is not None:  # as MinNewTokensLengthLogitsProcessor does
            scores[:, self.eos_ids] = -float("inf")  # in place: the logits are this step's own, read once
        if self.procs:
            scores = self.procs(self.history, scores)
        next_id = self.sample(scores)
        if raw is None:
            tok = int(next_id)  # the one read of the step's result on the host (it waits for the device)
        else:  # the id and its scores in one read: still one wait for the device
            row = pack(raw, next_id, self.top_logprobs).tolist()
            tok = int(row[0])
            self.collector.score(row)
        self.collector.put([tok])  # the id as read: a second copy from the device would be a second transfer
        if self.procs:  # only the logits processors (penalties, a grammar) read the history
            self.history = torch.cat([self.history, next_id.view(1, 1)], dim=1)
        step = self.steps
        self.steps += 1
        self.next_token = next_id
        if (tok in self.eos and step >= self.min_new) or self.collector.decoder.stopped_at_string:
            self.done = True
        elif self.steps >= self.max_new or self.cancel.check():
            self.done = True


def wants_compile(option: Optional[bool], device: str) -> bool:
    """``compile`` None means: on for CUDA (a small model is launch-bound there), off on a CPU, where the native
    kernels leave little for the compiler (measured: docs/performance.md)."""
    return option if option is not None else device.startswith("cuda")
