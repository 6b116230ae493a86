"""The long-lived engine: owns the target model (and draft) and runs every generation.

Qt-free and synchronous: the GUI runs one Engine on a worker thread and talks
to it through queued signals; the CLI and the speed lab call it directly.
Cancellation is a flag that the decode loop and the loader check.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence

from redline.inference.decoding.generate import generate
from redline.inference.decoding.hf import check_draft
from redline.inference.decoding.options import DecodeOptions, SamplingSettings
from redline.inference.decoding.prompt import build_prompt
from redline.inference.errors import IncompatibleDraft, NeedsOptIn, RedlineError
from redline.inference.events import EventFn, GenerationResult
from redline.inference.hardware.probe import default_device
from redline.inference.loading.loader import LoadedModel, free_memory, load_model
from redline.inference.loading.precision import PrecisionSpec
from redline.inference.memory.calibration import MemoryCheck, check_generation, predict_loaded
from redline.inference.memory.policy import bound_kernel_caches
from redline.inference.progress import ProgressFn, noop_progress
from redline.inference.sources.resolve import resolve
from redline.inference.speed.calibration import check_generation as check_speed


class Engine:
    def __init__(self, device: Optional[str] = None):
        bound_kernel_caches()  # before the first product: a day of prompt lengths must not grow them
        self.device = device or default_device()
        self.target: Optional[LoadedModel] = None
        self.draft: Optional[LoadedModel] = None
        self.memory_check: Optional[MemoryCheck] = None  # predicted vs measured, after the last generation
        self.record_memory = True  # feed measured loads into the per-machine estimator correction
        self.record_speed = True  # feed measured replies into the per-machine speed correction
        self.speed_check = None  # the speed model's prediction for the last reply (speed.model.SpeedPrediction)
        self._cancel = threading.Event()

    # -- control -------------------------------------------------------------
    def cancel(self) -> None:
        """Safe to call from any thread."""
        self._cancel.set()

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def clear_cancel(self) -> None:
        """Forget an earlier cancel; a multi-step task (the speed lab) calls this once when it starts."""
        self._cancel.clear()

    # -- models --------------------------------------------------------------
    def load(
        self,
        model: str,
        precision: PrecisionSpec,
        progress: ProgressFn = noop_progress,
        trust_remote_code: bool = False,
        allow_pickle: bool = False,
        opt_in: Optional[Callable[[NeedsOptIn], bool]] = None,
    ) -> LoadedModel:
        """Load ``model`` as the target. A folder whose code would run (or whose weights would be unpickled)
        raises NeedsOptIn unless the matching flag is set, or ``opt_in(exc)`` — asked at most once per kind —
        says yes (the user trusts it, or already did)."""
        self._cancel.clear()
        source = resolve(model)
        self.unload()
        flags = {"remote_code": trust_remote_code, "pickle": allow_pickle}
        while True:
            try:
                self.target = load_model(
                    source,
                    precision,
                    self.device,
                    progress,
                    self.cancelled,
                    trust_remote_code=flags["remote_code"],
                    allow_pickle=flags["pickle"],
                )
                break
            except NeedsOptIn as exc:
                if flags[exc.kind] or opt_in is None or not opt_in(exc):
                    raise
                flags[exc.kind] = True
        self._predict(self.target)
        return self.target

    def load_draft(self, model: str, precision: PrecisionSpec, progress: ProgressFn = noop_progress) -> LoadedModel:
        self._cancel.clear()
        if self.target is None:
            raise IncompatibleDraft("Load the target model before its draft.")
        self.unload_draft()
        draft = load_model(resolve(model), precision, self.device, progress, self.cancelled)
        try:
            check_draft(self.target, draft)
        except IncompatibleDraft:
            draft.release()
            free_memory(self.device)
            raise
        self.draft = draft
        self._predict(draft)
        return draft

    def unload_draft(self) -> None:
        if self.draft is not None:
            draft, self.draft = self.draft, None
            draft.release()  # its tensors go even if something else still holds the object
            free_memory(self.device)

    def unload(self) -> None:
        """Free the target and draft: weights, the fast path's fused weights and KV cache, and (via
        ``free_memory``) the allocator's cached pages, so memory returns to where it was before loading.
        ``release`` and ``free_memory`` each free inside ``memory_policy.returning_freed_memory``."""
        self.unload_draft()
        if self.target is not None:
            target, self.target = self.target, None
            target.release()
            free_memory(self.device)

    # -- predicted vs measured memory ----------------------------------------
    def _predict(self, loaded: LoadedModel) -> None:
        try:
            loaded.predicted_bytes = predict_loaded(loaded, 1).total_bytes
        except Exception:  # an estimate that cannot be made must never stop a load
            loaded.predicted_bytes = None

    def _check_memory(self, result: GenerationResult) -> GenerationResult:
        try:
            check = check_generation(self.target, result, self.draft, save=self.record_memory)
        except Exception:  # the comparison is a report; it must never break a chat
            check = None
        if check is not None:
            self.memory_check = check
            result.predicted_memory_bytes = check.predicted_bytes
            result.measured_memory_bytes = check.measured_bytes
            result.memory_error_pct = round(check.error_pct, 2)
        return result

    def _check_speed(self, result: GenerationResult, options: DecodeOptions) -> GenerationResult:
        try:
            pred = check_speed(self.target, result, options, self.draft, save=self.record_speed)
        except Exception:  # a report only: it must never break a chat
            pred = None
        if pred is not None:
            self.speed_check = pred
            result.predicted_tokens_per_s = round(pred.tokens_per_s, 2)
            result.predicted_ttft_ms = round(pred.ttft_ms, 1)
        return result

    # -- generation ----------------------------------------------------------
    def _require_target(self) -> LoadedModel:
        if self.target is None:
            raise RedlineError("No model is loaded.", "Load a model first.")
        return self.target

    def _should_cancel(self, request_cancelled: Optional[Callable[[], bool]]) -> Callable[[], bool]:
        """The engine's flag (cleared as each operation starts), or the request's own flag, which a
        caller sets when the user stops a request that may not have started yet."""
        if request_cancelled is None:
            return self.cancelled
        return lambda: self.cancelled() or request_cancelled()

    def generate_ids(
        self,
        input_ids: Sequence[int],
        sampling: SamplingSettings,
        options: DecodeOptions,
        on_event: Optional[EventFn] = None,
        context: Optional[int] = None,
        request_cancelled: Optional[Callable[[], bool]] = None,
    ) -> GenerationResult:
        target = self._require_target()
        self._cancel.clear()
        result = generate(
            target, input_ids, sampling, options, self.draft, on_event, self._should_cancel(request_cancelled), context
        )
        return self._check_speed(self._check_memory(result), options)

    def chat(
        self,
        messages: Sequence[dict],
        sampling: SamplingSettings,
        options: DecodeOptions,
        on_event: Optional[EventFn] = None,
        context: Optional[int] = None,
        request_cancelled: Optional[Callable[[], bool]] = None,
    ) -> GenerationResult:
        target = self._require_target()
        context = min(context or target.context_limit, target.context_limit)
        prompt = build_prompt(target.tokenizer, messages, context, sampling.max_new_tokens)
        self._cancel.clear()
        result = generate(
            target,
            prompt.input_ids,
            sampling,
            options,
            self.draft,
            on_event,
            self._should_cancel(request_cancelled),
            context,
        )
        result.dropped_messages = prompt.dropped_messages
        if prompt.dropped_messages:
            result.notes.append(
                f"{prompt.dropped_messages} earlier message(s) did not fit the context of "
                f"{context} tokens and were left out of the prompt."
            )
        if prompt.truncated_last:
            result.notes.append("The last message was longer than the context; only its end was sent.")
        if not prompt.used_template:
            result.notes.append("This model has no chat template; a plain 'User:/Assistant:' format was used.")
        return self._check_speed(self._check_memory(result), options)
