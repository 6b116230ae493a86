"""The per-machine speed correction: predicted vs measured tokens/s and TTFT, learned from this machine.

Every chat reply (``Engine``) and every speed-lab row (``bench/lab.py``) records the speed model's
uncorrected prediction beside what was measured. The ratio measured ÷ predicted of the last records of a
configuration's class (strategy × precision) on this device becomes that class's factor — the median, so one
reply slowed by another program cannot swing it, and bounded, since a ratio far outside the bounds means a
broken measurement rather than a slow kernel. A class not measured yet borrows the median of this device's
other records, so a machine that is slower than the defaults everywhere is predicted slower everywhere.

What a record teaches, and what it does not:

- the TTFT it keeps is the reply's own prefill, from the start of its work to its first token: a reply that waited
  behind another (or behind the speed lab) keeps that wait apart (``queued_ms``), never in its TTFT;
- each record keeps how busy the machine was while it was measured (``hardware/load.py``: other programs' share of
  the cores, the load average). A record taken while other programs kept the cores busy is set aside while its
  class has quiet ones; a class measured only under load learns from it once it has ``BUSY_QUORUM`` such records
  (this machine is busy as a rule), not on a handful — two replies slowed by a build flipped ``auto`` from the
  fast path to kv;
- each record keeps the machine's bandwidth and FLOP/s its prediction started from: a ratio is against those, so
  once they are measured again (``hardware/measurements.py``: a busy read replaced by a quiet one) the records made
  against the old figures no longer teach;
- where this device's quiet records say the predictions are off by more than ``DRIFT``× overall, the figures
  themselves may be wrong (read while the machine was busy, or before a change to it): they are measured again at
  the next chance (``measurements.mark_stale``).

A reply that thought (a reasoning model's, thinking on) also keeps its thinking tokens, from which the typical
thinking length of its model is learned (``speed/thinking.py``): the time to its first answer token.

Speculative pairs also keep their measured acceptance (accepted ÷ proposed draft tokens), per target, draft,
draft precision and draft tokens per step: the one figure the speed model cannot predict from shapes.

Stored as ``speed-calibration.json`` beside ``memory-calibration.json`` (``REDLINE_DATA_DIR`` overrides).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..estimate.calibration import data_dir, device_key
from ..estimate.model_shapes import shape_for_folder
from ..hardware.load import busy, cpu_count
from ..hardware.measurements import mark_stale
from . import arithmetic  # arithmetic.this_machine read at call time (tests give it a profile)
from .arithmetic import SpeedPrediction, predict
from .thinking import learned_thinking, reply_thinking

CLASS_HISTORY = 20  # records kept per class and device
LEARN_FROM = 10  # a class's factor is the median ratio of its last N records
FIT_SPAN = 3  # the longest prompt of a class's replies over its shortest, for a two-part TTFT fit
DEVICE_LEARN_FROM = 20  # an unmeasured class borrows the median of the device's last N records
MIN_FACTOR, MAX_FACTOR = 0.02, 20.0  # the factor's bounds: a busy 2-core CPU measured 0.05
BROKEN_RATIO = 100.0  # a ratio beyond 100× either way is a broken measurement: not recorded
MIN_TOKENS = 8  # replies shorter than this say too little about decode speed
ACCEPTANCE_HISTORY = 10
BUSY_QUORUM = 5  # a class measured only while the machine was busy learns from those records once it has this many
FIGURES_TOLERANCE = 0.1  # a record made against bandwidth / FLOP/s more than 10 % away is against another base
DRIFT = 2.0  # the device's median factor beyond 2x either way: measure the machine's figures again
DRIFT_SAMPLES = 5  # ... judged over at least this many quiet records


def calibration_file() -> Path:
    return data_dir() / "speed-calibration.json"


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # missing or damaged: start over rather than fail


def _bounded(x: float) -> float:
    return max(MIN_FACTOR, min(MAX_FACTOR, x))


@dataclass
class Factor:
    value: float = 1.0
    source: str = "none"  # "class" | "device" | "none"
    samples: int = 0
    set_aside: int = 0  # of the class's last records, those measured while the machine was busy and not used


def was_busy(record: dict) -> bool:
    """Whether a record was measured while other programs kept the machine busy (``hardware/load.py``)."""

    return busy(record.get("others_cpu_share"), record.get("load_average"), record.get("cpus"))


def taught_by(records: list) -> list:
    """The records a factor learns from: the quiet ones; where there are none, the busy ones only once they are
    ``BUSY_QUORUM`` or more (a busy machine as a rule), never a handful."""
    quiet = [r for r in records if not was_busy(r)]
    if quiet:
        return quiet
    return records if len(records) >= BUSY_QUORUM else []


def _same_base(record: dict, figures: Optional[tuple]) -> bool:
    """Whether ``record``'s prediction started from the machine figures ``figures`` (bandwidth, FLOP/s) give, within
    ``FIGURES_TOLERANCE`` (a record that did not keep them, or no figures to compare with: yes)."""
    if figures is None or record.get("bandwidth_bytes_per_s") is None:
        return True
    for mine, theirs in zip(figures, (record.get("bandwidth_bytes_per_s"), record.get("flops"))):
        if mine is None or theirs is None:
            if mine is not theirs:
                return False
            continue
        if abs(theirs - mine) > FIGURES_TOLERANCE * mine:
            return False
    return True


class SpeedCalibration:
    """The learned factors of one file, read once (cheap to build; the wizard reads it per refresh)."""

    def __init__(self, path: Optional[Path] = None, data: Optional[dict] = None):
        self.path = path or calibration_file()
        self.data = data if data is not None else _load(self.path)

    def reload(self) -> None:
        """Read the file again (another part of the app recorded something)."""
        self.data = _load(self.path)

    # -- reading --------------------------------------------------------------------
    def _records(self, key: Optional[str]) -> dict:
        if not key:
            return {}
        dev = self.data.get("devices", {}).get(key, {})
        return dev if isinstance(dev, dict) else {}

    def _factor(self, key: Optional[str], cls: str, field: str, figures: Optional[tuple] = None) -> Factor:
        classes = self._records(key)
        last = [r for r in classes.get(cls, []) if r.get(field) and _same_base(r, figures)][-LEARN_FROM:]
        own = taught_by(last)
        set_aside = len(last) - len(own)
        if own:
            return Factor(_bounded(statistics.median(r[field] for r in own)), "class", len(own), set_aside)
        # An unmeasured class borrows from the classes of its own strategy only: the strategies' code paths err
        # differently before correction (here the fast path's raw prediction was a third of what it measured,
        # transformers' kv path's within 5 %), so kv:fp32 borrowing the fast path's factor was predicted at 52
        # tok/s against 17.5 measured, and auto chose it over the fast path (tests/model_browser_accuracy.py).
        strategy = cls.split(":", 1)[0]
        same = [rs for c, rs in classes.items() if c.split(":", 1)[0] == strategy]
        pooled = sorted(
            (r for rs in same for r in rs if r.get(field) and _same_base(r, figures)), key=lambda r: r.get("time", 0)
        )
        pooled = [r[field] for r in taught_by(pooled[-DEVICE_LEARN_FROM:])]
        if pooled:
            return Factor(_bounded(statistics.median(pooled)), "device", len(pooled), set_aside)
        return Factor(set_aside=set_aside)

    def decode_factor(self, key: Optional[str], cls: str, figures: Optional[tuple] = None) -> Factor:
        """``figures``: the (bandwidth, FLOP/s) the prediction to correct starts from; records made against others
        are left out (None: all)."""
        return self._factor(key, cls, "decode_ratio", figures)

    def ttft_factor(self, key: Optional[str], cls: str, figures: Optional[tuple] = None) -> Factor:
        return self._factor(key, cls, "ttft_ratio", figures)

    def drift(self, key: Optional[str]) -> Optional[float]:
        """The median decode factor over this device's last quiet records of every class (None with fewer than
        ``DRIFT_SAMPLES``): far from 1, the machine's figures the predictions start from are likely wrong."""
        rows = [r for rs in self._records(key).values() if isinstance(rs, list) for r in rs if r.get("decode_ratio")]
        rows = [r for r in sorted(rows, key=lambda r: r.get("time", 0)) if not was_busy(r)][-DEVICE_LEARN_FROM:]
        return statistics.median(r["decode_ratio"] for r in rows) if len(rows) >= DRIFT_SAMPLES else None

    def ttft_fit(self, key: Optional[str], cls: str, figures: Optional[tuple] = None) -> Optional[tuple[float, float]]:
        """Factors for the prefill's two parts (``SpeedPrediction.ttft_compute_ms``, ``ttft_fixed_ms``) that fit
        this class's replies best in relative error, when they span prompt lengths at least FIT_SPAN apart (one
        length cannot tell a per-FLOP cost from a fixed one) and both factors come out positive; else None (the
        single factor then applies). Why two: the starter's bf16 prefill took 3.6 ms a token at 44 tokens and 1.9
        at 300, which one factor per class cannot follow (a 1B-shaped model's TTFT was 42 % off)."""
        rows = [
            r
            for r in self._records(key).get(cls, [])
            if r.get("measured_ttft_ms") and r.get("predicted_ttft_compute_ms") is not None and _same_base(r, figures)
        ]
        rows = taught_by(rows[-LEARN_FROM:])
        lengths = [max(1, r.get("prompt_tokens", 0) - r.get("cached_tokens", 0)) for r in rows]
        if len(rows) < 2 or max(lengths) < FIT_SPAN * min(lengths):
            return None
        # Minimise the sum of ((alpha C + beta F) / M - 1)^2: the 2 x 2 normal equations.
        saa = sab = sbb = sa = sb = 0.0
        for r in rows:
            m = float(r["measured_ttft_ms"])
            a, b = r["predicted_ttft_compute_ms"] / m, r["predicted_ttft_fixed_ms"] / m
            saa, sab, sbb, sa, sb = saa + a * a, sab + a * b, sbb + b * b, sa + a, sb + b
        det = saa * sbb - sab * sab
        if det <= 1e-12 * max(1.0, saa * sbb):
            return None
        alpha, beta = (sa * sbb - sb * sab) / det, (sb * saa - sa * sab) / det
        if not (MIN_FACTOR <= alpha <= MAX_FACTOR and MIN_FACTOR <= beta <= MAX_FACTOR):
            return None
        return alpha, beta

    def measured(self, key: Optional[str], cls: str, model: str) -> tuple[Optional[float], int]:
        """The median decode tokens/s measured here for this model and class, and how many records."""
        rows = [
            r
            for r in self._records(key).get(cls, [])[-LEARN_FROM:]
            if r.get("model") == model and r.get("measured_tokens_per_s")
        ]
        values = [r["measured_tokens_per_s"] for r in taught_by(rows)]
        return (statistics.median(values), len(values)) if values else (None, 0)

    def acceptance(self, target: str, draft: str, draft_precision: str, k: int) -> Optional[float]:
        """The median acceptance rate measured for this pair (None if never measured)."""
        rates = [
            r["rate"] for r in self.data.get("acceptance", {}).get(pair_key(target, draft, draft_precision, k), [])
        ]
        return statistics.median(rates) if rates else None

    def thinking_length(self, model: str) -> tuple[Optional[float], int]:
        """The typical thinking length of ``model``'s replies here (``thinking.learned_thinking``): records of every
        device and class, since how long a model thinks does not depend on how it is decoded."""
        records = [
            r
            for dev in self.data.get("devices", {}).values()
            if isinstance(dev, dict)
            for rs in dev.values()
            if isinstance(rs, list)
            for r in rs
            if isinstance(r, dict)
        ]
        return learned_thinking(records, model)

    def apply(self, prediction: SpeedPrediction, key: Optional[str], model: str) -> SpeedPrediction:
        """Fill in the learned factors and what was measured here."""
        figures = (prediction.bandwidth_bytes_per_s, prediction.flops)
        d = self.decode_factor(key, prediction.class_key, figures)
        t = self.ttft_factor(key, prediction.class_key, figures)
        prediction.decode_factor, prediction.ttft_factor = d.value, t.value
        prediction.ttft_fit = self.ttft_fit(key, prediction.class_key, figures)
        prediction.calibration, prediction.calibration_samples = d.source, d.samples
        if d.set_aside:
            prediction.notes.append(
                f"{d.set_aside} of this configuration's replies here were measured while other programs kept the "
                "machine busy: set aside"
            )
        prediction.measured_tokens_per_s, prediction.measured_samples = self.measured(key, prediction.class_key, model)
        prediction.thinking_tokens, prediction.thinking_samples = self.thinking_length(model)
        return prediction

    # -- writing --------------------------------------------------------------------
    def record(
        self,
        prediction: SpeedPrediction,
        key: str,
        model: str,
        measured_tokens_per_s: Optional[float],
        measured_ttft_ms: Optional[float],
        source: str,
        others_cpu_share: Optional[float] = None,
        load_average: Optional[float] = None,
        thinking: Optional[dict] = None,
    ) -> Optional[dict]:
        """Append one measurement (``prediction`` uncorrected for the same lengths) and save; the record or None.
        ``measured_ttft_ms``: the reply's own prefill (never its wait in a queue). ``others_cpu_share`` and
        ``load_average``: how busy the machine was while it was measured (``hardware/load.py``), where the caller
        watched it; unknown, a record counts as quiet. ``thinking``: a reply that thought, its thinking tokens and
        whether it was cut off while thinking (``thinking.reply_thinking``), kept for its model's typical length."""

        entry = {
            "model": model,
            "source": source,  # "chat" | "lab" | "acceptance"
            "prompt_tokens": prediction.prompt_tokens,
            "cached_tokens": prediction.cached_tokens,
            "new_tokens": prediction.new_tokens,
            "predicted_tokens_per_s": round(prediction.uncorrected_tokens_per_s, 3),
            "measured_tokens_per_s": measured_tokens_per_s,
            "predicted_ttft_ms": round(prediction.uncorrected_ttft_ms, 2),
            "predicted_ttft_compute_ms": round(prediction.ttft_compute_ms, 3),
            "predicted_ttft_fixed_ms": round(prediction.ttft_fixed_ms, 3),
            "measured_ttft_ms": measured_ttft_ms,
            # The figures the prediction started from: its ratio is against them (``_same_base``).
            "bandwidth_bytes_per_s": prediction.bandwidth_bytes_per_s,
            "flops": prediction.flops,
            # How busy the machine was (``was_busy``): a record taken under load is set aside while quiet ones exist.
            "others_cpu_share": others_cpu_share,
            "load_average": load_average,
            "cpus": cpu_count(),
            "time": time.time(),
            **(thinking or {}),
        }
        # Each ratio is measured ÷ predicted in its own unit (tokens/s; ms), so each factor multiplies its
        # own prediction.
        decode = _ratio(measured_tokens_per_s, prediction.uncorrected_tokens_per_s)
        ttft = _ratio(measured_ttft_ms, prediction.uncorrected_ttft_ms)
        if decode is None and ttft is None:
            return None
        entry["decode_ratio"] = decode
        entry["ttft_ratio"] = ttft
        devices = self.data.setdefault("devices", {})
        classes = devices.setdefault(key, {})
        classes[prediction.class_key] = (classes.get(prediction.class_key, []) + [entry])[-CLASS_HISTORY:]
        self.save()
        return entry

    def record_acceptance(
        self,
        target: str,
        draft: str,
        draft_precision: str,
        k: int,
        rate: Optional[float],
        proposed: Optional[int] = None,
        accepted: Optional[int] = None,
    ) -> None:
        if rate is None or proposed == 0:
            return
        table = self.data.setdefault("acceptance", {})
        key = pair_key(target, draft, draft_precision, k)
        entry = {"rate": rate, "proposed": proposed, "accepted": accepted, "time": time.time()}
        table[key] = (table.get(key, []) + [entry])[-ACCEPTANCE_HISTORY:]
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.data, indent=1), encoding="utf-8")
            tmp.replace(self.path)
        except OSError:
            pass  # a correction that cannot be saved must not break the chat


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if not a or not b or a <= 0 or b <= 0:
        return None
    r = a / b
    return r if 1.0 / BROKEN_RATIO <= r <= BROKEN_RATIO else None


