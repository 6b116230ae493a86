"""Load a model and its tokenizer at a chosen precision, with progress, cancel and measured memory."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from redline.inference.backend import Backend, Capabilities
from redline.inference.errors import Cancelled, ModelLoadError, NeedsOptIn, OutOfMemory, RedlineError
from redline.inference.hardware.probe import default_device
from redline.inference.loading.packed import check_precision, file_bits, load_packed, read_manifest
from redline.inference.loading.precision import (
    AS_FILE,
    WEIGHT_ONLY,
    PrecisionSpec,
    check_supported,
    from_pretrained_kwargs,
    torch_dtype,
)
from redline.inference.memory.measured import PeakMemory, process_rss
from redline.inference.memory.policy import collect_garbage, returning_freed_memory, trim, weights_in_own_mappings
from redline.inference.progress import CancelFn, ProgressFn, check_cancel, noop_progress, transformers_progress
from redline.inference.sources.resolve import ModelSource
from redline.inference.sources.trust import fingerprint, pickle_files, remote_code_files

LOCAL_STRATEGIES = ("kv", "fast", "naive", "static", "speculative", "prompt-lookup")


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
    limits: BatchLimits = field(default_factory=BatchLimits)
    on_result: Any = None
    _batcher: Any = field(default=None, repr=False)
    _fast_reason: Any = field(default=None, repr=False)

    kind = "local"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            strategies=LOCAL_STRATEGIES,
            token_ids=True,
            draft=True,
            measured_here=True,
            servable=True,
            concurrency="batch",
        )

    def reload_spec(self) -> tuple[str, Any, Optional[str]]:
        return self.source.spec, self.precision, None

    def answers_to(self, spec: str) -> bool:
        from redline.inference.remote.client import is_server_url
        from redline.inference.sources.resolve import resolve

        if is_server_url(spec):
            return False
        try:
            return resolve(spec) == self.source
        except RedlineError:
            return False

    def resolve_strategy(self, strategy: str) -> str:
        if strategy == "auto":  # the fast path where it runs (a chat's best), else the dynamic KV cache
            return "fast" if self.fast_path_reason() is None else "kv"
        return super().resolve_strategy(strategy)

    def fast_path_reason(self) -> Optional[str]:
        """None if Redline's fast decode path runs this model, else why not (asked once)."""
        if self._fast_reason is None:
            from redline.inference.decoding.fastpath import supports

            self._fast_reason = ("", supports(self.model))
        return self._fast_reason[1]

    def batchable(self, request) -> bool:
        return request.options.strategy == "fast" and self.model is not None and self.fast_path_reason() is None

    def batcher(self):
        """The fast path's batcher for this model (one: its KV cache is the model's), made on first use."""
        if self._batcher is None:
            from redline.inference.generation.batch import Batcher

            self._batcher = Batcher(
                self,
                self.limits.max_active,
                self.limits.kv_budget_tokens,
                self.on_result,
                self.limits.prefix_cache_bytes,
                disk_pages_bytes=self.limits.disk_pages_bytes,
            )
        return self._batcher

    def persist_prefix_cache(self) -> int:
        """Write the prefix cache's pages to disk (the model unloads, Redline quits): the pages handed over. A
        disk that fails costs only the pages (a warm restart), never the unload or the quit."""
        if self._batcher is None:
            return 0
        try:
            return self._batcher.persist()
        except Exception:
            return 0

    def generate(self, request, sink, submitted: Optional[float] = None):
        from redline.inference.generation.run import run_local

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

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def context_limit(self) -> int:
        cfg = (
            self.model.config.get_text_config() if hasattr(self.model.config, "get_text_config") else self.model.config
        )
        return int(getattr(cfg, "max_position_embeddings", 0) or 4096)


