"""Settings: model, precision, strategy, what auto favours, draft, lengths and sampling.

The panel edits a copy; "Apply" hands a new settings object to the window,
which saves it and reloads the model when the change needs that. The panel
says beforehand whether applying will reload.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..inference import MB, PRECISIONS, PRIORITIES, PRIORITY_LABELS, REASONING_EFFORTS, STRATEGIES
from .signals import emit

MIXED_EXAMPLE = "nf4+keep=lm_head"  # a mixed precision: nf4, with the output layer left unquantised
PRECISION_CHOICES = ("auto", *PRECISIONS, MIXED_EXAMPLE)  # the box is editable: any other mix can be typed
FIRST_STRATEGIES = (
    "auto",
    "kv",
    "fast",
)  # the ones most people want, listed first; then the rest in the engine's order
STRATEGY_CHOICES = FIRST_STRATEGIES + tuple(s for s in STRATEGIES if s not in FIRST_STRATEGIES)
DEFAULT_TEXT = "model default"


def _optional_double(lo, hi, step, decimals=2) -> QDoubleSpinBox:
    """The minimum stands for "not set" (the model's own default)."""
    box = QDoubleSpinBox()
    box.setRange(lo - step, hi)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    box.setSpecialValueText(DEFAULT_TEXT)
    return box


def _optional_int(lo, hi, special=DEFAULT_TEXT) -> QSpinBox:
    box = QSpinBox()
    box.setRange(lo - 1, hi)
    box.setSpecialValueText(special)
    return box


THEME_LABELS = {"system": "Follow the system", "light": "Light", "dark": "Dark"}


class SettingsPanel(QWidget):
    applied = Signal(object)  # the new settings object
    wizard_requested = Signal()
    theme_chosen = Signal(str)  # the window's theme, applied at once (no Apply): "system", "light" or "dark"

    def __init__(self, settings: Any, parent=None):
        super().__init__(parent)
        self.setObjectName("settingsPanel")
        self.current = settings
        outer = QVBoxLayout(self)
        form = QFormLayout()
        outer.addLayout(form)

        # Presets fill every field below; Apply loads them. The wizard makes new ones.
        self._presets: list = []
        self.preset = QComboBox()
        self.preset.setToolTip(
            "A saved configuration (model, precision, context, strategy, draft, sampling): "
            "choosing one fills the fields; Apply loads it"
        )
        self.preset.activated.connect(self._preset_chosen)
        self.wizard_button = QToolButton()
        self.wizard_button.setText("Wizard…")
        self.wizard_button.setToolTip(
            "Configure model…: choose a model, see what fits your memory, load it and save a preset (Ctrl+Shift+M)"
        )
        self.wizard_button.clicked.connect(self.wizard_requested)
        preset_row = QWidget()
        ph = QHBoxLayout(preset_row)
        ph.setContentsMargins(0, 0, 0, 0)
        ph.addWidget(self.preset, 1)
        ph.addWidget(self.wizard_button)
        form.addRow("Preset", preset_row)
        self.set_presets([])
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.addItem("starter")
        self.model.setToolTip("'starter', a model folder, a .gguf file or a hub id (owner/name)")
        form.addRow("Model", self._with_browse(self.model))
        self.precision = self._combo(PRECISION_CHOICES, editable=True)
        self.precision.setToolTip(
            "auto = the fastest precision that fits this machine for the priority below (predicted from this "
            "machine's measurements); mixed precision: e.g. nf4+keep=lm_head"
        )
        form.addRow("Precision", self.precision)
        self.strategy = self._combo(STRATEGY_CHOICES)
        self.strategy.setToolTip("auto = the fastest of kv and fast (and static on CUDA) for the precision")
        form.addRow("Strategy", self.strategy)
        self.priority = QComboBox()
        for key in PRIORITIES:
            self.priority.addItem(PRIORITY_LABELS[key], key)
        self.priority.setToolTip(
            "What auto favours. Quality first: the highest precision that fits (bf16, then int8, then nf4). "
            "Balanced: the fastest configuration that fits with 8-bit weights or more. Speed first: the fastest "
            "that fits, 4-bit weights included."
        )
        form.addRow("Auto favours", self.priority)
        self.draft_model = QComboBox()
        self.draft_model.setEditable(True)
        self.draft_model.addItems(["", "starter"])
        self.draft_model.setToolTip("A small model of the same family; used by the speculative strategy")
        form.addRow("Draft model", self._with_browse(self.draft_model))
        self.draft_precision = self._combo(PRECISION_CHOICES, editable=True)
        form.addRow("Draft precision", self.draft_precision)
        self.num_draft_tokens = QSpinBox()
        self.num_draft_tokens.setRange(1, 32)
        form.addRow("Draft tokens per step", self.num_draft_tokens)
        self.context_length = _optional_int(64, 1_048_576)
        self.context_length.setSingleStep(256)
        form.addRow("Context length", self.context_length)
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, 65536)
        form.addRow("Max new tokens", self.max_new_tokens)
        self.temperature = _optional_double(0.0, 2.0, 0.05)
        self.temperature.setToolTip("0 = greedy")
        form.addRow("Temperature", self.temperature)
        self.top_p = _optional_double(0.0, 1.0, 0.05)
        form.addRow("Top-p", self.top_p)
        self.top_k = _optional_int(0, 1000)
        form.addRow("Top-k", self.top_k)
        self.repetition_penalty = _optional_double(0.5, 3.0, 0.05)
        form.addRow("Repetition penalty", self.repetition_penalty)
        self.seed = _optional_int(0, 2_147_483_646, "random")
        form.addRow("Seed", self.seed)
        # A reasoning model's thinking (Qwen3, DeepSeek-R1, gpt-oss, Magistral): mapped to each model's own switch.
        self.thinking = self._combo(("auto", "on", "off"))
        self.thinking.setToolTip(
            "Whether a reasoning model thinks before it answers (auto: the model's own default). gpt-oss always "
            "thinks: off runs it at low effort. Models that do not reason ignore this."
        )
        form.addRow("Thinking", self.thinking)
        self.reasoning_effort = self._combo(("auto", *REASONING_EFFORTS))
        self.reasoning_effort.setToolTip("How hard it thinks, for models with effort levels (gpt-oss)")
        form.addRow("Reasoning effort", self.reasoning_effort)
        self.thinking_budget = QSpinBox()
        self.thinking_budget.setRange(0, 1_000_000)
        self.thinking_budget.setSingleStep(256)
        self.thinking_budget.setSuffix(" tokens")
        self.thinking_budget.setSpecialValueText("no limit")
        self.thinking_budget.setToolTip("After this many thinking tokens the thinking is closed and the answer follows")
        form.addRow("Thinking budget", self.thinking_budget)
        self.prefix_cache = QSpinBox()
        self.prefix_cache.setRange(0, 1_000_000)
        self.prefix_cache.setSingleStep(64)
        self.prefix_cache.setSuffix(" MB")
        self.prefix_cache.setSpecialValueText("off")
        self.prefix_cache.setToolTip(
            "KV cache kept of earlier turns and shared prompts, so the next turn reads only the new message "
            "(within the memory the KV cache may use); off reads the whole conversation at every turn"
        )
        form.addRow("Prefix cache", self.prefix_cache)
        self.kv_cache = QComboBox()
        self.kv_cache.addItem("bf16", "bf16")
        self.kv_cache.addItem("8-bit (q8)", "q8")
        self.kv_cache.setToolTip(
            "How the fast path keeps keys and values: bf16, or 8 bits with a scale per token and head (about half "
            "the memory per token, a little quality); applied by reloading the model"
        )
        form.addRow("KV cache", self.kv_cache)
        self.theme = QComboBox()
        for key, label in THEME_LABELS.items():
            self.theme.addItem(label, key)
        self.theme.setToolTip("The window's colours; Follow the system takes the desktop's light or dark scheme")
        self.theme.activated.connect(lambda _i: emit(self.theme_chosen, self.theme.currentData()))
        form.addRow("Theme", self.theme)

        self.reload_note = QLabel()
        self.reload_note.setObjectName("reloadNote")
        self.reload_note.setWordWrap(True)
        outer.addWidget(self.reload_note)
        row = QHBoxLayout()
        row.addStretch(1)
        self.revert_button = QPushButton("Revert")
        self.revert_button.clicked.connect(lambda: self.set_settings(self.current))
        self.apply_button = QPushButton("Apply")
        self.apply_button.setDefault(True)
        self.apply_button.clicked.connect(self.apply)
        row.addWidget(self.revert_button)
        row.addWidget(self.apply_button)
        outer.addLayout(row)
        outer.addStretch(1)

        self.current = None  # nothing shown yet: the first set_settings fills every field
        self.set_settings(settings)
        for w in (self.model, self.precision, self.strategy, self.priority, self.draft_model, self.draft_precision):
            w.currentTextChanged.connect(lambda _t: self._update_note())
        for w in (self.thinking, self.reasoning_effort, self.kv_cache):
            w.currentTextChanged.connect(lambda _t: self._update_note())
        for w in (
            self.num_draft_tokens,
            self.context_length,
            self.max_new_tokens,
            self.temperature,
            self.top_p,
            self.top_k,
            self.repetition_penalty,
            self.seed,
            self.prefix_cache,
            self.thinking_budget,
        ):
            w.valueChanged.connect(lambda _v: self._update_note())

    @staticmethod
    def _combo(items, editable=False) -> QComboBox:
        c = QComboBox()
        c.addItems(list(items))
        c.setEditable(editable)
        return c

    def _with_browse(self, combo: QComboBox) -> QWidget:
        w = QWidget()
        h = QHBoxLayout(w)
        h.setContentsMargins(0, 0, 0, 0)
        h.addWidget(combo, 1)
        folder = QToolButton()
        folder.setText("Folder…")
        folder.clicked.connect(lambda: self._browse(combo, folder=True))
        gguf = QToolButton()
        gguf.setText("GGUF…")
        gguf.clicked.connect(lambda: self._browse(combo, folder=False))
        h.addWidget(folder)
        h.addWidget(gguf)
        return w

    def _browse(self, combo: QComboBox, folder: bool) -> None:
        if folder:
            path = QFileDialog.getExistingDirectory(self, "Choose a model folder (with config.json)")
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF file", "", "GGUF files (*.gguf)")
        if path:
            combo.setCurrentText(path)

    # -- values -----------------------------------------------------------------
    def set_presets(self, presets: list) -> None:
        self._presets = list(presets)
        self.preset.clear()
        self.preset.addItem("(choose a preset)" if presets else "(none yet — the wizard saves them)")
        for p in self._presets:
            self.preset.addItem(p.name)
            self.preset.setItemData(self.preset.count() - 1, p.describe(), Qt.ToolTipRole)

    def _preset_chosen(self, index: int) -> None:
        if 1 <= index <= len(self._presets):
            self._fill(dataclasses.replace(self.current, **self._presets[index - 1].values))

    def set_settings(self, settings: Any) -> None:
        theme = getattr(settings, "theme", "system")
        self.theme.setCurrentIndex(max(0, self.theme.findData(theme)))
        if dataclasses.is_dataclass(self.current) and dataclasses.replace(self.current, theme=theme) == settings:
            self.current = settings  # only the theme changed (applied at once): edits not applied yet stay
            return
        self.current = settings
        self._fill(settings)

    def _fill(self, settings: Any) -> None:
        self.model.setCurrentText(settings.model or "starter")
        self.precision.setCurrentText(settings.precision)
        self.strategy.setCurrentText(settings.strategy)
        self.priority.setCurrentIndex(max(0, self.priority.findData(getattr(settings, "priority", "balanced"))))
        self.draft_model.setCurrentText(settings.draft_model or "")
        self.draft_precision.setCurrentText(settings.draft_precision)
        self.num_draft_tokens.setValue(settings.num_draft_tokens)
        self._set_opt(self.context_length, settings.context_length)
        self.max_new_tokens.setValue(settings.max_new_tokens)
        self._set_opt(self.temperature, settings.temperature)
        self._set_opt(self.top_p, settings.top_p)
        self._set_opt(self.top_k, settings.top_k)
        self._set_opt(self.repetition_penalty, settings.repetition_penalty)
        self._set_opt(self.seed, settings.seed)
        self.prefix_cache.setValue(round(getattr(settings, "prefix_cache_bytes", 256_000_000) / MB))
        self.kv_cache.setCurrentIndex(max(0, self.kv_cache.findData(getattr(settings, "kv_cache", "bf16"))))
        self.thinking.setCurrentText(getattr(settings, "thinking", "auto"))
        self.reasoning_effort.setCurrentText(getattr(settings, "reasoning_effort", "auto"))
        self.thinking_budget.setValue(getattr(settings, "thinking_budget", 0))
        self._update_note()

    @staticmethod
    def _set_opt(box, value) -> None:
        box.setValue(box.minimum() if value is None else value)

    @staticmethod
    def _get_opt(box) -> Optional[float]:
        return None if box.value() == box.minimum() else box.value()

    def values(self) -> dict:
        return {
            "model": self.model.currentText().strip() or None,
            "precision": self.precision.currentText().strip() or "auto",
            "strategy": self.strategy.currentText(),
            "priority": self.priority.currentData(),
            "draft_model": self.draft_model.currentText().strip() or None,
            "draft_precision": self.draft_precision.currentText().strip() or "auto",
            "num_draft_tokens": self.num_draft_tokens.value(),
            "context_length": self._get_opt(self.context_length),
            "max_new_tokens": self.max_new_tokens.value(),
            "temperature": self._get_opt(self.temperature),
            "top_p": self._get_opt(self.top_p),
            "top_k": self._get_opt(self.top_k),
            "repetition_penalty": self._get_opt(self.repetition_penalty),
            "seed": self._get_opt(self.seed),
            "prefix_cache_bytes": self._cache_bytes(),
            "kv_cache": self.kv_cache.currentData(),
            "thinking": self.thinking.currentText(),
            "reasoning_effort": self.reasoning_effort.currentText(),
            "thinking_budget": self.thinking_budget.value(),
        }

    def _cache_bytes(self) -> int:
        """The spin box's MB (decimal), or the exact bytes in use when the box still shows them."""
        current = getattr(self.current, "prefix_cache_bytes", 256_000_000)
        return current if self.prefix_cache.value() == round(current / MB) else self.prefix_cache.value() * MB

    def candidate(self) -> Any:
        return dataclasses.replace(self.current, **self.values())

    def _update_note(self) -> None:
        cand = self.candidate()
        if cand == self.current:
            self.reload_note.setText("")
            self.apply_button.setEnabled(False)
            return
        self.apply_button.setEnabled(True)
        if self.current.needs_reload(cand):
            self.reload_note.setText(
                "This change needs the model reloaded: Apply reloads it (progress shown above the chat)."
            )
        else:
            self.reload_note.setText("Applies to the next reply; no reload needed.")

    def apply(self) -> None:
        cand = self.candidate()
        emit(self.applied, cand)
