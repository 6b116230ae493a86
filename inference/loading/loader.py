"""Load a model and its tokenizer at a chosen precision, with progress, cancel and measured memory."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import psutil

from ..errors import ModelLoadError, NeedsOptIn, OutOfMemory
from ..estimate.fit import DEFAULT_CONTEXT_CAP, Planner, detect_target, precisions_for, suggest
from ..estimate.model_shapes import read_shape, shape_for_folder
from ..kernels.cpu import library as native
from ..memory.oom import oom_cause
from ..precision import (
    WEIGHT_ONLY,
    PrecisionSpec,
    parse_precision,
    torch_dtype,
)
from ..progress import transformers_progress
from ..sources.resolve import ModelSource
from ..sources.trust import fingerprint, pickle_files
from ..units import format_bytes


def estimate_shape(folder: Path, name: str):
    """The estimator's shape of ``folder``, or None where it cannot be read (the load then says why itself).
    Read before the weights: building it (the architecture on the meta device, the first time a config is seen)
    needs memory that a load which ran out has taken, and the out-of-memory message is built from it (without it
    test_oom's message lost its figures on a machine whose shape cache was empty)."""
    try:
        return shape_for_folder(folder, name)
    except Exception:
        return None


def out_of_memory(
    source: ModelSource,
    precision: PrecisionSpec,
    device: str,
    folder: Optional[Path],
    exc,
    shape=None,
    context: Optional[int] = None,
    kv: str = "bf16",
) -> OutOfMemory:
    """Say that memory ran out, what the estimator says this load needs, and what fits instead. ``shape``: read
    before the load (``estimate_shape``), so nothing need be built while memory is short. ``context``: the context
    the chat asked for (Settings, ``--context``; capped at the model's limit), else the one ``auto`` plans with (the
    model's own, at most ``DEFAULT_CONTEXT_CAP``); ``kv``: the KV cache's form the load keeps (``--kv``)."""
    message = f"Ran out of memory while loading {source.name} in {precision.label()} on {device} ({oom_cause(exc)})."
    generic = "Choose a smaller precision (q4, nf4 or int8), close other programs, or pick a smaller model."
    if folder is None:
        return OutOfMemory(message, generic)
    try:
        shape = shape or shape_for_folder(folder, source.name)
        context = min(shape.max_positions, context or DEFAULT_CONTEXT_CAP)
        target = detect_target(device="cpu" if device == "cpu" else device)
        planner = Planner(shape, target, kv=kv)
        e = planner.estimate(precision, context)
        load_bytes = e.weights_bytes + e.loading_bytes + e.overhead_bytes
        advice = suggest(planner, context, precision.name)
    except Exception:  # the diagnosis must not hide the failure
        return OutOfMemory(message, generic)
    hint = (
        f"The estimator puts loading it at about {format_bytes(load_bytes)} ({format_bytes(e.total_bytes)} for a "
        f"chat of {context:,} tokens), and {format_bytes(target.available_bytes)} is available ({target.label}). "
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
        # lazy: it may be missing or fail to load here, which the handler below says
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None  # no RLIMIT_AS here (Windows)
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def _thread_stack_bytes() -> int:
    """What a new thread reserves for its stack: glibc takes RLIMIT_STACK's soft limit (8 MiB unless changed)."""
    try:
        # lazy: it may be missing or fail to load here, which the handler below says
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

    shown = f"ulimit -v {limit // 1024}, {format_bytes(limit)}"
    try:
        # lazy: it may be missing or fail to load here, which the handler below says
        import torch
        import transformers  # noqa: F401
    except (ImportError, OSError, MemoryError) as exc:
        if not (isinstance(exc, MemoryError) or any(t in str(exc).lower() for t in MAP_FAILURES)):
            raise
        raise OutOfMemory(
            f"torch could not be loaded within this process's address-space limit ({shown}): {oom_cause(exc)}.",
            "Raise the limit in the shell that starts Redline (ulimit -v unlimited; torch's libraries alone map "
            "a few GB of address space, more for a CUDA build), then start it again.",
        ) from exc

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


BUILDING_KERNELS = "Building Redline's CPU kernels for this machine (once, about a minute)"


def kernels_to_build(device: str) -> bool:
    """Whether Redline's CPU kernels will be compiled the first time they are used here: a CPU they run on, and
    neither a library shipped with Redline (a wheel, the bundle) nor this machine's earlier build. A source checkout
    installed with ``make run`` builds them at install (the Makefile); otherwise it is the first load's."""
    if not device.startswith("cpu"):
        return False

    if native.status().get("loaded") or native.will_run() is not None:
        return False  # loaded already, or they will not run here (no compiler, another CPU, turned off)
    variants = native.variants_here()
    return not any(native.shipped_library(v) or native.cached_library(v) for v in variants)


def build_kernels_first(device: str, progress, fraction: float) -> None:
    """Compile the kernels now, saying so, where the load would otherwise compile them under another label (the
    first q8 load spent about 50 s under "Quantising weights")."""
    if kernels_to_build(device):
        progress(fraction, BUILDING_KERNELS)

        native.ensure_built()  # a failure leaves torch's operators in use, with the reason in native.status()


def _load_float(
    folder, precision, device, kwargs, progress, should_cancel, trust_remote_code, allow_pickle, towers=None
):
    """An ordinary transformers folder, through ``from_pretrained`` (and packed after loading for q8/q4).
    ``towers``: a vision model's tower modules (``loading/vision.py``), loaded with ``AutoModelForImageTextToText``
    and left unpacked by q8/q4; None for a text model."""
    # lazy: transformers loads on the engine's thread, never at import
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForCausalLM if towers is None else AutoModelForImageTextToText
    with transformers_progress(progress, 0.35, 0.95, "Loading weights", should_cancel):
        model = auto.from_pretrained(
            str(folder),
            trust_remote_code=trust_remote_code,
            use_safetensors=None if allow_pickle else True,
            weights_only=True,  # even with the pickle opt-in, never unpickle arbitrary objects
            **kwargs,
        )
    model.eval()
    if precision.name in WEIGHT_ONLY:
        progress(0.96, "Quantising weights")
        # lazy: weight_only imports torch (torch loads on the engine's thread, never at import)
        from .weight_only import quantize_model

        bits, dtype = 8 if precision.name == "q8" else 4, torch_dtype(precision.compute_dtype)
        quantize_model(model, bits, dtype, device=device, skip=towers or ())
        model.to(device)  # what stayed unquantised (embeddings, norms) follows the packed layers
    return model
