"""How the process holds memory between models, so that a long day of loading, chatting and unloading
ends near where it started. Two things on CPU builds of torch keep memory that no model owns (1, 2), and one
kept a model's weights twice (3):

1. The C heap. On Linux, glibc serves allocations under a threshold from its heaps (arenas) and larger ones
   from mappings of their own. The threshold is dynamic: it rises to the size of each large block freed, up to
   32 MiB. A model's weights are mostly blocks of 0.1-32 MiB, so after the first load they land in the heaps;
   freed, they stay there, and ``malloc_trim`` cannot return the free top of a worker thread's heap (it trims
   only the main heap's top). Measured on the starter in bf16: 50-100 MB stayed resident after every unload.
   So, on glibc:
     * while weights are created (loading, the fast path's fused copies and cache), every block of 128 KiB
       or more gets its own mapping, which goes back to the system whole when the model is freed;
     * while a model is freed, a heap's free top is returned as soon as it passes 128 KiB;
     * the rest of the time the thresholds sit at glibc's own maximums (32 MiB / 64 MiB), where the dynamic
       setting heads in a warm process anyway, so decoding allocates much as it did before. (Tight thresholds
       throughout would map and fault in fresh pages for every large per-token temporary; measured on this
       2-core CPU it gave 0.80-1.01x the decode speed of wide ones across runs, within the machine's noise
       at best: tools/experiments/memory_policy_bench.py --part heap.)
   Elsewhere (macOS, Windows, musl) these are no-ops.

2. Kernel caches. oneDNN (bf16/fp16 matrix products on CPU) and torch's ideep layer each keep a cache of
   compiled kernels keyed by shape, 1024 entries by default. Every new prompt length is a new shape, so over a
   day of chats the caches grow (about 2.5 MB per prompt length on the starter in bf16; 75 MB over a 30-turn
   conversation at 1024 entries, 20 MB at 32: tools/experiments/memory_policy_bench.py --part caches) and survive
   unloading.
   Redline bounds both to ``KERNEL_CACHE_ENTRIES``, enough for every shape one decoding step uses (the
   projections at one token, a draft's and a verify step's), unless the user set the variables themselves.

3. A checkpoint's pages the fast path copied. Weights in the file's own dtype are views of its memory mapping;
   the fast path concatenates q/k/v and gate/up into copies (``decoding/fastpath._fuse_linears``), and the
   pages its reads brought in stayed resident beside them (starter, bf16: 140 MB; a 7B model in bf16 about
   9 GB of its 13.5). ``release_pages`` asks Linux to page them out (``MADV_PAGEOUT``, kernel 5.4+): the
   contents are kept (a clean page of a file is read again if touched, anything else swapped), so it is safe
   whatever else maps them; it only gives the memory back. Measured (starter bf16, after a fast reply): RSS
   1,393 → 1,253 MB, replies unchanged. Elsewhere it does nothing and the estimator counts the copies
   (``estimator.fast_path_copy_bytes``).
"""

from __future__ import annotations

import bisect
import ctypes
import gc
import os
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
OWN_MAPPING_BYTES = 128 * 1024  # glibc's own starting threshold
DECODE_MMAP_BYTES = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
DECODE_TRIM_BYTES = 2 * DECODE_MMAP_BYTES  # what glibc sets beside it when the threshold moves

KERNEL_CACHE_ENTRIES = 32
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN, ideep

_c = None
_libc = None
_lock = threading.Lock()
_depth = {"weights": 0, "release": 0}  # nesting: a load inside a release window, an unload inside a load


def _linux_libc():
    """This process's C library on Linux (read once), with errno; False elsewhere or where it cannot be opened."""
    global _c
    if _c is None:
        _c = False
        if sys.platform.startswith("linux"):
            try:
                _c = ctypes.CDLL(None, use_errno=True)
            except OSError:
                _c = False
    return _c


def _glibc():
    """The C library's mallopt/malloc_trim where it is glibc; False elsewhere."""
    global _libc
    if _libc is None:
        _libc = False
        lib = _linux_libc()
        try:
            if lib:
                lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
                lib.malloc_trim.argtypes = [ctypes.c_size_t]
                _libc = lib
        except AttributeError:  # musl and others: no malloc_trim
            _libc = False
    return _libc


def _apply() -> None:
    lib = _glibc()
    if not lib:
        return
    lib.mallopt(M_MMAP_THRESHOLD, OWN_MAPPING_BYTES if _depth["weights"] else DECODE_MMAP_BYTES)
    lib.mallopt(M_TRIM_THRESHOLD, OWN_MAPPING_BYTES if _depth["release"] else DECODE_TRIM_BYTES)


@contextmanager
def _window(kind: str) -> Iterator[None]:
    with _lock:
        _depth[kind] += 1
        _apply()
    try:
        yield
    finally:
        with _lock:
            _depth[kind] -= 1
            _apply()


