"""The speed lab panel: run configurations side by side, watch them stream, compare and export.

The run itself is ``run_bench`` submitted to the engine service as one job through the window's
``EngineBridge`` (it has the engine to itself while it runs: chat replies asked meanwhile wait, and say so);
its channel brings back its progress events (phases, output tokens, finished rows), ending in the report.
Cancel stops this run and nothing else. Past runs are JSON files in a folder the caller hands in.

The configurations are edited as rows of a table (``configs.ConfigEditor``, with ready-made sets and
the text form in step); each row shows the tokens/s the speed model predicts here (asked on the engine thread
between runs) beside what the last run measured. The outputs stream side by side in a resizable splitter
(``outputs.OutputColumns``) with each column's live tokens/s; ``live_speed``, ``row_started`` and
``row_done`` let the window's gauges follow the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from redline.inference import (
    COLUMNS,
    MB,
    SEED_PRESET,
    SWEEP_COLUMNS,
    BenchLive,
    BenchPhase,
    BenchReport,
    BenchRow,
    BenchSpec,
    BenchStarted,
    BenchSweepRow,
    BenchToken,
    Cancelled,
    Completed,
    ConfigResult,
    Failed,
    Queued,
    RedlineError,
    SpeedPrediction,
    builtin_prompt_sets,
    list_reports,
    load_prompt_set,
    load_report,
    predictions_job,
    run_bench,
    save_report,
    to_csv,
    to_json,
    to_markdown,
)
from redline.ui.bridge import EngineBridge, user_message
from redline.ui.signals import emit
from redline.ui.speedlab.configs import ConfigEditor
from redline.ui.speedlab.outputs import OutputColumns

# The default rows: transformers' KV-cache loop beside Redline's fast path at 8 and 4 bits. On the starter and a
# 2-core CPU the speed model predicts about a minute for them with the default counts (13 generations a row);
# the ladder (naive:fp32 first, at a few tokens/s) takes many minutes and is a ready-made set instead.
DEFAULT_CONFIGS = "kv:fp32,fast:q8,fast:q4"
PREDICT_DELAY_MS = 400  # predictions are asked this long after the last edit
# The raw value behind each column, for sorting numerically rather than by text.
_SORT_KEYS = {
    "TTFT p50 ms": "ttft_ms",
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


def _scrolling(widget: QWidget) -> QScrollArea:
    """``widget`` in a scroll area of its own: its minimum size no longer holds the window's up."""
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.NoFrame)
    area.setWidget(widget)
    return area


def _duration(seconds: float) -> str:
    """A predicted duration as a person says it: "40 s", "about 1 min", "12 min"."""
    if seconds < 55:
        return f"{max(1, round(seconds / 5) * 5):.0f} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes >= 1.5 else "1 min"


def _short(label: str, width: int = 22) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


_ABBREV = {"speculative": "spec", "prompt-lookup": "lookup"}


def _tick(label: str) -> str:
    """A bar's axis label: the strategy (abbreviated) and precision; options are in the table."""
    run, sep, config = label.rpartition(" · ")
    strategy, _, rest = config.partition(":")
    text = _ABBREV.get(strategy, strategy) + (":" + rest.split("+")[0] if rest else "")
    return (run[-5:] + " " if sep else "") + text


