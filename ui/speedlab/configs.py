"""The speed lab's configuration editor: one table row per configuration (strategy, precision, draft and its
precision, draft tokens, compile, a reasoning model's thinking, the fast path's KV cache), added, duplicated and
removed by clicking; ready-made sets (the ladder, every precision, my presets); and the text form
(``kv:bf16,fast:q4,…``) kept as an advanced field, in step with the table both ways. Each row shows the tokens/s the
speed model predicts on this machine beside the tokens/s the last run measured.

The editor holds ``BenchConfig`` rows: a row typed in the text form keeps its text as its label until a cell of
it is edited; a row made in the table is labelled the way the text form writes it (``format_config``)."""

from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ...inference import (
    PRECISIONS,
    STRATEGIES,
    BenchConfig,
    RedlineError,
    SpeedPrediction,
    every_precision,
    for_model,
    format_config,
    from_presets,
    kv_forms,
    ladder,
    parse_config,
    parse_configs,
)
from ..signals import emit

COLUMNS = (
    "strategy",
    "precision",
    "draft / server",
    "draft precision",
    "draft tokens",
    "compile",
    "thinking",
    "KV",
    "predicted",
    "measured",
)
(STRATEGY, PRECISION, DRAFT, DRAFT_PRECISION, K, COMPILE, THINKING, KV, PREDICTED, MEASURED) = range(len(COLUMNS))
PRECISION_CHOICES = ("auto", *PRECISIONS)
REMOTE = "remote"  # a model on another OpenAI-compatible server: its address in the draft / server column
STRATEGY_CHOICES = (*STRATEGIES, REMOTE)
SERVER_HINT = "http://HOST:PORT/v1#MODEL"
COMPILE_CHOICES = (("default", None), ("on", True), ("off", False))
THINKING_CHOICES = (("default", None), ("on", True), ("off", False))  # the model's default, or on, or off
KV_CHOICES = (("default", None), ("bf16", "bf16"), ("q8", "q8"))  # the run's (the Settings), or bf16, or 8 bits
SETS = {
    "ladder": "The ladder: naive → kv → quantised → speculative → static",
    "every precision": "Every precision (kv)",
    "kv forms": "KV cache: 16-bit against 8-bit (fast)",
    "my presets": "My presets",
}
TIPS = {
    STRATEGY: "How it decodes: naive (no KV cache), kv, static (a cache for the whole context, compiled on CUDA), "
    "speculative (a draft model proposes tokens), prompt-lookup (copied from the context), fast (Redline's loop), "
    "remote (a model on another OpenAI-compatible server: its address in the next column but one)",
    PRECISION: "The weights' precision; auto is the device's default (bf16 where supported); a remote row's is the "
    "server's",
    DRAFT: "speculative: the draft model (starter, a folder, a .gguf file or a hub id); remote: the server's "
    f"address, {SERVER_HINT}",
    DRAFT_PRECISION: "speculative only: the draft's precision",
    K: "speculative only: tokens the draft proposes per step",
    COMPILE: "static only: compile the forward pass (default: on for CUDA, off for a CPU, where it takes minutes)",
    THINKING: "A reasoning model's thinking: the model's default, on or off. Two rows that differ only here compare "
    "the time to the first answer with thinking against without (a model that does not reason ignores it)",
    KV: "fast only: the KV cache in bf16 or in 8 bits (default: the Settings' KV cache). A q8 row beside the same "
    "row in bf16 shows what the 8 bits cost: its output's agreement with that row's and the perplexity difference",
    PREDICTED: "Decode tokens/s the speed model predicts on this machine, corrected by what it measured before",
    MEASURED: "Decode tokens/s the last run measured (median over its samples)",
}


