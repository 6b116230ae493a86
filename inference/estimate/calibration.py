"""Predicted vs measured memory, and the per-machine correction learned from it.

After a real load and generation the engine records the measured peak beside
the prediction. The residual (measured − predicted before correction) of the
last loads on this machine and device feeds a correction to the overhead term:
the median, so one odd load cannot swing it. Stored as a small JSON file under
the platform's data directory (``REDLINE_DATA_DIR`` overrides).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import platformdirs

from ..memory.measured import snapshot
from .estimator import MB, accuracy_margin, estimate
from .model_shapes import shape_for_folder

HISTORY = 20  # records kept per device
LEARN_FROM = 10  # the correction is the median residual of the last N records
MAX_CORRECTION = 4_000 * MB  # a residual this large means a wrong prediction, not overhead


def data_dir() -> Path:
    override = os.environ.get("REDLINE_DATA_DIR")
    path = Path(override) if override else Path(platformdirs.user_data_dir("redline", appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def calibration_file() -> Path:
    return data_dir() / "memory-calibration.json"


@dataclass
class MemoryCheck:
    """One load + generation: what was predicted, what was measured."""

    model: str
    precision: str
    device: str
    tokens: int
    predicted_bytes: int  # with the correction in force at the time
    measured_bytes: int
    correction_bytes: int  # the correction that was included in predicted_bytes
    time: float = 0.0

    @property
    def error_bytes(self) -> int:
        return self.predicted_bytes - self.measured_bytes

    @property
    def error_pct(self) -> float:
        return 100.0 * self.error_bytes / self.measured_bytes if self.measured_bytes else 0.0

    @property
    def within_target(self) -> bool:
        return abs(self.error_bytes) <= accuracy_margin(self.measured_bytes)

    @property
    def residual_bytes(self) -> int:
        """What the uncorrected prediction missed by (positive: it was too low)."""
        return self.measured_bytes - (self.predicted_bytes - self.correction_bytes)

    def summary(self) -> str:
        return (
            f"predicted {self.predicted_bytes / 1e9:.2f} GB, measured {self.measured_bytes / 1e9:.2f} GB "
            f"({self.error_pct:+.1f} %)"
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(error_pct=round(self.error_pct, 2), within_target=self.within_target)
        return d


def device_key(device: str) -> str:
    """Corrections are per machine (the file is) and per device: "cpu" or the GPU's name."""
    if device.startswith("cuda"):
        try:
            # lazy: torch loads on the engine's thread, never at import
            import torch

            return "cuda:" + torch.cuda.get_device_name(torch.device(device))
        except Exception:
            return "cuda"
    return "cpu"


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # missing or damaged: start over rather than fail a load


def correction_bytes(device: str, path: Optional[Path] = None, key: Optional[str] = None) -> int:
    """The learned correction to the overhead for this device (0 until a load was measured).

    ``key``: a device key already known (e.g. "cuda:" + the NVML name), to avoid importing torch."""
    records = _load(path or calibration_file()).get(key or device_key(device), [])
    residuals = [int(r["residual_bytes"]) for r in records[-LEARN_FROM:] if "residual_bytes" in r]
    if not residuals:
        return 0
    return int(max(-MAX_CORRECTION, min(MAX_CORRECTION, statistics.median(residuals))))


def record(check: MemoryCheck, path: Optional[Path] = None) -> None:
    """Append a measured load to the history that the correction learns from."""
    path = path or calibration_file()
    data = _load(path)
    key = device_key(check.device)
    entry = check.to_dict()
    entry["residual_bytes"] = check.residual_bytes
    entry["time"] = check.time or time.time()
    data[key] = (data.get(key, []) + [entry])[-HISTORY:]
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a correction that cannot be saved must not break the chat


def history(device: str, path: Optional[Path] = None) -> list[dict]:
    return list(_load(path or calibration_file()).get(device_key(device), []))


# --------------------------------------------------------------------------- the engine's side
def loaded_shape(model):
    """A loaded model's shape (``estimator.ModelShape``): read from its config and weight sizes once, not every
    reply (it never changes)."""

    if getattr(model, "estimate_shape", None) is None:
        model.estimate_shape = shape_for_folder(model.folder, model.name)
    return model.estimate_shape


def predict_loaded(
    loaded, tokens: int, prompt_tokens: Optional[int] = None, draft=None, correction: Optional[int] = None
):
    """The estimate for a model the engine has loaded, at ``tokens`` tokens in the cache."""

    shape = loaded_shape(loaded)
    draft_shape = loaded_shape(draft) if draft is not None else None
    if correction is None:
        correction = correction_bytes(loaded.device)
    return estimate(
        shape,
        loaded.precision,
        max(1, tokens),
        1,
        loaded.device,
        draft=draft_shape,
        draft_spec=draft.precision if draft is not None else None,
        correction_bytes=correction,
        prefill_tokens=prompt_tokens,
        baseline_bytes=getattr(loaded, "baseline_rss_bytes", None),
        # Once the fast path has run, its fused weights stay for the model's life (decoding/fastpath.get_decoder).
        strategy="fast" if getattr(loaded, "fast_decoder", None) is not None else None,
    )


def measured_peak_bytes(loaded, result=None, draft=None) -> Optional[int]:
    """The peak the prediction is compared with.

    CPU: the process's peak RSS over the load(s) and the generation. CUDA: torch's
    peak reserved memory plus what this process holds outside torch's allocator
    (CUDA context, cuBLAS workspace), read from NVML.
    """
    peaks = [loaded.peak_memory_bytes]
    if draft is not None:
        peaks.append(draft.peak_memory_bytes)
    if result is not None and result.peak_memory_bytes:
        peaks.append(result.peak_memory_bytes)
    peaks = [p for p in peaks if p]
    if not peaks:
        return None
    peak = max(peaks)
    if loaded.device.startswith("cuda"):
        snap = snapshot(loaded.device)
        if snap.device_this_process_bytes and snap.cuda_reserved_bytes is not None:
            peak += max(0, snap.device_this_process_bytes - snap.cuda_reserved_bytes)
    return int(peak)


def check_generation(loaded, result, draft=None, save: bool = True) -> Optional[MemoryCheck]:
    """Predicted vs measured after a load and a generation; feeds the per-machine correction."""
    measured = measured_peak_bytes(loaded, result, draft)
    if not measured or result.finish_reason == "error":
        return None
    correction = correction_bytes(loaded.device)
    tokens = result.prompt_tokens + result.new_tokens
    predicted = predict_loaded(loaded, tokens, result.prompt_tokens, draft, correction)
    check = MemoryCheck(
        model=loaded.name,
        precision=loaded.precision.label(),
        device=loaded.device,
        tokens=tokens,
        predicted_bytes=predicted.total_bytes,
        measured_bytes=measured,
        correction_bytes=predicted.correction_bytes,  # as applied (estimate() bounds it)
        time=time.time(),
    )
    if save:
        record(check)
    return check
