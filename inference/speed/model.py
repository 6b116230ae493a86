"""The speed model with this machine's learned factors applied: what the wizard, ``redline estimate``, the
speed lab and ``auto`` ask. Arithmetic only (no torch), so the wizard can call it live on the UI thread once
the machine's figures were measured on the engine thread."""

from __future__ import annotations

from typing import Optional, Union

from ..estimate.estimator import ModelShape
from ..precision import PrecisionSpec, parse_precision, resolve_precision
from .arithmetic import Machine, SpeedPrediction, predict
from .calibration import SpeedCalibration

# The reply a prediction for "a chat reply" is of (the wizard's speed column, ``redline estimate``, ``auto``).
CHAT_PROMPT_TOKENS = 64
CHAT_NEW_TOKENS = 256
NEXT_TURN_TOKENS = 130  # a conversation's next message: what a turn reads when the prefix cache holds the rest


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
        thinking: Optional[bool] = None,
        kv: str = "bf16",
    ) -> SpeedPrediction:
        """Predicted decode tokens/s and TTFT with the factors learned here. Speculative: ``acceptance`` (the
        rate, accepted ÷ proposed) defaults to the one measured for this pair, if any. ``kernels``: with or
        without Redline's CPU kernels (None: as they will run here). ``cached_tokens``: the prompt's first
        tokens the prefix cache holds (a conversation's next turn). ``thinking``: a reasoning model's reply with
        thinking on or off (None: the model's default), for its time to first answer (``ttfat_ms``): the TTFT plus
        the thinking length learned for this model here (``speed/thinking.py``). ``kv``: the KV cache's form
        (``--kv``: "q8" reads 8-bit rows where the fast path keeps the cache)."""
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
            kv=kv,
        )
        pred.thinking = thinking
        return self.calibration.apply(pred, self.machine.calibration_key, shape.name)

    def next_turn(
        self,
        shape: ModelShape,
        precision: Union[str, PrecisionSpec],
        strategy: str,
        context: int,
        new_tokens: int = CHAT_NEW_TOKENS,
        kv: str = "bf16",
    ) -> SpeedPrediction:
        """A late turn of a conversation that fills ``context`` tokens: its prompt is the whole conversation, of
        which the prefix cache holds all but the new ``NEXT_TURN_TOKENS``-token message where the code that runs
        keeps one. Only the fast path does (its paged KV cache, ``decoding/kv_cache.py``); transformers' paths
        (kv, static, naive, and ``fast`` where the fast path does not run the model) read it all again. The
        wizard and ``redline estimate`` both ask this, so the rule is stated once, beside the model it predicts."""
        prompt = max(1, context - new_tokens)
        whole = self.predict(shape, precision, strategy, prompt, new_tokens, kv=kv)
        if whole.path != "fast":
            return whole
        cached = max(0, prompt - NEXT_TURN_TOKENS)
        return self.predict(shape, precision, strategy, prompt, new_tokens, cached_tokens=cached, kv=kv)

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
            thinking=getattr(config, "thinking", None),
        )