class SpeedLabPanel(QWidget):
    """Side-by-side comparison of decoding configurations on one model."""

    run_finished = Signal(object)  # BenchReport
    # The window's gauges follow the lab: a row starts (its label), its live speed, the row's result.
    row_started = Signal(str)
    live_speed = Signal(float, object, int)  # tokens/s over the last second, TTFT ms (or None), new tokens
    row_done = Signal(object)  # ConfigResult
    token_latencies = Signal(list)  # ms between the streamed tokens of the column shown

    def __init__(
        self,
        bridge: EngineBridge,
        runs_dir: Optional[Path] = None,
        model: str = "starter",
        parent: Optional[QWidget] = None,
        server_keys=None,  # .get(url) → the API key saved for a server (remote:URL rows), or None
        presets: Optional[Callable[[], list]] = None,
    ):
        super().__init__(parent)
        self.bridge = bridge
        self.server_keys = server_keys
        self.runs_dir = Path(runs_dir) if runs_dir else None
        self._presets = presets  # () -> saved presets, for the "my presets" set
        self._predict = None  # the predictions asked of the engine thread: their channel, while it runs
        self._predict_again = False
        self._live_index: Optional[int] = None
        self._last_token_s: dict[int, float] = {}
        self.report: Optional[BenchReport] = None  # the run shown (live or reopened)
        self.shown: list[ConfigResult] = []  # rows in the table and charts (several runs when comparing)
        self._run = None  # the run going on: its channel
        self._followed = model  # the model the Model field was last set to from the window
        self._build(model)
        self.refresh_history()
        self.request_predictions()

    # -- layout ----------------------------------------------------------------
    def _build(self, model: str) -> None:
        form = QFormLayout()
        self.model_edit = QLineEdit(model)
        self.model_edit.setToolTip("starter, a model folder, a .gguf file or a hub id")
        self.configs_editor = ConfigEditor(DEFAULT_CONFIGS, self._presets)
        self.configs_editor.model = lambda: self.model_edit.text().strip() or "starter"
        self.configs_editor.device = self._device
        self.configs_edit = self.configs_editor.text_edit  # the text form (advanced), in step with the rows
        self._predict_timer = QTimer(self)
        self._predict_timer.setSingleShot(True)
        self._predict_timer.setInterval(PREDICT_DELAY_MS)
        self._predict_timer.timeout.connect(self.request_predictions)
        self.configs_editor.changed.connect(self._predict_timer.start)
        self.configs_editor.message.connect(lambda text: self.status_label.setText(text))
        self.model_edit.textChanged.connect(lambda _t: self._predict_timer.start())
        self.baseline_spin = QSpinBox(minimum=1, maximum=64, value=1)
        self.baseline_spin.setToolTip("Which configuration (1 = first) the others are compared with")
        self.prompts_combo = QComboBox(editable=True)
        self.prompts_combo.addItems(builtin_prompt_sets())
        self.prompts_combo.setCurrentText("short" if "short" in builtin_prompt_sets() else "")
        self.prompts_combo.setToolTip("A built-in prompt set, or the path of your own JSON prompt set")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse_prompts)
        prompts_row = QHBoxLayout()
        prompts_row.addWidget(self.prompts_combo, 1)
        prompts_row.addWidget(browse)
        self.new_tokens_spin = QSpinBox(minimum=1, maximum=8192, value=64)
        self.new_tokens_spin.valueChanged.connect(lambda _v: self._predict_timer.start())
        self.warmup_spin = QSpinBox(minimum=0, maximum=1000, value=1)
        self.samples_spin = QSpinBox(minimum=1, maximum=1000, value=3)
        self.seed_spin = QSpinBox(minimum=0, maximum=2**31 - 1, value=0)
        preset = QPushButton(f"Textbook protocol ({SEED_PRESET['warmup']} warm-up / {SEED_PRESET['samples']} samples)")
        preset.setToolTip(
            f"The textbook measurement protocol: {SEED_PRESET['warmup']} warm-up runs, then "
            f"{SEED_PRESET['samples']} measured samples per prompt and configuration (slow; steadier figures)"
        )
        preset.clicked.connect(self.apply_textbook_protocol)
        self.protocol_button = preset
        counts = QHBoxLayout()
        for text, w in (
            ("new tokens", self.new_tokens_spin),
            ("warm-up", self.warmup_spin),
            ("samples", self.samples_spin),
            ("seed", self.seed_spin),
        ):
            counts.addWidget(QLabel(text))
            counts.addWidget(w)
        counts.addStretch(1)
        protocol_row = QHBoxLayout()  # a row of its own: beside the counts it made the form 920 px wide
        protocol_row.addWidget(preset)
        protocol_row.addStretch(1)
        self.sweep_edit = QLineEdit()
        self.sweep_edit.setPlaceholderText("e.g. 1,2,4,8 — batch sweep of the baseline configuration (optional)")
        form.addRow("Model", self.model_edit)
        form.addRow("Configurations", self.configs_editor)
        form.addRow("Baseline", self.baseline_spin)
        form.addRow("Prompt set", prompts_row)
        form.addRow("Lengths", counts)
        form.addRow("", protocol_row)
        form.addRow("Batch sweep", self.sweep_edit)

        self.run_button = QPushButton("Run")
        self.run_button.clicked.connect(self.start)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        self.progress_bar = QProgressBar(minimum=0, maximum=1000)
        self.status_label = QLabel("Ready.")
        self.status_label.setWordWrap(True)
        controls = QHBoxLayout()
        controls.addWidget(self.run_button)
        controls.addWidget(self.cancel_button)
        controls.addWidget(self.progress_bar, 1)
        self.duration_label = QLabel("")  # how long Run is predicted to take, said before it is clicked
        self.duration_label.setObjectName("labDuration")
        self.duration_label.setWordWrap(True)
        for spin in (self.warmup_spin, self.samples_spin):
            spin.valueChanged.connect(lambda _v: self.show_duration())
        self.prompts_combo.currentTextChanged.connect(lambda _t: self.show_duration())
        self.configs_editor.changed.connect(self.show_duration)

        # Outputs side by side, one column per configuration, in a splitter the user can resize.
        self.outputs = OutputColumns()

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([h for h, _ in COLUMNS])
        self.table.setSortingEnabled(True)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.sweep_table = QTableWidget(0, len(SWEEP_COLUMNS))
        self.sweep_table.setHorizontalHeaderLabels([h for h, _ in SWEEP_COLUMNS])

        self.charts = QWidget()
        grid = QGridLayout(self.charts)
        self.tps_plot = self._plot("Decode tokens/s (median, min–max)", "tokens/s")
        self.ttft_plot = self._plot("Time to first token (p50)", "ms")
        self.latency_plot = self._plot("Per-token latency by position (median)", "ms")
        self.latency_plot.setLabel("bottom", "new token")
        self.latency_plot.addLegend(offset=(-10, 10), brush=pg.mkBrush(255, 255, 255, 210), labelTextColor="k")
        self.memory_plot = self._plot("Peak memory", "MB")
        grid.addWidget(self.tps_plot, 0, 0)
        grid.addWidget(self.ttft_plot, 0, 1)
        grid.addWidget(self.latency_plot, 1, 0)
        grid.addWidget(self.memory_plot, 1, 1)

        self.history = QListWidget()
        self.history.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.history.itemDoubleClicked.connect(lambda _item: self.open_selected())
        open_button = QPushButton("Open")
        open_button.clicked.connect(self.open_selected)
        compare_button = QPushButton("Compare selected")
        compare_button.clicked.connect(self.open_selected)
        history_box = QWidget()
        hl = QVBoxLayout(history_box)
        hl.addWidget(QLabel("Past runs (select several to compare them in one table)"))
        hl.addWidget(self.history, 1)
        hb = QHBoxLayout()
        hb.addWidget(open_button)
        hb.addWidget(compare_button)
        hb.addStretch(1)
        hl.addLayout(hb)

        self.tabs = QTabWidget()
        self.tabs.addTab(self.table, "Results")
        self.tabs.addTab(_scrolling(self.charts), "Charts")
        self.tabs.addTab(self.sweep_table, "Batch sweep")
        self.tabs.addTab(history_box, "Past runs")

        export_row = QHBoxLayout()
        export_row.addWidget(QLabel("Export:"))
        for fmt, kind in (("CSV", "csv"), ("JSON", "json"), ("Markdown", "markdown"), ("PNG", "png")):
            b = QPushButton(fmt)
            b.clicked.connect(lambda _=False, f=kind: self._export_dialog(f))
            export_row.addWidget(b)
        export_row.addStretch(1)

        # Everything in one vertical splitter: the configurations, the outputs, the results — each as tall as
        # the user drags it.
        setup = self.setup = QWidget()
        form_box = QWidget()
        form_box.setLayout(form)
        sv = QVBoxLayout(setup)
        sv.setContentsMargins(0, 0, 0, 0)
        # The form scrolls; Run, its predicted duration and the status stay in view under it.
        self.form_scroll = _scrolling(form_box)
        sv.addWidget(self.form_scroll, 1)
        sv.addLayout(controls)
        sv.addWidget(self.duration_label)
        sv.addWidget(self.status_label)
        self._form_box = form_box
        self.splitter = QSplitter(Qt.Vertical)
        self.splitter.setObjectName("labSplitter")
        self.splitter.setChildrenCollapsible(False)
        # The setup and the charts scroll inside their part rather than raise the window's minimum size: the lab
        # fits a 1366×768 laptop screen (its setup alone is 920×420 px), and a part made small never overlaps
        # another.
        self.splitter.addWidget(setup)
        self.splitter.addWidget(self.outputs)
        self.splitter.addWidget(self.tabs)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 2)
        self.splitter.setStretchFactor(2, 2)
        layout = QVBoxLayout(self)
        layout.addWidget(self.splitter, 1)
        layout.addLayout(export_row)
        self._sized = False

    def showEvent(self, event):  # noqa: N802
        """The first time the panel shows: the configurations at their natural height, then the outputs get
        more of the rest than the results (the user drags the handles from there)."""
        super().showEvent(event)
        if not self._sized and self.splitter.height() > 0:
            self._sized = True
            below = self.setup.sizeHint().height() - self.form_scroll.sizeHint().height()
            setup = min(self._form_box.sizeHint().height() + below + 4, int(self.splitter.height() * 0.55))
            rest = max(200, self.splitter.height() - setup)
            self.splitter.setSizes([setup, int(rest * 0.55), rest - int(rest * 0.55)])

    def _plot(self, title: str, unit: str) -> pg.PlotWidget:
        w = pg.PlotWidget(title=title)
        w.setBackground("w")
        w.setLabel("left", unit)
        w.showGrid(y=True, alpha=0.3)
        w.setMinimumHeight(180)
        font = w.getAxis("bottom").font()
        font.setPointSizeF(max(6.0, font.pointSizeF() * 0.85))
        w.getAxis("bottom").setStyle(tickFont=font, autoReduceTextSpace=False)
        return w

    # -- running ---------------------------------------------------------------
    def apply_textbook_protocol(self) -> None:
        """The textbook protocol's counts (``SEED_PRESET``): many warm-up runs and samples, for steady figures."""
        self.warmup_spin.setValue(SEED_PRESET["warmup"])
        self.samples_spin.setValue(SEED_PRESET["samples"])

    def _browse_prompts(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Prompt set", "", "Prompt sets (*.json)")
        if path:
            self.prompts_combo.setCurrentText(path)

    def _device(self) -> str:
        engine = self.bridge.engine
        return getattr(engine, "device", None) or "cpu"

    def build_spec(self) -> BenchSpec:
        configs = self.configs_editor.validated()
        sweep = []
        if self.sweep_edit.text().strip():
            try:
                sweep = [int(s) for s in self.sweep_edit.text().split(",") if s.strip()]
            except ValueError:
                raise RedlineError("Batch sizes must be whole numbers, e.g. 1,2,4,8.") from None
        return BenchSpec(
            model=self.model_edit.text().strip() or "starter",
            configs=configs,
            prompts=load_prompt_set(self.prompts_combo.currentText().strip() or "short"),
            new_tokens=self.new_tokens_spin.value(),
            warmup=self.warmup_spin.value(),
            samples=self.samples_spin.value(),
            seed=self.seed_spin.value(),
            baseline=self.baseline_spin.value() - 1,
            batch_sizes=sweep,
            server_keys=self._keys_for(configs),
        )

    def _keys_for(self, configs) -> dict:
        """The saved API key of each server a remote:URL row names."""
        keys = {}
        for c in configs:
            if c.strategy == "remote" and self.server_keys is not None:
                base = c.server.partition("#")[0].rstrip("/")
                key = self.server_keys.get(c.server)
                if key:
                    keys[base] = key
        return keys

    def start(self):
        """Validate the form and submit the run (its channel); bad input is reported and nothing is lost."""
        if self._run is not None:
            return None
        try:
            spec = self.build_spec()
        except RedlineError as exc:
            self.status_label.setText(f"<b>Cannot run:</b> {exc}")
            return None
        self._reset_outputs(spec)
        self.report = None
        self.shown = []
        self._refresh_views()
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress_bar.setValue(0)
        self.status_label.setText("Starting…")

        def task(engine, report):
            return run_bench(engine, spec, report, report.cancelled, restore_model=True)

        self._run = run = self.bridge.run(task, label="the speed lab")
        run.events.connect(lambda events, r=run: self._on_run_events(r, events))
        return run

    def cancel(self) -> None:
        """Stop this run after the current step (a chat reply is never touched)."""
        if self._run is not None:
            self._run.cancel()
        self.status_label.setText("Cancelling after the current step…")

    def running(self) -> bool:
        return self._run is not None

    def follow_model(self, spec: Optional[str]) -> None:
        """The chat loaded ``spec`` (a model, or a server's address): the lab's Model field follows it unless the
        user typed another model there, or a run is going on."""
        if not spec or self.running():
            return
        current = self.model_edit.text().strip()
        if current and current != self._followed:
            return  # the user's own choice stays
        self._followed = spec
        self.model_edit.setText(spec)

    def predicting(self) -> bool:
        """Predictions are being asked of the engine thread, or are due to be asked."""
        return self._predict is not None or self._predict_timer.isActive()

    def _on_run_events(self, run, events: list) -> None:
        if run is not self._run:
            return
        for ev in events:
            if isinstance(ev, Completed):
                self._on_done(ev.value)
            elif isinstance(ev, Failed):
                self._on_failed(ev.error)
            else:
                self._on_progress(ev)

    def _reset_outputs(self, spec: BenchSpec) -> None:
        self.outputs.reset(
            [c.label + ("  (baseline)" if i == spec.baseline else "") for i, c in enumerate(spec.configs)]
        )
        self.configs_editor.clear_measured()
        self._live_index = None
        self._last_token_s = {}

    def column_texts(self) -> list[str]:
        return self.outputs.texts()

    # -- how long a run takes, predicted ------------------------------------------------------
    def generations_per_row(self) -> int:
        """What one row runs: its warm-up runs, then each sample of each prompt (as ``run_bench`` does)."""
        try:
            prompts = len(load_prompt_set(self.prompts_combo.currentText().strip() or "short").prompts)
        except RedlineError:
            prompts = 1
        return self.warmup_spin.value() + self.samples_spin.value() * max(1, prompts)

    def predicted_seconds(self) -> tuple[Optional[float], int]:
        """The run's predicted seconds over the rows the speed model predicts (TTFT plus the new tokens at the
        predicted tokens/s, per generation), without loading; and how many rows it cannot predict."""
        n = self.generations_per_row()
        new_tokens = self.new_tokens_spin.value()
        total, unknown = 0.0, 0
        rows = self.configs_editor.configs()
        for r in range(len(rows)):
            p = self.configs_editor.prediction(r)
            if isinstance(p, SpeedPrediction) and p.tokens_per_s > 0:
                total += n * (p.ttft_ms / 1000 + new_tokens / p.tokens_per_s)
            else:
                unknown += 1
        return (total if unknown < len(rows) else None), unknown

    def show_duration(self) -> None:
        """Say before Run how long it is predicted to take."""
        seconds, unknown = self.predicted_seconds()
        rows = len(self.configs_editor.configs())
        if not rows:
            self.duration_label.setText("")
            return
        n = self.generations_per_row()
        what = f"{rows} configuration{'s' if rows != 1 else ''} × {n} generations"
        if seconds is None:
            self.duration_label.setText(f"Run: {what}; its duration cannot be predicted here.")
            return
        text = f"Run is predicted to take about {_duration(seconds)} ({what}, plus loading each precision)"
        if unknown:
            text += f"; {unknown} of them cannot be predicted and add to it"
        self.duration_label.setText(text + ".")

    # -- predictions (asked on the engine thread between runs) ---------------------------
    def request_predictions(self):
        """Ask the speed model for each row's tokens/s here; answered in ``_on_predictions``."""
        if self._run is not None or self._predict is not None:
            self._predict_again = True  # after the run (or the question already asked)
            return None
        self._predict_again = False
        try:
            configs = self.configs_editor.validated()
        except RedlineError:
            return None
        model = self.model_edit.text().strip() or "starter"
        self._predict_for = (model, [c.label for c in configs], self.new_tokens_spin.value())
        self._predict = ask = self.bridge.run(
            predictions_job(model, configs, self._prompt_tokens_guess(), self.new_tokens_spin.value())
        )
        ask.events.connect(lambda events, a=ask: self._on_prediction_events(a, events))
        return ask

    def _asked_for_now(self) -> bool:
        """Were the predictions that came back asked for the rows, model and length shown now?"""
        model = self.model_edit.text().strip() or "starter"
        now = (model, [c.label for c in self.configs_editor.configs()], self.new_tokens_spin.value())
        return getattr(self, "_predict_for", None) == now

    def _prompt_tokens_guess(self) -> int:
        """The first prompt's length before its tokenizer is at hand: about 4 characters a token, plus the chat
        template's few tokens. (Each row's own prediction, made when it runs, uses the real count.)"""
        try:
            prompt = load_prompt_set(self.prompts_combo.currentText().strip() or "short").prompts[0]
        except (RedlineError, IndexError):
            return 64
        return max(1, sum(len(str(m.get("content", ""))) for m in prompt.messages) // 4 + 16)

    def _on_prediction_events(self, ask, events: list) -> None:
        if ask is not self._predict or not ask.done:
            return
        self._predict = None
        final = events[-1]
        if isinstance(final, Failed):
            self._on_predictions_failed(user_message(final.error), final.error)
        else:
            self._on_predictions(final.value)

    def _on_predictions(self, predictions) -> None:
        if self._asked_for_now():
            self.configs_editor.set_predictions(list(predictions))
            self.show_duration()
        else:  # the rows changed while the engine thread answered: ask again for what is shown
            self._predict_again = True
        if self._predict_again:
            self._predict_timer.start()

    def _on_predictions_failed(self, message: str, exc) -> None:
        if isinstance(exc, RedlineError) and "shutting down" in str(exc):
            return  # the window is closing: predictions are only a hint
        if self._asked_for_now():
            self.configs_editor.set_predictions([f"Cannot predict: {message}"] * len(self.configs_editor.configs()))
        else:
            self._predict_timer.start()

    def _on_progress(self, ev) -> None:
        if isinstance(ev, Queued):  # a chat reply (or a load) has the engine: the run waits, and says so
            self.status_label.setText(f"Waiting to start: {ev.reason}.")
        elif isinstance(ev, BenchToken):
            col = self.outputs.column(ev.index)
            if col is not None:
                col.append(ev.text)
            if ev.time_s is not None:
                last = self._last_token_s.get(ev.index)
                if last is not None and ev.time_s > last:
                    emit(self.token_latencies, [(ev.time_s - last) * 1000.0])
                self._last_token_s[ev.index] = ev.time_s
        elif isinstance(ev, BenchLive):
            col = self.outputs.column(ev.index)
            if col is not None:
                col.live(ev.tokens_per_s_1s)
            emit(self.live_speed, ev.tokens_per_s_1s, ev.ttft_ms, ev.new_tokens)
        elif isinstance(ev, BenchPhase):
            self.progress_bar.setValue(int(ev.fraction * 1000))
            self.status_label.setText(ev.phase)
            col = self.outputs.column(ev.index) if ev.index is not None else None
            if col is not None:
                col.running(ev.phase.rpartition(": ")[2] if ": " in ev.phase else ev.phase)
            if ev.index is not None and ev.index != self._live_index:
                self._live_index = ev.index
                emit(self.row_started, ev.phase.split(": ")[0])
        elif isinstance(ev, BenchRow):
            self.shown = [r for r in self.shown if r.index != ev.result.index] + [ev.result]
            self.shown.sort(key=lambda r: r.index)
            r = ev.result
            col = self.outputs.column(r.index)
            if col is not None:
                col.finish(r)
            self.configs_editor.set_measured(r.index, r)
            emit(self.row_done, r)
            self._refresh_views()
        elif isinstance(ev, BenchSweepRow):
            if self.report is None:
                self._sweep_live = getattr(self, "_sweep_live", []) + [ev.row]
                self._fill_sweep(self._sweep_live)
        elif isinstance(ev, BenchStarted):
            self._sweep_live = []

    def _on_done(self, report) -> None:
        self._run = None
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.progress_bar.setValue(1000)
        self.show_reports([report])
        self._predict_timer.start()  # the run taught the speed model: predict again
        saved = ""
        if self.runs_dir is not None:
            try:
                saved = f" Saved as {save_report(report, self.runs_dir).name}."
            except OSError as exc:
                saved = f" Could not save the run: {exc}."
            self.refresh_history()
        self.status_label.setText(
            ("Cancelled; finished rows kept." if report.cancelled else f"Done in {report.seconds:.0f} s.") + saved
        )
        emit(self.run_finished, report)

    def _on_failed(self, exc: BaseException) -> None:
        self._run = None
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        if isinstance(exc, Cancelled):  # cancelled while it waited for the engine: nothing ran, nothing failed
            self.status_label.setText("Cancelled before it started: nothing ran.")
        else:
            self.status_label.setText(f"<b>The run failed:</b> {user_message(exc)}")
        self._predict_timer.start()

    # -- showing results -------------------------------------------------------
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
        self._refresh_views()
        self._fill_sweep(reports[0].sweep)

    def _refresh_views(self) -> None:
        self._fill_table(self.shown)
        self._fill_charts(self.shown)

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
        self.table.setSortingEnabled(True)
        self.table.resizeColumnsToContents()

    def _fill_sweep(self, rows) -> None:
        self.sweep_table.setRowCount(len(rows))
        for i, s in enumerate(rows):
            for j, (_h, fmt) in enumerate(SWEEP_COLUMNS):
                self.sweep_table.setItem(i, j, _SortItem(fmt(s), None))
        self.sweep_table.resizeColumnsToContents()

    def chart_data(self) -> dict:
        """What the charts plot, by chart; rows without a measurement are left out."""
        ok = [r for r in self.shown if r.tokens_per_s is not None]
        return {
            "tokens_per_s": [(r.config, r.tokens_per_s, r.tokens_per_s_min, r.tokens_per_s_max) for r in ok],
            "ttft_ms": [(r.config, r.ttft_ms) for r in self.shown if r.ttft_ms is not None],
            "latency_by_position": {
                r.config: list(r.per_token_ms_by_position) for r in self.shown if r.per_token_ms_by_position
            },
            "peak_memory_mib": [
                (r.config, r.peak_memory_bytes / MB) for r in self.shown if r.peak_memory_bytes is not None
            ],
        }

    def _bars(self, plot: pg.PlotWidget, items: list[tuple], errors: bool = False) -> None:
        plot.clear()
        if not items:
            return
        xs = list(range(len(items)))
        ys = [it[1] for it in items]
        brushes = [pg.intColor(i, hues=max(len(items), 3), alpha=200) for i in xs]
        plot.addItem(pg.BarGraphItem(x=xs, height=ys, width=0.6, brushes=brushes))
        if errors:
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

    def _fill_charts(self, rows: list[ConfigResult]) -> None:
        data = self.chart_data()
        self._bars(self.tps_plot, data["tokens_per_s"], errors=True)
        self._bars(self.ttft_plot, data["ttft_ms"])
        self._bars(self.memory_plot, data["peak_memory_mib"])
        self.latency_plot.clear()
        series = data["latency_by_position"]
        for i, (label, values) in enumerate(series.items()):
            pen = pg.mkPen(pg.intColor(i, hues=max(len(series), 3)), width=1.5)
            self.latency_plot.plot(list(range(1, len(values) + 1)), values, pen=pen, name=_short(label, 30))

    # -- past runs and export ----------------------------------------------------
    def refresh_history(self) -> None:
        self.history.clear()
        if self.runs_dir is None:
            return
        for path in list_reports(self.runs_dir):
            try:
                rep = load_report(path)
            except RedlineError:
                continue  # a foreign or damaged file is skipped, not deleted
            ok = sum(r.status == "ok" for r in rep.results)
            item = QListWidgetItem(
                f"{rep.started_at.replace('T', ' ')} — {rep.model} on {rep.device}: "
                f"{ok}/{len(rep.results)} configurations" + (" (cancelled)" if rep.cancelled else "")
            )
            item.setData(Qt.UserRole, str(path))
            self.history.addItem(item)

    def open_selected(self) -> None:
        items = self.history.selectedItems() or ([self.history.currentItem()] if self.history.currentItem() else [])
        reports = []
        for item in items:
            try:
                reports.append(load_report(Path(item.data(Qt.UserRole))))
            except RedlineError as exc:
                self.status_label.setText(str(exc))
        if reports:
            self.show_reports(reports)
            self.tabs.setCurrentIndex(0)

    def export(self, fmt: str, path: Path) -> Path:
        """Write the shown run as csv, json, markdown or png (the charts)."""
        path = Path(path)
        if fmt == "png":
            if not self.charts.grab().save(str(path)):
                raise OSError(f"Could not write {path}.")
            return path
        if self.report is None:
            raise RedlineError("There is no finished run to export.", "Run the lab or open a past run first.")
        text = {"csv": to_csv, "json": to_json, "markdown": to_markdown}[fmt](self.report)
        path.write_text(text, encoding="utf-8")
        return path

    def _export_dialog(self, fmt: str) -> None:
        ext = {"csv": "csv", "json": "json", "markdown": "md", "png": "png"}[fmt]
        path, _ = QFileDialog.getSaveFileName(self, f"Export {fmt}", f"speedlab.{ext}", f"*.{ext}")
        if not path:
            return
        try:
            self.export(fmt, Path(path))
            self.status_label.setText(f"Exported {path}.")
        except (RedlineError, OSError) as exc:
            QMessageBox.warning(self, "Export", str(exc))
