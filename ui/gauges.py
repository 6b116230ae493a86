"""Always-visible gauges: tokens/s, TTFT, per-token latency sparkline, memory.

Every figure shown is one that was read; a figure that could not be read is
shown as "unknown" with the reason, never guessed.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Optional

from PySide6.QtCore import QEvent, QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPen, QPolygonF
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from ..inference import format_bytes
from .style import current_theme

SPARK_POINTS = 200


def _nice_max(value: float) -> float:
    """The gauge's full scale: the next 1-2-5 step above the value (at least 10)."""
    value = max(value, 10.0)
    exp = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if value <= m * exp:
            return m * exp
    return 10 * exp


class SpeedGauge(QWidget):
    """A 240° arc dial with the value in the middle."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.value: Optional[float] = None
        self.caption = "tok/s"
        self.scale = 10.0
        self.setMinimumSize(150, 120)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def set_value(self, value: Optional[float], caption: str) -> None:
        self.value, self.caption = value, caption
        if value is not None and value > self.scale:
            self.scale = _nice_max(value)
        self.update()

    def paintEvent(self, _event):  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        side = min(self.width(), self.height() * 1.25) - 16
        rect = QRectF((self.width() - side) / 2, 8, side, side)
        theme = current_theme()  # every colour from the theme: the dial reads on a dark panel too
        pen = QPen(theme.color("track"), 10, Qt.SolidLine, Qt.RoundCap)
        p.setPen(pen)
        p.drawArc(rect, 210 * 16, -240 * 16)
        if self.value:
            pen.setColor(theme.color("accent"))
            p.setPen(pen)
            frac = min(1.0, self.value / self.scale)
            p.drawArc(rect, 210 * 16, int(-240 * 16 * frac))
        p.setPen(self.palette().color(self.foregroundRole()))
        f = QFont(self.font())
        f.setPointSizeF(f.pointSizeF() * 1.9)
        f.setBold(True)
        p.setFont(f)
        text = "—" if self.value is None else (f"{self.value:.1f}" if self.value < 100 else f"{self.value:.0f}")
        p.drawText(rect.adjusted(0, -6, 0, -6), Qt.AlignCenter, text)
        f.setPointSizeF(self.font().pointSizeF() * 0.9)
        f.setBold(False)
        p.setFont(f)
        p.drawText(rect.adjusted(0, side * 0.28, 0, side * 0.28), Qt.AlignCenter, self.caption)
        p.end()


class StackedBar(QWidget):
    """A horizontal bar split into coloured segments (bytes), with a legend below in a QLabel."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.segments: list[tuple[float, QColor]] = []
        self.total: Optional[float] = None
        self.setFixedHeight(14)

    def set_segments(self, segments: list[tuple[float, QColor]], total: Optional[float]) -> None:
        self.segments, self.total = segments, total
        self.update()

    def paintEvent(self, _event):  # noqa: N802
        p = QPainter(self)
        theme = current_theme()
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.fillRect(r, theme.color("track"))
        if self.total:
            x = r.left()
            for value, color in self.segments:
                w = r.width() * max(0.0, value) / self.total
                p.fillRect(QRectF(x, r.top(), w, r.height()), color)
                x += w
        else:  # nothing readable: hatch the bar instead of drawing a made-up level
            p.setPen(theme.color("muted"))
            p.drawText(r, Qt.AlignCenter, "unknown")
        p.setPen(theme.color("axis"))
        p.drawRect(r)
        p.end()


