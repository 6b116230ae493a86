"""A model loaded here (``LoadedModel``): its model, tokenizer, precision and device, what it can run, and the
fast path's batcher that its replies are decoded in."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import Cancelled, ModelLoadError, RedlineError
from ..estimate.estimator import context_limit
from ..estimate.vision import image_settings, image_tokens, is_vision_config
from ..generation.run import run_local
from ..hardware.probe import default_device
from ..loading.loader import _load_float, build_kernels_first, check_weights, estimate_shape, out_of_memory
from ..loading.packed import check_precision, load_packed
from ..loading.vision import keep_tower_unquantised, load_processor
from ..memory.measured import PeakMemory, process_rss
from ..memory.oom import free_memory, is_oom
from ..memory.policy import collect_garbage, returning_freed_memory, weights_in_own_mappings
from ..precision import (
    AS_FILE,
    PrecisionSpec,
    check_supported,
    from_pretrained_kwargs,
)
from ..progress import CancelFn, ProgressFn, check_cancel, noop_progress
from ..sources.config import load_config, load_tokenizer
from ..sources.manifest import file_bits, read_manifest
from ..sources.resolve import ModelSource, resolve
from .base import Backend, Capabilities, KvCacheHeld, KvRoom
from .embed import mean_pooled
from .remote import is_server_url

LOCAL_STRATEGIES = ("kv", "fast", "naive", "static", "speculative", "prompt-lookup")
VISION_ON_GENERATE = "a vision model runs on transformers' generate()"


@dataclass
class BatchLimits:
    """How many replies the batcher decodes together, and the KV-cache positions they may hold (None: from the
    memory free when the batcher starts)."""

    max_active: int = 4
    kv_budget_tokens: Optional[int] = None
    # What the prefix cache may keep of pages no reply uses (a conversation's earlier turns, a shared system
    # prompt); 0 turns it off. Within the KV budget either way.
    prefix_cache_bytes: int = 256 * 1000 * 1000
    # What of those pages may be kept on disk across restarts (written when evicted and when the model unloads or
    # Redline quits; decoding/disk_pages.py); 0 keeps none. Used only where reading beats computing (the CPU).
    disk_pages_bytes: int = 1000 * 1000 * 1000
    # The fast path's KV cache: "bf16" (the cache's float dtype) or "q8" (8-bit rows: int8 and a scale per token
    # and head, about half the memory; kernels/kv_quant.py). Taken by the decoder when it is built (a load).
    kv: str = "bf16"


@dataclass
class LoadedModel(Backend):
    model: Any
    tokenizer: Any
    source: ModelSource
    precision: PrecisionSpec
    device: str
    folder: Path
    load_seconds: float
    memory_bytes: int  # measured: device allocated on CUDA, RSS growth on CPU
    peak_memory_bytes: int
    notes: list[str] = field(default_factory=list)
    baseline_rss_bytes: Optional[int] = None  # process RSS before this load began (the estimator's CPU baseline)
    predicted_bytes: Optional[int] = None  # the estimator's prediction for the load (set by the engine)
    estimate_shape: Any = None  # inference.memory.estimator.ModelShape, read once for predicted-vs-measured
    fast_decoder: Any = None  # inference.decoding.fastpath.FastDecoder, built on first use (fused weights, KV cache)
    # Set by the engine when this model becomes its target: the draft for speculative decoding, the batcher's
    # limits, and the engine's predicted-vs-measured checks for a reply that ran alone.
    draft: Any = None
    # What a request's ``auto`` runs (the engine sets it from the speed model's ranking, as ``choose`` ranks a
    # load); None: the fast path where it runs, else the dynamic KV cache.
    auto_strategy: Optional[str] = None
    limits: BatchLimits = field(default_factory=BatchLimits)
    on_result: Any = None
    # A model that sees images: its processor (``AutoProcessor``: the image processor, the tokenizer, the chat
    # template that places image tokens), which builds its prompts (``prepare``); None for a text model.
    processor: Any = None
    _batcher: Any = field(default=None, repr=False)
    _fast_reason: Any = field(default=None, repr=False)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            strategies=LOCAL_STRATEGIES,
            token_ids=True,
            draft=True,
            measured_here=True,
            servable=True,
            concurrency="batch",
            vision=self.vision,
        )

    @property
    def vision(self) -> bool:
        """Whether it sees images (a message's Image attachments reach it through its processor)."""
        return self.processor is not None

    def reload_spec(self) -> tuple[str, Any, Optional[str]]:
        return self.source.spec, self.precision, None

    def answers_to(self, spec: str) -> bool:

        if is_server_url(spec):
            return False
        try:
            return resolve(spec) == self.source
        except RedlineError:
            return False

    def resolve_strategy(self, strategy: str) -> str:
        if strategy == "auto" and self.vision:
            return "kv"  # VISION_ON_GENERATE: the fast path takes no images
        if strategy == "auto":
            picked = self.auto_strategy
            if picked in self.capabilities.strategies and (picked != "fast" or self.fast_path_reason() is None):
                return picked
            return "fast" if self.fast_path_reason() is None else "kv"
        return super().resolve_strategy(strategy)

    def fast_path_reason(self) -> Optional[str]:
        """None if Redline's fast decode path runs this model, else why not (asked once)."""
        if self._fast_reason is None and self.vision:
            self._fast_reason = ("", VISION_ON_GENERATE)
        if self._fast_reason is None:
            # lazy: fastpath imports torch (torch loads on the engine's thread, never at import)
            from ..decoding.fastpath import supports

            self._fast_reason = ("", supports(self.model))
        return self._fast_reason[1]

    def batchable(self, request) -> bool:
        return request.options.strategy == "fast" and self.model is not None and self.fast_path_reason() is None

    def prepare_replies(self) -> None:
        """Build the fast path's batcher now (the decoder's fused weights, its KV pool, the prefix cache), at the
        load, where ``auto`` runs the fast path: built at the first reply, it was that reply's wait (85-340 ms of
        ``queued_ms`` before its TTFT with the starter; a copy of most weights for a larger model)."""
        if self.model is not None and self.resolve_strategy("auto") == "fast":
            self.batcher()

    def batcher(self):
        """The fast path's batcher for this model (one: its KV cache is the model's), made on first use."""
        if self._batcher is None:
            from ..generation.batch import Batcher  # lazy: torch, on the engine's thread

            self._batcher = Batcher(
                self,
                self.limits.max_active,
                self.limits.kv_budget_tokens,
                self.on_result,
                self.limits.prefix_cache_bytes,
                disk_pages_bytes=self.limits.disk_pages_bytes,
            )
        return self._batcher

    # -- replies that run together: the fast path's batch -------------------------------------------
    def admit(self, request):
        return self.batcher().prepare(request)

    def add(self, sink, request, submitted: float, prepared) -> None:
        self.batcher().add(sink, request, submitted, prepared)

    def step(self) -> None:
        if self._batcher is not None:
            self._batcher.step()

    def running(self) -> int:
        batcher = self._batcher
        return len(batcher) if batcher is not None else 0

    def kv_room(self) -> Optional[KvRoom]:
        batcher = self.batcher()
        return KvRoom(batcher.kv_budget_tokens, batcher.tokens_reserved(), batcher.kv_bytes_per_token())

    def cancel_running(self, note: str) -> None:
        if self._batcher is not None:
            self._batcher.cancel_all(note)

    def fail_running(self, error: BaseException) -> None:
        if self._batcher is not None:
            self._batcher.fail_all(error)

    # -- what it holds -------------------------------------------------------------------------------
    def embed(self, inputs) -> tuple[list[list[float]], int]:
        return mean_pooled(self.model, self.tokenizer, inputs, self.device, self.context_limit)

    def text_tokenizer(self) -> Any:
        return self.tokenizer

    def shape(self) -> Any:
        return self.estimate_shape

    def image_tokens(self, width: int, height: int) -> Optional[int]:
        """The image tokens an image of this size becomes here (``estimate.vision.image_tokens``, from the config
        and the folder's image-processor settings; for a family that does not know, the processor's own count)."""
        if not self.vision or self.model is None:
            return None
        try:
            return image_tokens(self.model.config, image_settings(self.folder), width, height)
        except ValueError:
            pass
        try:
            counted = self.processor._get_num_multimodal_tokens(image_sizes=[(int(height), int(width))])
            return int(counted.num_image_tokens[0])
        except Exception:  # a processor that cannot say: not known
            return None

    def kv_form(self) -> Optional[str]:
        dec = self.fast_decoder
        return dec.kv.form if dec is not None else None

    def cached_kv(self) -> Optional[KvCacheHeld]:
        batcher = self._batcher
        kv = batcher.dec.kv if batcher is not None else None
        if kv is None:
            return None  # no fast path built: auto does not run it here, and no fast reply has run yet
        try:
            limit = min(kv.cache_pages, kv.budget_pages or kv.cache_pages) * kv.page_bytes
            setting = self.limits.prefix_cache_bytes
            if kv.cache_pages > 0 and (kv.budget_pages is None or kv.cache_pages < kv.budget_pages):
                limit = int(setting)  # the setting itself (whole pages of it are kept), unless the budget is smaller
            return KvCacheHeld(int(kv.cached_bytes()), int(kv.cached_tokens()), int(limit))
        except (AttributeError, RuntimeError, ValueError):  # read from another thread while the model is freed
            return None

    def set_prefix_cache(self, nbytes: int) -> None:
        self.limits.prefix_cache_bytes = int(nbytes)
        if self._batcher is not None:
            self._batcher.set_prefix_cache(int(nbytes))

    def persist_prefix_cache(self) -> int:
        """Write the prefix cache's pages to disk (the model unloads, Redline quits): the pages handed over. A
        disk that fails costs only the pages (a warm restart), never the unload or the quit."""
        if self._batcher is None:
            return 0
        try:
            return self._batcher.persist()
        except Exception:
            return 0

    def compile_status(self) -> Optional[dict]:
        compiled = getattr(self.fast_decoder, "compiled", None)  # the decoder is built on first use
        return compiled.status() if compiled is not None else None

    def vocab_size(self) -> Optional[int]:
        config = getattr(self.model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config  # a vision model's text
        return getattr(text, "vocab_size", None)

    def names(self) -> set[str]:
        return {self.name, self.source.spec}

    def generate(self, request, sink, submitted: Optional[float] = None):

        return run_local(self, request, sink, submitted)

    def release(self) -> None:
        """Drop every tensor this object holds, so memory is freed even if something still refers to it."""
        self.persist_prefix_cache()  # before its pages are freed with the batcher
        with returning_freed_memory():
            self._batcher = None
            self.fast_decoder = None
            self.draft = None
            self.model = None
            self.tokenizer = None
            self.processor = None

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def context_limit(self) -> int:
        """The model's own limit, its rope scaling included (``estimate.estimator.context_limit``)."""
        return context_limit(self.model.config)


def load_model(
    source: ModelSource,
    precision: PrecisionSpec,
    device: Optional[str] = None,
    progress: ProgressFn = noop_progress,
    should_cancel: Optional[CancelFn] = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    context: Optional[int] = None,
    kv: str = "bf16",
) -> LoadedModel:
    """Load ``source`` at ``precision``. Raises a RedlineError subclass with a fix on failure (running out of
    memory: what the estimator says a chat of ``context`` tokens with the ``kv`` cache needs, ``out_of_memory``)."""
    device = device or default_device()
    # The baseline is the process with its runtime (torch and transformers imported) but without this model: the
    # estimator's CPU overhead is that runtime, so measuring before the first import would leave it out.
    import torch  # noqa: F401
    import transformers  # noqa: F401

    baseline_rss = process_rss()
    notes = []
    warning = check_supported(precision, device)
    if warning:
        notes.append(warning)
    started = time.perf_counter()

    def fetch_progress(fraction: float, phase: str) -> None:
        progress(0.3 * fraction, phase)

    folder = source.prepare(fetch_progress, should_cancel)
    check_cancel(should_cancel)
    progress(0.3, "Reading config")
    config = load_config(folder, trust_remote_code)
    check_weights(folder, allow_pickle)
    manifest = read_manifest(folder)
    if manifest is not None:
        check_precision(manifest, precision.name, folder)
        if precision.auto:
            # "auto" for a folder that keeps a GGUF's quantisation: as the file is.
            precision = PrecisionSpec(AS_FILE, compute_dtype="bf16", skip_modules=precision.skip_modules, auto=True)
            check_supported(precision, device)
        notes.append(f"Quantised layers from the GGUF: {file_bits(manifest)} ({len(manifest['modules'])} layers).")
    # A model that sees images loads with its processor, whose tokenizer is the model's.
    vision = manifest is None and is_vision_config(config)
    processor = load_processor(folder, config, trust_remote_code) if vision else None
    tokenizer = processor.tokenizer if processor is not None else load_tokenizer(folder, trust_remote_code)
    check_cancel(should_cancel)
    shape = estimate_shape(folder, source.name)  # before the weights (its docstring says why)
    from .. import units  # noqa: F401
    from ..estimate import fit  # noqa: F401 - the out-of-memory message's, imported while memory is there

    # The kernels pack q8/q4 weights, read a GGUF's blocks and run the fast path on a CPU: built before the weights
    # of either kind of folder, under their own name (not "Quantising weights").
    build_kernels_first(device, progress, 0.35)
    kwargs = from_pretrained_kwargs(precision, device) if manifest is None else {}
    towers = keep_tower_unquantised(kwargs, precision, shape, config) if vision else None
    rss_before = process_rss()
    model = None
    try:
        # Weights in mappings of their own, which go back to the system whole when the model is unloaded.
        with PeakMemory(device) as peak, weights_in_own_mappings():
            if manifest is not None:
                model = load_packed(
                    folder,
                    config,
                    manifest,
                    precision,
                    device,
                    lambda f, phase: progress(0.35 + 0.6 * f, phase),
                    should_cancel,
                )
            else:
                model = _load_float(
                    folder, precision, device, kwargs, progress, should_cancel, trust_remote_code, allow_pickle, towers
                )
                collect_garbage()
    except Cancelled:
        with returning_freed_memory():
            model = None
            free_memory(device)
        raise
    except RedlineError:
        raise
    except Exception as exc:
        with returning_freed_memory():
            model = None
            free_memory(device)
        if is_oom(exc):
            raise out_of_memory(source, precision, device, folder, exc, shape, context, kv) from exc
        raise ModelLoadError(
            f"Could not load the weights of {source.name} ({type(exc).__name__}: {exc}).",
            "The weight files may be truncated or corrupt; download the model again.",
        ) from exc
    if device.startswith("cuda"):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        memory = int(torch.cuda.memory_allocated())
    else:
        memory = max(0, process_rss() - rss_before)
    progress(1.0, "Loaded")
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        source=source,
        precision=precision,
        device=device,
        folder=folder,
        load_seconds=time.perf_counter() - started,
        memory_bytes=memory,
        peak_memory_bytes=peak.peak_bytes,
        notes=notes,
        baseline_rss_bytes=baseline_rss,
        estimate_shape=shape,  # read once, before the weights (memory.calibration.loaded_shape reuses it)
        processor=processor,
    )
