"""The wizard's second page: where the model will run (this machine, or a GPU from the built-in list) and the
memory to plan with."""

from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QButtonGroup, QComboBox, QHBoxLayout, QRadioButton, QVBoxLayout, QWizardPage
from qasync import asyncSlot

from ...inference import CONSUMER_GPUS, GB, Target, detect_target, format_bytes
from ..bridge import TaskFailed
from ..signals import emit
from .labels import BAD, colored, wrap_label
from .tips import with_tip


class HardwarePage(QWizardPage):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Hardware")
        self.setSubTitle("Where the model will run, and how much memory it may use.")
        v = QVBoxLayout(self)
        self.this_machine = with_tip(QRadioButton("&This machine"), "this_machine")
        self.this_machine.setChecked(True)
        v.addWidget(self.this_machine)
        self.details = wrap_label("Reading the hardware…", "hardwareDetails")
        self.details.setContentsMargins(22, 0, 0, 6)
        v.addWidget(self.details)
        row = QHBoxLayout()
        self.other = with_tip(QRadioButton("Plan for &another GPU:"), "other_gpu")
        self.gpu_list = with_tip(QComboBox(), "gpu_list")
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
        self.note = wrap_label(name="hardwareNote")
        v.addWidget(self.note)
        v.addStretch(1)
        group = QButtonGroup(self)
        group.addButton(self.this_machine)
        group.addButton(self.other)
        self.speed_done = False  # the speed figures were measured (or could not be)
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
            colored(self.details, f"The hardware could not be read: {exc}", BAD)
            return
        self.wiz.machine = machine
        self.details.setText(describe_machine(machine) + "\nMeasuring memory bandwidth and FLOP/s (once)…")
        self._update()
        try:  # the speed model's figures: measured once per machine (a few seconds), then cached
            self.wiz.speed_machine = await self.wiz.measure_machine()
        except TaskFailed as exc:
            self.wiz.speed_machine = None
            self.details.setText(describe_machine(machine) + f"\nSpeed cannot be predicted: {exc}")
        else:
            self.details.setText(describe_machine(machine, self.wiz.speed_machine))
        self.speed_done = True
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
        emit(self.completeChanged)

    def chosen_target(self) -> Optional[Target]:
        if self.other.isChecked():
            return detect_target(gpu=self.gpu_list.currentData())
        return self.wiz.machine.target if self.wiz.machine else None

    def isComplete(self):  # noqa: N802
        return self.other.isChecked() or (self.wiz.machine is not None and self.speed_done)

    def validatePage(self):  # noqa: N802
        self.wiz.target = self.chosen_target()
        on_this = self.this_machine.isChecked() and self.wiz.machine is not None
        self.wiz.correction = self.wiz.machine.correction_bytes if on_this else 0
        return True


def describe_machine(m, speed=None) -> str:
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
    if speed is not None:
        flops = f" and {speed.flops / 1e9:,.0f} GFLOP/s" if speed.flops else ""
        lines.append(
            f"Measured here: {speed.bandwidth_bytes_per_s / 1e9:.1f} GB/s of memory bandwidth{flops} "
            "(what the speed predictions start from)."
        )
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