class Sparkline(QWidget):
    """The last ``SPARK_POINTS`` per-token latencies as a line, with the scale's top and bottom labelled."""

    AXIS_W = 42

    def __init__(self, parent=None):
        super().__init__(parent)
        self.values: list[float] = []
        self.setFixedHeight(70)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def setData(self, values) -> None:  # noqa: N802 - the name the plotting library used
        self.values = list(values)
        self.update()

    def paintEvent(self, _event):  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        theme = current_theme()
        plot = QRectF(self.AXIS_W, 4, max(1, self.width() - self.AXIS_W - 4), max(1, self.height() - 8))
        p.setPen(QPen(theme.color("axis")))
        p.drawLine(plot.bottomLeft(), plot.bottomRight())
        p.drawLine(plot.bottomLeft(), plot.topLeft())
        if self.values:
            top = _nice_max(max(self.values))
            p.setPen(theme.color("muted"))
            p.drawText(QRectF(0, plot.top() - 6, self.AXIS_W - 4, 14), Qt.AlignRight | Qt.AlignVCenter, f"{top:g}")
            p.drawText(QRectF(0, plot.bottom() - 8, self.AXIS_W - 4, 14), Qt.AlignRight | Qt.AlignVCenter, "0")
            n = len(self.values)
            step = plot.width() / max(1, SPARK_POINTS - 1)
            x0 = plot.right() - step * (n - 1)
            points = [
                QPointF(x0 + i * step, plot.bottom() - plot.height() * min(v, top) / top)
                for i, v in enumerate(self.values)
            ]
            p.setPen(QPen(theme.color("accent"), 1.5))
            p.drawPolyline(QPolygonF(points))
        p.end()


