"""Measured memory: process RSS (CPU) and torch/NVML figures (CUDA).

A background sampler records the peak RSS during an operation, because the
kernel's lifetime peak (ru_maxrss) cannot be reset between generations.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import psutil

from ..hardware.probe import _nvml_gpus

_PROC = psutil.Process()


def process_rss() -> int:
    return int(_PROC.memory_info().rss)


@dataclass
class MemorySnapshot:
    device: str
    rss_bytes: int
    system_used_bytes: int
    system_total_bytes: int
    cuda_allocated_bytes: Optional[int] = None
    cuda_reserved_bytes: Optional[int] = None
    device_used_bytes: Optional[int] = None
    device_total_bytes: Optional[int] = None
    device_this_process_bytes: Optional[int] = None
    device_other_processes_bytes: Optional[int] = None


def snapshot(device: str = "cpu") -> MemorySnapshot:
    vm = psutil.virtual_memory()
    snap = MemorySnapshot(device, process_rss(), int(vm.total - vm.available), int(vm.total))
    if device.startswith("cuda"):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        snap.cuda_allocated_bytes = int(torch.cuda.memory_allocated())
        snap.cuda_reserved_bytes = int(torch.cuda.memory_reserved())

        idx = torch.cuda.current_device()
        gpus = _nvml_gpus()
        if idx < len(gpus):
            g = gpus[idx]
            snap.device_used_bytes, snap.device_total_bytes = g.used_bytes, g.total_bytes
            snap.device_this_process_bytes = g.this_process_bytes
            snap.device_other_processes_bytes = g.other_processes_bytes
        else:
            free, total = torch.cuda.mem_get_info()
            snap.device_used_bytes, snap.device_total_bytes = total - free, total
    return snap


class PeakMemory:
    """Context manager measuring peak memory of a block.

    On CUDA: torch's peak allocated/reserved since entry. On CPU: peak process
    RSS sampled every ``interval`` seconds (plus at entry and exit).
    """

    def __init__(self, device: str = "cpu", interval: float = 0.01):
        self.device = device
        self.interval = interval
        self.start_rss = 0
        self.peak_rss = 0
        self.peak_allocated: Optional[int] = None
        self.peak_reserved: Optional[int] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_rss = max(self.peak_rss, process_rss())

    def __enter__(self) -> "PeakMemory":
        self.start_rss = self.peak_rss = process_rss()
        if self.device.startswith("cuda"):
            # lazy: torch loads on the engine's thread, never at import
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._thread = threading.Thread(target=self._run, daemon=True, name="redline-rss-sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.read()

    def read(self) -> "PeakMemory":
        """The peaks so far (also while still watching: a batch's replies end one by one)."""
        self.peak_rss = max(self.peak_rss, process_rss())
        if self.device.startswith("cuda"):
            # lazy: torch loads on the engine's thread, never at import
            import torch

            torch.cuda.synchronize()
            self.peak_allocated = int(torch.cuda.max_memory_allocated())
            self.peak_reserved = int(torch.cuda.max_memory_reserved())
        return self

    @property
    def peak_bytes(self) -> int:
        """The figure we report as "peak memory": device reserved on CUDA, RSS on CPU."""
        if self.peak_reserved is not None:
            return self.peak_reserved
        return self.peak_rss
