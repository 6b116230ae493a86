"""Which configuration to load: the user's priority, the memory that fits, the speed predicted here.

- **quality** first (today's order): the highest precision that fits — bf16 (fp16 on cards without bf16),
  then int8, then nf4 — and for it the fastest strategy;
- **balanced** (the default): the fastest configuration that fits and keeps at least 8-bit weights
  (fp32, bf16/fp16, q8, int8);
- **speed** first: the fastest configuration that fits, 4-bit weights included (q4, nf4).

The strategies considered change the speed but not the reply: ``kv``, ``fast`` (where the fast path runs the
architecture) and, on CUDA, ``static`` (compiled). Speculative decoding and prompt lookup are chosen by the
user (they need a draft model, or depend on the text). ``precision``/``strategy`` other than ``auto`` pin that
half of the choice. The chat window and ``redline chat`` both resolve ``auto`` through ``resolve_auto``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from redline.inference.cost import code_path
from redline.inference.loading.precision import QUANTISED, bitsandbytes_available, parse_precision
from redline.inference.memory.estimator import ModelShape
from redline.inference.memory.fit import MIN_CONTEXT, Planner, suggest
from redline.inference.speed.model import SpeedModel

PRIORITIES = ("quality", "balanced", "speed")
DEFAULT_PRIORITY = "balanced"
PRIORITY_LABELS = {
    "quality": "Quality first",
    "balanced": "Balanced (fastest with 8-bit weights or more)",
    "speed": "Speed first",
}
EIGHT_BIT = ("fp32", "bf16", "fp16", "q8", "int8")
DEFAULT_CONTEXT_CAP = 8192  # as `redline estimate` and the wizard: the model's context, at most this
# The lengths a prediction for "a chat reply" assumes.
CHAT_PROMPT_TOKENS = 64
CHAT_NEW_TOKENS = 256


@dataclass
class Candidate:
    precision: str
    strategy: str
    tokens_per_s: float
    ttft_ms: float
    fits: bool
    total_bytes: int
    measured_tokens_per_s: Optional[float] = None
    calibration: str = "none"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class AutoChoice:
    precision: Optional[str]  # None: nothing fits
    strategy: str
    priority: str
    reason: str  # one line, as the status bar shows it
    tokens_per_s: Optional[float] = None
    ttft_ms: Optional[float] = None
    context: Optional[int] = None
    fits: bool = True
    candidates: list[Candidate] = field(default_factory=list)  # fastest first

    def to_dict(self) -> dict:
        d = asdict(self)
        d["candidates"] = [c.to_dict() for c in self.candidates]
        return d


def check_priority(priority: str) -> str:
    if priority not in PRIORITIES:
        from redline.inference.errors import UnsupportedConfiguration

        raise UnsupportedConfiguration(f"Unknown priority {priority!r}.", f"Choose one of: {', '.join(PRIORITIES)}.")
    return priority


def _precisions(priority: str, half: str, device: str, packed: bool = False) -> list[str]:
    if packed:
        # A converted quantised GGUF: its layers as the file has them keep the quality its user chose; other
        # precisions start from its de-quantised weights and are never better than the file, so only speed
        # first weighs them against it.
        return ["gguf"] + (["q4", "q8", half] if priority == "speed" else [])
    bnb = bitsandbytes_available()
    out = ["fp32", half, "q8"] + (["int8"] if bnb else [])
    if priority == "speed":
        out += ["q4"] + (["nf4"] if bnb else [])
    if device.startswith("cuda"):
        out = [p for p in out if p != "fp32"]  # twice bf16's bytes and no tensor cores: never the fastest
    return out


def _strategies(shape: ModelShape, precision: str, device: str) -> list[str]:
    spec = parse_precision(precision)
    out = ["kv"]
    if code_path("fast", spec, shape, device)[0] == "fast":
        out.append("fast")
    if device.startswith("cuda"):
        out.append("static")
    return out


def choose(
    shape: ModelShape,
    planner: Planner,
    speed: SpeedModel,
    context: int,
    priority: str = DEFAULT_PRIORITY,
    precision: str = "auto",
    strategy: str = "auto",
    prompt_tokens: int = CHAT_PROMPT_TOKENS,
    new_tokens: int = CHAT_NEW_TOKENS,
) -> AutoChoice:
    """The configuration to load for ``priority``, among those that fit at ``context`` tokens."""
    check_priority(priority)
    device = planner.target.device
    half = "bf16" if planner.target.bf16 else "fp16"
    auto_p = precision in ("auto", "", None)
    auto_s = strategy in ("auto", "", None)
    if auto_p and priority == "quality":
        first = suggest(planner, context)
        precisions = [first.precision] if (first.precision and first.change is None) else []
    elif auto_p:
        precisions = _precisions(priority, half, device, bool(getattr(shape, "packed", None)))
    else:
        precisions = [precision]
    candidates: list[Candidate] = []
    for p in precisions:
        spec = parse_precision(p)
        est = planner.estimate(spec, context)
        strategies = _strategies(shape, p, device) if auto_s else [strategy]
        for s in strategies:
            if s == "fast" and spec.name in QUANTISED:
                continue
            # The fast path's fused weights can add to a mapped checkpoint (estimator.fast_path_copy_bytes).
            s_est = planner.estimate(spec, context, strategy=s) if s == "fast" else est
            # A pinned strategy whose speed depends on a draft or the text ranks the precisions as kv does.
            rank = "kv" if s in ("speculative", "prompt-lookup") else s
            pred = speed.predict(shape, spec, rank, prompt_tokens, new_tokens)
            candidates.append(
                Candidate(
                    p,
                    s,
                    pred.tokens_per_s,
                    pred.ttft_ms,
                    bool(s_est.fits),
                    s_est.total_bytes,
                    pred.measured_tokens_per_s,
                    pred.calibration,
                )
            )
    candidates.sort(key=lambda c: -c.tokens_per_s)
    fitting = [c for c in candidates if c.fits]
    if fitting:
        best = fitting[0]
        return AutoChoice(
            best.precision,
            best.strategy,
            priority,
            _reason(best, priority, auto_p, auto_s),
            best.tokens_per_s,
            best.ttft_ms,
            context,
            True,
            candidates,
        )
    # Nothing considered fits: the memory suggestion names the change that would (or the lowest precision).
    s = suggest(planner, context, None if auto_p else precision)
    p = s.precision or (precisions[-1] if precisions else half)
    st = strategy if not auto_s else "kv"
    text = f"auto: {st} · {p} — nothing fits as asked; {s.text}"
    return AutoChoice(p, st, priority, text, None, None, s.context or context, False, candidates)


def _reason(best: Candidate, priority: str, auto_p: bool, auto_s: bool) -> str:
    speed = (
        f"≈ {best.tokens_per_s:.0f} tok/s predicted"
        if best.tokens_per_s >= 10
        else (f"≈ {best.tokens_per_s:.1f} tok/s predicted")
    )
    if best.measured_tokens_per_s is not None:
        speed += f", {best.measured_tokens_per_s:.1f} measured here"
    head = f"auto: {best.strategy} · {best.precision} — "
    if not auto_p:
        return head + f"the fastest strategy for {best.precision} ({speed})"
    if best.precision == "gguf" and priority != "speed":
        why = "the GGUF's layers as the file has them" + (", with the fastest strategy" if auto_s else "")
    elif priority == "quality":
        why = (
            "the highest precision that fits, with its fastest strategy"
            if auto_s
            else "the highest precision that fits"
        )
    elif priority == "balanced":
        why = (
            "fastest that fits with 8-bit weights"
            if auto_s
            else f"the fastest 8-bit-or-more precision for {best.strategy}"
        )
    else:
        why = "fastest that fits" if auto_s else f"the fastest precision for {best.strategy}"
    return head + f"{why} ({speed})"


def resolve_auto(
    model: str,
    device: str,
    precision: str = "auto",
    strategy: str = "auto",
    priority: str = DEFAULT_PRIORITY,
    context: Optional[int] = None,
    reclaimable_bytes: int = 0,
    free_gb: Optional[float] = None,
) -> AutoChoice:
    """``auto`` for ``model`` on this machine, as the chat window and ``redline chat`` both resolve it.

    Reads the model's shape (no weights), the memory available (the model loaded now counts as free when
    ``reclaimable_bytes`` says so), the learned memory correction, the measured bandwidth and FLOP/s, and
    the learned speed factors. Runs on the engine thread (it may import torch)."""
    from redline.inference.memory.calibration import correction_bytes
    from redline.inference.memory.fit import detect_target
    from redline.inference.memory.model_shapes import read_shape
    from redline.inference.speed.arithmetic import this_machine

    shape = read_shape(model)
    target = detect_target(free_gb, None, reclaimable_bytes, device)
    correction = correction_bytes(target.device, key=target.calibration_key) if target.calibration_key else 0
    planner = Planner(shape, target, 1, None, None, correction)
    ctx = context or min(shape.max_positions, DEFAULT_CONTEXT_CAP)
    ctx = max(min(ctx, shape.max_positions), min(MIN_CONTEXT, shape.max_positions))
    speed = SpeedModel(this_machine(target.device))
    return choose(shape, planner, speed, ctx, priority, precision, strategy)