OOM_TEXTS = (
    "out of memory",  # torch.OutOfMemoryError, CUDA and MPS
    "can't allocate memory",  # torch's DefaultCPUAllocator
    "cannot allocate memory",  # ENOMEM as the OS words it (safetensors' mmap, Rust's io errors)
    "bad_alloc",  # std::bad_alloc from C++ code
    "os error 12",
    "errno 12",
)


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is an allocation failure rather than a broken file."""
    import errno

    import torch

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
            return True
        if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
            return True
        text = str(exc).lower()
        if any(t in text for t in OOM_TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _oom_cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def estimate_shape(folder: Path, name: str):
    """The estimator's shape of ``folder``, or None where it cannot be read (the load then says why itself).
    Read before the weights: building it (the architecture on the meta device, the first time a config is seen)
    needs memory that a load which ran out has taken, and the out-of-memory message is built from it (without it
    test_oom's message lost its figures on a machine whose shape cache was empty)."""
    try:
        from redline.inference.memory.model_shapes import shape_for_folder

        return shape_for_folder(folder, name)
    except Exception:
        return None


def out_of_memory(
    source: ModelSource, precision: PrecisionSpec, device: str, folder: Optional[Path], exc, shape=None
) -> OutOfMemory:
    """Say that memory ran out, what the estimator says this load needs, and what fits instead. ``shape``: read
    before the load (``estimate_shape``), so nothing need be built while memory is short."""
    message = f"Ran out of memory while loading {source.name} in {precision.label()} on {device} ({_oom_cause(exc)})."
    generic = "Choose a smaller precision (q4, nf4 or int8), close other programs, or pick a smaller model."
    if folder is None:
        return OutOfMemory(message, generic)
    try:
        from redline.inference.memory.fit import Planner, detect_target, suggest
        from redline.inference.memory.model_shapes import shape_for_folder
        from redline.inference.units import format_bytes

        shape = shape or shape_for_folder(folder, source.name)
        context = min(shape.max_positions, 4096)
        target = detect_target(device="cpu" if device == "cpu" else device)
        planner = Planner(shape, target)
        e = planner.estimate(precision, context)
        load_bytes = e.weights_bytes + e.loading_bytes + e.overhead_bytes
        advice = suggest(planner, context, precision.name)
    except Exception:  # the diagnosis must not hide the failure
        return OutOfMemory(message, generic)
    hint = (
        f"The estimator puts loading it at about {format_bytes(load_bytes)} ({format_bytes(e.total_bytes)} with a "
        f"{context}-token chat), and {format_bytes(target.available_bytes)} is available ({target.label}). "
        f"{advice.text}"
    )
    return OutOfMemory(message, hint)


# What a chat maps beyond torch and transformers before its model's own bytes: the modules a load imports
# (bitsandbytes' library among them), the tokenizer's and the engine's threads, heap arenas. Measured with a
# 2-layer model (tests/conftest.py build_tiny_model) on torch 2.14.1, 2 cores: VmPeak 730-800 MB above the
# address space after importing torch and transformers. With less room, whether a run lives depends on the order
# its threads start (one that cannot start its stack makes libgomp end the process): refused before that.
RUNTIME_GROWTH_BYTES = 800 * 1000 * 1000
MAP_FAILURES = ("failed to map segment", "cannot allocate memory", "cannot map", "out of memory")


def address_space_limit() -> Optional[int]:
    """This process's address-space limit in bytes (``ulimit -v``, RLIMIT_AS's soft limit), None without one."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None  # no RLIMIT_AS here (Windows)
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def _thread_stack_bytes() -> int:
    """What a new thread reserves for its stack: glibc takes RLIMIT_STACK's soft limit (8 MiB unless changed)."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_STACK)
    except (ImportError, OSError, ValueError):
        soft = -1
    return int(soft) if 0 < soft != resource.RLIM_INFINITY else 8 * 1024 * 1024


def check_address_space(model: Optional[str] = None, precision: Optional[str] = None) -> None:
    """Under an address-space limit, load torch and check that its threads fit, before any model loads.

    Past the limit, importing torch fails with a traceback (its libraries cannot be mapped), and OpenMP cannot
    start a thread: libgomp then ends the process ("Thread creation failed"), which no Python code can catch.
    Either way the user would read no sentence of Redline's. With ``model`` (a ``--model`` value) the room left
    must also hold the estimator's smallest load of it (of ``precision``, or of any precision for ``auto``).
    Raises OutOfMemory with the limit and the value to set instead; does nothing without a limit."""
    limit = address_space_limit()
    if limit is None:
        return
    from redline.inference.units import format_bytes

    shown = f"ulimit -v {limit // 1024}, {format_bytes(limit)}"
    try:
        import torch
        import transformers  # noqa: F401
    except (ImportError, OSError, MemoryError) as exc:
        if not (isinstance(exc, MemoryError) or any(t in str(exc).lower() for t in MAP_FAILURES)):
            raise
        raise OutOfMemory(
            f"torch could not be loaded within this process's address-space limit ({shown}): {_oom_cause(exc)}.",
            "Raise the limit in the shell that starts Redline (ulimit -v unlimited; torch's libraries alone map "
            "a few GB of address space, more for a CUDA build), then start it again.",
        ) from exc
    import psutil

    threads = max(1, torch.get_num_threads())
    load, what = _smallest_load(model, precision)
    need = (threads + 1) * _thread_stack_bytes() + RUNTIME_GROWTH_BYTES + load
    used = psutil.Process().memory_info().vms
    if limit - used < need:
        raise OutOfMemory(
            f"This process's address-space limit ({shown}) leaves {format_bytes(max(0, limit - used))} once torch "
            f"is loaded, less than the {format_bytes(need)} that the rest of Redline's runtime, torch's {threads} "
            f"threads and {what} need, so it would be stopped mid-start.",
            f"Raise the limit in the shell that starts Redline (ulimit -v unlimited, or at least "
            f"ulimit -v {-(-(used + need) // 1024)}), then start it again.",
        )


def _smallest_load(model: Optional[str], precision: Optional[str]) -> tuple[int, str]:
    """The estimator's smallest load of ``model`` (weights, what loading them takes, a 256-token cache) and its
    words; 0 when the model's shape cannot be read."""
    if model:
        try:
            from redline.inference.loading.precision import parse_precision
            from redline.inference.memory.fit import Planner, detect_target, precisions_for
            from redline.inference.memory.model_shapes import read_shape

            shape = read_shape(model)
            planner = Planner(shape, detect_target(device="cpu"))
            names = precisions_for(shape) if precision in (None, "auto") else [precision]
            best = None
            for name in names:
                # Everything but the runtime (counted above), at the shortest useful chat.
                e = planner.estimate(parse_precision(name), 256)
                size = e.total_bytes - e.overhead_bytes
                if best is None or size < best[0]:
                    best = (size, name)
            if best is not None:
                return best[0], f"loading {shape.name} in {best[1]} (its smallest load)"
        except Exception:  # no estimate: the runtime's share still catches a limit no load could fit
            pass
    return 0, "a model load"


def free_memory(device: str) -> None:
    """Give freed model memory back: collect cycles, empty torch's CUDA cache, and return the C heap's free
    pages to the system (see ``memory_policy`` for why glibc would otherwise keep them)."""
    with returning_freed_memory():
        collect_garbage()
        if device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
        trim()


def read_config(folder: Path) -> dict:
    """Read config.json with errors that name the file and the problem."""
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing.", "A transformers model folder needs config.json.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}).",
            "Restore the file from the model's original download.",
        ) from exc
    except UnicodeDecodeError as exc:
        raise ModelLoadError(f"{path} is not a text file.", "Restore it from the original download.") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object.", "Restore it from the original download.")
    if "model_type" not in data:
        raise ModelLoadError(
            f"{path} has no 'model_type' field, so the architecture is unknown.",
            "Restore the file from the model's original download.",
        )
    return data