class ConfigEditor(QWidget):
    """Rows of configurations, a ready-made set picker, and the text form in step with them."""

    changed = Signal()  # the rows changed (an edit, a set, the text form)
    message = Signal(str)  # something to tell the user (a set that is empty)

    def __init__(self, text: str, presets: Optional[Callable[[], list]] = None, parent=None):
        super().__init__(parent)
        self._presets = presets  # () -> the saved presets (PresetLike), for "my presets"
        self._rows: list[BenchConfig] = []
        self._pred: list = []  # per row: a SpeedPrediction, a reason it has none, or None (not asked yet)
        self._meas: list = []  # per row: the last run's ConfigResult, or None
        self._syncing = False
        self.text_error: Optional[str] = None  # why the text form does not parse (the rows keep the last good one)
        self.model: Callable[[], str] = lambda: "starter"
        self.device: Callable[[], str] = lambda: "cpu"
        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)

        top = QHBoxLayout()
        self.set_combo = QComboBox()
        self.set_combo.setObjectName("readySets")
        # The rows below are not a set until one is used: the combo must not show the ladder's name over other rows
        # (a user then read "the ladder has no naive row", issue 49).
        self.set_combo.addItem("Choose a set…", None)
        for key, label in SETS.items():
            self.set_combo.addItem(label, key)
        self.set_combo.setToolTip("Ready-made sets of configurations; Use replaces the rows below")
        self.set_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.set_combo.setMinimumContentsLength(24)  # the ladder's long name is elided, not the row widened
        self.use_set_button = QPushButton("Use set")
        self.use_set_button.setToolTip("Replace the rows with the chosen set")
        self.use_set_button.clicked.connect(lambda: self.use_set(self.set_combo.currentData()))
        self.use_set_button.setEnabled(False)
        self.set_combo.currentIndexChanged.connect(
            lambda _: self.use_set_button.setEnabled(self.set_combo.currentData() is not None)
        )
        self.add_button = QPushButton("Add")
        self.add_button.setToolTip("Add a configuration (a copy of the last row's precision, strategy kv)")
        self.add_button.clicked.connect(lambda: self.add_row())
        self.duplicate_button = QPushButton("Duplicate")
        self.duplicate_button.setToolTip("Copy the selected row, to change one thing in it")
        self.duplicate_button.clicked.connect(self.duplicate_selected)
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Remove the selected rows")
        self.remove_button.clicked.connect(self.remove_selected)
        top.addWidget(QLabel("Ready-made:"))
        top.addWidget(self.set_combo)
        top.addWidget(self.use_set_button)
        top.addSpacing(16)
        for b in (self.add_button, self.duplicate_button, self.remove_button):
            top.addWidget(b)
        top.addStretch(1)
        v.addLayout(top)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("configTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        for col, tip in TIPS.items():
            self.table.horizontalHeaderItem(col).setToolTip(tip)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)  # the cells are widgets
        self.table.verticalHeader().setDefaultSectionSize(30)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(DRAFT, QHeaderView.Stretch)
        self.table.setMinimumHeight(150)
        v.addWidget(self.table, 1)

        adv = QHBoxLayout()
        # The text form folds away (it is in step with the rows either way): one line less for a small screen.
        self.text_toggle = QToolButton()
        self.text_toggle.setObjectName("textFormToggle")
        self.text_toggle.setCheckable(True)
        self.text_toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.text_toggle.setArrowType(Qt.RightArrow)
        self.text_toggle.setText("Text form (advanced)")
        self.text_toggle.setToolTip("Show the configurations as text (kv:bf16,fast:q4,…), to copy or type them")
        self.text_toggle.toggled.connect(self.show_text_form)
        adv.addWidget(self.text_toggle)
        self.text_edit = QLineEdit()
        self.text_edit.setObjectName("configsText")
        self.text_edit.setToolTip(
            "strategy:precision, comma-separated, e.g. naive:fp32,kv:bf16,kv:int8,"
            "speculative:bf16+draft=starter@int8/k=5,prompt-lookup:bf16 — kept in step with the table"
        )
        adv.addWidget(self.text_edit, 1)
        v.addLayout(adv)
        self.text_edit.textChanged.connect(self._text_changed)
        self.text_edit.setText(text)
        self.text_edit.setVisible(False)

    def show_text_form(self, shown: bool) -> None:
        """Unfold (or fold away) the text form."""
        self.text_toggle.setChecked(shown)
        self.text_toggle.setArrowType(Qt.DownArrow if shown else Qt.RightArrow)
        self.text_edit.setVisible(shown)

    # -- the rows ------------------------------------------------------------------
    def configs(self) -> list[BenchConfig]:
        return list(self._rows)

    def _reset(self, configs: list[BenchConfig]) -> None:
        self._rows = list(configs)
        self._pred = [None] * len(self._rows)
        self._meas = [None] * len(self._rows)

    def set_configs(self, configs: list[BenchConfig]) -> None:
        """Replace the rows (a ready-made set, the rows the model can run): shown from the first, none selected.
        The table kept its scroll position and selection, so after Add (which scrolls to the new row) the ladder
        showed from its fourth row, without its naive row in view."""
        self._reset(configs)
        self._fill()
        self.table.clearSelection()
        self.table.setCurrentCell(-1, -1)
        self.table.scrollToTop()
        self._rows_changed()

    def add_row(self, config: Optional[BenchConfig] = None) -> None:
        if config is None:
            last = self._rows[-1] if self._rows else None
            config = BenchConfig(strategy="kv", precision=last.precision if last else "auto")
        self._rows.append(config)
        self._pred.append(None)
        self._meas.append(None)
        self._fill()
        self.table.selectRow(len(self._rows) - 1)
        self._rows_changed()

    def selected_rows(self) -> list[int]:
        model = self.table.selectionModel()
        return sorted({i.row() for i in model.selectedRows()}) if model else []

    def duplicate_selected(self) -> None:
        rows = self.selected_rows() or ([len(self._rows) - 1] if self._rows else [])
        for offset, r in enumerate(rows):
            copy = BenchConfig(**{**self._rows[r + offset].to_dict(), "text": ""})
            self._rows.insert(r + offset + 1, copy)
            self._pred.insert(r + offset + 1, self._pred[r + offset])
            self._meas.insert(r + offset + 1, None)
        self._fill()
        if rows:
            self.table.selectRow(rows[-1] + len(rows))
        self._rows_changed()

    def remove_selected(self) -> None:
        rows = self.selected_rows()
        if not rows:
            return
        keep = [i for i in range(len(self._rows)) if i not in rows]
        self._rows = [self._rows[i] for i in keep]
        self._pred = [self._pred[i] for i in keep]
        self._meas = [self._meas[i] for i in keep]
        self._fill()
        self._rows_changed()

    def use_set(self, key: str) -> None:
        if key == "ladder":
            configs = ladder(self.device(), self.model() or "starter")
        elif key == "every precision":
            configs = every_precision("kv")
        elif key == "kv forms":
            configs = kv_forms(self.device())
        elif key == "my presets":
            configs = from_presets(self._presets() if self._presets else [])
            if not configs:
                emit(self.message, "No presets saved yet: the configuration wizard saves them.")
                return
        else:
            raise ValueError(f"unknown set {key!r}")
        model = self.model() or "starter"
        runnable = for_model(configs, model)  # as the model's backend says (a server runs its own row only)
        left_out = [c.label for c in configs if c not in runnable]
        self.set_configs(runnable)
        if left_out:
            emit(
                self.message,
                f"{model} cannot run {len(left_out)} of the set's rows ({', '.join(left_out[:3])}"
                f"{', …' if len(left_out) > 3 else ''}): they were left out.",
            )

    # -- the table's widgets ---------------------------------------------------------
    def _fill(self) -> None:
        self._syncing = True
        self.table.setRowCount(len(self._rows))
        for r, c in enumerate(self._rows):
            strategy = QComboBox()
            strategy.addItems(list(STRATEGY_CHOICES))
            strategy.setCurrentText(c.strategy)
            remote = c.strategy == REMOTE
            precision = _combo(("server",) if remote else PRECISION_CHOICES, c.precision)
            precision.setEnabled(not remote)
            draft = QLineEdit((c.server if remote else c.draft) or "")
            draft.setPlaceholderText("draft model" if c.strategy == "speculative" else (SERVER_HINT if remote else ""))
            dprec = _combo(PRECISION_CHOICES, c.draft_precision)
            k = QSpinBox()
            k.setRange(1, 32)
            k.setValue(c.k)
            comp = QComboBox()
            for label, value in COMPILE_CHOICES:
                comp.addItem(label, value)
            comp.setCurrentIndex([v for _l, v in COMPILE_CHOICES].index(c.compile))
            think = QComboBox()
            for label, value in THINKING_CHOICES:
                think.addItem(label, value)
            think.setCurrentIndex([v for _l, v in THINKING_CHOICES].index(c.thinking))
            think.setEnabled(not remote)
            kv = QComboBox()
            for label, value in KV_CHOICES:
                kv.addItem(label, value)
            kv.setCurrentIndex([v for _l, v in KV_CHOICES].index(c.kv))
            kv.setEnabled(c.strategy == "fast")
            speculative = c.strategy == "speculative"
            for w in (dprec, k):
                w.setEnabled(speculative)
            draft.setEnabled(speculative or remote)
            comp.setEnabled(c.strategy == "static")
            for col, w in (
                (STRATEGY, strategy),
                (PRECISION, precision),
                (DRAFT, draft),
                (DRAFT_PRECISION, dprec),
                (K, k),
                (COMPILE, comp),
                (THINKING, think),
                (KV, kv),
            ):
                w.setToolTip(TIPS[col])
                self.table.setCellWidget(r, col, w)
            strategy.currentTextChanged.connect(lambda _t, row=r: self._cell_changed(row, refill=True))
            precision.currentTextChanged.connect(lambda _t, row=r: self._cell_changed(row))
            draft.textEdited.connect(lambda _t, row=r: self._cell_changed(row))
            dprec.currentTextChanged.connect(lambda _t, row=r: self._cell_changed(row))
            k.valueChanged.connect(lambda _v, row=r: self._cell_changed(row))
            comp.currentIndexChanged.connect(lambda _i, row=r: self._cell_changed(row))
            think.currentIndexChanged.connect(lambda _i, row=r: self._cell_changed(row))
            kv.currentIndexChanged.connect(lambda _i, row=r: self._cell_changed(row))
            for col in (PREDICTED, MEASURED):
                item = QTableWidgetItem("")
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                item.setToolTip(TIPS[col])
                self.table.setItem(r, col, item)
            self._show_prediction(r)
            self._show_measured(r)
        self._syncing = False

    def _row_from_widgets(self, r: int) -> BenchConfig:
        w = self.table.cellWidget
        strategy = w(r, STRATEGY).currentText()
        draft = w(r, DRAFT).text().strip() or None
        if strategy == REMOTE:  # the server decodes as it does: its address is all there is to set
            return BenchConfig(strategy=REMOTE, precision="server", server=draft or "")
        if w(r, PRECISION).currentText().strip() == "server":  # was a remote row: the device's default now
            w(r, PRECISION).setCurrentText("auto")
        return BenchConfig(
            strategy=strategy,
            precision=w(r, PRECISION).currentText().strip() or "auto",
            draft=draft if strategy == "speculative" else None,
            draft_precision=(w(r, DRAFT_PRECISION).currentText().strip() or "auto")
            if strategy == "speculative"
            else "auto",
            k=w(r, K).value(),
            schedule=self._rows[r].schedule,
            lookup=self._rows[r].lookup,
            compile=w(r, COMPILE).currentData() if strategy == "static" else None,
            thinking=w(r, THINKING).currentData(),
            kv=w(r, KV).currentData() if strategy == "fast" else None,
        )

    def _cell_changed(self, r: int, refill: bool = False) -> None:
        if self._syncing or r >= len(self._rows):
            return
        self._rows[r] = self._row_from_widgets(r)
        self._pred[r] = self._meas[r] = None
        if refill:  # a new strategy enables other cells
            self._fill()
        else:
            self._show_prediction(r)
            self._show_measured(r)
        self._rows_changed()

    # -- the text form, in step ------------------------------------------------------
    def _rows_changed(self) -> None:
        self._syncing = True
        self.text_edit.setText(",".join(c.label for c in self._rows))
        self._syncing = False
        self.text_error = None
        emit(self.changed)

    def _text_changed(self, text: str) -> None:
        if self._syncing:
            return
        try:
            configs = parse_configs(text) if text.strip() else []
        except RedlineError as exc:
            self.text_error = str(exc)  # half-typed or wrong: the rows keep the last good text's
            emit(self.changed)
            return
        self.text_error = None
        self._reset(configs)
        self._fill()
        emit(self.changed)

    def validated(self) -> list[BenchConfig]:
        """The rows, each checked as the text form checks it; raises the text form's or a row's error."""
        if self.text_error:
            raise RedlineError(self.text_error)
        if not self._rows:
            raise RedlineError("No configurations.", "Add a row, or choose a ready-made set.")
        for i, c in enumerate(self._rows):
            try:
                parse_config(format_config(c))
            except RedlineError as exc:
                raise RedlineError(f"Row {i + 1}: {exc}") from None
        return self.configs()

    # -- predicted and measured --------------------------------------------------------
    def set_predictions(self, predictions: list) -> None:
        """Per row: a SpeedPrediction, or the reason there is none (text)."""
        for r, p in enumerate(predictions[: len(self._rows)]):
            self._pred[r] = p
            self._show_prediction(r)

    def prediction(self, r: int):
        return self._pred[r] if r < len(self._pred) else None

    def set_measured(self, r: int, result) -> None:
        if r < len(self._meas):
            self._meas[r] = result
            self._show_measured(r)
            self._show_prediction(r)

    def clear_measured(self) -> None:
        for r in range(len(self._rows)):
            self.set_measured(r, None)

    def _show_prediction(self, r: int) -> None:
        """The prediction for the next run; once a row ran, the one it had before it ran (beside what it measured),
        the next run's in the tooltip."""
        item = self.table.item(r, PREDICTED)
        pred = self._pred[r] if r < len(self._pred) else None
        ran = self._meas[r] if r < len(self._meas) else None
        if item is None:
            return
        tip = TIPS[PREDICTED]
        if isinstance(pred, SpeedPrediction):
            tip = pred.tip() + _answer_tip(pred)  # the wizard's words for the same figures
        elif pred:
            tip = str(pred)
        if ran is not None and getattr(ran, "predicted_tokens_per_s", None):
            item.setText(f"≈ {ran.predicted_tokens_per_s:.1f}")
            item.setToolTip(f"Predicted before this row ran: ≈ {ran.predicted_tokens_per_s:.1f} tok/s. Next run: {tip}")
            return
        if isinstance(pred, SpeedPrediction):
            item.setText(f"≈ {pred.tokens_per_s:.1f}")
        else:
            item.setText("—" if pred else "")
        item.setToolTip(tip)

    def _show_measured(self, r: int) -> None:
        item = self.table.item(r, MEASURED)
        result = self._meas[r] if r < len(self._meas) else None
        if item is None:
            return
        if result is None:
            item.setText("")
            item.setToolTip(TIPS[MEASURED])
            return
        if result.status != "ok" or result.tokens_per_s is None:
            item.setText(result.status)
            item.setToolTip(result.error or result.status)
            return
        text = f"{result.tokens_per_s:.1f}"
        if result.prediction_error_pct is not None:
            text += f" ({result.prediction_error_pct:+.0f} %)"
        item.setText(text)
        item.setToolTip(
            "Measured decode tokens/s"
            + (
                f"; the speed model predicted {result.predicted_tokens_per_s:.1f} before the run (error in brackets)"
                if result.predicted_tokens_per_s
                else ""
            )
        )


def _answer_tip(pred: SpeedPrediction) -> str:
    """A reasoning model's time to first answer, for the predicted cell's tooltip: what it is made of, or that the
    model's thinking length is not learned yet (nothing for a model never seen thinking, unless the row asks)."""
    if pred.thinking is False:
        return f" Thinking off: the first answer token is the first token (≈ {pred.ttfat_ms:.0f} ms)."
    if pred.ttfat_ms is not None:
        return (
            f" Time to first answer ≈ {pred.ttfat_ms:.0f} ms: the TTFT plus ≈ {pred.thinking_tokens:.0f} thinking "
            f"tokens, this model's median over its last {pred.thinking_samples} replies that thought here."
        )
    if pred.thinking:
        return " Time to first answer: not learned yet (every reply of this model that thinks teaches it)."
    return ""


def _combo(items, current: str) -> QComboBox:
    c = QComboBox()
    c.setEditable(True)
    c.addItems(list(items))
    c.setCurrentText(current)
    return c
