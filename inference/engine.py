"""The long-lived engine: owns the target model (and draft) and runs every generation.

Qt-free and synchronous. The engine service (``service/scheduler.py``) runs one Engine on its worker
thread and is how the window, the CLI, the speed lab and the HTTP server reach it; scripts and tests may
call it directly. There is no engine-wide cancel: every load and generation takes its own
``should_cancel`` (a request's cancel handle), checked by the loader and once per decode step.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from redline.inference.decoding.generate import generate, new_result
from redline.inference.decoding.hf import check_draft
from redline.inference.decoding.options import DecodeOptions, SamplingSettings
from redline.inference.errors import IncompatibleDraft, NeedsOptIn, RedlineError, UnsupportedConfiguration
from redline.inference.events import EventFn, FinishedEvent, GenerationResult, Notice
from redline.inference.hardware.probe import default_device
from redline.inference.loading.loader import LoadedModel, free_memory, load_model
from redline.inference.loading.precision import PrecisionSpec
from redline.inference.memory.calibration import MemoryCheck, check_generation, predict_loaded
from redline.inference.memory.policy import bound_kernel_caches
from redline.inference.progress import CancelFn, ProgressFn, noop_progress
from redline.inference.remote.client import connect, is_server_url
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

    # -- models --------------------------------------------------------------
    def load(
        self,
        model: str,
        precision: PrecisionSpec,
        progress: ProgressFn = noop_progress,
        trust_remote_code: bool = False,
        allow_pickle: bool = False,
        opt_in: Optional[Callable[[NeedsOptIn], bool]] = None,
        should_cancel: Optional[CancelFn] = None,
        api_key: Optional[str] = None,
    ) -> LoadedModel:
        """Load ``model`` as the target. A folder whose code would run (or whose weights would be unpickled)
        raises NeedsOptIn unless the matching flag is set, or ``opt_in(exc)`` — asked at most once per kind —
        says yes (the user trusts it, or already did).

        A server's address (``http://HOST:PORT/v1[#MODEL]``) connects to that server's model instead
        (``remote/client.py``), with ``api_key`` if it needs one; nothing loads here."""
        if is_server_url(model):
            progress(0.1, f"connecting to {model.split('#')[0]}")
            remote = connect(model, api_key)
            self.unload()
            self.target = remote
            progress(1.0, "connected")
            return remote
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
                    should_cancel,
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

    def load_draft(
        self,
        model: str,
        precision: PrecisionSpec,
        progress: ProgressFn = noop_progress,
        should_cancel: Optional[CancelFn] = None,
    ) -> LoadedModel:
        if self.target is None:
            raise IncompatibleDraft("Load the target model before its draft.")
        if getattr(self.target, "remote", False):
            raise IncompatibleDraft(
                "A model on a server takes no local draft.", "Use the server's own speculative decoding."
            )
        self.unload_draft()
        draft = load_model(resolve(model), precision, self.device, progress, should_cancel)
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

    def check_result(self, result: GenerationResult, options: DecodeOptions) -> GenerationResult:
        """Predicted vs measured memory and speed for a finished reply (``chat``, ``generate_ids``, and the
        service's batch when the reply ran alone); the per-machine corrections learn from it."""
        return self._check_speed(self._check_memory(result), options)

    def _check_memory(self, result: GenerationResult) -> GenerationResult:
        if getattr(self.target, "remote", False):
            return result  # the memory is the server's
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
        if getattr(self.target, "remote", False):
            return result  # the speed is the server's and its network's, not this machine's
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

    def generate_ids(
        self,
        input_ids: Sequence[int],
        sampling: SamplingSettings,
        options: DecodeOptions,
        on_event: Optional[EventFn] = None,
        context: Optional[int] = None,
        should_cancel: Optional[CancelFn] = None,
        logits_processor=None,
    ) -> GenerationResult:
        target = self._require_target()
        if getattr(target, "remote", False):
            raise UnsupportedConfiguration(
                "A model on a server takes chat messages, not token ids.", "Send messages instead."
            )
        result = generate(
            target, input_ids, sampling, options, self.draft, on_event, should_cancel, context, logits_processor
        )
        return self.check_result(result, options)

    def chat(
        self,
        messages: Sequence[dict],
        sampling: SamplingSettings,
        options: DecodeOptions,
        on_event: Optional[EventFn] = None,
        context: Optional[int] = None,
        should_cancel: Optional[CancelFn] = None,
        logits_processor=None,
    ) -> GenerationResult:
        """Answer ``messages`` (rendered with the model's chat template) with one generation."""
        from redline.inference.service.batcher import prepare_prompt
        from redline.inference.service.requests import GenerationRequest

        target = self._require_target()
        if getattr(target, "remote", False):
            result = target.chat(messages, sampling, on_event, should_cancel)
            if on_event is not None:
                on_event(FinishedEvent(result))
            return result
        request = GenerationRequest(messages=messages, sampling=sampling, options=options, context=context)
        prepared = new_result(target, 0, options)
        prompt, context = prepare_prompt(target, request, prepared)
        if on_event is not None:
            for note in prepared.notes:  # said before the reply starts
                on_event(Notice(note))
        result = generate(
            target, prompt, sampling, options, self.draft, on_event, should_cancel, context, logits_processor
        )
        result.notes[:0] = prepared.notes
        result.dropped_messages = prepared.dropped_messages
        return self.check_result(result, options)
