"""The speed model with this machine's learned factors applied: what the wizard, ``redline estimate``, the
speed lab and ``auto`` ask. Arithmetic only (no torch), so the wizard can call it live on the UI thread once
the machine's figures were measured on the engine thread."""

from __future__ import annotations

from typing import Optional, Union

from redline.inference.loading.precision import PrecisionSpec, parse_precision, resolve_precision
from redline.inference.memory.estimator import ModelShape
from redline.inference.speed.arithmetic import Machine, SpeedPrediction, predict
from redline.inference.speed.calibration import SpeedCalibration


class SpeedModel:
    def __init__(self, machine: Machine, calibration: Optional[SpeedCalibration] = None):
        self.machine = machine
        # A hypothetical card has nothing learned; this machine's file applies only to this machine.
        self.calibration = calibration if calibration is not None else SpeedCalibration()

    def spec(self, precision: Union[str, PrecisionSpec]) -> PrecisionSpec:
        if isinstance(precision, PrecisionSpec):
            return precision
        return resolve_precision(precision, self.machine.device) if "auto" in precision else parse_precision(precision)

    def predict(
        self,
        shape: ModelShape,
        precision: Union[str, PrecisionSpec],
        strategy: str = "kv",
        prompt_tokens: int = 64,
        new_tokens: int = 128,
        *,
        k: int = 5,
        draft: Optional[ModelShape] = None,
        draft_precision: Union[str, PrecisionSpec, None] = None,
        acceptance: Optional[float] = None,
        compile: Optional[bool] = None,
        config: str = "",
        kernels: Optional[bool] = None,
        cached_tokens: int = 0,
    ) -> SpeedPrediction:
        """Predicted decode tokens/s and TTFT with the factors learned here. Speculative: ``acceptance`` (the
        rate, accepted ÷ proposed) defaults to the one measured for this pair, if any. ``kernels``: with or
        without Redline's CPU kernels (None: as they will run here). ``cached_tokens``: the prompt's first
        tokens the prefix cache holds (a conversation's next turn)."""
        spec = self.spec(precision)
        dspec = self.spec(draft_precision) if draft_precision is not None else None
        if strategy == "speculative" and acceptance is None and draft is not None:
            acceptance = self.calibration.acceptance(shape.name, draft.name, (dspec or spec).label(), k)
        pred = predict(
            shape,
            spec,
            strategy,
            self.machine,
            prompt_tokens,
            new_tokens,
            k=k,
            draft=draft,
            draft_spec=dspec,
            acceptance=acceptance,
            compile=compile,
            config=config,
            kernels=kernels,
            cached_tokens=cached_tokens,
        )
        return self.calibration.apply(pred, self.machine.calibration_key, shape.name)

    def predict_config(
        self, shape: ModelShape, config, prompt_tokens: int, new_tokens: int, draft: Optional[ModelShape] = None
    ) -> SpeedPrediction:
        """For a speed-lab row (``BenchConfig``)."""
        return self.predict(
            shape,
            config.precision,
            config.strategy,
            prompt_tokens,
            new_tokens,
            k=config.k,
            draft=draft if config.strategy == "speculative" else None,
            draft_precision=config.draft_precision if config.strategy == "speculative" else None,
            compile=config.compile,
            config=config.label,
        )
