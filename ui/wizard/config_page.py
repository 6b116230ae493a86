"""The wizard's third page: the memory each precision needs at the chosen context, predicted from the model's
config, and the decode speed predicted on this machine (learned from its own measurements), with the row the
user's priority suggests selected and, when nothing fits, the one change that makes it fit."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSlider,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWizardPage,
)

from ...inference import (
    AS_FILE,
    DEFAULT_CONTEXT_CAP,
    NEXT_TURN_TOKENS,
    PRECISIONS,
    PRIORITIES,
    PRIORITY_LABELS,
    Planner,
    SpeedModel,
    choose,
    fastest_that_fits,
    format_bytes,
    parse_precision,
    rank_strategies,
    suggest,
)
from ..signals import emit
from .labels import BAD, CLOSE, OK, PALE, colored, wrap_label
from .tips import TIPS, with_tip

# Any model: every precision but "as the file is" (AS_FILE: only offered for a GGUF whose layers stay quantised);
# such a GGUF: that first, then what it can be converted to (bitsandbytes needs a float checkpoint).
SHOWN = tuple(p for p in PRECISIONS if p != AS_FILE)
PACKED_SHOWN = (AS_FILE, "bf16", "fp16", "fp32", "q8", "q4")

MIN_CONTEXT = 256
KV_LABELS = {"16-bit": "bf16", "8-bit": "q8"}  # the KV cache's forms (``--kv``), as the page names them

COLUMNS = (
    "precision", "weights", "KV cache", "activations", "overhead", "loading", "total", "fits", "speed", "first token",
)  # fmt: skip
FITS_COLUMN, SPEED_COLUMN = COLUMNS.index("fits"), COLUMNS.index("speed")
FIRST_TOKEN_COLUMN = COLUMNS.index("first token")


class ConfigPage(QWizardPage):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Configuration")
        self.setSubTitle(
            "Memory each precision needs, predicted from the model's config, and its speed predicted on this "
            "machine. The row your priority suggests is selected; pick another if you prefer."
        )
        v = QVBoxLayout(self)
        self.header = wrap_label(name="configHeader")
        v.addWidget(self.header)
        form = QHBoxLayout()
        form.addWidget(QLabel("&Context:"))
        self.slider = with_tip(QSlider(Qt.Horizontal), "context")
        self.slider.setObjectName("contextSlider")
        self.context = with_tip(QSpinBox(), "context")
        self.context.setSuffix(" tokens")
        form.itemAt(0).widget().setBuddy(self.slider)
        form.addWidget(self.slider, 1)
        form.addWidget(self.context)
        batch_label = QLabel("&Batch:")
        self.batch = with_tip(QSpinBox(), "batch")
        self.batch.setRange(1, 64)
        batch_label.setBuddy(self.batch)
        form.addSpacing(12)
        form.addWidget(batch_label)
        form.addWidget(self.batch)
        priority_label = QLabel("&Favour:")
        self.priority = with_tip(QComboBox(), "priority")
        self.priority.setObjectName("priorityBox")
        for key in PRIORITIES:
            self.priority.addItem(PRIORITY_LABELS[key], key)
        priority_label.setBuddy(self.priority)
        form.addSpacing(12)
        form.addWidget(priority_label)
        form.addWidget(self.priority)
        kv_label = QLabel("&KV cache:")
        self.kv = with_tip(QComboBox(), "kv")
        self.kv.setObjectName("kvBox")
        for label, form_ in KV_LABELS.items():
            self.kv.addItem(label, form_)
        kv_label.setBuddy(self.kv)
        form.addSpacing(12)
        form.addWidget(kv_label)
        form.addWidget(self.kv)
        v.addLayout(form)
        self.table = with_tip(QTableWidget(0, len(COLUMNS)), "table")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        # Every column as wide as its text (a stretched column cut "activation" and the speed's measured figure);
        # the last one takes what is left.
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setTabKeyNavigation(False)  # Tab leaves the table; the arrow keys move between rows
        v.addWidget(self.table, 1)
        self.why = wrap_label(name="suggestionText")
        v.addWidget(self.why)
        fix_row = QHBoxLayout()
        self.fix_button = with_tip(QPushButton(), "fix")
        self.fix_button.hide()
        fix_row.addWidget(self.fix_button)
        fix_row.addStretch(1)
        v.addLayout(fix_row)
        self.choice_label = wrap_label(name="choiceText")
        v.addWidget(self.choice_label)

        self.suggestion = None
        self.choice = None  # redline.inference.AutoChoice for the priority, when the speed is known
        self.speeds: dict = {}  # precision → the fastest strategy's SpeedPrediction
        self.estimates = []
        self.fix_context: Optional[int] = None
        self.fix_kv = False  # the fix is the 8-bit KV cache (auto found only it makes the context fit)
        self._user_row: Optional[str] = None  # a precision the user picked over the suggestion
        self._filling = False
        self.slider.valueChanged.connect(self._slider_moved)
        self.context.valueChanged.connect(self._context_typed)
        self.batch.valueChanged.connect(lambda _v: self.refresh())
        self.priority.currentIndexChanged.connect(self._priority_changed)
        self.kv.currentIndexChanged.connect(self._kv_changed)
        self.table.itemSelectionChanged.connect(self._row_changed)
        self.fix_button.clicked.connect(self._apply_fix)

    # The slider moves in steps of 256 tokens; the box takes any value.
    def _slider_moved(self, value: int) -> None:
        if not self._filling:
            self.context.setValue(min(self.context.maximum(), value * MIN_CONTEXT))

    def _context_typed(self, value: int) -> None:
        if self._filling:
            return
        self._filling = True
        self.slider.setValue(max(1, round(value / MIN_CONTEXT)))
        self._filling = False
        self.refresh()

    def initializePage(self):  # noqa: N802
        shape = self.wiz.model.shape
        top = shape.max_positions
        self._filling = True
        self.context.setRange(min(MIN_CONTEXT, top), top)
        self.slider.setRange(max(1, min(MIN_CONTEXT, top) // MIN_CONTEXT), max(1, top // MIN_CONTEXT))
        self.slider.setPageStep(max(1, top // MIN_CONTEXT // 16))
        self.priority.setCurrentIndex(max(0, self.priority.findData(self.wiz.priority)))
        self.kv.setCurrentIndex(max(0, self.kv.findData(self.wiz.kv)))
        self._filling = False
        self._user_row = None
        found = self.wiz.found_precision  # the model browser's predicted precision
        if found and found[0] == self.wiz.model_page.picker.spec():
            self._user_row = found[1]
        self.shown = SHOWN  # the precisions in the table, in its order
        start = self.wiz.context or min(top, DEFAULT_CONTEXT_CAP)
        t = self.wiz.target
        self.header.setText(
            f"{self.wiz.model.name} on {t.label}: {format_bytes(t.available_bytes)} available. "
            "'Fits' keeps a safety margin of 10 % or 300 MB, whichever is larger."
        )
        if self.context.value() == start:
            self.refresh()
        else:
            self.context.setValue(start)

    def _priority_changed(self, _index: int) -> None:
        if self._filling:
            return
        self.wiz.priority = self.priority.currentData()
        self._user_row = None  # a new priority suggests its own row
        self.refresh()

    def _kv_changed(self, _index: int) -> None:
        if self._filling:
            return
        self.wiz.kv = self.kv.currentData()
        self.refresh()

    def speed_model(self) -> Optional[SpeedModel]:
        """The speed model for where the wizard plans: this machine (measured on the hardware page), or a
        card from the list (its published bandwidth, nothing learned)."""
        return self.wiz.speed_model()

    def planner(self, draft=None, draft_spec=None) -> Planner:
        return Planner(
            self.wiz.model.shape,
            self.wiz.target,
            self.batch.value(),
            draft,
            draft_spec,
            self.wiz.correction,
            self.kv.currentData(),
        )

    def refresh(self) -> None:
        if self.wiz.model is None or self.wiz.target is None:
            return
        planner = self.planner()
        ctx = self.context.value()
        self.shown = PACKED_SHOWN if getattr(self.wiz.model.shape, "packed", None) else SHOWN
        self.estimates = [planner.estimate(parse_precision(p), ctx) for p in self.shown]
        self.suggestion = suggest(planner, ctx)
        speed = self.speed_model()
        self.speeds, self.turns, self.choice = {}, {}, None
        if speed is not None:
            shape = self.wiz.model.shape
            for p in self.shown:
                # Each row's strategy is the one ``auto`` would take for that precision (choose.py's ranking).
                best = fastest_that_fits(rank_strategies(shape, planner, speed, ctx, p))
                self.speeds[p] = best.prediction if best is not None else None
                turn = speed.next_turn(shape, p, best.strategy, ctx, kv=best.kv) if best is not None else None
                self.turns[p] = turn
            self.choice = choose(shape, planner, speed, ctx, self.priority.currentData())
        self._filling = True
        self.table.setRowCount(len(self.estimates))
        for row, e in enumerate(self.estimates):
            cells = (
                e.precision,
                format_bytes(e.weights_bytes),
                format_bytes(e.kv_cache_bytes),
                format_bytes(e.activation_bytes),
                format_bytes(e.overhead_bytes),
                format_bytes(e.loading_bytes),
                format_bytes(e.total_bytes),
                fit_text(e),
                speed_text(self.speeds.get(self.shown[row])),
                first_token_text(self.speeds.get(self.shown[row]), self.turns.get(self.shown[row])),
            )
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setTextAlignment((Qt.AlignLeft if col == 0 else Qt.AlignRight) | Qt.AlignVCenter)
                if col == 0:
                    item.setToolTip(TIPS["as_file"] if self.shown[row] == AS_FILE else TIPS[self.shown[row]])
                if col == FITS_COLUMN:
                    color = fit_color(e)
                    item.setForeground(QColor(color))
                    item.setBackground(QColor(PALE[color]))
                if col == SPEED_COLUMN:
                    item.setToolTip(speed_tip(self.speeds.get(self.shown[row]), ctx))
                if col == FIRST_TOKEN_COLUMN:
                    item.setToolTip(first_token_tip(self.speeds.get(self.shown[row]), self.turns.get(self.shown[row])))
                self.table.setItem(row, col, item)
        self._filling = False
        s = self.suggestion
        fits_now = s.change is None and s.precision is not None
        then = "then fits" if not fits_now else "faster at long contexts"  # speed first may take it where all fit
        c = self.choice
        # Only the 8-bit KV cache makes this context fit (``choose``): said, and offered as the fix.
        self.fix_kv = c is not None and c.fits and c.kv == "q8" and self.kv.currentData() != "q8"
        # With the 8-bit cache chosen, auto's pick fits even where the memory suggestion's ladder (bf16, int8, q8, nf4)
        # finds nothing: its row is the one to select.
        eight = c is not None and c.kv == "q8" and self.kv.currentData() == "q8"
        if (fits_now or eight) and c is not None and c.fits and c.precision in self.shown:
            self.why.setText(f"{c.reason}. Memory: {s.text}")
            suggested = c.precision
            fits_now = True
        elif self.fix_kv:
            self.why.setText(f"{c.reason}. With a 16-bit cache: {s.text}")
            suggested = None
        else:
            self.why.setText(s.text)
            suggested = s.precision
        self.why.setStyleSheet("" if fits_now else f"color: {BAD if s.precision is None else CLOSE};")
        self.fix_context = s.context if (s.change == "context" and s.context and not self.fix_kv) else None
        if self.fix_kv:
            self.fix_button.setText(f"Keep the KV cache in 8 bits ({c.strategy} · {c.precision} {then})")
            self.fix_button.show()
        elif self.fix_context:
            self.fix_button.setText(f"Use a context of {self.fix_context} tokens")
            self.fix_button.show()
        else:
            self.fix_button.hide()
        want = self._user_row if self._user_row in self.shown else (suggested if fits_now else None)
        self._select(want)

    def _select(self, precision: Optional[str]) -> None:
        self._filling = True
        if precision in self.shown:
            self.table.selectRow(self.shown.index(precision))
        else:
            self.table.clearSelection()
        self._filling = False
        self._describe_choice()

    def _row_changed(self) -> None:
        if self._filling:
            return
        row = self.selected_row()
        self._user_row = self.shown[row] if row is not None else None
        self._describe_choice()

    def _apply_fix(self) -> None:
        if self.fix_kv:
            self._user_row = None
            self.kv.setCurrentIndex(self.kv.findData("q8"))
        elif self.fix_context:
            self._user_row = None
            self.context.setValue(self.fix_context)

    def selected_row(self) -> Optional[int]:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return rows[0].row() if rows else None

    def selected_precision(self) -> Optional[str]:
        row = self.selected_row()
        return self.shown[row] if row is not None else None

    def _describe_choice(self) -> None:
        row = self.selected_row()
        if row is None:
            colored(self.choice_label, "Select a row to continue (one that does not fit can still be tried).")
        else:
            e = self.estimates[row]
            pred = self.speeds.get(self.shown[row])
            pace = f", {pred.tokens_per_s:.1f} tokens/s with {pred.strategy}" if pred is not None else ""
            if e.fits:
                colored(
                    self.choice_label,
                    f"Next: {e.precision} at {e.context} tokens, predicted {format_bytes(e.total_bytes)}{pace}.",
                )
            else:
                colored(
                    self.choice_label,
                    f"{e.precision} does not fit: {format_bytes(e.total_bytes)} predicted, "
                    f"{format_bytes(e.available_bytes)} available. You can still try; loading may run "
                    "out of memory.",
                    CLOSE,
                )
        emit(self.completeChanged)

    def isComplete(self):  # noqa: N802
        return self.selected_row() is not None

    def validatePage(self):  # noqa: N802
        self.wiz.precision = self.selected_precision()
        self.wiz.context = self.context.value()
        self.wiz.batch = self.batch.value()
        self.wiz.priority = self.priority.currentData()
        self.wiz.kv = self.kv.currentData()
        pred = self.speeds.get(self.wiz.precision)
        # The fastest strategy for the row chosen (kv where the speed is unknown); the next page may add a draft.
        self.wiz.plain_strategy = pred.strategy if pred is not None else "kv"
        return True


def fit_text(e) -> str:
    if e.fits:
        return "fits"
    return "too close" if e.total_bytes <= (e.available_bytes or 0) else "does not fit"


def fit_color(e) -> str:
    return OK if e.fits else CLOSE if e.total_bytes <= (e.available_bytes or 0) else BAD


def fmt_ms(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.0f} ms"


def first_token_text(pred, turn) -> str:
    """ "≈ 150 ms · next turn 60 ms" (the tooltip says what each is)."""
    if pred is None:
        return "—"
    text = f"≈ {fmt_ms(pred.ttft_ms)}"
    if turn is not None:
        text += f" · next turn {fmt_ms(turn.ttft_ms)}"
    return text


def first_token_tip(pred, turn) -> str:
    if pred is None:
        return "The time to first token is predicted once this machine's bandwidth has been measured."
    tip = f"Time to first token for a new {pred.prompt_tokens}-token prompt: ≈ {fmt_ms(pred.ttft_ms)}."
    if turn is not None and turn.cached_tokens:
        tip += (
            f" Next turn: a {NEXT_TURN_TOKENS}-token message in a conversation of {turn.prompt_tokens} tokens, "
            f"the other {turn.cached_tokens} read from the prefix cache (kept from the turns before): "
            f"≈ {fmt_ms(turn.ttft_ms)}."
        )
    elif turn is not None:
        tip += (
            f" Next turn in a conversation of {turn.prompt_tokens} tokens: ≈ {fmt_ms(turn.ttft_ms)}, the whole "
            f"conversation read again ({turn.strategy} keeps no cache between replies)."
        )
    return tip


def speed_text(pred) -> str:
    """The speed cell: the prediction's own text with its strategy (``SpeedPrediction.text``), or a dash."""
    return "—" if pred is None else pred.text(strategy=True)


def speed_tip(pred, context: int) -> str:
    """The speed cell's tooltip: the prediction's own (``SpeedPrediction.tip``) and how far the context grows."""
    if pred is None:
        return "The speed is predicted once this machine's bandwidth has been measured (the hardware page)."
    return f"{pred.tip()} The KV cache read per token grows with the conversation, up to {context} tokens."
