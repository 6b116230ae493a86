"""Help → About Redline: the version, the libraries it runs on, the GPU, where its files live, the licence.

Everything a bug report needs, with a button that copies it as text. The paths are handed in by the
application (ui never imports app). Library versions come from the installed packages' metadata, so
opening the dialog imports nothing heavy; the GPU and torch's CUDA build need torch, so they are read by
``probe_hardware()`` on a worker thread and filled in when ready.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Optional, Union

from PySide6.QtCore import Qt, qVersion
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

from ..inference import format_bytes, probe_machine, torch_cuda_build
from .style import app_icon

PENDING = "detecting…"
# (label, distribution names to try): read from package metadata, never by importing the package.
LIBRARIES = (
    ("PySide6", ("PySide6-Essentials", "PySide6")),
    ("torch", ("torch",)),
    ("transformers", ("transformers",)),
    ("bitsandbytes", ("bitsandbytes",)),
    ("accelerate", ("accelerate",)),
)


@dataclass(frozen=True)
class AboutInfo:
    """What the application knows about itself; built by the app and handed to the window."""

    version: str
    licence: str
    paths: tuple[tuple[str, str], ...] = ()  # (what, where), e.g. ("Conversations", ".../conversations.sqlite3")


@dataclass
class HardwareSummary:
    cuda_build: Optional[str]  # the CUDA version torch was built for; None for a CPU-only torch
    cuda_available: bool
    gpus: list[str] = field(default_factory=list)  # "NVIDIA GeForce RTX 4090 · 25.8 GB"
    cpu: str = ""
    ram: str = ""


def library_versions() -> list[tuple[str, str]]:
    rows = [("Python", platform.python_version())]
    for label, dists in LIBRARIES:
        found = "not installed"
        for dist in dists:
            try:
                found = version(dist)
                break
            except PackageNotFoundError:
                continue
        if label == "PySide6":
            found = f"{found} (Qt {qVersion()})"
        rows.append((label, found))
    return rows


def probe_hardware() -> HardwareSummary:
    """Reads the GPUs (NVML, then torch) and torch's CUDA build. Imports torch: never on the UI thread."""

    info = probe_machine()
    return HardwareSummary(
        cuda_build=torch_cuda_build(),
        cuda_available=info.cuda_available,
        gpus=[f"{g.name} · {format_bytes(g.total_bytes)}" for g in info.gpus],
        cpu=f"{info.cpu} · {info.cpu_cores} threads",
        ram=format_bytes(info.ram_total_bytes),
    )


class AboutDialog(QDialog):
    def __init__(self, info: AboutInfo, parent=None):
        super().__init__(parent)
        self.info = info
        self.setWindowTitle("About Redline")
        self.setWindowIcon(app_icon())
        self.setMinimumWidth(560)
        v = QVBoxLayout(self)

        head = QHBoxLayout()
        logo = QLabel()
        logo.setPixmap(app_icon().pixmap(64, 64))
        head.addWidget(logo)
        title = QLabel(
            f"<b style='font-size:18px'>Redline {info.version}</b><br>"
            "Chat with local models, and see, measured, why it is fast."
        )
        title.setObjectName("aboutTitle")
        head.addWidget(title, 1)
        v.addLayout(head)

        self.form = QFormLayout()
        self.values: dict[str, QLabel] = {}
        self._add("Version", info.version)
        self._add("Licence", info.licence)
        for label, value in library_versions():
            self._add(label, value)
        for label in ("CUDA (torch build)", "GPU", "CPU", "RAM", "CPU kernels"):
            self._add(label, PENDING)
        for label, path in info.paths:
            self._add(label, path)
        v.addLayout(self.form)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_button = QPushButton("Copy details")
        self.copy_button.setToolTip("Copy everything above as text, e.g. for a bug report")
        self.copy_button.clicked.connect(self.copy_details)
        buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        v.addWidget(buttons)

    def _add(self, label: str, value: str) -> None:
        field_label = QLabel(value)
        field_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        field_label.setWordWrap(True)
        self.values[label] = field_label
        self.form.addRow(f"{label}:", field_label)

    def value(self, label: str) -> str:
        return self.values[label].text()

    def set_hardware(self, hw: Union[HardwareSummary, BaseException]) -> None:
        """Fill in the GPU rows from ``probe_hardware()``, or say why they could not be read."""
        if isinstance(hw, BaseException):
            reason = f"unknown ({type(hw).__name__}: {hw})"
            for label in ("CUDA (torch build)", "GPU", "CPU", "RAM"):
                self.values[label].setText(reason)
            return
        cuda = f"CUDA {hw.cuda_build}" if hw.cuda_build else "none: this torch is a CPU-only build"
        if hw.cuda_build and not hw.cuda_available:
            cuda += " (no usable GPU found by torch)"
        self.values["CUDA (torch build)"].setText(cuda)
        self.values["GPU"].setText("; ".join(hw.gpus) if hw.gpus else "none found: models run on the CPU")
        self.values["CPU"].setText(hw.cpu)
        self.values["RAM"].setText(hw.ram)

    def set_kernels(self, report) -> None:
        """Whether Redline's CPU kernels run here (``redline.inference.KernelsReport``): when they cannot, why,
        what it costs (the speed model's prediction with and without them) and how to fix it."""
        if isinstance(report, BaseException):
            self.values["CPU kernels"].setText(f"unknown ({report})")
            return
        if report.on:
            self.values["CPU kernels"].setText(
                "not used: this model runs on the GPU" if report.device.startswith("cuda") else report.text
            )
            return
        self.values["CPU kernels"].setText(report.sentence())

    def details(self) -> str:
        return "\n".join(f"{label}: {w.text()}" for label, w in self.values.items())

    def copy_details(self) -> None:
        QGuiApplication.clipboard().setText(self.details())
