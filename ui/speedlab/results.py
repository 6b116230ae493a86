"""The speed lab's results: the table of rows shown (sortable by the numbers behind the cells), the batch sweep's
table, and what they show — one run (live or reopened) or several compared, each row then labelled by its run.
The charts (``charts.Charts``) are redrawn from the same rows."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QTableWidget, QTableWidgetItem

from ...inference import COLUMNS, SWEEP_COLUMNS, BenchReport, ConfigResult, hidden_columns
from .charts import Charts

# The raw value behind each column, for sorting numerically rather than by text.
_SORT_KEYS = {
    "TTFT p50 ms": "ttft_ms",
    "TTFA p50 ms": "ttfat_ms",
    "pred. TTFA ms": "predicted_ttfat_ms",
    "think tokens": "thinking_tokens",
    "think tok/s": "thinking_tokens_per_s",
    "answer tok/s": "answer_tokens_per_s",
    "tok p50 ms": "p50_ms",
    "tok p95 ms": "p95_ms",
    "tok/s": "tokens_per_s",
    "tok/s range": "tokens_per_s_min",
    "pred. tok/s": "predicted_tokens_per_s",
    "pred. error": "prediction_error_pct",
    "total s": "total_s",
    "load s": "load_s",
    "peak MB": "peak_memory_bytes",
    "accept": "acceptance_rate",
    "acc. len": "mean_accepted_length",
    "speedup": "speedup",
    "matches": "diverges_at",
    "q8 KV agrees": "kv_agreement",
    "q8 KV ppl": "kv_ppl_change",
}


class _SortItem(QTableWidgetItem):
    """A cell that sorts by its raw number (empty cells last), and by text otherwise."""

    def __init__(self, text: str, key):
        super().__init__(text)
        self.key = key
        self.setFlags(self.flags() & ~Qt.ItemIsEditable)

    def __lt__(self, other):
        a, b = self.key, getattr(other, "key", None)
        if isinstance(a, (int, float)) or isinstance(b, (int, float)):
            if a is None:
                return False
            if b is None:
                return True
            return a < b
        return self.text() < other.text()


class ResultsView:
    """The rows shown in ``table`` and ``charts``, and the sweep's rows in ``sweep_table``.

    ``report``: the run shown (live or reopened; None before a run ends), ``shown``: its rows (several runs'
    when comparing)."""

    def __init__(self, charts: Charts):
        self.charts = charts
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([h for h, _ in COLUMNS])
        self.table.setSortingEnabled(True)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.sweep_table = QTableWidget(0, len(SWEEP_COLUMNS))
        self.sweep_table.setHorizontalHeaderLabels([h for h, _ in SWEEP_COLUMNS])
        self.report: Optional[BenchReport] = None
        self.shown: list[ConfigResult] = []
        self._sweep_live: list = []  # the sweep's rows as a run streams them

    def clear(self) -> None:
        """A run starts: nothing shown until its rows come."""
        self.report = None
        self.shown = []
        self._sweep_live = []
        self.refresh()

    def show_reports(self, reports: list[BenchReport]) -> None:
        """Show one run, or several side by side (rows labelled by run)."""
        if not reports:
            return
        self.report = reports[0]
        if len(reports) == 1:
            self.shown = list(reports[0].results)
        else:
            self.shown = []
            for rep in reports:
                tag = rep.started_at.replace("T", " ")[:16]
                for r in rep.results:
                    copy = ConfigResult(**r.to_dict())
                    copy.config = f"{tag} · {r.config}"
                    self.shown.append(copy)
        self.refresh()
        self.fill_sweep(reports[0].sweep)

    def add_row(self, result: ConfigResult) -> None:
        """A row of the running run ended: shown in its place (by index)."""
        self.shown = [r for r in self.shown if r.index != result.index] + [result]
        self.shown.sort(key=lambda r: r.index)
        self.refresh()

    def sweep_started(self) -> None:
        self._sweep_live = []

    def add_sweep_row(self, row) -> None:
        if self.report is None:  # a reopened run's sweep is not the live one's
            self._sweep_live = self._sweep_live + [row]
            self.fill_sweep(self._sweep_live)

    def refresh(self) -> None:
        self._fill_table(self.shown)
        self.charts.fill(self.shown)

    def _fill_table(self, rows: list[ConfigResult]) -> None:
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            for j, (header, fmt) in enumerate(COLUMNS):
                key = getattr(r, _SORT_KEYS[header]) if header in _SORT_KEYS else None
                if header == "matches" and r.matches_baseline:
                    key = float("inf")  # a full match sorts after any divergence point
                item = _SortItem(fmt(r), key)
                if header == "status" and r.status != "ok":
                    item.setForeground(Qt.red)
                self.table.setItem(i, j, item)
        # A reasoning model's columns (time to first answer, thinking and answer tok/s) only where a row has them, the
        # KV cache's (its form, a q8 row's agreement and perplexity against bf16) only where a row kept it in 8 bits.
        hidden = hidden_columns(rows)
        for j, (header, _fmt) in enumerate(COLUMNS):
            self.table.setColumnHidden(j, header in hidden)
        self.table.setSortingEnabled(True)
        self.table.resizeColumnsToContents()

    def fill_sweep(self, rows) -> None:
        self.sweep_table.setRowCount(len(rows))
        for i, s in enumerate(rows):
            for j, (_h, fmt) in enumerate(SWEEP_COLUMNS):
                self.sweep_table.setItem(i, j, _SortItem(fmt(s), None))
        self.sweep_table.resizeColumnsToContents()
