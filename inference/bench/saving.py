"""Speed-lab reports saved as JSON files, and read back."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import UnsupportedConfiguration
from .results import BenchReport


def save_report(report: BenchReport, folder: Path) -> Path:
    """Keep a run as ``<folder>/<started>-<model>.json`` so it can be reopened and compared."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = report.started_at.replace(":", "").replace("-", "")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", report.model)[:60]
    path = folder / f"{stamp}-{safe}.json"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{stamp}-{safe}-{n}.json"
    path.write_text(json.dumps(report.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
    return path


def load_report(path: Path) -> BenchReport:
    try:
        return BenchReport.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, TypeError, AttributeError) as exc:
        raise UnsupportedConfiguration(f"{path} is not a saved speed-lab run ({exc}).") from exc


def list_reports(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*.json"), reverse=True) if Path(folder).is_dir() else []
