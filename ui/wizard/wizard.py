"""The model configuration wizard: from "I have this model" to "it is loaded with the best configuration".

Model → hardware → a memory and speed estimate per precision with the row the user's priority suggests →
optional speculative decoding (with the predicted speed-up) → load (through the window's own load path, so
the chat ends up with the model) with predicted vs measured memory → save as a preset.

The wizard is opened with ``open()`` (window-modal, never a nested event loop) and talks to the
engine only through the window's ``EngineBridge`` (its questions are ``redline.inference`` jobs). Its host (the
window's model controller) provides: ``settings``, ``settings_values()``, ``configure(values) -> awaitable
LoadReport | None``, ``last_load_error``, ``cancel_load()`` and the ``load_progress(float, str)`` signal.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QWizard

from ...inference import (
    DEFAULT_PRIORITY,
    Planner,
    SpeedCalibration,
    SpeedModel,
    acceptance_job,
    card_machine,
    describe_job,
    hardware_job,
    machine_job,
    pair_job,
    parse_precision,
)
from ..bridge import EngineBridge
from ..protocols import PresetStoreLike
from .config_page import ConfigPage
from .draft_page import DraftPage
from .hardware_page import HardwarePage
from .load_page import LoadPage
from .model_page import ModelPage
from .preset_page import PresetPage

MODEL_PAGE, HARDWARE_PAGE, CONFIG_PAGE, DRAFT_PAGE, LOAD_PAGE, PRESET_PAGE = range(6)


class ConfigWizard(QWizard):
    preset_saved = Signal(str)

    def __init__(self, bridge: EngineBridge, host: Any, presets: Optional[PresetStoreLike], parent=None):
        super().__init__(parent)
        self.bridge, self.host, self.presets = bridge, host, presets
        self.setObjectName("configWizard")
        self.setWindowTitle("Configure model")
        self.setWizardStyle(QWizard.ClassicStyle)  # the same look on every platform (and offscreen)
        self.setOption(QWizard.NoBackButtonOnLastPage, False)
        self.setWindowModality(Qt.WindowModal)
        self.resize(960, 620)
        # What the pages decide, in order.
        self.model = None  # inference.sources.describe.ModelDescription
        self.machine = None  # redline.inference.MachineInfo
        self.target = None  # inference.memory.fit.Target planned for
        self.correction = 0
        self.speed_machine = None  # redline.inference.Machine: this machine's measured bandwidth and FLOP/s
        self.calibration = SpeedCalibration()  # the speed factors learned on this machine (read once)
        self.priority = getattr(host.settings, "priority", DEFAULT_PRIORITY)
        self.plain_strategy = "kv"  # the fastest strategy for the precision chosen on page 3
        self.found_precision: Optional[tuple[str, str]] = None  # (model, precision) the model browser fetched
        self.precision: Optional[str] = None
        self.context: Optional[int] = None
        self.batch = 1
        self.kv = getattr(host.settings, "kv_cache", "bf16")  # the KV cache's form (Settings → KV cache)
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
        return self.bridge.run(describe_job(spec))

    def probe_hardware(self):
        return self.bridge.run(hardware_job())

    def check_pair(self, target_spec: str, draft_spec: str):
        return self.bridge.run(pair_job(target_spec, draft_spec))

    def measure_machine(self):
        return self.bridge.run(machine_job())

    def measure_acceptance(self, draft_spec: str, draft_precision: str, k: int):
        return self.bridge.run(acceptance_job(self.model.spec, self.precision, draft_spec, draft_precision, k))

    def speed_model(self) -> Optional[SpeedModel]:
        """Predictions for where the wizard plans: this machine (its measured figures and what it learned), or a
        card from the built-in list (its published bandwidth; nothing learned applies)."""
        t = self.target
        if t is not None and t.calibration_key is None and t.bandwidth_gb_s:
            return SpeedModel(card_machine(t.label.removeprefix("an "), t.bandwidth_gb_s), self.calibration)
        if self.speed_machine is None:
            return None
        return SpeedModel(self.speed_machine, self.calibration)

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
            priority=self.priority,
            kv_cache=self.kv,
            draft_model=self.draft_model,
            draft_precision=self.draft_precision,
            num_draft_tokens=self.num_draft_tokens,
        )
        return values

    def planned_total(self) -> Optional[int]:
        """The configuration page's prediction for what was chosen (with the draft, if any)."""
        if self.model is None or self.target is None or not self.precision:
            return None

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
            self.kv,
        )
        return planner.estimate(parse_precision(self.precision), self.context).total_bytes

    async def load(self):
        """Load through the window; returns (LoadReport, None) or (None, the reason)."""
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
