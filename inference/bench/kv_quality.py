"""What the KV cache in 8 bits costs in quality, in the speed lab: a row that ran the fast path with q8 KV beside the
same row with bf16 KV (``BenchConfig.kv``; ``fast:q8+kv=q8`` beside ``fast:q8+kv=bf16``) is compared with it.

- **Agreement** (torch-free, from the rows' greedy outputs, the same prompts): the first new token where the q8
  row's output differs from the bf16 row's, and the share of positions where the two hold the same token, over the
  longer of each pair of outputs (a reply that stopped sooner counts its missing tokens as differing), pooled over
  the prompts. After the first difference the two replies go on from different texts, so the share says more about
  how far they drift than about single flips; the first difference is the sharp figure.
- **Perplexity difference** (engine-side, torch): the bf16 row's replies scored token by token after their prompts
  under both KV forms — two fresh pools of the decoder loaded for whichever row of the pair ran second, so nothing
  but the KV form differs (``tools/accuracy/kv_q8_quality.py`` does the same on a fixed 2,000-token text) — as
  ``ppl(q8) ÷ ppl(bf16) − 1``; the same pass gives the **next-token agreement** the tool reports, the share of the
  bf16 replies' tokens that q8 KV picks greedily given the reply so far. It costs about two generations per prompt,
  once per pair.

A q8 row with no bf16 counterpart (or whose counterpart failed) gets none of these (not zero)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from .configs import BenchConfig
from .results import ConfigResult


@dataclasses.dataclass(frozen=True)
class Agreement:
    """Two greedy outputs compared token by token."""

    matched: int  # positions holding the same token
    compared: int  # positions compared: the longer output's length
    first_diff: Optional[int]  # the first position that differs; None: identical

    @property
    def share(self) -> Optional[float]:
        return self.matched / self.compared if self.compared else None


def agreement(reference: Sequence[int], other: Sequence[int]) -> Agreement:
    """``other`` against ``reference``: the first differing position (where one ends before the other, that end;
    None when identical) and the positions that match over the longer of the two."""
    matched = sum(1 for a, b in zip(reference, other) if a == b)
    first = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if first is None and len(reference) != len(other):
        first = min(len(reference), len(other))
    return Agreement(matched, max(len(reference), len(other)), first)


def pooled(references: Sequence[Sequence[int]], others: Sequence[Sequence[int]]) -> Agreement:
    """Each prompt's pair compared, pooled: matched and compared positions summed, the earliest first difference."""
    parts = [agreement(a, b) for a, b in zip(references, others)]
    firsts = [p.first_diff for p in parts if p.first_diff is not None]
    return Agreement(sum(p.matched for p in parts), sum(p.compared for p in parts), min(firsts) if firsts else None)


def _same_but_kv(config: BenchConfig) -> BenchConfig:
    return dataclasses.replace(config, kv=None, text="")


def pairs(rows: Sequence[ConfigResult], configs: Sequence[BenchConfig]) -> dict[int, int]:
    """Each q8 row's bf16 counterpart (row indices): the first row whose KV form was bf16 and whose configuration is
    the same but for its KV form. Rows that did not run the fast path have no form (``ConfigResult.kv`` None)."""
    out = {}
    for row in rows:
        if row.kv != "q8":
            continue
        mine = _same_but_kv(configs[row.index])
        for other in rows:
            if other.kv == "bf16" and _same_but_kv(configs[other.index]) == mine:
                out[row.index] = other.index
                break
    return out


def compare(rows: Sequence[ConfigResult], configs: Sequence[BenchConfig]) -> None:
    """Fill each q8 row's agreement with its bf16 counterpart, where both ran (their first measured sample of each
    prompt, ``ConfigResult.token_ids``)."""
    by_index = {r.index: r for r in rows}
    for q8, bf16 in pairs(rows, configs).items():
        row, ref = by_index[q8], by_index[bf16]
        row.kv_reference = ref.config
        if row.status != "ok" or ref.status != "ok" or not row.token_ids or len(ref.token_ids) != len(row.token_ids):
            continue
        found = pooled(ref.token_ids, row.token_ids)
        row.kv_agreement, row.kv_first_diff, row.kv_compared_tokens = found.share, found.first_diff, found.compared


def completed_pairs(
    rows: Sequence[ConfigResult], configs: Sequence[BenchConfig], index: int
) -> list[tuple[ConfigResult, ConfigResult]]:
    """The (q8 row, bf16 row) pairs that row ``index`` completes: both ended well, ``index`` one of them (each pair
    is completed once, by the later of its two rows)."""
    by_index = {r.index: r for r in rows}
    return [
        (by_index[q8], by_index[bf16])
        for q8, bf16 in pairs(rows, configs).items()
        if index in (q8, bf16) and by_index[q8].status == by_index[bf16].status == "ok"
    ]


def score_pair(target, q8: ConfigResult, bf16: ConfigResult, prompts: Sequence[Sequence[int]]) -> None:
    """The perplexity difference of ``bf16``'s replies under q8 KV against bf16 KV, on ``target``'s fast decoder
    (built for the row that just ran), written to ``q8.kv_ppl_change``; a note instead where it cannot be scored."""
    dec = getattr(target, "fast_decoder", None)
    if dec is None or not bf16.token_ids or len(prompts) != len(bf16.token_ids):
        return
    try:
        nll, same = {form: 0.0 for form in ("bf16", "q8")}, 0
        for prompt, reply in zip(prompts, bf16.token_ids):
            for form in nll:
                part, agreed = _reply_nll(dec, form, list(prompt), list(reply))
                nll[form] += part
                same += agreed if form == "q8" else 0
        n = sum(len(r) for r in bf16.token_ids)
        if n:
            q8.kv_ppl_change = math.exp((nll["q8"] - nll["bf16"]) / n) - 1.0
            q8.kv_forced_agreement = same / n
    except Exception as exc:  # a quality figure is a report: it must never fail the row
        q8.notes.append(f"KV perplexity difference unavailable ({type(exc).__name__}: {exc})")


def _reply_nll(dec, form: str, prompt: list[int], reply: list[int]) -> tuple[float, int]:
    """The negative log-likelihood of ``reply`` after ``prompt`` and the positions whose greedy token is reply's own,
    teacher-forced one token a step, with a fresh pool
    of ``form`` swapped into the decoder (its own put back after). The eager step: a compiled one, built on the
    decoder's own pool, would start compiling again for another."""
    # lazy: torch and the decoder's cache load on the engine's thread, never where the lab's results are imported
    import torch

    from ..decoding.kv_cache import PagedKV  # lazy: it imports torch

    own = dec.kv
    pool = PagedKV(
        own.layers,
        own.kv_heads,
        own.head_dim,
        own.dtype if own.form != "q8" else dec.act_dtype,
        own.device,
        tokens=len(prompt) + len(reply),
        cleared=own.cleared,
        form=form,
    )
    nll, same = 0.0, 0
    compiled = dec.compiled
    dec.kv, dec.compiled = pool, None
    try:
        with torch.inference_mode():
            logits = dec.prefill(torch.tensor(prompt, device=dec.device), 0, seq=0)
            for i, tok in enumerate(reply):
                nll -= torch.log_softmax(logits.float(), -1)[tok].item()
                same += int(int(logits.argmax()) == tok)
                if i + 1 < len(reply):
                    step = dec.step(torch.tensor([tok], device=dec.device), [len(prompt) + i], [0])
                    logits = step[0]
    finally:
        dec.kv, dec.compiled = own, compiled
    return nll, same
