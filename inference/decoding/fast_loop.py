"""The ``fast`` strategy's loop, in gpt-fast's shape: prefill once, then one token per step from the
fast decoder's preallocated cache (``fastpath.py``), with the same sampling transformations generate()
applies (transformers' own logits processors) and the same streaming contract."""

from __future__ import annotations

from redline.inference.decoding.hf import CancelCriteria
from redline.inference.decoding.options import eos_token_ids
from redline.inference.loading.loader import LoadedModel


def logits_processors(cfg):
    """The same sampling transformations generate() applies, from transformers' public classes."""
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


def prefill(dec, prompt: list[int]):
    """Run the whole prompt once; the logits of its last position."""
    import torch

    return dec.forward(torch.tensor(prompt, dtype=torch.long, device=dec.device), 0)


def decode_one_token(dec, token, pos: int):
    """One step: the new token (a one-element tensor on the device) at position ``pos``; the next logits."""
    return dec.forward(token.view(1), pos)


def sample(scores, cfg):
    """The next token id as a one-element tensor on the scores' device (sampling stays on the device)."""
    import torch

    if cfg.do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1)[0]
    return torch.argmax(scores, dim=-1)


def decode_n_tokens(dec, logits, history, pos: int, cfg, collector, cancel: CancelCriteria, max_new: int) -> None:
    """Pick a token from ``logits``, stream it, feed it back; until end of sequence, a stop string, the
    length, or a cancel. The token history, the end-of-sequence ids and the sampling live on the model's
    device: the one host synchronisation per token is reading the new id to stream it."""
    import torch

    procs = logits_processors(cfg)
    eos = eos_token_ids(cfg)
    eos_ids = torch.tensor(eos, dtype=torch.long, device=logits.device) if eos else None
    min_new = cfg.min_new_tokens or 0
    for step in range(max_new):
        scores = logits[None]
        if step < min_new and eos_ids is not None:  # as MinNewTokensLengthLogitsProcessor does in generate()
            scores = scores.clone()
            scores[:, eos_ids] = -float("inf")
        if procs:
            scores = procs(history, scores)
        next_id = sample(scores, cfg)
        tok = int(next_id)
        collector.put(next_id)
        if procs:
            history = torch.cat([history, next_id.view(1, 1)], dim=1)
        if (tok in eos and step >= min_new) or collector.decoder.stopped_at_string or step == max_new - 1:
            return
        if cancel.check():
            return
        logits = decode_one_token(dec, next_id, pos)
        pos += 1


def run_fast(target: LoadedModel, prompt: list[int], cfg, collector, cancel: CancelCriteria, max_new: int) -> None:
    import torch

    from redline.inference.decoding.fastpath import get_decoder

    dec = get_decoder(target, len(prompt) + max_new)
    history = torch.tensor([prompt], dtype=torch.long, device=dec.device)
    collector.put(history)  # generate() hands the streamer the prompt first; keep the same contract
    logits = prefill(dec, prompt)
    decode_n_tokens(dec, logits, history, len(prompt), cfg, collector, cancel, max_new)
