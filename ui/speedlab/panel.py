"""The speed lab panel: run configurations side by side, watch them stream, compare and export.

It assembles the lab's parts, each a module of ``redline.ui.speedlab`` handed the few collaborators it uses (never
the panel):

- ``form``: the setup — the model, the configurations as rows (``configs.ConfigEditor``, with ready-made sets and
  the text form in step), the baseline, prompt set, lengths, counts and batch sweep; the run they make;
- ``predictions``: each row's tokens/s the speed model predicts here (asked on the engine thread between runs,
  shown beside what the last run measured) and the run's predicted duration, said before Run;
- ``run_controller``: Run and Cancel — ``run_bench`` as one job through the window's ``EngineBridge`` (it has the
  engine to itself while it runs: chat replies asked meanwhile wait, and say so), its events, the signals the
  window's gauges follow (``link.py``);
- ``outputs``: the outputs side by side in a resizable splitter, each column with its live tokens/s;
- ``results`` and ``charts``: the rows shown (one run or several compared) as a sortable table, the batch sweep's
  table and four charts;
- ``saved_runs``: past runs, JSON files in a folder the caller hands in, reopened and compared;
- ``export``: the run shown as CSV, JSON or Markdown, the charts as PNG.

What app/, the tests and the tools use of the panel itself: its signals, its widgets (``model_edit``,
``configs_editor``, ``configs_edit``, the spins, ``run_button``, ``status_label``, ``table``, ``outputs``, …), its
parts (``form``, ``predictions``, ``runs``, ``results``, ``charts``, ``saved``) and the actions that span parts
(``start``, ``cancel``, ``follow_model``, ``show_reports``, ``export``, ``open_selected``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from ...inference import BenchConfig, BenchReport, BenchSpec, ConfigResult, configs_text, for_model, parse_configs
from ..bridge import EngineBridge
from .charts import Charts, chart_data
from .export import export, export_row
from .form import SetupForm
from .outputs import OutputColumns
from .predictions import Predictions
from .results import ResultsView
from .run_controller import RunController, RunControls
from .saved_runs import SavedRuns

# The default rows: transformers' KV-cache loop beside Redline's fast path at 8 and 4 bits. On the starter and a
# 2-core CPU the speed model predicts about a minute for them with the default counts (13 generations a row);
# the ladder (naive:fp32 first, at a few tokens/s) takes many minutes and is a ready-made set instead.
DEFAULT_CONFIGS = "kv:fp32,fast:q8,fast:q4"


def _default_rows(model: str) -> list[BenchConfig]:
    """The default rows that ``model`` can run (a server's own row for a model on a server)."""
    return for_model(parse_configs(DEFAULT_CONFIGS), model)


def _scrolling(widget: QWidget) -> QScrollArea:
    """``widget`` in a scroll area of its own: its minimum size no longer holds the window's up."""
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.NoFrame)
    area.setWidget(widget)
    return area


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
        self._followed = model  # the model the Model field was last set to from the window
        rows = configs_text(_default_rows(model))
        self.form = SetupForm(model, rows, presets, self._device, server_keys)
        self._expose_form(self.form)
        self._made = self.configs_editor.configs()  # the rows the lab chose itself (not the user), last

        self.run_button = QPushButton("Run")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress_bar = QProgressBar(minimum=0, maximum=1000)
        self.status_label = QLabel("Ready.")
        self.status_label.setWordWrap(True)
        self.duration_label = QLabel("")  # how long Run is predicted to take, said before it is clicked
        self.duration_label.setObjectName("labDuration")
        self.duration_label.setWordWrap(True)
        controls = RunControls(self.run_button, self.cancel_button, self.progress_bar, self.status_label)
        self.form.configs_editor.message.connect(controls.say)

        self.outputs = OutputColumns()  # one column per configuration, in a splitter the user can resize
        self.charts = Charts()
        for name in ("tps_plot", "ttft_plot", "latency_plot", "memory_plot"):
            setattr(self, name, getattr(self.charts, name))
        self.results = ResultsView(self.charts)
        self.table, self.sweep_table = self.results.table, self.results.sweep_table
        self.saved = SavedRuns(runs_dir, self._show_opened, controls.say)
        self.history = self.saved.history

        self.predictions = Predictions(bridge, self.form, self.duration_label, self.running, self)
        self.runs = RunController(
            bridge, self.form, controls, self.outputs, self.results, self.saved, self.predictions.later, self
        )
        for signal in ("run_finished", "row_started", "live_speed", "row_done", "token_latencies"):
            getattr(self.runs, signal).connect(getattr(self, signal))
        self.run_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel)

        self._lay_out()
        self.saved.refresh()
        self.request_predictions()

    def _expose_form(self, form: SetupForm) -> None:
        """The form's widgets as the panel's own (the tests, the tools and the screenshots drive them)."""
        for name in (
            "model_edit",
            "configs_editor",
            "configs_edit",
            "baseline_spin",
            "prompts_combo",
            "new_tokens_spin",
            "warmup_spin",
            "samples_spin",
            "seed_spin",
            "protocol_button",
            "sweep_edit",
        ):
            setattr(self, name, getattr(form, name))

    # -- layout ----------------------------------------------------------------
    def _lay_out(self) -> None:
        controls = QHBoxLayout()
        controls.addWidget(self.run_button)
        controls.addWidget(self.cancel_button)
        controls.addWidget(self.progress_bar, 1)

        self.tabs = QTabWidget()
        self.tabs.addTab(self.table, "Results")
        self.tabs.addTab(_scrolling(self.charts), "Charts")
        self.tabs.addTab(self.sweep_table, "Batch sweep")
        self.tabs.addTab(self.saved, "Past runs")

        # Everything in one vertical splitter: the configurations, the outputs, the results — each as tall as
        # the user drags it.
        setup = self.setup = QWidget()
        sv = QVBoxLayout(setup)
        sv.setContentsMargins(0, 0, 0, 0)
        # The form scrolls; Run, its predicted duration and the status stay in view under it.
        self.form_scroll = _scrolling(self.form)
        sv.addWidget(self.form_scroll, 1)
        sv.addLayout(controls)
        sv.addWidget(self.duration_label)
        sv.addWidget(self.status_label)
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
        layout.addLayout(export_row(self.export, self.status_label.setText, self))
        self._sized = False

    def showEvent(self, event):  # noqa: N802
        """The first time the panel shows: the configurations at their natural height, then the outputs get
        more of the rest than the results (the user drags the handles from there)."""
        super().showEvent(event)
        if not self._sized and self.splitter.height() > 0:
            self._sized = True
            below = self.setup.sizeHint().height() - self.form_scroll.sizeHint().height()
            setup = min(self.form.sizeHint().height() + below + 4, int(self.splitter.height() * 0.55))
            rest = max(200, self.splitter.height() - setup)
            self.splitter.setSizes([setup, int(rest * 0.55), rest - int(rest * 0.55)])

    def _device(self) -> str:
        engine = self.bridge.engine
        return getattr(engine, "device", None) or "cpu"

    # -- running (run_controller.py) ----------------------------------------------------------
    def start(self):
        """Validate the form and submit the run (its channel); bad input is reported and nothing is lost."""
        return self.runs.start()

    def cancel(self) -> None:
        """Stop this run after the current step (a chat reply is never touched)."""
        self.runs.cancel()

    def running(self) -> bool:
        return self.runs.running() if hasattr(self, "runs") else False

    def build_spec(self) -> BenchSpec:
        return self.form.build_spec()

    def apply_textbook_protocol(self) -> None:
        self.form.apply_textbook_protocol()

    def column_texts(self) -> list[str]:
        return self.outputs.texts()

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
        # The rows follow too, to what the model's backend can run: rows the lab chose itself become the defaults
        # for the new model; the user's own rows lose only those it cannot run (a model on a server runs as the
        # server decodes: its remote row).
        rows = self.configs_editor.configs()
        new = _default_rows(spec) if rows == self._made else for_model(rows, spec)
        if new != rows:
            self._made = new
            self.configs_editor.set_configs(new)
            self.status_label.setText(f"The lab follows the chat to {spec}: its rows are now {configs_text(new)}.")

    # -- predictions (predictions.py) ---------------------------------------------------------
    def request_predictions(self):
        return self.predictions.request()

    def predicting(self) -> bool:
        return self.predictions.predicting()

    def generations_per_row(self) -> int:
        return self.form.generations_per_row()

    def predicted_seconds(self) -> tuple[Optional[float], int]:
        return self.predictions.predicted_seconds()

    def show_duration(self) -> None:
        self.predictions.show_duration()

    # -- results, saved runs and export --------------------------------------------------------
    @property
    def report(self) -> Optional[BenchReport]:
        """The run shown (live or reopened)."""
        return self.results.report

    @property
    def shown(self) -> list[ConfigResult]:
        """The rows in the table and charts (several runs' when comparing)."""
        return self.results.shown

    def show_reports(self, reports: list[BenchReport]) -> None:
        """Show one run, or several side by side (rows labelled by run)."""
        self.results.show_reports(reports)

    def _show_opened(self, reports: list[BenchReport]) -> None:
        self.results.show_reports(reports)
        self.tabs.setCurrentIndex(0)

    def chart_data(self) -> dict:
        """What the charts plot, by chart; rows without a measurement are left out."""
        return chart_data(self.results.shown)

    def refresh_history(self) -> None:
        self.saved.refresh()

    def open_selected(self) -> None:
        self.saved.open_selected()

    def export(self, fmt: str, path: Path) -> Path:
        """Write the shown run as csv, json, markdown or png (the charts)."""
        return export(fmt, path, self.results.report, self.charts)