def check_weights(folder: Path, allow_pickle: bool = False) -> None:
    if any(folder.glob("*.safetensors")):
        return
    pickles = pickle_files(folder)
    if pickles:
        if allow_pickle:
            return
        raise NeedsOptIn(
            f"{folder.name} holds only pickle-based weights ({', '.join(pickles[:3])}), which can run code when "
            "loaded.",
            "Convert the model to safetensors, or opt in for this model with --allow-pickle "
            "(they are then loaded with weights_only=True).",
            "pickle",
            folder,
            pickles,
            fingerprint(folder, "pickle"),
        )
    raise ModelLoadError(
        f"{folder} has no weight files (*.safetensors).", "The download may be incomplete; fetch the model again."
    )


def _remote_code_opt_in(folder: Path) -> NeedsOptIn:
    files = remote_code_files(folder)
    return NeedsOptIn(
        f"{folder.name} needs custom Python code shipped with the model ({', '.join(files) or 'auto_map'}), "
        "which Redline does not run unless you opt in.",
        "If you trust its author, opt in for this model with --trust-remote-code.",
        "remote_code",
        folder,
        files,
        fingerprint(folder, "remote_code"),
    )


def code_opt_in(spec: str) -> Optional[NeedsOptIn]:
    """The opt-in that loading ``spec`` (a ``--model`` value) would ask for because its folder ships custom code,
    read from its config.json on disk alone (nothing fetched, nothing run); None when it asks none or the folder
    is not here yet. Asked before anything reads the model's shape, so an untrusted model is refused for that
    reason, not for a field its custom config leaves out."""
    from redline.inference.sources.resolve import resolve

    try:
        folder = resolve(spec).local_folder()
        data = json.loads((folder / "config.json").read_text(encoding="utf-8")) if folder is not None else None
    except (RedlineError, OSError, ValueError):
        return None  # the load itself says what is wrong with the folder
    if not isinstance(data, dict) or "auto_map" not in data:
        return None
    return _remote_code_opt_in(folder)


