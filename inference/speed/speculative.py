"""Will a draft model make decoding faster here? The speed model's cost ratio and a measured acceptance.

Speculative decoding pays when the draft is cheap *and* agrees with the target: a step costs ``k`` draft steps
and one verification pass, and yields ``(1 − α^(k+1)) ÷ (1 − α)`` tokens, so the speed-up over the target alone
is that ÷ (k × cost ratio + verification ratio), with

- the **cost ratio** = draft cost per token ÷ target cost per token, from the speed model (its learned factors
  included), and the verification ratio the target's pass over k + 1 tokens ÷ its one-token step;
- α, the per-token **acceptance**, which no shape can predict: it is measured by ``measure_acceptance`` — a
  few dozen tokens through the real speculative strategy — and kept per pair (``speed/calibration.py``).

The starter drafting for itself is the plain case of a draft that cannot pay: its cost ratio is about 1, so
even with every draft token accepted a step costs k + 1 target steps for at most k + 1 tokens.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Optional

from ..backends.local import load_model
from ..cost import code_path
from ..decoding.hf import check_draft
from ..decoding.options import DecodeOptions, SamplingSettings
from ..decoding.prompt import build_prompt
from ..errors import RedlineError
from ..estimate.estimator import ModelShape
from ..generation.run import generate
from ..memory.oom import free_memory
from ..precision import resolve_precision
from ..progress import noop_progress
from ..sources.resolve import resolve
from .arithmetic import (
    break_even_acceptance,
    speculative_speedup,
    step_cost,
    token_acceptance,
    tokens_per_step,
)
from .calibration import SpeedCalibration
from .model import SpeedModel

CALIBRATION_TOKENS = 48  # tokens the acceptance run generates: a few dozen, a few seconds for a small pair
CALIBRATION_PROMPT = (
    "Explain in a few sentences why the sky is blue, then list three everyday examples of light scattering."
)
MAX_K = 16


@dataclass
class DraftAdvice:
    target: str
    draft: str
    k: int
    cost_ratio: float  # draft cost per token ÷ target cost per token
    verify_ratio: float  # the target's pass over k + 1 tokens ÷ its one-token step
    acceptance_rate: Optional[float]  # measured: accepted ÷ proposed draft tokens (None: not measured yet)
    token_acceptance: Optional[float]  # α, per token, from the rate
    speedup: Optional[float]  # predicted, at k
    best_k: Optional[int] = None
    best_speedup: Optional[float] = None
    break_even: Optional[float] = None  # per-token acceptance needed to pay at k; None: cannot pay
    target_tokens_per_s: Optional[float] = None  # the target alone on transformers' generate() (kv)
    predicted_tokens_per_s: Optional[float] = None  # with the draft
    fast_tokens_per_s: Optional[float] = None  # the target alone on the fast path, where it runs
    verdict: str = "unknown"  # "faster" | "slower" | "unknown"
    text: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def advise(
    speed: SpeedModel,
    target: ModelShape,
    target_precision,
    draft: ModelShape,
    draft_precision,
    k: int = 5,
    context: int = 512,
    acceptance_rate: Optional[float] = None,
) -> DraftAdvice:
    """Predicted speed-up of ``draft`` for ``target`` at ``k`` draft tokens per step. ``acceptance_rate``
    defaults to the one measured for this pair (``SpeedCalibration.acceptance``)."""
    m = speed.machine
    tspec, dspec = speed.spec(target_precision), speed.spec(draft_precision)
    tpath, _ = code_path("kv", tspec, target, m.device)
    dpath, _ = code_path("kv", dspec, draft, m.device)
    cal, key = speed.calibration, m.calibration_key
    tf = cal.decode_factor(key, f"kv:{tspec.name}").value
    df = cal.decode_factor(key, f"kv:{dspec.name}").value
    t_one = step_cost(target, tspec, m, tpath, 1, context).seconds / tf
    d_one = step_cost(draft, dspec, m, dpath, 1, context).seconds / df
    ratio = d_one / t_one

    def verify(kk: int) -> float:
        return step_cost(target, tspec, m, tpath, kk + 1, context).seconds / tf / t_one

    if acceptance_rate is None:
        acceptance_rate = cal.acceptance(target.name, draft.name, dspec.label(), k)
    target_tps = 1.0 / t_one
    adv = DraftAdvice(target.name, draft.name, k, ratio, verify(k), acceptance_rate, None, None)
    adv.target_tokens_per_s = target_tps
    if code_path("fast", tspec, target, m.device)[0] == "fast":
        adv.fast_tokens_per_s = speed.predict(target, tspec, "fast", context, 128).tokens_per_s
    be = break_even_acceptance(k, ratio, adv.verify_ratio)
    adv.break_even = be
    if acceptance_rate is not None:
        alpha = token_acceptance(acceptance_rate, k)
        adv.token_acceptance = alpha
        adv.speedup = speculative_speedup(alpha, k, ratio, adv.verify_ratio)
        adv.predicted_tokens_per_s = target_tps * adv.speedup
        options = [(speculative_speedup(alpha, kk, ratio, verify(kk)), kk) for kk in range(1, MAX_K + 1)]
        adv.best_speedup, adv.best_k = max(options)
        adv.verdict = "faster" if adv.speedup > 1.0 else "slower"
    elif be is None:
        adv.verdict = "slower"
    adv.text = advice_text(adv)
    return adv


def advice_text(a: DraftAdvice) -> str:
    cost = f"the draft costs {a.cost_ratio:.2f}× the target per token"
    if a.speedup is None:
        if a.break_even is None:
            return (
                f"Slower: {cost}, so even if every draft token were accepted a step of {a.k} draft tokens would "
                "cost more than it yields. Choose a much smaller draft, or no draft."
            )
        return (
            f"{cost.capitalize()}; it pays only if at least {a.break_even:.0%} of draft tokens are accepted "
            f"(per token). Measure the acceptance to know."
        )
    base = (
        f"{a.acceptance_rate:.0%} of draft tokens accepted (measured), {cost}: "
        f"predicted {a.speedup:.2f}× the target alone at {a.k} draft tokens"
    )
    if a.verdict == "slower":
        return (
            f"Slower: {base}. Speculative decoding would make replies slower here; choose a much smaller draft "
            "or no draft."
        )
    text = f"Faster: {base}"
    if a.best_k and a.best_k != a.k and a.best_speedup and a.best_speedup > a.speedup * 1.02:
        text += f"; {a.best_k} draft tokens would give {a.best_speedup:.2f}×"
    text += "."
    if a.fast_tokens_per_s and a.predicted_tokens_per_s and a.fast_tokens_per_s > a.predicted_tokens_per_s:
        text += (
            f" But the fast strategy alone predicts {a.fast_tokens_per_s:.1f} tok/s against "
            f"{a.predicted_tokens_per_s:.1f} with the draft: without a draft is faster here."
        )
    return text


@dataclass
class AcceptanceMeasurement:
    target: str
    draft: str
    draft_precision: str
    k: int
    acceptance_rate: Optional[float]
    mean_accepted_length: Optional[float]
    proposed: int
    accepted: int
    new_tokens: int
    tokens_per_s: Optional[float]
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def measure_acceptance(
    engine,
    target: str,
    target_precision,
    draft: str,
    draft_precision,
    k: int = 5,
    tokens: int = CALIBRATION_TOKENS,
    progress=None,
    save: bool = True,
    should_cancel=None,
) -> AcceptanceMeasurement:
    """Run ``tokens`` greedy tokens of a fixed prompt through the real speculative strategy and measure how
    many draft tokens the target accepts. Models the engine already holds are reused; others are loaded for
    the run and released after it, so the chat's model stays loaded. Records the rate for the pair."""

    progress = progress or noop_progress
    cancelled = should_cancel or (lambda: False)  # this job's own cancel (there is no engine-wide one)
    device = engine.device
    tspec = target_precision if not isinstance(target_precision, str) else resolve_precision(target_precision, device)
    dspec = draft_precision if not isinstance(draft_precision, str) else resolve_precision(draft_precision, device)
    started = time.perf_counter()
    temporary = []

    def held(spec_text, spec, share, base):
        source = resolve(spec_text)
        for m in (engine.target, engine.draft):
            if m is not None and m.source == source and m.precision == spec:
                return m
        m = load_model(source, spec, device, lambda f, ph: progress(base + f * share, ph), cancelled)
        temporary.append(m)
        return m

    try:
        t = held(target, tspec, 0.45, 0.0)
        d = held(draft, dspec, 0.45, 0.45)
        check_draft(t, d)
        progress(0.9, "measuring acceptance")
        prompt = build_prompt(t.tokenizer, [{"role": "user", "content": CALIBRATION_PROMPT}], 4096, tokens)
        result = generate(
            t,
            prompt.input_ids,
            SamplingSettings(max_new_tokens=tokens, temperature=0.0, seed=0, min_new_tokens=tokens),
            DecodeOptions(strategy="speculative", num_draft_tokens=k),
            d,
            None,
            cancelled,
        )
    finally:
        for m in temporary:
            m.release()
        if temporary:
            free_memory(device)
    if result.finish_reason == "error":
        raise RedlineError(f"The acceptance run failed: {result.error}")
    out = AcceptanceMeasurement(
        t.name,
        d.name,
        dspec.label(),
        k,
        result.acceptance_rate,
        result.mean_accepted_length,
        result.draft_proposed or 0,
        result.draft_accepted or 0,
        result.new_tokens,
        result.tokens_per_s,
        time.perf_counter() - started,
    )
    if save and out.proposed:
        SpeedCalibration().record_acceptance(
            out.target, out.draft, out.draft_precision, k, out.acceptance_rate or 0.0, out.proposed, out.accepted
        )
    progress(1.0, "done")
    return out


__all__ = [
    "AcceptanceMeasurement",
    "DraftAdvice",
    "advise",
    "measure_acceptance",
    "tokens_per_step",
]
