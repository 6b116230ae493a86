"""The long-lived engine: owns the target (a model loaded here, or a model on a server: ``backend.Backend``) and
its draft, loads them, and runs every generation.

Qt-free and synchronous. The engine service (``service/scheduler.py``) runs one Engine on its worker
thread and is how the window, the CLI, the speed lab and the HTTP server reach it; scripts, the speed lab's
jobs and tests may call it directly. There is no engine-wide cancel: every load and generation takes its own
cancel (a request's handle), checked by the loader and once per decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .backends.local import BatchLimits, LoadedModel, load_model
from .backends.remote import connect, is_server_url
from .decoding.hf import check_draft
from .decoding.options import DecodeOptions, SamplingSettings
from .errors import Cancelled, IncompatibleDraft, NeedsOptIn, RedlineError, UnsupportedConfiguration
from .estimate.calibration import MemoryCheck, check_generation, measured_peak_bytes, predict_loaded
from .events import EventFn, GenerationResult, Progress
from .generation.lifecycle import DirectSink, Sink
from .generation.request import GenerationRequest
from .hardware.probe import default_device
from .memory.oom import free_memory
from .memory.policy import bound_kernel_caches
from .precision import PrecisionSpec, resolve_precision
from .progress import CancelFn, ProgressFn, noop_progress
from .sources.resolve import resolve
from .speed import arithmetic  # arithmetic.cached_machine read at call time (tests give it a machine)
from .speed.calibration import check_generation as check_speed
from .speed.choose import auto_strategy
from .speed.model import SpeedModel


@dataclass
class LoadRequest:
    """What to load: a model (a folder, hub id, GGUF file, ``starter``, or a server's ``http://…/v1[#MODEL]``) at
    a precision, and optionally its draft. ``opt_in(NeedsOptIn) -> bool`` answers whether a folder's code may
    run or its pickle weights be read. A draft that fails leaves the target loaded and says why in the report,
    unless ``draft_required`` (the CLI's ``--strategy speculative``), where the load fails."""

    model: str
    precision: Any = "auto"  # a PrecisionSpec, or its text ("auto", "q8", "nf4+keep=lm_head", …)
    draft: Optional[str] = None
    draft_precision: Any = "auto"
    api_key: Optional[str] = field(default=None, repr=False)
    opt_in: Optional[Callable[[NeedsOptIn], bool]] = None
    draft_required: bool = False
    context: Optional[int] = None  # the chat's context (Settings, --context): what an out-of-memory message names


@dataclass
class LoadReport:
    """What was loaded, as the window, the wizard and the CLI show it."""

    name: str
    device: str
    precision: str
    memory_bytes: int
    load_seconds: float
    notes: list[str] = field(default_factory=list)
    draft_name: Optional[str] = None
    draft_error: Optional[str] = None
    # The estimator's prediction for what was loaded (target and draft, one token of context) and the
    # measured peak of the load it predicts (RSS on CPU; torch reserved + the CUDA context on GPUs).
    predicted_bytes: Optional[int] = None
    measured_bytes: Optional[int] = None
    # False for a model on a server: its memory and speed are the server's (``Capabilities.measured_here``).
    measured_here: bool = True
    context_limit: Optional[int] = None


class Engine:
    def __init__(self, device: Optional[str] = None, limits: Optional[BatchLimits] = None):
        bound_kernel_caches()  # before the first product: a day of prompt lengths must not grow them
        self.device = device or default_device()
        self.limits = limits or BatchLimits()
        self.target: Optional[Any] = None  # a Backend: LoadedModel or RemoteModel
        self.draft: Optional[LoadedModel] = None
        self.memory_check: Optional[MemoryCheck] = None  # predicted vs measured, after the last generation
        self.record_memory = True  # feed measured loads into the per-machine estimator correction
        self.record_speed = True  # feed measured replies into the per-machine speed correction
        self.speed_check = None  # the speed model's prediction for the last reply (speed.arithmetic.SpeedPrediction)

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
        context: Optional[int] = None,
    ):
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
                loaded = load_model(
                    source,
                    precision,
                    self.device,
                    progress,
                    should_cancel,
                    trust_remote_code=flags["remote_code"],
                    allow_pickle=flags["pickle"],
                    context=context,
                    kv=self.limits.kv,
                )
                break
            except NeedsOptIn as exc:
                if flags[exc.kind] or opt_in is None or not opt_in(exc):
                    raise
                flags[exc.kind] = True
        loaded.limits = self.limits
        loaded.on_result = self.check_result
        loaded.auto_strategy = self._auto_strategy(loaded)
        self.target = loaded
        self._predict(loaded)
        return loaded

    def _auto_strategy(self, loaded: LoadedModel) -> Optional[str]:
        """What a request's ``auto`` runs on ``loaded``: ``choose``'s pick with its precision pinned, the one meaning
        of auto (docs/speed-model.md#auto), from this machine's cached figures. None before they were ever measured
        (nothing is measured during a load): the backend then takes the fast path where it runs."""

        try:
            machine = arithmetic.cached_machine(self.device)
            if machine is None or loaded.estimate_shape is None:
                return None
            return auto_strategy(loaded.estimate_shape, loaded.precision, SpeedModel(machine))
        except Exception:  # a prediction only: never fail a load over it
            return None

    def load_draft(
        self,
        model: str,
        precision: PrecisionSpec,
        progress: ProgressFn = noop_progress,
        should_cancel: Optional[CancelFn] = None,
    ) -> LoadedModel:
        if self.target is None:
            raise IncompatibleDraft("Load the target model before its draft.")
        if not self.target.capabilities.draft:
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
        self.target.draft = draft
        self._predict(draft)
        return draft

    def load_all(self, request: LoadRequest, report: Callable[[Any], None], should_cancel=None) -> LoadReport:
        """The one load job (the window, the wizard, the CLI, the server's load on request): the target, then its
        draft if asked (else the draft goes), with ``Progress`` reported; what was loaded, predicted and measured."""
        share = 0.75 if request.draft else 1.0

        def target_progress(fraction: float, phase: str) -> None:
            report(Progress(fraction * share, phase))

        if is_server_url(request.model):
            target = self.load(request.model, None, target_progress, api_key=request.api_key)
            report(Progress(1.0, "Connected"))
            return LoadReport(
                target.name, target.device, "server", 0, target.load_seconds, list(target.notes),
                measured_here=target.capabilities.measured_here, context_limit=target.context_limit,
            )  # fmt: skip
        spec = _precision(request.precision, self.device)
        target = self.load(
            request.model, spec, target_progress, opt_in=request.opt_in, should_cancel=should_cancel,
            context=request.context,
        )  # fmt: skip
        info = LoadReport(
            target.name,
            target.device,
            target.precision.label(),
            target.memory_bytes,
            target.load_seconds,
            list(target.notes),
            context_limit=target.context_limit,
        )
        if request.draft:
            try:
                draft = self.load_draft(
                    request.draft,
                    _precision(request.draft_precision, self.device),
                    lambda f, phase: report(Progress(share + f * (1 - share), f"draft: {phase}")),
                    should_cancel,
                )
                info.draft_name = draft.name
            except Cancelled:
                raise
            except RedlineError as exc:  # keep the target: the user can still chat without the draft
                if request.draft_required:
                    raise
                info.draft_error = str(exc)
        else:
            self.unload_draft()
        info.predicted_bytes, info.measured_bytes = self._predicted_vs_measured()
        report(Progress(1.0, "Preparing the fast path"))
        target.prepare_replies()
        report(Progress(1.0, "Loaded"))
        return info

    def _predicted_vs_measured(self) -> tuple[Optional[int], Optional[int]]:

        target, draft = self.target, self.draft
        try:
            measured = measured_peak_bytes(target, None, draft)
        except Exception:  # a report only: never fail a load over it
            measured = None
        if draft is None:
            return target.predicted_bytes, measured
        try:
            return predict_loaded(target, 1, draft=draft).total_bytes, measured
        except Exception:
            return None, measured

    def unload_draft(self) -> None:
        if self.draft is not None:
            draft, self.draft = self.draft, None
            if self.target is not None and self.target.draft is draft:
                self.target.draft = None
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

    def persist_prefix_cache(self) -> int:
        """Write the loaded model's prefix-cache pages to disk (Redline quits with the model loaded)."""
        return self.target.persist_prefix_cache() if self.target is not None else 0

    # -- predicted vs measured memory ----------------------------------------
    def _predict(self, loaded: LoadedModel) -> None:
        try:
            loaded.predicted_bytes = predict_loaded(loaded, 1).total_bytes
        except Exception:  # an estimate that cannot be made must never stop a load
            loaded.predicted_bytes = None

    def check_result(self, result: GenerationResult, options: DecodeOptions) -> GenerationResult:
        """Predicted vs measured memory and speed for a finished reply that ran alone (the fair sample); the
        per-machine corrections learn from it. Only for a model loaded here: a server's figures are its own."""
        if self.target is None or not self.target.capabilities.measured_here:
            return result
        return self._check_speed(self._check_memory(result), options)

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
    def _require_target(self):
        if self.target is None:
            raise RedlineError("No model is loaded.", "Load a model first.")
        return self.target

    def run(self, request: GenerationRequest, sink: Sink, submitted: Optional[float] = None) -> GenerationResult:
        """Run ``request`` to its end on the target, reporting to ``sink``; its GenerationResult."""
        target = self._require_target()
        if request.input_ids is not None and not target.capabilities.token_ids:
            raise UnsupportedConfiguration(
                "A model on a server takes chat messages, not token ids.", "Send messages instead."
            )
        return target.generate(target.resolved(request), sink, submitted)

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
        request = GenerationRequest(
            messages=messages, sampling=sampling, options=options, context=context, logits_processor=logits_processor
        )
        return self.run(request, DirectSink(on_event, should_cancel))


def _precision(value, device: str) -> PrecisionSpec:
    return value if isinstance(value, PrecisionSpec) else resolve_precision(str(value or "auto"), device)
