"""The wizard's fourth page: an optional speed-up, speculative decoding with a draft model (checked against
the target's tokenizer) or prompt lookup, with the draft's memory added to the estimate and the speed-up
predicted from the draft's cost per token and the acceptance measured in a short run (``measure``)."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
    QWizardPage,
)
from qasync import asyncSlot

from ...inference import Planner, advise, format_bytes, parse_precision
from ..bridge import TaskFailed
from ..signals import emit
from .config_page import SHOWN
from .labels import BAD, CLOSE, OK, colored, wrap_label
from .model_picker import CheckedPicker, ModelPicker
from .tips import with_tip


class DraftPage(QWizardPage, CheckedPicker):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Speculative decoding (optional)")
        self.setSubTitle("Make replies faster with a small draft model, or by copying from the conversation.")
        v = QVBoxLayout(self)
        self.none = with_tip(QRadioButton("&No draft model"), "none")
        self.speculative = with_tip(QRadioButton("&Draft model (speculative decoding):"), "speculative")
        self.lookup = with_tip(QRadioButton("&Prompt lookup (no draft model)"), "lookup")
        group = QButtonGroup(self)
        for r in (self.none, self.speculative):
            group.addButton(r)
            v.addWidget(r)
        self.draft_box = QWidget()
        dv = QVBoxLayout(self.draft_box)
        dv.setContentsMargins(22, 0, 0, 0)
        self.picker = ModelPicker(wizard.presets.recent_models() if wizard.presets else [])
        with_tip(self.picker, "draft_picker")
        dv.addWidget(self.picker)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldsStayAtSizeHint)
        self.draft_precision = with_tip(QComboBox(), "draft_precision")
        self.draft_precision.addItems(SHOWN)
        form.addRow("Draft pr&ecision:", self.draft_precision)
        self.tokens = with_tip(QSpinBox(), "draft_tokens")
        self.tokens.setRange(1, 16)
        self.tokens.setValue(5)
        form.addRow("Draft &tokens per step:", self.tokens)
        dv.addLayout(form)
        dv.addWidget(
            wrap_label(
                "Start with 5. If most drafted tokens are accepted (the chat shows the rate), try 6–8; "
                "if few are, try 3–4 — a rejected token costs a draft step for nothing."
            )
        )
        self.status = wrap_label(name="draftStatus")
        self.memory = wrap_label(name="draftMemory")
        self.speed = wrap_label(name="draftSpeed")
        dv.addWidget(self.status)
        dv.addWidget(self.memory)
        dv.addWidget(self.speed)
        measure_row = QHBoxLayout()
        self.measure_button = with_tip(QPushButton("&Measure acceptance"), "measure_acceptance")
        self.measure_button.setEnabled(False)
        self.measure_button.clicked.connect(self.measure)
        measure_row.addWidget(self.measure_button)
        measure_row.addStretch(1)
        dv.addLayout(measure_row)
        v.addWidget(self.draft_box)
        group.addButton(self.lookup)
        v.addWidget(self.lookup)
        v.addStretch(1)
        self.none.setChecked(True)
        self.draft_desc = None
        self.pair = None
        self.advice = None  # redline.inference.DraftAdvice for the draft chosen
        self.measuring = False
        self._setup_check(self.picker, self.status)
        group.buttonToggled.connect(lambda _b, on: on and self._mode_changed())
        self.draft_precision.currentTextChanged.connect(lambda _t: self._show_memory())
        self.tokens.valueChanged.connect(lambda _v: self._show_speed())
        s = wizard.host.settings
        if s.draft_model:
            self.picker.set_spec(s.draft_model)
        self.tokens.setValue(s.num_draft_tokens or 5)
        if s.strategy == "speculative":
            self.speculative.setChecked(True)
        elif s.strategy == "prompt-lookup":
            self.lookup.setChecked(True)
        self._mode_changed()

    def strategy(self) -> str:
        if self.speculative.isChecked():
            return "speculative"
        if self.lookup.isChecked():
            return "prompt-lookup"
        return self.wiz.plain_strategy  # the fastest strategy for the precision chosen on the previous page

    def initializePage(self):  # noqa: N802
        self.none.setText(f"&No draft model: {self.wiz.plain_strategy}, one token per step")
        self.draft_precision.setCurrentText(self.wiz.precision or "bf16")
        if self.speculative.isChecked():
            self._schedule()

    def _mode_changed(self) -> None:
        self.draft_box.setEnabled(self.speculative.isChecked())
        if self.speculative.isChecked() and self.draft_desc is None and self.wiz.model is not None:
            self._schedule()
        emit(self.completeChanged)

    def _on_invalidated(self) -> None:
        self.draft_desc = self.pair = self.advice = None
        self.memory.setText("")
        self.speed.setText("")
        self.measure_button.setEnabled(False)
        emit(self.completeChanged)

    @asyncSlot()
    async def check(self) -> None:
        spec, token = self.picker.spec(), self._token
        if not spec or self.wiz.model is None:
            return
        colored(self.status, f"Checking {spec} against {self.wiz.model.name}…")
        try:
            desc = await self.wiz.describe(spec)
            if token != self._token:
                return
            pair = await self.wiz.check_pair(self.wiz.model.spec, spec)
        except TaskFailed as exc:
            if token == self._token:
                colored(self.status, f"Not usable as a draft: {exc}", BAD)
            return
        if token != self._token:
            return
        self.draft_desc, self.pair = desc, pair
        if pair.mode == "unknown":
            colored(self.status, pair.reason, CLOSE)
        else:
            verb = (
                "Compatible (shared vocabulary)"
                if pair.mode == "shared"
                else "Compatible through universal assisted decoding"
            )
            colored(self.status, f"✓ {verb}: {pair.reason}", OK)
        self._show_memory()
        emit(self.completeChanged)

    def _show_speed(self, acceptance_rate=None) -> None:
        """The speed-up predicted from the draft's cost per token (the speed model) and the acceptance measured
        for this pair (a short run: Measure acceptance), with a plain warning when it would be slower."""
        speed = self.wiz.speed_model()
        if self.draft_desc is None or speed is None or not self.wiz.precision:
            self.speed.setText("")
            return
        self.advice = advise(
            speed,
            self.wiz.model.shape,
            self.wiz.precision,
            self.draft_desc.shape,
            self.draft_precision.currentText(),
            self.tokens.value(),
            min(self.wiz.context or 512, 512),
            acceptance_rate,
        )
        a = self.advice
        color = BAD if a.verdict == "slower" else OK if a.verdict == "faster" else CLOSE
        colored(self.speed, a.text, color)
        self.measure_button.setEnabled(not self.measuring and self.wiz.target is not None)

    @asyncSlot()
    async def measure(self) -> None:
        """A few dozen tokens through the real speculative strategy, then the advice with the measured rate."""
        if self.draft_desc is None or self.measuring:
            return
        self.measuring = True
        self.measure_button.setEnabled(False)
        colored(self.speed, "Measuring how many draft tokens the model accepts (loads both models if needed)…")
        try:
            run = await self.wiz.measure_acceptance(
                self.draft_desc.spec, self.draft_precision.currentText(), self.tokens.value()
            )
        except TaskFailed as exc:
            self.measuring = False
            colored(self.speed, f"The acceptance run failed: {exc}", BAD)
            self.measure_button.setEnabled(True)
            return
        self.measuring = False
        self.wiz.calibration.reload()  # the run recorded the pair's acceptance
        self._show_speed(run.acceptance_rate)
        if self.advice is not None:
            self.speed.setText(
                f"{self.speed.text()} (Measured: {run.accepted} of {run.proposed} draft tokens accepted over "
                f"{run.new_tokens} tokens, {run.seconds:.1f} s.)"
            )

    def _show_memory(self) -> None:
        self._show_speed()
        if self.draft_desc is None or self.wiz.target is None or not self.wiz.precision:
            return
        planner = Planner(
            self.wiz.model.shape,
            self.wiz.target,
            self.wiz.batch,
            self.draft_desc.shape,
            parse_precision(self.draft_precision.currentText()),
            self.wiz.correction,
        )
        e = planner.estimate(parse_precision(self.wiz.precision), self.wiz.context)
        verdict = "fits" if e.fits else "does not fit"
        colored(
            self.memory,
            f"With the draft: {format_bytes(e.total_bytes)} predicted ({format_bytes(e.draft_bytes)} of it "
            f"the draft's weights and KV cache) of {format_bytes(e.available_bytes)} available at "
            f"{self.wiz.context} tokens — {verdict}.",
            OK if e.fits else BAD,
        )

    def isComplete(self):  # noqa: N802
        if not self.speculative.isChecked():
            return True
        return self.draft_desc is not None and self.pair is not None

    def validatePage(self):  # noqa: N802
        self.wiz.strategy = self.strategy()
        spec = self.speculative.isChecked()
        self.wiz.draft_model = self.draft_desc.spec if spec else self.wiz.host.settings.draft_model
        self.wiz.draft_precision = (
            self.draft_precision.currentText() if spec else self.wiz.host.settings.draft_precision
        )
        self.wiz.num_draft_tokens = self.tokens.value()
        return True
