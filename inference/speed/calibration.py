"""The per-machine speed correction: predicted vs measured tokens/s and TTFT, learned from this machine.

Every chat reply (``Engine``) and every speed-lab row (``bench/lab.py``) records the speed model's
uncorrected prediction beside what was measured. The ratio measured ÷ predicted of the last records of a
configuration's class (strategy × precision) on this device becomes that class's factor — the median, so one
reply slowed by another program cannot swing it, and bounded, since a ratio far outside the bounds means a
broken measurement rather than a slow kernel. A class not measured yet borrows the median of this device's
other records, so a machine that is slower than the defaults everywhere is predicted slower everywhere.

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

from redline.inference.memory.calibration import data_dir, device_key
from redline.inference.speed.arithmetic import SpeedPrediction

CLASS_HISTORY = 20  # records kept per class and device
LEARN_FROM = 10  # a class's factor is the median ratio of its last N records
FIT_SPAN = 3  # the longest prompt of a class's replies over its shortest, for a two-part TTFT fit
DEVICE_LEARN_FROM = 20  # an unmeasured class borrows the median of the device's last N records
MIN_FACTOR, MAX_FACTOR = 0.02, 20.0  # the factor's bounds: a busy 2-core CPU measured 0.05
BROKEN_RATIO = 100.0  # a ratio beyond 100× either way is a broken measurement: not recorded
MIN_TOKENS = 8  # replies shorter than this say too little about decode speed
ACCEPTANCE_HISTORY = 10


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

    def _factor(self, key: Optional[str], cls: str, field: str) -> Factor:
        classes = self._records(key)
        own = [r[field] for r in classes.get(cls, [])[-LEARN_FROM:] if r.get(field)]
        if own:
            return Factor(_bounded(statistics.median(own)), "class", len(own))
        # An unmeasured class borrows from the classes of its own strategy only: the strategies' code paths err
        # differently before correction (here the fast path's raw prediction was a third of what it measured,
        # transformers' kv path's within 5 %), so kv:fp32 borrowing the fast path's factor was predicted at 52
        # tok/s against 17.5 measured, and auto chose it over the fast path (tests/model_browser_accuracy.py).
        strategy = cls.split(":", 1)[0]
        same = [rs for c, rs in classes.items() if c.split(":", 1)[0] == strategy]
        pooled = sorted((r for rs in same for r in rs if r.get(field)), key=lambda r: r.get("time", 0))
        pooled = [r[field] for r in pooled[-DEVICE_LEARN_FROM:]]
        if pooled:
            return Factor(_bounded(statistics.median(pooled)), "device", len(pooled))
        return Factor()

    def decode_factor(self, key: Optional[str], cls: str) -> Factor:
        return self._factor(key, cls, "decode_ratio")

    def ttft_factor(self, key: Optional[str], cls: str) -> Factor:
        return self._factor(key, cls, "ttft_ratio")

    def ttft_fit(self, key: Optional[str], cls: str) -> Optional[tuple[float, float]]:
        """Factors for the prefill's two parts (``SpeedPrediction.ttft_compute_ms``, ``ttft_fixed_ms``) that fit
        this class's replies best in relative error, when they span prompt lengths at least FIT_SPAN apart (one
        length cannot tell a per-FLOP cost from a fixed one) and both factors come out positive; else None (the
        single factor then applies). Why two: the starter's bf16 prefill took 3.6 ms a token at 44 tokens and 1.9
        at 300, which one factor per class cannot follow (a 1B-shaped model's TTFT was 42 % off)."""
        rows = [
            r
            for r in self._records(key).get(cls, [])[-LEARN_FROM:]
            if r.get("measured_ttft_ms") and r.get("predicted_ttft_compute_ms") is not None
        ]
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
        values = [
            r["measured_tokens_per_s"]
            for r in self._records(key).get(cls, [])[-LEARN_FROM:]
            if r.get("model") == model and r.get("measured_tokens_per_s")
        ]
        return (statistics.median(values), len(values)) if values else (None, 0)

    def acceptance(self, target: str, draft: str, draft_precision: str, k: int) -> Optional[float]:
        """The median acceptance rate measured for this pair (None if never measured)."""
        rates = [
            r["rate"] for r in self.data.get("acceptance", {}).get(pair_key(target, draft, draft_precision, k), [])
        ]
        return statistics.median(rates) if rates else None

    def apply(self, prediction: SpeedPrediction, key: Optional[str], model: str) -> SpeedPrediction:
        """Fill in the learned factors and what was measured here."""
        d = self.decode_factor(key, prediction.class_key)
        t = self.ttft_factor(key, prediction.class_key)
        prediction.decode_factor, prediction.ttft_factor = d.value, t.value
        prediction.ttft_fit = self.ttft_fit(key, prediction.class_key)
        prediction.calibration, prediction.calibration_samples = d.source, d.samples
        prediction.measured_tokens_per_s, prediction.measured_samples = self.measured(key, prediction.class_key, model)
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
    ) -> Optional[dict]:
        """Append one measurement (``prediction`` uncorrected for the same lengths) and save; the record or None."""
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
            "time": time.time(),
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


# --------------------------------------------------------------------------- the engine's side
def _shape_of(model):
    from redline.inference.memory.model_shapes import shape_for_folder

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
):
    """The speed model's prediction for a model the engine has loaded (uncorrected, then with the factors in
    force now): returns (prediction with factors applied, device key)."""
    from redline.inference.speed.arithmetic import predict, this_machine

    machine = this_machine(loaded.device)
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
    )
    if save:
        cal.record(pred, key, loaded.name, result.tokens_per_s, result.ttft_ms, source)
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
