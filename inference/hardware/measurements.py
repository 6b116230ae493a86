"""Figures measured once per machine (memory bandwidth, FLOP/s) and kept in the cache folder.

Each figure lives in ``<cache>/<name>.json`` under a key naming the device: the GPU's name, or the CPU's name
with torch's thread count (the same CPU measures differently with another number of threads).
"""

from __future__ import annotations

import json
import time
from typing import Callable

from redline.inference.hardware.probe import cpu_name
from redline.inference.paths import cache_dir


def device_key(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"cuda:{torch.cuda.get_device_name()}"
    return f"cpu:{cpu_name()}:threads={torch.get_num_threads()}"


def measured(name: str, field: str, device: str, measure: Callable[[str], float], refresh: bool = False) -> float:
    """``measure(device)``, from the cache when it holds the figure for this device (unless ``refresh``)."""
    path = cache_dir() / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    key = device_key(device)
    if not refresh and key in data:
        try:
            return float(data[key][field])
        except (KeyError, TypeError, ValueError):
            pass  # an entry someone edited: measure again
    value = measure(device)
    data[key] = {field: value, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        path.write_text(json.dumps(data, indent=2))
    except OSError:
        pass  # a figure that cannot be cached is measured again next time
    return value
