"""How long a reasoning model thinks before it answers, learned per model from its replies here.

A reasoning model's first *answer* token comes after its thinking: the time to first answer is the TTFT plus the
thinking's tokens at the decode rate. The decode rate and the TTFT the speed model predicts from the model's shape
and this machine (``arithmetic.py``); how many tokens a model thinks it cannot: that is the model's habit (and the
questions asked), not arithmetic. So every reply that thought keeps its thinking tokens in its calibration record
(``calibration.SpeedCalibration.record``), and the typical length is the median of this model's last
``LEARN_FROM`` such replies, whatever the strategy, precision or machine they ran on (the tokens a model thinks do
not depend on how it is decoded). Until one reply with thinking on is recorded there is no typical length, and the
prediction says "not learned yet" rather than make one up.

A reply cut off while it still thought (its token cap reached, a lab row shorter than the thinking) says only that the
thinking was *at least* that long: counted as its own length it would teach a thinking as short as the cap. Such a
record is a right-censored observation, and the median is the Kaplan–Meier estimate's (the smallest length at which
the share of replies still thinking falls to a half); where cut replies are so many that the estimate never falls to
a half, the median is not known and nothing is learned.
"""

from __future__ import annotations

from typing import Iterable, Optional

LEARN_FROM = 10  # the typical thinking is the median of the model's last N replies that thought


def reply_thinking(result) -> Optional[dict]:
    """What a finished reply (``GenerationResult``) adds to its calibration record: its thinking tokens and whether
    it was cut off while still thinking; None for a reply that did not think (a model without reasoning, thinking
    off, nothing between the tags)."""
    if getattr(result, "reasoning_format", None) is None or not getattr(result, "reasoning_tokens", 0):
        return None
    # A reply that never reached its answer stopped thinking only because it stopped: its length is a lower bound.
    cut = result.answer_tokens == 0 and result.finish_reason != "eos"
    return {"thinking_tokens": int(result.reasoning_tokens), "thinking_cut": cut}


def median_thinking(records: Iterable[dict]) -> tuple[Optional[float], int]:
    """The median thinking length of ``records`` (each with ``thinking_tokens`` and ``thinking_cut``), cut ones as
    lower bounds (Kaplan–Meier), and how many records it is from; (None, n) where the median is not known."""
    rows = sorted((float(r["thinking_tokens"]), bool(r.get("thinking_cut"))) for r in records)
    n = len(rows)
    if not n:
        return None, 0
    if not any(cut for _, cut in rows):  # no lower bounds: the plain median (the mean of the two middle ones)
        values = [v for v, _ in rows]
        mid = n // 2
        return (values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2), n
    surviving, at_risk, i = 1.0, n, 0
    while i < n:
        length = rows[i][0]
        ended = sum(1 for v, cut in rows[i:] if v == length and not cut)
        same = sum(1 for v, _ in rows[i:] if v == length)
        if ended:
            surviving *= 1 - ended / at_risk
            if surviving <= 0.5:
                return length, n
        at_risk -= same
        i += same
    return None, n


def learned_thinking(records: Iterable[dict], model: str) -> tuple[Optional[float], int]:
    """The typical thinking length of ``model`` from calibration records (any device, any class), the last
    ``LEARN_FROM`` of its replies that thought: (median or None, how many replies)."""
    mine = sorted((r for r in records if r.get("model") == model and r.get("thinking_tokens")), key=_time)
    return median_thinking(mine[-LEARN_FROM:])


def _time(record: dict) -> float:
    return record.get("time", 0.0)
