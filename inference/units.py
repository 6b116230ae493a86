"""Byte counts as people read them, in one place: decimal units (1 MB = 1,000,000 bytes), as disks,
download sizes, the estimator and the docs use them."""

from __future__ import annotations

from typing import Optional

KB = 1000
MB = 1000**2
GB = 1000**3


def format_bytes(n: Optional[float]) -> str:
    """``523 MB``, ``1.52 GB``, ``14.2 GB``: three significant digits from a megabyte up; None is "unknown"."""
    if n is None:
        return "unknown"
    sign, n = ("-" if n < 0 else ""), abs(n)
    if n < KB:
        return f"{sign}{n:.0f} B"
    for unit, size in (("GB", GB), ("MB", MB), ("KB", KB)):
        if n >= size or unit == "KB":
            value = n / size
            digits = 2 if value < 10 else 1 if value < 100 else 0
            if unit != "GB" and value >= 100:
                return f"{sign}{value:,.0f} {unit}"
            return f"{sign}{value:,.{digits}f} {unit}"
    raise AssertionError("unreachable")
