"""Which configuration to load: the user's priority, the memory that fits, the speed predicted here.

- **quality** first (the memory suggestion's order, ``fit.suggested_ladder``): the highest precision that fits —
  bf16 (fp16 on cards without bf16), then int8, then nf4, with q8 by its bytes where Redline's CPU kernels run —
  and for it the fastest strategy;
- **balanced** (the default): the fastest configuration that fits and keeps at least 8-bit weights
  (fp32, bf16/fp16, q8, int8);
- **speed** first: the fastest configuration that fits, 4-bit weights included (q4, nf4).

The strategies considered change the speed but not the reply: ``kv``, ``fast`` (where the fast path runs the
architecture) and, on CUDA, ``static`` (compiled). Speculative decoding and prompt lookup are chosen by the
user (they need a draft model, or depend on the text). ``precision``/``strategy`` other than ``auto`` pin that
half of the choice. The KV cache stays in the form the planner was given (``--kv``, Settings → KV cache), except
that where nothing considered fits with a 16-bit cache and the fast path's 8-bit one makes it fit, ``auto`` takes
the 8-bit cache (``AutoChoice.kv``) and its reason says so; and under the ``speed`` priority, where a long context
makes the cache a real share of what a fast-path step reads (``KV_SPEED_SHARE``), the fast path with the 8-bit
cache is ranked too and taken where it is predicted faster at that context (its reason gives both speeds). Under
``balanced`` and ``quality`` the 8-bit cache's quality cost stays the user's call. The chat window and ``redline
chat`` both resolve ``auto`` through ``resolve_auto``; the wizard's table shows each precision's
``fastest_that_fits`` of what ``rank_strategies`` ranks, the ranking ``choose`` picks from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Optional, Union

from ..cost import code_path
from ..errors import UnsupportedConfiguration
from ..estimate.calibration import correction_bytes
from ..estimate.estimator import ModelShape
from ..estimate.fit import DEFAULT_CONTEXT_CAP, MIN_CONTEXT, Planner, detect_target, suggest
from ..estimate.model_shapes import read_shape
from ..precision import QUANTISED, PrecisionSpec, bitsandbytes_available, parse_precision
from ..units import format_bytes
from . import arithmetic  # arithmetic.this_machine read at call time (tests give it a profile)
from .arithmetic import SpeedPrediction
from .model import CHAT_NEW_TOKENS, CHAT_PROMPT_TOKENS, SpeedModel

PRIORITIES = ("quality", "balanced", "speed")
DEFAULT_PRIORITY = "balanced"
PRIORITY_LABELS = {
    "quality": "Quality first",
    "balanced": "Balanced (fastest with 8-bit weights or more)",
    "speed": "Speed first",
}
EIGHT_BIT = ("fp32", "bf16", "fp16", "q8", "int8")
# Under the speed priority the 8-bit KV cache is weighed where a 16-bit cache read at the context is at least this
# share of a fast-path decode step's bytes (the starter at q8 on a CPU: 19 % at 2,048 tokens, 48 % at 8,192).
KV_SPEED_SHARE = 0.10


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
    kv: str = "bf16"  # the KV cache's form this configuration keeps (``--kv``)
    # The whole prediction (bytes per token, bandwidth, what was learned here), for a table's tooltip; not in the
    # JSON record (``redline estimate --json`` lists each candidate's figures above).
    prediction: Optional[SpeedPrediction] = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "prediction"}


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
    kv: str = "bf16"  # the KV cache's form to load with (``kv_form_job``): "q8" where only that makes it fit

    def to_dict(self) -> dict:
        d = asdict(replace(self, candidates=[]))
        d["candidates"] = [c.to_dict() for c in self.candidates]
        return d


def check_priority(priority: str) -> str:
    if priority not in PRIORITIES:
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


def _strategies(shape: ModelShape, spec: PrecisionSpec, device: str) -> list[str]:
    """The strategies ``auto`` weighs: those that give the same reply and run here."""
    out = ["kv"]
    if code_path("fast", spec, shape, device)[0] == "fast":
        out.append("fast")
    if device.startswith("cuda"):
        out.append("static")
    return out


def auto_strategy(
    shape: ModelShape,
    precision: Union[str, PrecisionSpec],
    speed: SpeedModel,
    prompt_tokens: int = CHAT_PROMPT_TOKENS,
    new_tokens: int = CHAT_NEW_TOKENS,
) -> str:
    """Strategy ``auto`` for a precision already fixed (a model loaded at it): what ``choose`` takes with that
    precision pinned, from the same ranking and the same pick (memory aside: the model is loaded, so all fit). The
    one meaning of ``auto`` (docs/speed-model.md#auto), for whatever resolves a request that still says it."""
    return fastest_that_fits(
        rank_strategies(shape, None, speed, 0, precision, "auto", prompt_tokens, new_tokens)
    ).strategy


def rank_strategies(
    shape: ModelShape,
    planner: Optional[Planner],
    speed: SpeedModel,
    context: int,
    precision: Union[str, PrecisionSpec],
    strategy: str = "auto",
    prompt_tokens: int = CHAT_PROMPT_TOKENS,
    new_tokens: int = CHAT_NEW_TOKENS,
) -> list[Candidate]:
    """One precision's configurations, fastest predicted first: the strategies ``auto`` weighs for it (or the one
    pinned), each with its prediction and whether it fits at ``context``. ``choose`` ranks every precision it
    considers with this, and the wizard shows each row's ``fastest_that_fits``: one ranking, not a copy of it.
    ``planner`` None: the model is loaded already, so each fits (``auto_strategy``)."""
    spec = precision if isinstance(precision, PrecisionSpec) else parse_precision(precision)
    label = precision if isinstance(precision, str) else spec.label()
    device = planner.target.device if planner is not None else speed.machine.device
    est = planner.estimate(spec, context) if planner is not None else None
    out: list[Candidate] = []
    for s in _strategies(shape, spec, device) if strategy in ("auto", "", None) else [strategy]:
        if s == "fast" and spec.name in QUANTISED:
            continue
        # The fast path's fused weights can add to a mapped checkpoint (estimator.fast_path_copy_bytes).
        s_est = planner.estimate(spec, context, strategy=s) if (planner is not None and s == "fast") else est
        # A pinned strategy whose speed depends on a draft or the text ranks the precisions as kv does.
        as_kv = "kv" if s in ("speculative", "prompt-lookup") else s
        kv = planner.kv_form(spec, s) if planner is not None else "bf16"
        pred = speed.predict(shape, spec, as_kv, prompt_tokens, new_tokens, kv=kv)
        out.append(
            Candidate(
                label,
                s,
                pred.tokens_per_s,
                pred.ttft_ms,
                s_est is None or bool(s_est.fits),
                s_est.total_bytes if s_est is not None else 0,
                pred.measured_tokens_per_s,
                pred.calibration,
                kv,
                pred,
            )
        )
    out.sort(key=lambda c: -c.tokens_per_s)
    return out


def fastest_that_fits(candidates: list[Candidate]) -> Optional[Candidate]:
    """What ``choose`` takes from a ranking: the fastest that fits (``trusted_fastest``), or, where none fits, the
    fastest (a table row that does not fit still shows its speed). None for an empty ranking."""
    fitting = [c for c in candidates if c.fits]
    return trusted_fastest(fitting) if fitting else (candidates[0] if candidates else None)


def _uncorrected(c: Candidate) -> float:
    pred = getattr(c, "prediction", None)
    return pred.uncorrected_tokens_per_s if pred is not None else c.tokens_per_s


def trusted_fastest(ranked: list[Candidate]) -> Candidate:
    """The first of ``ranked`` (fastest first), except that a configuration not measured here never beats one
    measured here on a factor it borrowed (or on none) alone: it stays ahead of the measured ones only where the
    speed model's uncorrected prediction puts it ahead of each of them too. fast:q8, measured, lost to kv:q8, never
    measured, on kv:bf16's factor once two of its replies were slowed by other programs; what was measured says
    more than what was borrowed."""
    measured = [c for c in ranked if c.calibration == "class"]
    if not measured:
        return ranked[0]
    top = max(_uncorrected(c) for c in measured)
    return next(c for c in ranked if c.calibration == "class" or _uncorrected(c) > top)


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
        candidates += rank_strategies(shape, planner, speed, context, p, strategy, prompt_tokens, new_tokens)
    candidates.sort(key=lambda c: -c.tokens_per_s)
    best = fastest_that_fits(candidates)
    why_kv = ""
    if (
        best is not None
        and best.fits
        and priority == "speed"
        and planner.kv == "bf16"
        and (auto_s or strategy == "fast")
    ):
        candidates, faster = _faster_with_8bit_kv(shape, planner, speed, context, candidates, prompt_tokens, new_tokens)
        best = fastest_that_fits(candidates)
        why_kv = faster.get(best.precision, "") if best.kv == "q8" else ""
    if (best is None or not best.fits) and planner.kv == "bf16" and (auto_s or strategy == "fast"):
        candidates, why_kv = _with_8bit_kv(shape, planner, speed, context, priority, precisions, auto_p, candidates)
        best = fastest_that_fits(candidates)
    if best is not None and best.fits:
        ahead = next((c for c in candidates if c.fits), None)  # what the factors alone ranked first
        return AutoChoice(
            best.precision,
            best.strategy,
            priority,
            _reason(best, priority, auto_p, auto_s) + _why_not(ahead, best) + why_kv,
            best.tokens_per_s,
            best.ttft_ms,
            context,
            True,
            candidates,
            best.kv,
        )
    # Nothing considered fits: the memory suggestion names the change that would (or the lowest precision).
    s = suggest(planner, context, None if auto_p else precision)
    p = s.precision or (precisions[-1] if precisions else half)
    st = strategy if not auto_s else "kv"
    text = f"auto: {st} · {p} — nothing fits as asked; {s.text}"
    return AutoChoice(p, st, priority, text, None, None, s.context or context, False, candidates, planner.kv)


def _faster_with_8bit_kv(shape, planner: Planner, speed, context: int, candidates, prompt_tokens, new_tokens):
    """Speed first: each fast-path configuration that fits, ranked again with the 8-bit KV cache (its speed at the
    chat's prompt, as the rest of the ranking, just ahead of its 16-bit twin) where a 16-bit cache read at
    ``context`` is at least ``KV_SPEED_SHARE`` of the step and the 8-bit one is predicted faster there. Returns the
    candidates and, per precision given the 8-bit cache, the sentence that says by how much."""
    eight, out, why = planner.with_kv("q8"), [], {}
    full = max(1, context - new_tokens)  # a conversation that fills the context
    for c in candidates:
        spec = parse_precision(c.precision) if c.strategy == "fast" and c.kv == "bf16" and c.fits else None
        if spec is not None and eight.kv_form(spec, "fast") == "q8":
            wide = speed.predict(shape, spec, "fast", full, new_tokens)
            narrow = speed.predict(shape, spec, "fast", full, new_tokens, kv="q8")
            if wide.kv_read_bytes >= KV_SPEED_SHARE * wide.bytes_per_token and narrow.tokens_per_s > wide.tokens_per_s:
                twin = rank_strategies(shape, eight, speed, context, c.precision, "fast", prompt_tokens, new_tokens)[0]
                twin.tokens_per_s = max(twin.tokens_per_s, c.tokens_per_s)  # never behind its 16-bit twin
                out.append(twin)
                why[c.precision] = (
                    f"; 8-bit KV: ≈ {narrow.tokens_per_s:.{_places(narrow.tokens_per_s)}f} tok/s at {context:,} "
                    f"tokens against {wide.tokens_per_s:.{_places(wide.tokens_per_s)}f} with 16-bit"
                )
        out.append(c)
    out.sort(key=lambda c: -c.tokens_per_s)  # stable: a twin stays ahead of its 16-bit one
    return out, why


def _places(tokens_per_s: float) -> int:
    return 0 if tokens_per_s >= 10 else 1  # as the reason's own speed


def _with_8bit_kv(shape, planner: Planner, speed, context, priority, precisions, auto_p, candidates):
    """Nothing fits with a 16-bit KV cache: the fast path's configurations with an 8-bit one, ranked, put before
    those that did not fit, and the sentence that says what the 8-bit cache changed ("" where it makes nothing fit:
    the candidates are then as they were)."""
    eight = planner.with_kv("q8")
    if auto_p and priority == "quality":
        first = suggest(eight, context)
        precisions = [first.precision] if (first.precision and first.change is None) else []
    more = [c for p in precisions for c in rank_strategies(shape, eight, speed, context, p, "fast") if c.kv == "q8"]
    more.sort(key=lambda c: -c.tokens_per_s)
    best = fastest_that_fits(more)
    if best is None or not best.fits:
        return candidates, ""
    spec = parse_precision(best.precision)
    wide, narrow = (p.estimate(spec, context, strategy="fast").kv_cache_bytes for p in (planner, eight))
    why = (
        f"; with the KV cache in 8 bits: at {context:,} tokens a 16-bit cache ({format_bytes(wide)}) would not fit, "
        f"an 8-bit one ({format_bytes(narrow)}) does"
    )
    return more + candidates, why


def _reason(best: Candidate, priority: str, auto_p: bool, auto_s: bool) -> str:
    speed = (
        f"≈ {best.tokens_per_s:.0f} tok/s predicted"
        if best.tokens_per_s >= 10
        else (f"≈ {best.tokens_per_s:.1f} tok/s predicted")
    )
    if best.measured_tokens_per_s is not None:
        speed += f", {best.measured_tokens_per_s:.1f} measured here"
    speed += "; " + learned_from(best)
    head = f"auto: {best.strategy} · {best.precision}{' · 8-bit KV' if best.kv == 'q8' else ''} — "
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


def learned_from(c: Candidate) -> str:
    """What the candidate's speed factor was learned from, as the status line says it."""
    pred = getattr(c, "prediction", None)
    n = pred.calibration_samples if pred is not None else 0
    if c.calibration == "class":
        text = f"learned from {n} of its replies here" if n else "learned from its replies here"
    elif c.calibration == "device":
        text = f"not measured here, factor borrowed from other {c.strategy} replies"
    else:
        text = "nothing measured here yet"
    busy = next((note for note in (pred.notes if pred is not None else []) if note.endswith("busy: set aside")), "")
    if busy:
        text += f"; {busy.split(' of ')[0]} measured while the machine was busy set aside"
    return text


def _why_not(ahead: Optional[Candidate], best: Candidate) -> str:
    """Why the configuration the factors alone ranked first was not chosen (``trusted_fastest``), or ""."""
    if ahead is None or ahead is best:
        return ""
    return (
        f"; not {ahead.strategy} · {ahead.precision} (≈ {ahead.tokens_per_s:.1f} tok/s): not measured here, ahead only "
        "on a borrowed factor"
    )


def resolve_auto(
    model: str,
    device: str,
    precision: str = "auto",
    strategy: str = "auto",
    priority: str = DEFAULT_PRIORITY,
    context: Optional[int] = None,
    reclaimable_bytes: int = 0,
    free_gb: Optional[float] = None,
    kv: str = "bf16",
) -> AutoChoice:
    """``auto`` for ``model`` on this machine, as the chat window and ``redline chat`` both resolve it; ``kv``: the
    KV cache's form set (Settings → KV cache, ``--kv``), which the choice may take to 8 bits (``AutoChoice.kv``).

    Reads the model's shape (no weights), the memory available (the model loaded now counts as free when
    ``reclaimable_bytes`` says so), the learned memory correction, the measured bandwidth and FLOP/s, and
    the learned speed factors. Runs on the engine thread (it may import torch)."""

    shape = read_shape(model)
    target = detect_target(free_gb, None, reclaimable_bytes, device)
    correction = correction_bytes(target.device, key=target.calibration_key) if target.calibration_key else 0
    planner = Planner(shape, target, 1, None, None, correction, kv)
    ctx = context or min(shape.max_positions, DEFAULT_CONTEXT_CAP)
    ctx = max(min(ctx, shape.max_positions), min(MIN_CONTEXT, shape.max_positions))
    speed = SpeedModel(arithmetic.this_machine(target.device))
    return choose(shape, planner, speed, ctx, priority, precision, strategy)
