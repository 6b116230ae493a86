"""The model configuration wizard: from "I have this model" to "it is loaded with the best configuration".

Model → hardware → a memory estimate per precision with the suggested row → optional speculative
decoding → load (through the window's own load path, so the chat ends up with the model) with
predicted vs measured memory → save as a preset.

The wizard is opened with ``open()`` (window-modal, never a nested event loop) and talks to the
engine only through the window's ``EngineClient``. Its host (the main window) provides:
``settings``, ``settings_values()``, ``configure(values) -> awaitable ModelInfo | None``,
``last_load_error``, ``cancel_load()`` and the ``load_progress(float, str)`` signal.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QWizard

from redline.inference import parse_precision
from redline.ui.engine_client import EngineClient, describe_task, hardware_task, pair_task
from redline.ui.protocols import PresetStoreLike
from redline.ui.wizard.config_page import ConfigPage
from redline.ui.wizard.draft_page import DraftPage
from redline.ui.wizard.hardware_page import HardwarePage
from redline.ui.wizard.load_page import LoadPage
from redline.ui.wizard.model_page import ModelPage
from redline.ui.wizard.preset_page import PresetPage

MODEL_PAGE, HARDWARE_PAGE, CONFIG_PAGE, DRAFT_PAGE, LOAD_PAGE, PRESET_PAGE = range(6)


class ConfigWizard(QWizard):
    preset_saved = Signal(str)

    def __init__(self, client: EngineClient, host: Any, presets: Optional[PresetStoreLike], parent=None):
        super().__init__(parent)
        self.client, self.host, self.presets = client, host, presets
        self.setObjectName("configWizard")
        self.setWindowTitle("Configure model")
        self.setWizardStyle(QWizard.ClassicStyle)  # the same look on every platform (and offscreen)
        self.setOption(QWizard.NoBackButtonOnLastPage, False)
        self.setWindowModality(Qt.WindowModal)
        self.resize(820, 600)
        # What the pages decide, in order.
        self.model = None  # inference.sources.describe.ModelDescription
        self.machine = None  # engine_client.MachineInfo
        self.target = None  # inference.memory.fit.Target planned for
        self.correction = 0
        self.precision: Optional[str] = None
        self.context: Optional[int] = None
        self.batch = 1
        self.strategy = host.settings.strategy
        self.draft_model = host.settings.draft_model
        self.draft_precision = host.settings.draft_precision
        self.num_draft_tokens = host.settings.num_draft_tokens
        self._busy = False

        self.model_page = ModelPage(self)
        self.hardware_page = HardwarePage(self)
        self.config_page = ConfigPage(self)
        self.draft_page = DraftPage(self)
        self.load_page = LoadPage(self)
        self.preset_page = PresetPage(self)
        for pid, page in enumerate(
            (self.model_page, self.hardware_page, self.config_page, self.draft_page, self.load_page, self.preset_page)
        ):
            self.setPage(pid, page)
        self.setButtonText(QWizard.FinishButton, "&Finish")

    # -- engine-thread questions ------------------------------------------------
    def describe(self, spec: str):
        return self.client.run(describe_task(spec))

    def probe_hardware(self):
        return self.client.run(hardware_task())

    def check_pair(self, target_spec: str, draft_spec: str):
        return self.client.run(pair_task(target_spec, draft_spec))

    # -- decisions ----------------------------------------------------------------
    def model_changed(self) -> None:
        """A different model: the context chosen for the previous one no longer applies."""
        self.context = None

    def settings_values(self) -> dict:
        """The window's settings with what the wizard chose."""
        values = dataclasses.asdict(self.host.settings)
        values.update(
            model=self.model.spec,
            precision=self.precision,
            context_length=self.context,
            strategy=self.strategy,
            draft_model=self.draft_model,
            draft_precision=self.draft_precision,
            num_draft_tokens=self.num_draft_tokens,
        )
        return values

    def planned_total(self) -> Optional[int]:
        """The configuration page's prediction for what was chosen (with the draft, if any)."""
        if self.model is None or self.target is None or not self.precision:
            return None
        from redline.inference import Planner

        draft = (
            self.draft_page.draft_desc.shape
            if (self.strategy == "speculative" and self.draft_page.draft_desc)
            else None
        )
        planner = Planner(
            self.model.shape,
            self.target,
            self.batch,
            draft,
            parse_precision(self.draft_precision) if draft else None,
            self.correction,
        )
        return planner.estimate(parse_precision(self.precision), self.context).total_bytes

    async def load(self):
        """Load through the window; returns (ModelInfo, None) or (None, the reason)."""
        info = await self.host.configure(self.settings_values())
        return info, (None if info is not None else self.host.last_load_error)

    # -- while loading, Back is off and Cancel cancels the load --------------------
    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.button(QWizard.BackButton).setEnabled(not busy)

    def reject(self) -> None:
        if self._busy:
            self.load_page.cancel()
        super().reject()
