"""The run's clock, its sections' deadlines, and the report rewritten after every cell.

A section's deadline is its share of the budget from where it starts, or, when the sections before it left time
unused, the end of its share of the run as planned (their savings pass to it), never past the run's end. Cells
call ``Section.check()`` inside their loops: past the deadline it raises ``Cut``, and the cell and its section
are reported as cut, with why. ``Report.write()`` replaces both files atomically (a temporary file, then
``os.replace``), so a run killed at any moment leaves a whole report of what it measured until then.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional


class Cut(Exception):
    """A section's deadline passed (or the run's budget was spent) inside a cell."""


class Clock:
    def __init__(self, budget_s: float):
        self.started = time.perf_counter()
        self.budget_s = float(budget_s)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def end(self) -> float:
        return self.started + self.budget_s


class Section:
    def __init__(self, number: int, key: str, title: str, share: float, columns: tuple):
        self.number, self.key, self.title, self.share, self.columns = number, key, title, share, columns
        self.status = "not started"
        self.cells: list[dict] = []
        self.notes: list[str] = []
        self.deadline: Optional[float] = None
        self.started: Optional[float] = None
        self.seconds: Optional[float] = None
        self.clock: Optional[Clock] = None

    def open(self, clock: Clock, planned_end: float) -> None:
        """Start now: the deadline is this section's share from now, or its planned end if earlier sections left
        time unused, never past the run's end."""
        now = time.perf_counter()
        self.clock, self.started = clock, now
        own = now + self.share * clock.budget_s
        self.deadline = min(clock.end, max(own, planned_end))
        self.status = "running"

    def left(self) -> float:
        return max(0.0, self.deadline - time.perf_counter()) if self.deadline is not None else 0.0

    def allowed_s(self) -> float:
        return (self.deadline - self.started) if self.deadline is not None else 0.0

    def check(self, doing: str = "") -> None:
        """Raise ``Cut`` once the deadline has passed (call inside loops)."""
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            raise Cut(self.why_cut(doing))

    def why_cut(self, doing: str = "") -> str:
        run_end = self.clock is not None and self.deadline >= self.clock.end - 1e-6
        limit = (
            f"the run's budget ({self.clock.budget_s:.0f} s) ran out"
            if run_end
            else f"the section's {self.allowed_s():.0f} s ran out"
        )
        return limit + (f" while {doing}" if doing else "")

    def to_dict(self) -> dict:
        return {
            "number": self.number,
            "key": self.key,
            "title": self.title,
            "status": self.status,
            "seconds": self.seconds,
            "allowed_s": None if self.deadline is None else round(self.allowed_s(), 1),
            "notes": self.notes,
            "cells": self.cells,
        }


class Report:
    """The sections and their cells, as JSON and Markdown under ``out``, rewritten after every change."""

    def __init__(self, out: Path, info: dict, sections: list[Section], extra_md: Callable[[], list[str]]):
        self.out, self.info, self.sections, self.extra_md = out, info, sections, extra_md
        self.state = "running"
        self.clock: Optional[Clock] = None
        self.cells_written = 0
        # A test's stand-in for a run killed at its limit: end the process (no clean-up, no atexit) right after
        # the report is written for the Nth cell, as SIGKILL would.
        self.exit_after_cells: Optional[int] = None

    def log(self, text: str) -> None:
        print(text, flush=True)
        with (self.out / "gpu-check.log").open("a", encoding="utf-8") as fh:
            fh.write(text + "\n")

    def add(self, section: Section, cell: dict) -> dict:
        section.cells.append(cell)
        self.cells_written += 1
        self.write()
        figures = ", ".join(
            f"{k} {_fmt(cell[k])}"
            for k in ("tokens_per_s", "ttft_ms", "max_abs_err", "longest_gap_ms", "measured_gb")
            if cell.get(k) is not None
        )
        self.log(f"[{section.number}] {cell.get('name')}: {cell.get('status')}" + (f" ({figures})" if figures else ""))
        if self.exit_after_cells is not None and self.cells_written >= self.exit_after_cells:
            os._exit(3)
        return cell

    def to_dict(self) -> dict:
        return {
            "info": self.info,
            "state": self.state,
            "elapsed_s": None if self.clock is None else round(self.clock.elapsed(), 1),
            "budget_s": None if self.clock is None else self.clock.budget_s,
            "cells_written": self.cells_written,
            "sections": [s.to_dict() for s in self.sections],
        }

    def write(self) -> None:
        data = self.to_dict()
        _replace(self.out / "gpu-check.json", json.dumps(data, indent=1, default=str))
        _replace(self.out / "gpu-check.md", "\n".join(self.markdown(data)) + "\n")

    def markdown(self, data: dict) -> list[str]:
        info = data["info"]
        lines = [
            f"# gpu-check: {info['device']}",
            "",
            f"torch {info['torch']}, CUDA {info['cuda']}, transformers {info['transformers']}, Python "
            f"{info['python']}; budget {data['budget_s']:.0f} s, {data['elapsed_s']:.0f} s so far"
            + ("; **dry run on the CPU** (tiny model, tiny sizes: the code path, not figures)" * info["dry_run"]),
            "",
            f"**State: {data['state']}**",
        ]
        if info.get("findings"):
            lines += ["", "Findings:"] + [f"- {f}" for f in info["findings"]]
        for s in self.sections:
            lines += ["", f"## {s.number}. {s.title}", "", f"Status: {s.status}" + _secs(s)]
            if s.cells:
                cols = (("cell", "name"), ("status", "status")) + s.columns
                lines += ["", "| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
                for c in s.cells:
                    lines.append("| " + " | ".join(_fmt(c.get(k)) for _, k in cols) + " |")
            if s.notes:
                lines += [""] + [f"- {n}" for n in s.notes]
        return lines + [""] + self.extra_md()


def _secs(s: Section) -> str:
    if s.seconds is None:
        return ""
    return f" ({s.seconds:.0f} s of {s.allowed_s():.0f} s allowed)"


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:  # NaN
            return "nan"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 100:
            return f"{v:,.0f}"
        if a >= 1:
            return f"{v:.1f}"
        if a >= 0.01:
            return f"{v:.3f}"
        return f"{v:.2e}"
    text = str(v).replace("|", "/").replace("\n", " ")
    return text if len(text) <= 160 else text[:157] + "..."


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