def load_config(folder: Path, trust_remote_code: bool = False):
    from transformers import AutoConfig

    data = read_config(folder)
    if "auto_map" in data and not trust_remote_code:
        raise _remote_code_opt_in(folder)
    try:
        return AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except (ValueError, KeyError) as exc:
        raise ModelLoadError(
            f"{folder / 'config.json'}: model_type {data.get('model_type')!r} is not an architecture this "
            f"version of transformers knows ({exc}).",
            "Upgrade transformers, or choose a model of a supported architecture.",
        ) from exc


def load_tokenizer(folder: Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(
            f"Could not load the tokenizer in {folder} ({type(exc).__name__}: {exc}).",
            "The folder needs tokenizer.json or tokenizer.model and tokenizer_config.json.",
        ) from exc
    return tok


def _load_float(folder, precision, device, kwargs, progress, should_cancel, trust_remote_code, allow_pickle):
    """An ordinary transformers folder, through ``from_pretrained`` (and packed after loading for q8/q4)."""
    from transformers import AutoModelForCausalLM

    with transformers_progress(progress, 0.35, 0.95, "Loading weights", should_cancel):
        model = AutoModelForCausalLM.from_pretrained(
            str(folder),
            trust_remote_code=trust_remote_code,
            use_safetensors=None if allow_pickle else True,
            weights_only=True,  # even with the pickle opt-in, never unpickle arbitrary objects
            **kwargs,
        )
    model.eval()
    if precision.name in WEIGHT_ONLY:
        progress(0.96, "Quantising weights")
        from redline.inference.loading.weight_only import quantize_model

        quantize_model(model, 8 if precision.name == "q8" else 4, torch_dtype(precision.compute_dtype), device=device)
        model.to(device)  # what stayed unquantised (embeddings, norms) follows the packed layers
    return model


def load_model(
    source: ModelSource,
    precision: PrecisionSpec,
    device: Optional[str] = None,
    progress: ProgressFn = noop_progress,
    should_cancel: Optional[CancelFn] = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> LoadedModel:
    """Load ``source`` at ``precision``. Raises a RedlineError subclass with a fix on failure."""
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
    tokenizer = load_tokenizer(folder, trust_remote_code)
    check_cancel(should_cancel)
    shape = estimate_shape(folder, source.name)  # before the weights (its docstring says why)
    from redline.inference import units  # noqa: F401
    from redline.inference.memory import fit  # noqa: F401 - the out-of-memory message's, imported while memory is there

    kwargs = from_pretrained_kwargs(precision, device) if manifest is None else {}
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
                    folder, precision, device, kwargs, progress, should_cancel, trust_remote_code, allow_pickle
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
            raise out_of_memory(source, precision, device, folder, exc, shape) from exc
        raise ModelLoadError(
            f"Could not load the weights of {source.name} ({type(exc).__name__}: {exc}).",
            "The weight files may be truncated or corrupt; download the model again.",
        ) from exc
    if device.startswith("cuda"):
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
    )
