"""Running out of memory: whether an error is an allocation failure (not a broken file), and giving freed memory
back after a failure or an unload."""

from __future__ import annotations

import errno

from .policy import collect_garbage, returning_freed_memory, trim

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

    # lazy: torch loads on the engine's thread, never at import
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


def oom_cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def free_memory(device: str) -> None:
    """Give freed model memory back: collect cycles, empty torch's CUDA cache, and return the C heap's free
    pages to the system (see ``memory_policy`` for why glibc would otherwise keep them)."""
    with returning_freed_memory():
        collect_garbage()
        if device.startswith("cuda"):
            # lazy: torch loads on the engine's thread, never at import
            import torch

            torch.cuda.empty_cache()
        trim()
