"""Each variant predicted on this machine for a chosen context: memory, whether it fits, speed, download size,
and the one "recommended here".

- memory: the estimator's peak (``memory.estimator.estimate`` through a ``Planner`` on this machine's target:
  the GPU's free memory, or the free RAM when there is no GPU), with the learned per-machine correction;
- **fits** when the total plus the estimate's own margin (10 % / 300 MB) is within what is available,
  **tight** when only the total is, **does not fit** otherwise;
- decode tokens/s and TTFT: the speed model (``SpeedModel``, this machine's measured figures and learned
  factors) for the variant's precision with its fastest strategy (``speed.choose.choose``, precision pinned);
- recommended here, by the user's priority (#20): *quality* — the highest quality (bits per weight) that
  fits; *balanced* — the fastest that fits among those keeping 8-bit weights or more (the highest quality that
  fits when none does); *speed* — the fastest that fits. A variant slower than ``USEFUL_TOKENS_PER_S`` is
  recommended only when nothing faster fits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import psutil

from ..errors import RedlineError
from ..estimate.calibration import correction_bytes
from ..estimate.estimator import CPU_BASELINE_BYTES, accuracy_margin
from ..estimate.fit import MIN_CONTEXT, Planner, Target, detect_target
from ..precision import parse_precision
from ..speed.arithmetic import this_machine
from ..speed.choose import DEFAULT_CONTEXT_CAP, check_priority, choose
from ..speed.model import SpeedModel
from .variants import RepoVariants, Variant

USEFUL_TOKENS_PER_S = 5.0
FITS, TIGHT, NO_FIT, UNKNOWN = "fits", "tight", "does not fit", "cannot tell"


@dataclass
class VariantPrediction:
    name: str
    precision: str
    strategy: str  # the configuration it would load in: precision + this strategy
    context: int
    download_bytes: int
    total_bytes: Optional[int]  # predicted peak memory; None when the shape could not be read
    margin_bytes: int
    available_bytes: int
    fit: str  # FITS / TIGHT / NO_FIT / UNKNOWN
    tokens_per_s: Optional[float]
    ttft_ms: Optional[float]
    quality_bits: float
    device: str
    recommended: bool = False
    why: str = ""  # the recommendation's reason, or the problem that kept it from being predicted

    def to_dict(self) -> dict:
        return asdict(self)


def context_for(variant: Variant, context: Optional[int]) -> int:

    shape = variant.model_shape()
    longest = shape.max_positions if shape is not None else DEFAULT_CONTEXT_CAP
    ctx = context or min(longest, DEFAULT_CONTEXT_CAP)
    return max(min(ctx, longest), min(MIN_CONTEXT, longest))


def predict_variant(
    variant: Variant,
    target: Target,
    speed: SpeedModel,
    context: Optional[int],
    correction: int = 0,
    baseline_bytes: Optional[int] = None,
):
    """``baseline_bytes`` (CPU): the resident memory of the process that will load it, before the load (as the
    engine's own prediction uses once loaded); None: the estimator's default Python/torch baseline."""

    shape = variant.model_shape()
    ctx = context_for(variant, context)
    blank = VariantPrediction(
        variant.name,
        variant.precision,
        "",
        ctx,
        variant.download_bytes,
        None,
        0,
        target.available_bytes,
        UNKNOWN,
        None,
        None,
        variant.quality_bits,
        target.device,
        why=variant.problem,
    )
    if shape is None:
        return blank
    planner = Planner(shape, target, 1, None, None, correction)
    try:
        est = planner.estimate(_spec(variant.precision), ctx)
        pick = choose(shape, planner, speed, ctx, precision=variant.precision)
    except RedlineError as exc:
        blank.why = str(exc)
        return blank
    speed_of = pick
    if pick.tokens_per_s is None and pick.candidates:  # it does not fit: its fastest strategy's speed still says
        speed_of = pick.candidates[0]
    if speed_of.strategy == "fast":  # its memory as it would run (the fused weights beside a mapped checkpoint)
        est = planner.estimate(_spec(variant.precision), ctx, strategy="fast")
    if baseline_bytes is not None and target.device == "cpu":
        est.total_bytes = max(0, est.total_bytes + int(baseline_bytes) - CPU_BASELINE_BYTES)
        est.margin_bytes = accuracy_margin(est.total_bytes)
        est.fits = est.total_bytes + est.margin_bytes <= target.available_bytes
    fit = FITS if est.fits else (TIGHT if est.total_bytes <= target.available_bytes else NO_FIT)
    return VariantPrediction(
        variant.name,
        variant.precision,
        speed_of.strategy,
        ctx,
        variant.download_bytes,
        est.total_bytes,
        est.margin_bytes,
        target.available_bytes,
        fit,
        speed_of.tokens_per_s,
        speed_of.ttft_ms,
        variant.quality_bits,
        target.device,
    )


def _spec(precision: str):

    return parse_precision(precision)


def recommend(predictions: list[VariantPrediction], priority: str) -> Optional[VariantPrediction]:
    """Mark the variant recommended here for ``priority``; None when none fits."""

    check_priority(priority)
    fitting = [p for p in predictions if p.fit == FITS]
    if not fitting:
        return None
    useful = [p for p in fitting if (p.tokens_per_s or 0) >= USEFUL_TOKENS_PER_S] or fitting

    def speed(p):
        return p.tokens_per_s or 0.0

    if priority == "quality":
        best = max(useful, key=lambda p: (p.quality_bits, speed(p)))
        why = "the highest quality that fits here at a useful speed"
    elif priority == "speed":
        best = max(useful, key=lambda p: (speed(p), p.quality_bits))
        why = "the fastest that fits here"
    else:
        eight = [p for p in useful if p.quality_bits >= 8]
        if eight:
            best = max(eight, key=lambda p: (speed(p), p.quality_bits))
            why = "the fastest that fits here with 8-bit weights or more"
        else:
            best = max(useful, key=lambda p: (p.quality_bits, speed(p)))
            why = "nothing with 8-bit weights fits: the highest quality that does"
    best.recommended = True
    best.why = why
    return best


def process_rss() -> int:
    """This process's resident memory now: the CPU baseline for a model this process will load."""

    return int(psutil.Process().memory_info().rss)


def machine_target(device: Optional[str] = None) -> tuple[Target, SpeedModel, int]:
    """This machine's target (GPU free memory, or free RAM), its speed model and learned memory correction.
    Imports torch (the speed model measures the machine once): run it off the UI thread."""

    target = detect_target(device=device)
    correction = correction_bytes(target.device, key=target.calibration_key) if target.calibration_key else 0
    return target, SpeedModel(this_machine(target.device)), correction


def predict_repo(
    rv: RepoVariants,
    context: Optional[int] = None,
    priority: str = "balanced",
    target: Optional[Target] = None,
    speed: Optional[SpeedModel] = None,
    correction: int = 0,
    baseline_bytes: Optional[int] = None,
) -> list[VariantPrediction]:
    """Every variant of ``rv`` predicted (on this machine unless ``target``/``speed`` say otherwise), the one
    recommended here marked. ``baseline_bytes``: see ``predict_variant``."""
    if target is None or speed is None:
        t, s, c = machine_target()
        target, speed, correction = target or t, speed or s, correction or c
    out = [predict_variant(v, target, speed, context, correction, baseline_bytes) for v in rv.variants]
    recommend(out, priority)
    return out
