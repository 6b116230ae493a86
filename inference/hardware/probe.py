"""What the machine has: GPUs (NVML, then torch), RAM and CPU (psutil).

Every figure is read, never assumed. A value that cannot be read is None and
the caller shows it as unknown.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Optional

import psutil


@dataclass
class GpuInfo:
    index: int
    name: str
    total_bytes: Optional[int]
    free_bytes: Optional[int]
    used_bytes: Optional[int]
    this_process_bytes: Optional[int] = None
    other_processes_bytes: Optional[int] = None
    source: str = "nvml"


@dataclass
class HardwareInfo:
    cpu: str
    cpu_cores: int
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: list[GpuInfo] = field(default_factory=list)
    cuda_available: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def device(self) -> str:
        return "cuda" if self.cuda_available else "cpu"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvml_gpus() -> list[GpuInfo]:
    try:
        # lazy: it may be missing or fail to load here, which the handler below says
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    gpus = []
    try:
        pid = os.getpid()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            mine = others = None
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                mine = sum((p.usedGpuMemory or 0) for p in procs if p.pid == pid)
                others = max(0, int(mem.used) - mine)
            except Exception:
                pass
            gpus.append(GpuInfo(i, name, int(mem.total), int(mem.free), int(mem.used), mine, others))
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return gpus


def cuda_available() -> bool:
    try:
        # lazy: torch loads on the engine's thread, never at import
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def probe(include_gpus: bool = True) -> HardwareInfo:
    vm = psutil.virtual_memory()
    info = HardwareInfo(
        cpu=cpu_name(),
        cpu_cores=psutil.cpu_count(logical=True) or 1,
        ram_total_bytes=int(vm.total),
        ram_available_bytes=int(vm.available),
    )
    if include_gpus:
        info.gpus = _nvml_gpus()
        info.cuda_available = cuda_available()
        if info.cuda_available and not info.gpus:
            # lazy: torch loads on the engine's thread, never at import
            import torch

            for i in range(torch.cuda.device_count()):
                free, total = torch.cuda.mem_get_info(i)
                info.gpus.append(GpuInfo(i, torch.cuda.get_device_name(i), total, free, total - free, source="torch"))
    return info


def torch_cuda_build() -> Optional[str]:
    """The CUDA version this torch was built for (e.g. "12.4"); None for a CPU-only build.

    Imports torch: call it off the UI thread.
    """
    # lazy: torch loads on the engine's thread, never at import
    import torch

    return torch.version.cuda


def default_device() -> str:
    return "cuda" if cuda_available() else "cpu"
