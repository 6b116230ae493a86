"""Figures measured per machine (memory bandwidth, FLOP/s) and kept in the cache folder.

Each figure lives in ``<cache>/<name>.json`` under a key naming the device: the GPU's name, or the CPU's name
with torch's thread count (the same CPU measures differently with another number of threads).

Every speed prediction and every ``auto`` choice starts from these figures, so a read taken while another program
kept the cores busy (a build: 12.5 GB/s where a quiet read streams at 20+) would skew all of them for good. So:

- each read on a CPU is watched (``load.CpuLoad``): it is *quiet* when other programs used at most ``QUIET_SHARE``
  of the cores meanwhile. A GPU's read is taken as quiet (the CPU's load does not slow a GPU's reduction);
- the figure is the best of the last ``READS_KEPT`` reads, the quiet ones where there are any (a busy machine only
  ever reads lower);
- until a quiet read is in, the figure is measured again at a later call, at most once every ``RETRY_S`` and only
  when the machine is quiet then (a short look first: ``load.others_share_now``);
- ``mark_stale`` (the speed calibration, when its learned factors drift far from 1) has it measured afresh at the
  next quiet chance, at most once every ``DRIFT_RETRY_S``.
"""

from __future__ import annotations

import json
import time
from typing import Callable, Optional

from ..paths import cache_dir
from .load import CpuLoad, others_share_now
from .probe import cpu_name

QUIET_SHARE = 0.1  # others used at most a tenth of the cores during the read
READS_KEPT = 3
RETRY_S = 600.0  # a figure without a quiet read is tried again after 10 minutes, when the machine is quiet
DRIFT_RETRY_S = 7 * 24 * 3600.0  # a figure is measured afresh for drifting factors at most once a week
NAMES = (("bandwidth", "bytes_per_s"), ("compute", "flops"))


def device_key(device: str) -> str:
    # lazy: torch loads on the engine's thread, never at import
    import torch

    if device.startswith("cuda"):
        return f"cuda:{torch.cuda.get_device_name()}"
    return f"cpu:{cpu_name()}:threads={torch.get_num_threads()}"


def _read(name: str) -> dict:
    try:
        data = json.loads((cache_dir() / f"{name}.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(name: str, data: dict) -> None:
    try:
        (cache_dir() / f"{name}.json").write_text(json.dumps(data, indent=2))
    except OSError:
        pass  # a figure that cannot be cached is measured again next time


def _value(entry, field: str) -> Optional[float]:
    try:
        return float(entry[field])
    except (KeyError, TypeError, ValueError):
        return None  # none, or an entry someone edited: measure again


def _due(entry: dict, now: float) -> bool:
    """A figure to measure again (when the machine is quiet): no quiet read yet, or marked stale."""
    if entry.get("quiet") is True and not entry.get("stale"):
        return False
    return now - float(entry.get("tried_at") or 0.0) >= RETRY_S


def _quiet(share: Optional[float], device: str) -> bool:
    if device.startswith("cuda"):
        return True
    return share is not None and share <= QUIET_SHARE


def measured(name: str, field: str, device: str, measure: Callable[[str], float], refresh: bool = False) -> float:
    """``measure(device)``'s figure for this device: from the cache, measured again where it holds no quiet read
    yet (or was marked stale) and the machine is quiet now, measured now where it holds none (or ``refresh``)."""
    data = _read(name)
    key = device_key(device)
    entry = data.get(key) if isinstance(data.get(key), dict) else {}
    value = _value(entry, field)
    now = time.time()
    if value is not None and not refresh:
        if not _due(entry, now):
            return value
        if not device.startswith("cuda") and not _quiet(others_share_now(), device):
            entry["tried_at"] = now  # busy again: the figure stays as it is, tried again later
            data[key] = entry
            _write(name, data)
            return value
    watch = CpuLoad()
    read = measure(device)
    share = watch.others_share()
    quiet = _quiet(share, device)
    fresh = refresh or bool(entry.get("stale"))
    reads = [] if fresh else list(entry.get("reads") or ([{"value": value, "quiet": False}] if value else []))
    reads = (reads + [{"value": read, "others_cpu_share": share, "quiet": quiet, "at": _stamp()}])[-READS_KEPT:]
    kept = [r for r in reads if r.get("quiet")] or reads
    best = max(float(r["value"]) for r in kept)
    data[key] = {
        field: best,
        "measured_at": _stamp(),
        "quiet": any(r.get("quiet") for r in reads),
        "reads": reads,
        "tried_at": now,
        **({"stale_marked_at": entry["stale_marked_at"]} if entry.get("stale_marked_at") else {}),
    }
    _write(name, data)
    return best


def mark_stale(device: str, why: str) -> bool:
    """Have this device's figures measured afresh at the next quiet chance (``why``: kept with them); at most once
    every ``DRIFT_RETRY_S``. True when marked."""
    try:
        key = device_key(device)
    except Exception:  # torch not importable here: nothing to mark
        return False
    now, marked = time.time(), False
    for name, _field in NAMES:
        data = _read(name)
        entry = data.get(key)
        if not isinstance(entry, dict) or entry.get("stale"):
            continue
        if now - float(entry.get("stale_marked_at") or 0.0) < DRIFT_RETRY_S:
            continue
        entry.update(stale=why, stale_marked_at=now, tried_at=0.0)
        _write(name, data)
        marked = True
    return marked


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")
