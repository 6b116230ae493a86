"""The speed lab's charts: decode tokens/s (median, with its min–max), time to first token, per-token latency by
position and peak memory, one bar or line per row shown (one run, or several compared)."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtWidgets import QGridLayout, QWidget

from ...inference import MB, ConfigResult

_ABBREV = {"speculative": "spec", "prompt-lookup": "lookup"}


def _short(label: str, width: int = 22) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def _tick(label: str) -> str:
    """A bar's axis label: the strategy (abbreviated) and precision; options are in the table."""
    run, sep, config = label.rpartition(" · ")
    strategy, _, rest = config.partition(":")
    text = _ABBREV.get(strategy, strategy) + (":" + rest.split("+")[0] if rest else "")
    return (run[-5:] + " " if sep else "") + text


def chart_data(rows: list[ConfigResult]) -> dict:
    """What the charts plot, by chart; rows without a measurement are left out."""
    ok = [r for r in rows if r.tokens_per_s is not None]
    return {
        "tokens_per_s": [(r.config, r.tokens_per_s, r.tokens_per_s_min, r.tokens_per_s_max) for r in ok],
        "ttft_ms": [(r.config, r.ttft_ms) for r in rows if r.ttft_ms is not None],
        "latency_by_position": {r.config: list(r.per_token_ms_by_position) for r in rows if r.per_token_ms_by_position},
        "peak_memory_mib": [(r.config, r.peak_memory_bytes / MB) for r in rows if r.peak_memory_bytes is not None],
    }


class Charts(QWidget):
    """Four plots in a grid; ``fill(rows)`` redraws them from the rows shown."""

    def __init__(self, parent=None):
        super().__init__(parent)
        grid = QGridLayout(self)
        self.tps_plot = _plot("Decode tokens/s (median, min–max)", "tokens/s")
        self.ttft_plot = _plot("Time to first token (p50)", "ms")
        self.latency_plot = _plot("Per-token latency by position (median)", "ms")
        self.latency_plot.setLabel("bottom", "new token")
        self.latency_plot.addLegend(offset=(-10, 10), brush=pg.mkBrush(255, 255, 255, 210), labelTextColor="k")
        self.memory_plot = _plot("Peak memory", "MB")
        grid.addWidget(self.tps_plot, 0, 0)
        grid.addWidget(self.ttft_plot, 0, 1)
        grid.addWidget(self.latency_plot, 1, 0)
        grid.addWidget(self.memory_plot, 1, 1)

    def fill(self, rows: list[ConfigResult]) -> None:
        data = chart_data(rows)
        _bars(self.tps_plot, data["tokens_per_s"], errors=True)
        _bars(self.ttft_plot, data["ttft_ms"])
        _bars(self.memory_plot, data["peak_memory_mib"])
        self.latency_plot.clear()
        series = data["latency_by_position"]
        for i, (label, values) in enumerate(series.items()):
            pen = pg.mkPen(pg.intColor(i, hues=max(len(series), 3)), width=1.5)
            self.latency_plot.plot(list(range(1, len(values) + 1)), values, pen=pen, name=_short(label, 30))


def _plot(title: str, unit: str) -> pg.PlotWidget:
    w = pg.PlotWidget(title=title)
    w.setBackground("w")
    w.setLabel("left", unit)
    w.showGrid(y=True, alpha=0.3)
    w.setMinimumHeight(180)
    font = w.getAxis("bottom").font()
    font.setPointSizeF(max(6.0, font.pointSizeF() * 0.85))
    w.getAxis("bottom").setStyle(tickFont=font, autoReduceTextSpace=False)
    return w


def _bars(plot: pg.PlotWidget, items: list[tuple], errors: bool = False) -> None:
    plot.clear()
    if not items:
        return
    xs = list(range(len(items)))
    ys = [it[1] for it in items]
    brushes = [pg.intColor(i, hues=max(len(items), 3), alpha=200) for i in xs]
    plot.addItem(pg.BarGraphItem(x=xs, height=ys, width=0.6, brushes=brushes))
    if errors:
        # lazy: numpy loads with the engine, not at import
        import numpy as np

        top = np.array([it[3] - it[1] for it in items], dtype=float)
        bottom = np.array([it[1] - it[2] for it in items], dtype=float)
        plot.addItem(
            pg.ErrorBarItem(
                x=np.array(xs, dtype=float),
                y=np.array(ys, dtype=float),
                top=top,
                bottom=bottom,
                beam=0.25,
                pen=pg.mkPen("k", width=1.5),
            )
        )
    plot.getAxis("bottom").setTicks([[(i, _tick(it[0])) for i, it in enumerate(items)]])
    plot.setXRange(-0.6, len(items) - 0.4, padding=0)