class GaugesPanel(QFrame):
    # The memory bars' colours, the theme's (read when drawn, so a new theme shows at the next reading).
    THIS = property(lambda self: current_theme().color("accent"))
    OTHER = property(lambda self: current_theme().color("other"))
    TORCH = property(lambda self: current_theme().color("torch"))

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("gaugesPanel")
        self.setMinimumWidth(250)
        self.setMaximumWidth(340)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 10, 10)
        layout.setSpacing(6)
        title = QLabel("Speed")
        title.setObjectName("panelTitle")
        layout.addWidget(title)
        self.title = title
        self.source_label = QLabel("")  # what the gauges show when it is not the chat (the speed lab's row)
        self.source_label.setObjectName("gaugeSource")
        self.source_label.setWordWrap(True)
        self.source_label.hide()
        layout.addWidget(self.source_label)
        self.gauge = SpeedGauge(self)
        layout.addWidget(self.gauge)
        grid = QGridLayout()
        self.ttft_label = QLabel("—")
        self.ttft_label.setObjectName("ttftValue")
        self.tokens_label = QLabel("—")
        grid.addWidget(QLabel("Time to first token"), 0, 0)
        grid.addWidget(self.ttft_label, 0, 1, Qt.AlignRight)
        grid.addWidget(QLabel("Tokens"), 1, 0)
        grid.addWidget(self.tokens_label, 1, 1, Qt.AlignRight)
        layout.addLayout(grid)
        layout.addWidget(QLabel("Per-token latency (ms)"))
        self.spark = self._make_sparkline()
        layout.addWidget(self.spark)
        self.latency_label = QLabel("—")
        self.latency_label.setObjectName("latencyLabel")
        layout.addWidget(self.latency_label)

        mem_title = QLabel("Memory")
        mem_title.setObjectName("panelTitle")
        layout.addSpacing(6)
        layout.addWidget(mem_title)
        self.device_label = QLabel("device: not loaded yet")
        self.device_label.setWordWrap(True)
        layout.addWidget(self.device_label)
        self.mem_bar = StackedBar(self)
        layout.addWidget(self.mem_bar)
        self.mem_label = QLabel("—")
        self.mem_label.setWordWrap(True)
        self.mem_label.setTextFormat(Qt.RichText)
        layout.addWidget(self.mem_label)
        self.torch_bar = StackedBar(self)
        layout.addWidget(self.torch_bar)
        self.torch_label = QLabel("")
        self.torch_label.setWordWrap(True)
        self.torch_label.setTextFormat(Qt.RichText)
        layout.addWidget(self.torch_label)
        self.kv_label = QLabel("")  # the prefix cache: KV kept of earlier turns for the next one
        self.kv_label.setObjectName("kvCacheLabel")
        self.kv_label.setWordWrap(True)
        self.kv_label.hide()
        layout.addWidget(self.kv_label)
        self.kv_cache = None
        layout.addStretch(1)
        self._latencies: deque[float] = deque(maxlen=SPARK_POINTS)
        self.last_snapshot = None
        self.remote: Optional[str] = None  # the model runs on this server: its memory is not shown here
        self.rate_updates = 0  # how many live readings arrived (tests check the gauges are fed)

    def _make_sparkline(self):
        # Painted by hand: a plotting library here cost a second of start-up (its import pulls numpy and
        # wraps all of Qt) and a re-plot per batch of tokens; a polyline of 200 points costs neither.
        w = Sparkline(self)
        self._curve = w
        return w

    # -- speed ----------------------------------------------------------------------
    def set_source(self, text: str) -> None:
        """Say what the speed gauges follow when it is not the chat (e.g. "speed lab: fast:q8"); "" for the chat."""
        self.source_label.setText(text)
        self.source_label.setVisible(bool(text))

    def start_reply(self) -> None:
        self.set_source("")
        self._latencies.clear()
        self._curve.setData([])
        self.gauge.set_value(None, "tok/s (1 s)")
        self.ttft_label.setText("waiting…")
        self.tokens_label.setText("0")
        self.latency_label.setText("—")

    def live(
        self,
        tokens_per_s_1s: float,
        ttft_ms: Optional[float],
        new_tokens: int,
        engine_tokens_per_s: Optional[float] = None,
        source: Optional[str] = None,
    ) -> None:
        """A reply's rolling speed, TTFT and tokens; ``engine_tokens_per_s`` is what the engine writes in all when
        other replies run at the same time (shown under the gauge). ``source`` names what the figures are of ("" for
        the chat, "speed lab: fast:q8" for a lab row), so the label always matches the figures it sits on."""
        self.rate_updates += 1
        if source is not None and source != self.source_label.text():
            self.set_source(source)
        total = engine_tokens_per_s if engine_tokens_per_s and engine_tokens_per_s > tokens_per_s_1s + 0.05 else None
        self.gauge.set_value(tokens_per_s_1s, "tok/s (1 s)" if total is None else f"tok/s · engine {total:.1f}")
        if ttft_ms is not None:
            self.ttft_label.setText(f"{ttft_ms:.0f} ms")
        self.tokens_label.setText(str(new_tokens))

    def latencies(self) -> list[float]:
        """The per-token latencies the sparkline shows now (ms, oldest first)."""
        return list(self._latencies)

    def add_latencies(self, ms: list[float]) -> None:
        if not ms:
            return
        self._latencies.extend(ms)
        self._curve.setData(list(self._latencies))

    def finish_reply(
        self,
        tokens_per_s: Optional[float],
        ttft_ms: Optional[float],
        new_tokens: int,
        p50_ms: Optional[float],
        p95_ms: Optional[float],
        source: Optional[str] = None,
    ) -> None:
        if source is not None:
            self.set_source(source)
        self.gauge.set_value(tokens_per_s, "tok/s (last reply)")
        self.ttft_label.setText("—" if ttft_ms is None else f"{ttft_ms:.0f} ms")
        self.tokens_label.setText(str(new_tokens))
        if p50_ms is not None:
            self.latency_label.setText(f"p50 {p50_ms:.1f} ms · p95 {p95_ms:.1f} ms")
        else:
            self.latency_label.setText("—")  # never the previous reply's figures under this one's

    def changeEvent(self, event):  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() == QEvent.PaletteChange and self.last_snapshot is not None:
            self.set_memory(self.last_snapshot)  # the legend's swatches in the new theme's colours

    # -- memory ---------------------------------------------------------------------
    def set_kv_cache(self, held) -> None:
        """The prefix cache now (``redline.inference.KvCacheHeld``), or None where there is none to show (no model,
        a server's model, no fast-path reply yet): the KV cache kept of earlier turns, within its size."""
        self.kv_cache = held
        if held is None:
            self.kv_label.hide()
            self.kv_label.setText("")
            return
        if held.limit_bytes <= 0:
            self.kv_label.setText("Prefix cache: off (Settings → Prefix cache)")
            self.kv_label.setToolTip("Each turn reads the whole conversation again.")
        else:
            kept = (
                f"{format_bytes(held.cached_bytes)} ({held.cached_tokens:,} tokens) of {format_bytes(held.limit_bytes)}"
                if held.cached_bytes
                else f"none yet (up to {format_bytes(held.limit_bytes)})"
            )
            self.kv_label.setText(f"KV cache kept for later turns: {kept}")
            self.kv_label.setToolTip(
                "Computed KV pages no reply uses now, kept so that a prompt starting the same way (the next turn, "
                "Regenerate, a shared system prompt) is not read again; the least recently used go first. Its size "
                "is Settings → Prefix cache, within the memory the KV cache may use."
            )
        self.kv_label.show()

    def set_device(self, text: str) -> None:
        self.device_label.setText(text)

    def set_remote(self, server: Optional[str]) -> None:
        """The model runs on a server (its name), or here (None): the memory gauge says whose memory it shows."""
        self.remote = server
        if self.last_snapshot is not None:
            self.set_memory(self.last_snapshot)

    def set_memory(self, snap) -> None:
        """``snap`` is an inference.memory.measured.MemorySnapshot or an Exception (could not read)."""
        self.last_snapshot = snap
        if self.remote and not isinstance(snap, Exception):
            self.mem_bar.set_segments([(snap.rss_bytes, self.THIS)], snap.system_total_bytes)
            self.mem_label.setText(
                f"The model's memory is the server's ({self.remote}); it is not measured here.<br>"
                f"This app (RSS): {format_bytes(snap.rss_bytes)}"
            )
            self.torch_bar.hide()
            self.torch_label.setText("")
            return
        if isinstance(snap, Exception):
            self.mem_bar.set_segments([], None)
            self.mem_label.setText(f"Memory could not be read: {snap}")
            return
        sw = lambda c: f"<span style='color:{c.name()}'>■</span>"  # noqa: E731
        if snap.device.startswith("cuda"):
            total = snap.device_total_bytes
            mine, others = snap.device_this_process_bytes, snap.device_other_processes_bytes
            used = snap.device_used_bytes
            if mine is None:  # NVML per-process figures unavailable (e.g. in some containers)
                segments = [(used or 0, self.THIS)]
                legend = (
                    f"{sw(self.THIS)} used (all processes) {format_bytes(used)}<br>"
                    "this process / others: unknown (NVML gives no per-process figures here)"
                )
            else:
                segments = [(mine, self.THIS), (others or 0, self.OTHER)]
                legend = (
                    f"{sw(self.THIS)} this process {format_bytes(mine)}<br>"
                    f"{sw(self.OTHER)} other processes {format_bytes(others)}"
                )
            free = (total - used) if (total is not None and used is not None) else None
            self.mem_bar.set_segments(segments, total)
            self.mem_label.setText(f"{legend}<br>free {format_bytes(free)} of {format_bytes(total)}")
            self.torch_bar.show()
            alloc, reserved = snap.cuda_allocated_bytes, snap.cuda_reserved_bytes
            self.torch_bar.set_segments(
                [(alloc or 0, self.TORCH), ((reserved or 0) - (alloc or 0), current_theme().color("torch_reserved"))],
                reserved or None,
            )
            self.torch_label.setText(
                f"torch: {sw(self.TORCH)} allocated {format_bytes(alloc)} of {format_bytes(reserved)} reserved"
            )
        else:
            total = snap.system_total_bytes
            others = max(0, snap.system_used_bytes - snap.rss_bytes)
            self.mem_bar.set_segments([(snap.rss_bytes, self.THIS), (others, self.OTHER)], total)
            self.mem_label.setText(
                f"{sw(self.THIS)} this process (RSS) {format_bytes(snap.rss_bytes)}<br>"
                f"{sw(self.OTHER)} rest of the system {format_bytes(others)}<br>"
                f"free {format_bytes(total - snap.system_used_bytes)} of {format_bytes(total)} RAM"
            )
            self.torch_bar.hide()
            self.torch_label.setText("")
