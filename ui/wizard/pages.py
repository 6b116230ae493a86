"""The configuration wizard's pages: model, hardware, configuration, speculative decoding, load, preset.

Pages never wait on the engine: anything that imports torch or reads tokenizers (describing a
model, probing the hardware, comparing a draft's tokenizer, loading) is an engine-thread task
awaited in an ``asyncSlot``; a page is "complete" only once its answer is in. The estimates
themselves are arithmetic on the model's shape, so the table recomputes live on the UI thread.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Optional

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QSlider,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
    QWizardPage,
)
from qasync import asyncSlot

from redline.inference import (
    CONSUMER_GPUS,
    GB,
    MB,
    Planner,
    Target,
    detect_target,
    format_bytes,
    parse_precision,
    suggest,
)
from redline.ui.engine_client import TaskFailed

SHOWN_PRECISIONS = ("bf16", "fp16", "fp32", "int8", "nf4", "fp4", "q8", "q4")
# A GGUF whose layers stay quantised: as the file is first; bitsandbytes is refused for such a folder.
PACKED_SHOWN = ("gguf", "bf16", "fp16", "fp32", "q8", "q4")
DEFAULT_CONTEXT_CAP = 8192  # the default context: the model's own, capped here (as `redline estimate`)
MIN_CONTEXT = 256
OK, BAD, CLOSE = "#1b7f3b", "#c0182b", "#b26a00"
PALE = {OK: "#e3f4e8", BAD: "#fdecee", CLOSE: "#fff3dc"}  # the fits column's backgrounds
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

# One sentence per term, shown as tooltips: the wizard is for people who do not know them yet.
TIPS = {
    "starter": "SmolLM2-135M-Instruct, a small real chat model that runs on any CPU (about 100 MB to fetch once).",
    "recent": "A model you loaded before.",
    "folder": "A folder holding a Hugging Face model: config.json, *.safetensors weights and the tokenizer.",
    "gguf": "A .gguf file from llama.cpp, LM Studio or Ollama; Redline converts it once and caches the result.",
    "as_file": "As the file is: the GGUF's quantised layers kept at their own 4 or 8 bits (the smallest load).",
    "hub": "A Hugging Face hub id such as HuggingFaceTB/SmolLM2-360M-Instruct: the local cache first, else a download.",
    "browse_folder": "Choose the folder that holds config.json.",
    "browse_gguf": "Choose a .gguf file.",
    "this_machine": "Plan with the memory free on this machine right now (other programs' use subtracted).",
    "other_gpu": "Plan for a card you do not have (yet): its whole memory, as if nothing else used it.",
    "gpu_list": "Consumer GPUs with their memory; half precision is fp16 on cards without bf16.",
    "context": "How many tokens (roughly ¾ of a word each) the model sees at once; the KV cache grows with it.",
    "batch": "Replies generated at once; chat uses 1, and memory for the KV cache grows with each.",
    "table": (
        "The predicted peak memory per precision: weights, the KV cache (what the model remembers of the "
        "conversation), activations, runtime overhead and the load's temporary copies."
    ),
    "bf16": "bf16: 2 bytes per weight, the precision most models are trained in; the default where supported.",
    "fp16": "fp16: 2 bytes per weight; for GPUs without bf16 (slow on most CPUs).",
    "fp32": "fp32: 4 bytes per weight; exact, but twice the memory of bf16 for no gain in chat.",
    "int8": "int8 (bitsandbytes LLM.int8): 1 byte per weight, half of bf16; usually slower than bf16 at batch 1.",
    "nf4": (
        "nf4 (bitsandbytes 4-bit NormalFloat): about half a byte per weight, a quarter of bf16, "
        "at a small cost in quality."
    ),
    "fp4": "fp4 (bitsandbytes 4-bit float): the memory of nf4 at lower quality; nf4 is the better 4-bit choice.",
    "q8": "q8: weights in int8 on torch's packed kernels, built for speed at batch 1.",
    "q4": "q4: weights in int4 on torch's packed kernels (groups of 32), a quarter of bf16's weight bytes.",
    "fix": "Apply the one change that makes the model fit.",
    "none": "Plain decoding with the KV cache: one token per step.",
    "speculative": (
        "A small draft model proposes several tokens and the big model checks them all in one step; "
        "the reply is the same, often faster."
    ),
    "lookup": (
        "Prompt lookup: candidate tokens copied from text already in the conversation, checked like a "
        "draft's; no second model, fast when the reply quotes the input."
    ),
    "draft_picker": "The draft model: a much smaller model, ideally of the same family (same tokenizer).",
    "draft_precision": "The draft's precision; its weights and KV cache add to the memory total.",
    "draft_tokens": "Tokens the draft proposes per step: 5 is a good start; 4–6 is usually best.",
    "cancel": "Stop loading (Esc); nothing stays half-loaded.",
    "retry": "Try loading again.",
    "preset_name": "The preset's name, as listed under Model → Presets and in Settings.",
    "save_preset": (
        "Save model, precision, context, strategy, draft and sampling as a preset, a small JSON file in "
        "Redline's config folder."
    ),
}


def _colored(label: QLabel, text: str, color: Optional[str] = None) -> None:
    label.setText(text)
    label.setStyleSheet(f"color: {color};" if color else "")


def _wrap_label(text: str = "", name: Optional[str] = None) -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    if name:
        label.setObjectName(name)
    return label


def _tip(widget, key: str):
    widget.setToolTip(TIPS[key])
    return widget


# --------------------------------------------------------------------------- the model picker
class ModelPicker(QWidget):
    """Starter, a recent model, a folder, a .gguf file or a hub id; ``spec()`` is what to pass as the model."""

    changed = Signal()

    def __init__(self, recent: list[str], parent=None):
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        self.group = QButtonGroup(self)
        self.radios = {}
        for row, (key, text) in enumerate(
            (
                ("starter", "Built-in &starter model (SmolLM2-135M-Instruct)"),
                ("recent", "&Recent model:"),
                ("folder", "Local &folder:"),
                ("gguf", "&GGUF file:"),
                ("hub", "&Hub id:"),
            )
        ):
            radio = _tip(QRadioButton(text), key)
            self.group.addButton(radio, row)
            self.radios[key] = radio
            grid.addWidget(radio, row, 0)
        self.recent = _tip(QComboBox(), "recent")
        self.recent.addItems(recent)
        if not recent:
            self.recent.setPlaceholderText("(none yet)")
            self.radios["recent"].setEnabled(False)
        grid.addWidget(self.recent, 1, 1, 1, 2)
        self.folder = _tip(QLineEdit(), "folder")
        self.folder.setPlaceholderText("a folder with config.json")
        self.folder_button = _tip(QPushButton("Browse…"), "browse_folder")
        grid.addWidget(self.folder, 2, 1)
        grid.addWidget(self.folder_button, 2, 2)
        self.gguf = _tip(QLineEdit(), "gguf")
        self.gguf.setPlaceholderText("a .gguf file")
        self.gguf_button = _tip(QPushButton("Browse…"), "browse_gguf")
        grid.addWidget(self.gguf, 3, 1)
        grid.addWidget(self.gguf_button, 3, 2)
        self.hub = _tip(QLineEdit(), "hub")
        self.hub.setPlaceholderText("owner/name, e.g. HuggingFaceTB/SmolLM2-360M-Instruct")
        grid.addWidget(self.hub, 4, 1, 1, 2)
        grid.setColumnStretch(1, 1)
        self.radios["starter"].setChecked(True)

        self.group.idToggled.connect(lambda _id, on: on and self.changed.emit())
        self.recent.currentTextChanged.connect(lambda _t: self._edited("recent"))
        for key, edit in (("folder", self.folder), ("gguf", self.gguf), ("hub", self.hub)):
            edit.textEdited.connect(lambda _t, k=key: self._edited(k))
        self.folder_button.clicked.connect(self._browse_folder)
        self.gguf_button.clicked.connect(self._browse_gguf)

    def _edited(self, key: str) -> None:
        if self.radios[key].isChecked():
            self.changed.emit()
        elif self.radios[key].isEnabled():
            self.radios[key].setChecked(True)  # emits changed

    def _browse_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a model folder (with config.json)")
        if path:
            self.folder.setText(path)
            self._edited("folder")

    def _browse_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF file", "", "GGUF files (*.gguf)")
        if path:
            self.gguf.setText(path)
            self._edited("gguf")

    def kind(self) -> str:
        return next(k for k, r in self.radios.items() if r.isChecked())

    def spec(self) -> str:
        kind = self.kind()
        return {
            "starter": "starter",
            "recent": self.recent.currentText(),
            "folder": self.folder.text(),
            "gguf": self.gguf.text(),
            "hub": self.hub.text(),
        }[kind].strip()

    def set_spec(self, spec: Optional[str]) -> None:
        """Show ``spec`` under the choice it belongs to."""
        if not spec or spec.strip().lower() == "starter":
            self.radios["starter"].setChecked(True)
            return
        path = os.path.expanduser(spec)
        if spec.lower().endswith(".gguf"):
            self.gguf.setText(spec)
            self.radios["gguf"].setChecked(True)
        elif os.path.isdir(path) or not _HUB_ID.match(spec):
            self.folder.setText(spec)
            self.radios["folder"].setChecked(True)
        else:
            self.hub.setText(spec)
            self.radios["hub"].setChecked(True)


class _CheckedPicker:
    """A picker whose choice is checked on the engine thread shortly after it changes."""

    def _setup_check(self, picker: ModelPicker, status: QLabel) -> None:
        self._picker, self._status = picker, status
        self._token = 0
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(400)  # wait for the user to stop typing
        self._timer.timeout.connect(self.check)
        picker.changed.connect(self._schedule)

    def _schedule(self) -> None:
        self._token += 1  # any answer in flight is now stale
        self._on_invalidated()
        self._timer.start()

    def _on_invalidated(self) -> None:
        pass


# --------------------------------------------------------------------------- 1. model
class ModelPage(QWizardPage, _CheckedPicker):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Model")
        self.setSubTitle("Which model do you want to chat with? Anything you choose is checked before you go on.")
        v = QVBoxLayout(self)
        self.picker = ModelPicker(wizard.presets.recent_models() if wizard.presets else [])
        v.addWidget(self.picker)
        self.status = _wrap_label(name="modelStatus")
        self.availability = _wrap_label(name="modelAvailability")
        v.addWidget(self.status)
        v.addWidget(self.availability)
        v.addStretch(1)
        self.desc = None
        self._setup_check(self.picker, self.status)
        self.picker.set_spec(wizard.host.settings.model)

    def initializePage(self):  # noqa: N802
        if self.desc is None:
            self._schedule()

    def _on_invalidated(self) -> None:
        self.desc = None
        self.availability.setText("")
        self.completeChanged.emit()

    @asyncSlot()
    async def check(self) -> None:
        spec, token = self.picker.spec(), self._token
        if not spec:
            _colored(self.status, "Choose a model above.")
            return
        _colored(self.status, f"Checking {spec}…")
        try:
            desc = await self.wiz.describe(spec)
        except TaskFailed as exc:
            if token == self._token:
                _colored(self.status, f"This model cannot be used: {exc}", BAD)
            return
        if token != self._token:
            return
        self.desc = desc
        _colored(self.status, "✓ " + desc.summary(), OK)
        _colored(self.availability, desc.availability(), None if desc.loadable else CLOSE)
        self.completeChanged.emit()

    def isComplete(self):  # noqa: N802
        return self.desc is not None

    def validatePage(self):  # noqa: N802
        if self.wiz.model is None or self.wiz.model.spec != self.desc.spec:
            self.wiz.model_changed()
        self.wiz.model = self.desc
        return True


# --------------------------------------------------------------------------- 2. hardware
class HardwarePage(QWizardPage):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Hardware")
        self.setSubTitle("Where the model will run, and how much memory it may use.")
        v = QVBoxLayout(self)
        self.this_machine = _tip(QRadioButton("&This machine"), "this_machine")
        self.this_machine.setChecked(True)
        v.addWidget(self.this_machine)
        self.details = _wrap_label("Reading the hardware…", "hardwareDetails")
        self.details.setContentsMargins(22, 0, 0, 6)
        v.addWidget(self.details)
        row = QHBoxLayout()
        self.other = _tip(QRadioButton("Plan for &another GPU:"), "other_gpu")
        self.gpu_list = _tip(QComboBox(), "gpu_list")
        for g in CONSUMER_GPUS:
            self.gpu_list.addItem(
                f"{g.name}  ({g.memory_bytes / GB:.1f} GB, {g.bandwidth_gb_s:.0f} GB/s"
                + ("" if g.bf16 else ", fp16 only")
                + ")",
                g.name,
            )
        self.gpu_list.setCurrentIndex(self.gpu_list.findData("RTX 3060 12GB"))
        row.addWidget(self.other)
        row.addWidget(self.gpu_list, 1)
        v.addLayout(row)
        self.note = _wrap_label(name="hardwareNote")
        v.addWidget(self.note)
        v.addStretch(1)
        group = QButtonGroup(self)
        group.addButton(self.this_machine)
        group.addButton(self.other)
        self.this_machine.toggled.connect(self._update)
        self.gpu_list.currentIndexChanged.connect(lambda _i: self._choose_other())

    def _choose_other(self) -> None:
        if not self.other.isChecked():
            self.other.setChecked(True)
        self._update()

    def initializePage(self):  # noqa: N802
        if self.wiz.machine is None:
            self.probe()
        self._update()

    @asyncSlot()
    async def probe(self) -> None:
        try:
            machine = await self.wiz.probe_hardware()
        except TaskFailed as exc:
            _colored(self.details, f"The hardware could not be read: {exc}", BAD)
            return
        self.wiz.machine = machine
        self.details.setText(describe_machine(machine))
        self._update()

    def _update(self) -> None:
        m = self.wiz.machine
        if self.other.isChecked():
            name = self.gpu_list.currentData()
            where = "this machine's CPU" if m is None or m.device == "cpu" else "this machine's GPU"
            self.note.setText(
                f"Estimates are for an {name} with nothing else on it. Loading in this wizard still runs on {where}."
            )
        else:
            self.note.setText("")
        self.completeChanged.emit()

    def chosen_target(self) -> Optional[Target]:
        if self.other.isChecked():
            return detect_target(gpu=self.gpu_list.currentData())
        return self.wiz.machine.target if self.wiz.machine else None

    def isComplete(self):  # noqa: N802
        return self.other.isChecked() or self.wiz.machine is not None

    def validatePage(self):  # noqa: N802
        self.wiz.target = self.chosen_target()
        on_this = self.this_machine.isChecked() and self.wiz.machine is not None
        self.wiz.correction = self.wiz.machine.correction_bytes if on_this else 0
        return True


def describe_machine(m) -> str:
    hw = m.hardware
    lines = []
    if hw.gpus:
        for g in hw.gpus:
            line = f"GPU {g.index}: {g.name} — {format_bytes(g.total_bytes)} total, {format_bytes(g.free_bytes)} free"
            if g.other_processes_bytes is not None:
                line += f"; other processes use {format_bytes(g.other_processes_bytes)}"
            if g.this_process_bytes:
                line += f", Redline {format_bytes(g.this_process_bytes)}"
            lines.append(line)
        if m.device == "cpu":
            lines.append("This build of PyTorch cannot use the GPU, so models run on the CPU.")
    else:
        lines.append("No GPU — models run on the CPU.")
    lines.append(
        f"System RAM: {format_bytes(hw.ram_total_bytes)} total, {format_bytes(hw.ram_available_bytes)} available"
    )
    lines.append(f"CPU: {hw.cpu}, {hw.cpu_cores} threads")
    lines.append(f"Planning with {format_bytes(m.target.available_bytes)}: {m.target.label}.")
    if m.reclaimable_bytes:
        lines.append(
            f"(That counts the {format_bytes(m.reclaimable_bytes)} the model loaded now gives back when it is "
            "replaced.)"
        )
    if m.correction_bytes:
        lines.append(
            f"Estimates include a correction of {format_bytes(m.correction_bytes)} learned from loads measured "
            "on this machine."
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- 3. configuration
COLUMNS = ("precision", "weights", "KV cache", "activations", "overhead", "loading", "total", "fits")


class ConfigPage(QWizardPage):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Configuration")
        self.setSubTitle(
            "Memory each precision needs, predicted from the model's config. The suggested row is "
            "selected; pick another if you prefer."
        )
        v = QVBoxLayout(self)
        self.header = _wrap_label(name="configHeader")
        v.addWidget(self.header)
        form = QHBoxLayout()
        form.addWidget(QLabel("&Context:"))
        self.slider = _tip(QSlider(Qt.Horizontal), "context")
        self.slider.setObjectName("contextSlider")
        self.context = _tip(QSpinBox(), "context")
        self.context.setSuffix(" tokens")
        form.itemAt(0).widget().setBuddy(self.slider)
        form.addWidget(self.slider, 1)
        form.addWidget(self.context)
        batch_label = QLabel("&Batch:")
        self.batch = _tip(QSpinBox(), "batch")
        self.batch.setRange(1, 64)
        batch_label.setBuddy(self.batch)
        form.addSpacing(12)
        form.addWidget(batch_label)
        form.addWidget(self.batch)
        v.addLayout(form)
        self.table = _tip(QTableWidget(0, len(COLUMNS)), "table")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        self.table.horizontalHeader().setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeToContents)
        self.table.setTabKeyNavigation(False)  # Tab leaves the table; the arrow keys move between rows
        v.addWidget(self.table, 1)
        self.why = _wrap_label(name="suggestionText")
        v.addWidget(self.why)
        fix_row = QHBoxLayout()
        self.fix_button = _tip(QPushButton(), "fix")
        self.fix_button.hide()
        fix_row.addWidget(self.fix_button)
        fix_row.addStretch(1)
        v.addLayout(fix_row)
        self.choice = _wrap_label(name="choiceText")
        v.addWidget(self.choice)

        self.suggestion = None
        self.estimates = []
        self._fix_context: Optional[int] = None
        self._user_row: Optional[str] = None  # a precision the user picked over the suggestion
        self._filling = False
        self.slider.valueChanged.connect(self._slider_moved)
        self.context.valueChanged.connect(self._context_typed)
        self.batch.valueChanged.connect(lambda _v: self.refresh())
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
        self._filling = False
        self._user_row = None
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

    def planner(self, draft=None, draft_spec=None) -> Planner:
        return Planner(
            self.wiz.model.shape, self.wiz.target, self.batch.value(), draft, draft_spec, self.wiz.correction
        )

    def refresh(self) -> None:
        if self.wiz.model is None or self.wiz.target is None:
            return
        planner = self.planner()
        ctx = self.context.value()
        self.shown = PACKED_SHOWN if self.wiz.model.shape.packed else SHOWN_PRECISIONS
        self.estimates = [planner.estimate(parse_precision(p), ctx) for p in self.shown]
        self.suggestion = suggest(planner, ctx)
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
            )
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setTextAlignment((Qt.AlignLeft if col == 0 else Qt.AlignRight) | Qt.AlignVCenter)
                if col == 0:
                    item.setToolTip(TIPS["as_file"] if self.shown[row] == "gguf" else TIPS[self.shown[row]])
                if col == len(cells) - 1:
                    color = fit_color(e)
                    item.setForeground(QColor(color))
                    item.setBackground(QColor(PALE[color]))
                self.table.setItem(row, col, item)
        self._filling = False
        s = self.suggestion
        fits_now = s.change is None and s.precision is not None
        self.why.setText(s.text)
        self.why.setStyleSheet("" if fits_now else f"color: {BAD if s.precision is None else CLOSE};")
        self._fix_context = s.context if (s.change == "context" and s.context) else None
        if self._fix_context:
            self.fix_button.setText(f"Use a context of {self._fix_context} tokens")
            self.fix_button.show()
        else:
            self.fix_button.hide()
        want = self._user_row or (s.precision if fits_now else None)
        self._select(want)

    def _shown(self) -> tuple:
        return getattr(self, "shown", SHOWN_PRECISIONS)

    def _select(self, precision: Optional[str]) -> None:
        self._filling = True
        if precision in self._shown():
            self.table.selectRow(self._shown().index(precision))
        else:
            self.table.clearSelection()
        self._filling = False
        self._describe_choice()

    def _row_changed(self) -> None:
        if self._filling:
            return
        row = self.selected_row()
        self._user_row = self._shown()[row] if row is not None else None
        self._describe_choice()

    def _apply_fix(self) -> None:
        if self._fix_context:
            self._user_row = None
            self.context.setValue(self._fix_context)

    def selected_row(self) -> Optional[int]:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return rows[0].row() if rows else None

    def selected_precision(self) -> Optional[str]:
        row = self.selected_row()
        return self._shown()[row] if row is not None else None

    def _describe_choice(self) -> None:
        row = self.selected_row()
        if row is None:
            _colored(self.choice, "Select a row to continue (one that does not fit can still be tried).")
        else:
            e = self.estimates[row]
            if e.fits:
                _colored(
                    self.choice, f"Next: {e.precision} at {e.context} tokens, predicted {format_bytes(e.total_bytes)}."
                )
            else:
                _colored(
                    self.choice,
                    f"{e.precision} does not fit: {format_bytes(e.total_bytes)} predicted, "
                    f"{format_bytes(e.available_bytes)} available. You can still try; loading may run "
                    "out of memory.",
                    CLOSE,
                )
        self.completeChanged.emit()

    def isComplete(self):  # noqa: N802
        return self.selected_row() is not None

    def validatePage(self):  # noqa: N802
        self.wiz.precision = self.selected_precision()
        self.wiz.context = self.context.value()
        self.wiz.batch = self.batch.value()
        return True


def fit_text(e) -> str:
    if e.fits:
        return "fits"
    return "too close" if e.total_bytes <= (e.available_bytes or 0) else "does not fit"


def fit_color(e) -> str:
    return OK if e.fits else CLOSE if e.total_bytes <= (e.available_bytes or 0) else BAD


# --------------------------------------------------------------------------- 4. speculative decoding
class DraftPage(QWizardPage, _CheckedPicker):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Speculative decoding (optional)")
        self.setSubTitle("Make replies faster with a small draft model, or by copying from the conversation.")
        v = QVBoxLayout(self)
        self.none = _tip(QRadioButton("&No speed-up beyond the KV cache"), "none")
        self.speculative = _tip(QRadioButton("&Draft model (speculative decoding):"), "speculative")
        self.lookup = _tip(QRadioButton("&Prompt lookup (no draft model)"), "lookup")
        group = QButtonGroup(self)
        for r in (self.none, self.speculative):
            group.addButton(r)
            v.addWidget(r)
        self.draft_box = QWidget()
        dv = QVBoxLayout(self.draft_box)
        dv.setContentsMargins(22, 0, 0, 0)
        self.picker = ModelPicker(wizard.presets.recent_models() if wizard.presets else [])
        _tip(self.picker, "draft_picker")
        dv.addWidget(self.picker)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldsStayAtSizeHint)
        self.draft_precision = _tip(QComboBox(), "draft_precision")
        self.draft_precision.addItems(SHOWN_PRECISIONS)
        form.addRow("Draft pr&ecision:", self.draft_precision)
        self.tokens = _tip(QSpinBox(), "draft_tokens")
        self.tokens.setRange(1, 16)
        self.tokens.setValue(5)
        form.addRow("Draft &tokens per step:", self.tokens)
        dv.addLayout(form)
        dv.addWidget(
            _wrap_label(
                "Start with 5. If most drafted tokens are accepted (the chat shows the rate), try 6–8; "
                "if few are, try 3–4 — a rejected token costs a draft step for nothing."
            )
        )
        self.status = _wrap_label(name="draftStatus")
        self.memory = _wrap_label(name="draftMemory")
        dv.addWidget(self.status)
        dv.addWidget(self.memory)
        v.addWidget(self.draft_box)
        group.addButton(self.lookup)
        v.addWidget(self.lookup)
        v.addStretch(1)
        self.none.setChecked(True)
        self.draft_desc = None
        self.pair = None
        self._setup_check(self.picker, self.status)
        group.buttonToggled.connect(lambda _b, on: on and self._mode_changed())
        self.draft_precision.currentTextChanged.connect(lambda _t: self._show_memory())
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
        return (
            "kv"
            if self.wiz.host.settings.strategy in ("speculative", "prompt-lookup")
            else self.wiz.host.settings.strategy
        )

    def initializePage(self):  # noqa: N802
        self.draft_precision.setCurrentText(self.wiz.precision or "bf16")
        if self.speculative.isChecked():
            self._schedule()

    def _mode_changed(self) -> None:
        self.draft_box.setEnabled(self.speculative.isChecked())
        if self.speculative.isChecked() and self.draft_desc is None and self.wiz.model is not None:
            self._schedule()
        self.completeChanged.emit()

    def _on_invalidated(self) -> None:
        self.draft_desc = self.pair = None
        self.memory.setText("")
        self.completeChanged.emit()

    @asyncSlot()
    async def check(self) -> None:
        spec, token = self.picker.spec(), self._token
        if not spec or self.wiz.model is None:
            return
        _colored(self.status, f"Checking {spec} against {self.wiz.model.name}…")
        try:
            desc = await self.wiz.describe(spec)
            if token != self._token:
                return
            pair = await self.wiz.check_pair(self.wiz.model.spec, spec)
        except TaskFailed as exc:
            if token == self._token:
                _colored(self.status, f"Not usable as a draft: {exc}", BAD)
            return
        if token != self._token:
            return
        self.draft_desc, self.pair = desc, pair
        if pair.mode == "unknown":
            _colored(self.status, pair.reason, CLOSE)
        else:
            verb = (
                "Compatible (shared vocabulary)"
                if pair.mode == "shared"
                else "Compatible through universal assisted decoding"
            )
            _colored(self.status, f"✓ {verb}: {pair.reason}", OK)
        self._show_memory()
        self.completeChanged.emit()

    def _show_memory(self) -> None:
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
        _colored(
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


# --------------------------------------------------------------------------- 5. load
class LoadPage(QWizardPage):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Load")
        self.setSubTitle(
            "Loading with this configuration. Afterwards: the memory predicted beside the memory measured."
        )
        v = QVBoxLayout(self)
        self.summary = _wrap_label(name="loadSummary")
        v.addWidget(self.summary)
        row = QHBoxLayout()
        self.phase = QLabel("")
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setToolTip("Loading progress: fetching, reading the config, loading (and quantising) the weights.")
        self.cancel_button = _tip(QPushButton("Cancel loading"), "cancel")
        self.retry_button = _tip(QPushButton("Load again"), "retry")
        self.retry_button.hide()
        row.addWidget(self.bar, 1)
        row.addWidget(self.cancel_button)
        row.addWidget(self.retry_button)
        v.addWidget(self.phase)
        v.addLayout(row)
        self.result = _wrap_label(name="loadResult")
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
        self.note = _wrap_label(name="loadNote")
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
        self.completeChanged.emit()
        self.wiz.set_busy(True)
        try:
            info, error = await self.wiz.load()
        finally:
            self.loading = False
            self.wiz.set_busy(False)
        self.cancel_button.hide()
        if info is None:
            self.phase.setText("Not loaded")
            _colored(self.result, error or "The model was not loaded.", BAD)
            self.retry_button.show()
            self.completeChanged.emit()
            return
        self.info = info
        self.bar.setValue(1000)
        self.phase.setText(f"Loaded in {info.load_seconds:.1f} s on {info.device}")
        draft = f" with draft {info.draft_name}" if info.draft_name else ""
        text = f"{info.name} ({info.precision}){draft} is loaded; the chat window uses it now."
        if info.draft_error:
            text += f" The draft was not loaded: {info.draft_error}"
        _colored(self.result, text, OK if not info.draft_error else CLOSE)
        self._show_figures(info)
        self.completeChanged.emit()

    def _show_figures(self, info) -> None:
        self.predicted.setText(format_bytes(info.predicted_bytes))
        self.measured.setText(format_bytes(info.measured_bytes))
        notes = []
        if info.predicted_bytes and info.measured_bytes:
            err = 100.0 * (info.predicted_bytes - info.measured_bytes) / info.measured_bytes
            self.error.setText(f"{err:+.1f} %")
            within = abs(info.predicted_bytes - info.measured_bytes) <= max(0.10 * info.measured_bytes, 300 * MB)
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


# --------------------------------------------------------------------------- 6. preset
class PresetPage(QWizardPage):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Save as preset")
        self.setSubTitle("Keep this configuration under a name, to load it again in one step.")
        v = QVBoxLayout(self)
        self.save_box = _tip(QCheckBox("&Save as a preset"), "save_preset")
        self.save_box.setChecked(wizard.presets is not None)
        self.save_box.setEnabled(wizard.presets is not None)
        v.addWidget(self.save_box)
        row = QHBoxLayout()
        name_label = QLabel("&Name:")
        self.name = _tip(QLineEdit(), "preset_name")
        self.name.setObjectName("presetName")
        name_label.setBuddy(self.name)
        row.addWidget(name_label)
        row.addWidget(self.name, 1)
        v.addLayout(row)
        self.note = _wrap_label(name="presetNote")
        v.addWidget(self.note)
        self.contents = _wrap_label(name="presetContents")
        v.addWidget(self.contents)
        v.addStretch(1)
        self.saved = None
        self.name.textChanged.connect(lambda _t: self._update_note())
        self.save_box.toggled.connect(lambda on: (self.name.setEnabled(on), self._update_note()))

    def initializePage(self):  # noqa: N802
        w = self.wiz
        extra = {"speculative": " · speculative", "prompt-lookup": " · prompt lookup"}.get(w.strategy, "")
        self.name.setText(
            f"{w.model.name} · {w.precision} · {w.context // 1024 or w.context}"
            f"{'k' if w.context >= 1024 else ''}{extra}"
        )
        s = w.host.settings
        sampling = (
            ", ".join(
                f"{k.replace('_', ' ')} {getattr(s, k)}"
                for k in ("temperature", "top_p", "top_k", "repetition_penalty", "seed")
                if getattr(s, k) is not None
            )
            or "the model's own sampling defaults"
        )
        self.contents.setText(
            f"The preset keeps: {s.model} · {s.precision} · {s.context_length} tokens · "
            f"{s.strategy}"
            + (f" · draft {s.draft_model}" if s.strategy == "speculative" else "")
            + f" · max {s.max_new_tokens} new tokens · {sampling}. Presets are listed under "
            "Model → Presets and in Settings, where they can be renamed and deleted."
        )
        self._update_note()

    def _update_note(self) -> None:
        presets = self.wiz.presets
        name = self.name.text().strip()
        if presets is None or not self.save_box.isChecked():
            _colored(self.note, "Nothing is saved; Finish closes the wizard.")
        elif not name:
            _colored(self.note, "Type a name.", CLOSE)
        elif presets.get(name) is not None:
            _colored(self.note, f"A preset named “{name}” exists; Finish replaces it.", CLOSE)
        else:
            _colored(self.note, "Finish saves the preset.")

    def validatePage(self):  # noqa: N802
        presets = self.wiz.presets
        if presets is None or not self.save_box.isChecked():
            return True
        try:
            self.saved = presets.save(self.name.text(), dataclasses.asdict(self.wiz.host.settings))
        except ValueError as exc:  # PresetError: a name that cannot be used
            _colored(self.note, str(exc), BAD)
            return False
        self.wiz.preset_saved.emit(self.saved.name)
        return True