def weights_in_own_mappings():
    """Blocks of 128 KiB or more allocated inside get their own mapping (returned whole when freed)."""
    return _window("weights")


def returning_freed_memory():
    """Frees inside give a heap's free top back to the system as soon as it passes 128 KiB."""
    return _window("release")


_collector: Optional[Callable[[], None]] = None


def set_collector(fn: Optional[Callable[[], None]]) -> None:
    """Who runs the cyclic garbage collector when the engine frees a model (None: the calling thread).

    Why: in the desktop app the garbage can hold Qt objects (a chart's items, a widget in a cycle), and a Qt
    object destroyed on the engine's thread while the UI thread is inside Qt can deadlock both (pyqtgraph's
    ``GarbageCollector`` exists for the same reason). The window installs a collector that runs on the UI
    thread."""
    global _collector
    _collector = fn


def collector() -> Optional[Callable[[], None]]:
    return _collector


def collect_garbage() -> None:
    """``gc.collect()``, on the thread the installed collector chooses."""
    (_collector or gc.collect)()


MADV_PAGEOUT = 21  # linux/mman.h (5.4+)
_advise = None


def _madvise():
    global _advise
    if _advise is None:
        _advise = False
        lib = _linux_libc()
        try:
            if lib:
                lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                lib.madvise.restype = ctypes.c_int
                _advise = lib.madvise
        except AttributeError:
            _advise = False
    return _advise


def releases_pages() -> bool:
    """Whether ``release_pages`` can give pages back here (Linux); the estimator asks."""
    return bool(_madvise())


def _file_mappings() -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of files (``/proc/self/maps``), sorted."""
    out = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    lo, _, hi = parts[0].partition("-")
                    out.append((int(lo, 16), int(hi, 16)))
    except OSError:
        return []
    return sorted(out)


_held = threading.local()  # the file mappings read once (``one_reading_of_the_mappings``), per thread


@contextmanager
def one_reading_of_the_mappings() -> Iterator[None]:
    """Inside, ``release_pages`` reads this process's file mappings once instead of at every call. Why: with torch
    loaded ``/proc/self/maps`` holds thousands of lines, and the fast path's decoder gives pages back after each of
    a model's fusions (60 for the starter): reading it each time took 220 of the 300 ms the decoder's build took,
    paid by the first reply. Nothing inside maps or unmaps a file (fusing copies weights into memory of its own),
    so the one reading holds throughout."""
    if getattr(_held, "active", False):
        yield
        return
    _held.active, _held.ranges = True, None
    try:
        yield
    finally:
        _held.active, _held.ranges = False, None


def _mappings_now() -> list[tuple[int, int]]:
    if not getattr(_held, "active", False):
        return _file_mappings()
    if _held.ranges is None:
        _held.ranges = _file_mappings()
    return _held.ranges


def _in_a_mapping(ranges: list[tuple[int, int]], starts: list[int], start: int, size: int) -> bool:
    """Whether [start, start + size) lies inside one of ``ranges`` (sorted, not overlapping)."""
    i = bisect.bisect_right(starts, start) - 1
    return i >= 0 and start + size <= ranges[i][1]


def release_pages(tensors) -> int:
    """Page out the whole pages inside each CPU tensor's storage that lie in a mapping of a file (the caller stops
    using them); the bytes asked for. Only file mappings: anonymous memory about to be freed would be written to
    swap for nothing. Contents are kept (see 3. above); a kernel without MADV_PAGEOUT refuses: nothing changes."""
    advise = _madvise()
    if not advise:
        return 0
    tensors = [t for t in tensors if t is not None and t.device.type == "cpu"]
    files = _mappings_now() if tensors else []
    starts = [lo for lo, _ in files]
    page = os.sysconf("SC_PAGE_SIZE")
    asked = 0
    for t in tensors:
        # The tensor's own bytes, not its storage's: a storage may be a whole file's, other tensors live in it.
        start, size = t.data_ptr(), t.numel() * t.element_size() if t.is_contiguous() else 0
        if not _in_a_mapping(files, starts, start, size):
            continue
        lo, hi = -(-start // page) * page, (start + size) // page * page
        if hi > lo and advise(lo, hi - lo, MADV_PAGEOUT) == 0:
            asked += hi - lo
    return asked


def trim() -> None:
    """``malloc_trim(0)``: return the free pages inside every heap (where the C library is glibc)."""
    lib = _glibc()
    if lib:
        lib.malloc_trim(0)


def bound_kernel_caches() -> None:
    """Cap oneDNN's and ideep's kernel caches. The libraries read these variables when they create their first
    kernel, so this works after ``import torch`` as long as no bf16/fp16 product ran yet."""
    for name in KERNEL_CACHE_VARIABLES:
        os.environ.setdefault(name, str(KERNEL_CACHE_ENTRIES))