def pair_key(target: str, draft: str, draft_precision: str, k: int) -> str:
    return f"{target} | {draft}@{draft_precision} | k={k}"


def check_drift(cal: SpeedCalibration, key: str, device: str) -> bool:
    """Where this device's quiet records put its predictions off by more than ``DRIFT``× overall, ask for the
    machine's bandwidth and FLOP/s to be measured again (at the next chance, when the machine is quiet; at most once
    a ``measurements.DRIFT_RETRY_S``). True when it asked."""
    factor = cal.drift(key)
    if factor is None or 1.0 / DRIFT <= factor <= DRIFT:
        return False

    return mark_stale(device, f"the learned speed factors drifted to {factor:.2f}x")


# --------------------------------------------------------------------------- the engine's side
def _shape_of(model):

    if getattr(model, "estimate_shape", None) is None:
        model.estimate_shape = shape_for_folder(model.folder, model.name)
    return model.estimate_shape


def predict_generation(
    loaded,
    strategy: str,
    prompt_tokens: int,
    new_tokens: int,
    *,
    draft=None,
    k: int = 5,
    acceptance: Optional[float] = None,
    compile: Optional[bool] = None,
    calibration: Optional[SpeedCalibration] = None,
    config: str = "",
    cached_tokens: int = 0,
    thinking: Optional[bool] = None,
):
    """The speed model's prediction for a model the engine has loaded (uncorrected, then with the factors in
    force now): returns (prediction with factors applied, device key). ``thinking``: whether the reply thinks
    before it answers (its time to first answer, ``SpeedPrediction.ttfat_ms``; None: the model's default)."""

    machine = arithmetic.this_machine(loaded.device)
    key = device_key(loaded.device)
    cal = calibration or SpeedCalibration()
    if strategy == "speculative" and draft is not None and acceptance is None:
        acceptance = cal.acceptance(loaded.name, draft.name, draft.precision.label(), k)  # None: assumed
    pred = predict(
        _shape_of(loaded),
        loaded.precision,
        strategy,
        machine,
        prompt_tokens,
        new_tokens,
        k=k,
        draft=_shape_of(draft) if draft is not None else None,
        draft_spec=draft.precision if draft is not None else None,
        acceptance=acceptance,
        compile=compile,
        config=config,
        cached_tokens=cached_tokens,
    )
    pred.thinking = thinking
    cal.apply(pred, key, loaded.name)
    return pred, key, cal


