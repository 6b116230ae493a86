"""The wizard's fifth page: loading through the window's own load path, then the memory predicted beside the
memory measured."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
    QWizardPage,
)
from qasync import asyncSlot

from ...inference import accuracy_margin, format_bytes
from ..signals import emit
from .labels import BAD, CLOSE, OK, colored, wrap_label
from .tips import with_tip


class LoadPage(QWizardPage):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Load")
        self.setSubTitle(
            "Loading with this configuration. Afterwards: the memory predicted beside the memory measured."
        )
        v = QVBoxLayout(self)
        self.summary = wrap_label(name="loadSummary")
        v.addWidget(self.summary)
        row = QHBoxLayout()
        self.phase = QLabel("")
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setToolTip("Loading progress: fetching, reading the config, loading (and quantising) the weights.")
        self.cancel_button = with_tip(QPushButton("Cancel loading"), "cancel")
        self.retry_button = with_tip(QPushButton("Load again"), "retry")
        self.retry_button.hide()
        row.addWidget(self.bar, 1)
        row.addWidget(self.cancel_button)
        row.addWidget(self.retry_button)
        v.addWidget(self.phase)
        v.addLayout(row)
        self.result = wrap_label(name="loadResult")
        v.addWidget(self.result)
        grid = QGridLayout()
        self.predicted = QLabel()
        self.measured = QLabel()
        self.error = QLabel()
        for col, (title, label, tip) in enumerate(
            (
                ("Predicted", self.predicted, "The estimator's figure for this load, made before any weight was read."),
                (
                    "Measured",
                    self.measured,
                    "The peak memory the load really took: this process's peak RSS on a CPU, "
                    "peak GPU memory (torch reserved plus the CUDA context) on a GPU.",
                ),
                ("Error", self.error, "(predicted − measured) ÷ measured; the target is within 10 % or 300 MB."),
            )
        ):
            head = QLabel(title)
            head.setObjectName("panelTitle")
            head.setToolTip(tip)
            label.setToolTip(tip)
            label.setObjectName(f"memory{title}")
            label.setStyleSheet("font-size: 18px; font-weight: bold;")
            grid.addWidget(head, 0, col)
            grid.addWidget(label, 1, col)
        self.figures = QWidget()
        self.figures.setLayout(grid)
        self.figures.hide()
        v.addWidget(self.figures)
        self.note = wrap_label(name="loadNote")
        v.addWidget(self.note)
        v.addStretch(1)
        self.info = None
        self.loading = False
        self.cancel_button.clicked.connect(self.cancel)
        self.retry_button.clicked.connect(self.start)
        wizard.host.load_progress.connect(self._progress)

    def initializePage(self):  # noqa: N802
        w = self.wiz
        strategy = {
            "kv": "KV cache",
            "fast": "the fast decode path",
            "speculative": f"speculative with draft {w.draft_model} ({w.draft_precision}, "
            f"{w.num_draft_tokens} tokens per step)",
            "prompt-lookup": "prompt lookup",
        }.get(w.strategy, w.strategy)
        self.summary.setText(f"{w.model.name} · {w.precision} · {w.context} tokens of context · {strategy}")
        self.start()

    def _progress(self, fraction: float, phase: str) -> None:
        if self.loading:
            self.bar.setValue(int(max(0.0, min(1.0, fraction)) * 1000))
            self.phase.setText(phase)

    @asyncSlot()
    async def start(self) -> None:
        if self.loading:
            return
        self.info = None
        self.loading = True
        self.figures.hide()
        self.retry_button.hide()
        self.cancel_button.show()
        self.cancel_button.setEnabled(True)
        self.result.setText("")
        self.note.setText("")
        self.bar.setValue(0)
        self.phase.setText("Starting…")
        emit(self.completeChanged)
        self.wiz.set_busy(True)
        try:
            info, error = await self.wiz.load()
        finally:
            self.loading = False
            self.wiz.set_busy(False)
        self.cancel_button.hide()
        if info is None:
            self.phase.setText("Not loaded")
            colored(self.result, error or "The model was not loaded.", BAD)
            self.retry_button.show()
            emit(self.completeChanged)
            return
        self.info = info
        self.bar.setValue(1000)
        self.phase.setText(f"Loaded in {info.load_seconds:.1f} s on {info.device}")
        draft = f" with draft {info.draft_name}" if info.draft_name else ""
        text = f"{info.name} ({info.precision}){draft} is loaded; the chat window uses it now."
        if info.draft_error:
            text += f" The draft was not loaded: {info.draft_error}"
        colored(self.result, text, OK if not info.draft_error else CLOSE)
        self.show_figures(info)
        emit(self.completeChanged)

    def show_figures(self, info) -> None:
        self.predicted.setText(format_bytes(info.predicted_bytes))
        self.measured.setText(format_bytes(info.measured_bytes))
        notes = []
        if info.predicted_bytes and info.measured_bytes:
            err = 100.0 * (info.predicted_bytes - info.measured_bytes) / info.measured_bytes
            self.error.setText(f"{err:+.1f} %")
            within = abs(info.predicted_bytes - info.measured_bytes) <= accuracy_margin(info.measured_bytes)
            self.error.setStyleSheet(f"font-size: 18px; font-weight: bold; color: {OK if within else BAD};")
            notes.append(
                "Within the estimator's target (10 % or 300 MB)."
                if within
                else "Outside the estimator's target (10 % or 300 MB); after a few replies Redline learns a "
                "correction for this machine."
            )
        else:
            self.error.setText("unknown")
        planned = self.wiz.planned_total()
        if planned is not None:
            notes.append(
                f"The configuration page predicted {format_bytes(planned)} for a full context of "
                f"{self.wiz.context} tokens; this load has not used its KV cache yet, so the figures above "
                "are for the load with a one-token context. The chat compares prediction and measurement "
                "again after every reply."
            )
        if info.device == "cpu":
            notes.append("On a CPU the measurement is the whole process's resident memory, the window included.")
        self.note.setText(" ".join(notes))
        self.figures.show()

    def cancel(self) -> None:
        if self.loading:
            self.cancel_button.setEnabled(False)
            self.phase.setText("Cancelling…")
            self.wiz.host.cancel_load()

    def isComplete(self):  # noqa: N802
        return self.info is not None and not self.loading
