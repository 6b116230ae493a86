"""The wizard's first page: which model, checked (it exists, it can be read) before the user goes on."""

from __future__ import annotations

from PySide6.QtWidgets import QPushButton, QVBoxLayout, QWizardPage
from qasync import asyncSlot

from ..bridge import TaskFailed
from ..models.dialog import ModelsDialog
from ..signals import emit
from .labels import BAD, CLOSE, OK, colored, wrap_label
from .model_picker import CheckedPicker, ModelPicker


class ModelPage(QWizardPage, CheckedPicker):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Model")
        self.setSubTitle("Which model do you want to chat with? Anything you choose is checked before you go on.")
        v = QVBoxLayout(self)
        self.picker = ModelPicker(wizard.presets.recent_models() if wizard.presets else [])
        v.addWidget(self.picker)
        self.find_button = QPushButton("Find a model on the hub…")
        self.find_button.setToolTip(
            "Search the hub for models Redline can run; every file of a model is predicted here (memory, fit, "
            "speed) before anything downloads."
        )
        self.find_button.clicked.connect(self.find_model)
        v.addWidget(self.find_button)
        self.status = wrap_label(name="modelStatus")
        self.availability = wrap_label(name="modelAvailability")
        v.addWidget(self.status)
        v.addWidget(self.availability)
        v.addStretch(1)
        self.desc = None
        self._setup_check(self.picker, self.status)
        self.picker.set_spec(wizard.host.settings.model)

    def find_model(self):
        """The model browser; what is fetched (or picked from the library) becomes the choice, checked as typed."""

        settings = self.wiz.host.settings
        recent = self.wiz.presets.recent_models() if self.wiz.presets else []
        self.browser = ModelsDialog(self, getattr(settings, "priority", "balanced"), recent)
        self.browser.chosen.connect(lambda model, precision, _strategy: self._found(model, precision))
        self.browser.open()
        return self.browser

    def _found(self, model: str, precision: str = "") -> None:
        # The precision the browser predicted for it (and fetched it for) becomes the configuration page's row,
        # as if the user had picked it there; choosing another model there forgets it.
        self.wiz.found_precision = (model, precision) if precision else None
        self.picker.set_spec(model)
        emit(self.picker.changed)

    def initializePage(self):  # noqa: N802
        if self.desc is None:
            self._schedule()

    def _on_invalidated(self) -> None:
        self.desc = None
        self.availability.setText("")
        emit(self.completeChanged)

    @asyncSlot()
    async def check(self) -> None:
        spec, token = self.picker.spec(), self._token
        if not spec:
            colored(self.status, "Choose a model above.")
            return
        colored(self.status, f"Checking {spec}…")
        try:
            desc = await self.wiz.describe(spec)
        except TaskFailed as exc:
            if token == self._token:
                colored(self.status, f"This model cannot be used: {exc}", BAD)
            return
        if token != self._token:
            return
        self.desc = desc
        colored(self.status, "✓ " + desc.summary(), OK)
        colored(self.availability, desc.availability(), None if desc.loadable else CLOSE)
        emit(self.completeChanged)

    def isComplete(self):  # noqa: N802
        return self.desc is not None

    def validatePage(self):  # noqa: N802
        if self.wiz.model is None or self.wiz.model.spec != self.desc.spec:
            self.wiz.model_changed()
        self.wiz.model = self.desc
        return True