def check_generation(loaded, result, options, draft=None, save: bool = True, source: str = "chat"):
    """Predicted vs measured speed after a generation; feeds this machine's speed correction.

    Returns the prediction made *before* this measurement was recorded (with the factors then in force),
    or None when the reply says too little (an error, fewer than ``MIN_TOKENS`` tokens)."""
    if result.finish_reason == "error" or (result.new_tokens or 0) < MIN_TOKENS or not result.tokens_per_s:
        return None
    speculative = result.strategy == "speculative" and draft is not None
    pred, key, cal = predict_generation(
        loaded,
        result.strategy,
        result.prompt_tokens,
        result.new_tokens,
        draft=draft if speculative else None,
        k=options.num_draft_tokens,
        acceptance=result.acceptance_rate if speculative else None,
        compile=options.compile,
        # A turn read partly from the prefix cache is predicted as such: compared with a whole prompt's prefill,
        # its short TTFT would teach the calibration that prefills are faster than they are.
        cached_tokens=result.cached_tokens or 0,
        # A reasoning model's reply: predicted with thinking where it thought (its time to first answer).
        thinking=(result.reasoning_tokens > 0) if getattr(result, "reasoning_format", None) is not None else None,
    )
    if save:
        # ``ttft_ms`` is the reply's own prefill: its wait behind other replies is ``queued_ms``, kept apart.
        cal.record(
            pred,
            key,
            loaded.name,
            result.tokens_per_s,
            result.ttft_ms,
            source,
            getattr(result, "others_cpu_share", None),
            getattr(result, "load_average", None),
            reply_thinking(result),
        )
        check_drift(cal, key, loaded.device)
        if speculative and result.draft_proposed:
            cal.record_acceptance(
                loaded.name,
                draft.name,
                draft.precision.label(),
                options.num_draft_tokens,
                result.acceptance_rate or 0.0,
                result.draft_proposed,
                result.draft_accepted or 0,
            )
    return pred
