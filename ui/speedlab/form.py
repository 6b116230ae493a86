"""The speed lab's setup form: the model, the configurations (``configs.ConfigEditor``), the baseline, the prompt
set, the lengths and counts (with the textbook protocol's), the optional batch sweep — and the run they make
(``build_spec``)."""

from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from ...inference import SEED_PRESET, BenchSpec, RedlineError, builtin_prompt_sets, load_prompt_set
from .configs import ConfigEditor


class SetupForm(QWidget):
    """``rows``: the configurations' text to start with; ``presets``: () -> saved presets, for "my presets";
    ``device``: () -> the engine's device, for the ladder; ``server_keys``: ``.get(url)`` → the API key saved for a
    server (remote:URL rows), or None."""

    def __init__(
        self,
        model: str,
        rows: str,
        presets: Optional[Callable[[], list]] = None,
        device: Callable[[], str] = lambda: "cpu",
        server_keys=None,
        parent: Optional[QWidget] = None,
    ):
        super().__init__(parent)
        self.server_keys = server_keys
        form = QFormLayout(self)
        self.model_edit = QLineEdit(model)
        self.model_edit.setToolTip("starter, a model folder, a .gguf file or a hub id")
        self.configs_editor = ConfigEditor(rows, presets)
        self.configs_editor.model = self.model
        self.configs_editor.device = device
        self.configs_edit = self.configs_editor.text_edit  # the text form (advanced), in step with the rows
        self.baseline_spin = QSpinBox(minimum=1, maximum=64, value=1)
        self.baseline_spin.setToolTip("Which configuration (1 = first) the others are compared with")
        self.prompts_combo = QComboBox(editable=True)
        self.prompts_combo.addItems(builtin_prompt_sets())
        self.prompts_combo.setCurrentText("short" if "short" in builtin_prompt_sets() else "")
        self.prompts_combo.setToolTip("A built-in prompt set, or the path of your own JSON prompt set")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse_prompts)
        prompts_row = QHBoxLayout()
        prompts_row.addWidget(self.prompts_combo, 1)
        prompts_row.addWidget(browse)
        self.new_tokens_spin = QSpinBox(minimum=1, maximum=8192, value=64)
        self.warmup_spin = QSpinBox(minimum=0, maximum=1000, value=1)
        self.samples_spin = QSpinBox(minimum=1, maximum=1000, value=3)
        self.seed_spin = QSpinBox(minimum=0, maximum=2**31 - 1, value=0)
        preset = QPushButton(f"Textbook protocol ({SEED_PRESET['warmup']} warm-up / {SEED_PRESET['samples']} samples)")
        preset.setToolTip(
            f"The textbook measurement protocol: {SEED_PRESET['warmup']} warm-up runs, then "
            f"{SEED_PRESET['samples']} measured samples per prompt and configuration (slow; steadier figures)"
        )
        preset.clicked.connect(self.apply_textbook_protocol)
        self.protocol_button = preset
        counts = QHBoxLayout()
        for text, w in (
            ("new tokens", self.new_tokens_spin),
            ("warm-up", self.warmup_spin),
            ("samples", self.samples_spin),
            ("seed", self.seed_spin),
        ):
            counts.addWidget(QLabel(text))
            counts.addWidget(w)
        counts.addStretch(1)
        protocol_row = QHBoxLayout()  # a row of its own: beside the counts it made the form 920 px wide
        protocol_row.addWidget(preset)
        protocol_row.addStretch(1)
        self.sweep_edit = QLineEdit()
        self.sweep_edit.setPlaceholderText("e.g. 1,2,4,8 — batch sweep of the baseline configuration (optional)")
        form.addRow("Model", self.model_edit)
        form.addRow("Configurations", self.configs_editor)
        form.addRow("Baseline", self.baseline_spin)
        form.addRow("Prompt set", prompts_row)
        form.addRow("Lengths", counts)
        form.addRow("", protocol_row)
        form.addRow("Batch sweep", self.sweep_edit)

    def model(self) -> str:
        return self.model_edit.text().strip() or "starter"

    def prompt_set_name(self) -> str:
        return self.prompts_combo.currentText().strip() or "short"

    def apply_textbook_protocol(self) -> None:
        """The textbook protocol's counts (``SEED_PRESET``): many warm-up runs and samples, for steady figures."""
        self.warmup_spin.setValue(SEED_PRESET["warmup"])
        self.samples_spin.setValue(SEED_PRESET["samples"])

    def _browse_prompts(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Prompt set", "", "Prompt sets (*.json)")
        if path:
            self.prompts_combo.setCurrentText(path)

    def build_spec(self) -> BenchSpec:
        """The run the form describes; raises the form's first error (a row, the prompt set, the sweep)."""
        configs = self.configs_editor.validated()
        sweep = []
        if self.sweep_edit.text().strip():
            try:
                sweep = [int(s) for s in self.sweep_edit.text().split(",") if s.strip()]
            except ValueError:
                raise RedlineError("Batch sizes must be whole numbers, e.g. 1,2,4,8.") from None
        return BenchSpec(
            model=self.model(),
            configs=configs,
            prompts=load_prompt_set(self.prompt_set_name()),
            new_tokens=self.new_tokens_spin.value(),
            warmup=self.warmup_spin.value(),
            samples=self.samples_spin.value(),
            seed=self.seed_spin.value(),
            baseline=self.baseline_spin.value() - 1,
            batch_sizes=sweep,
            server_keys=self._keys_for(configs),
        )

    def _keys_for(self, configs) -> dict:
        """The saved API key of each server a remote:URL row names."""
        keys = {}
        for c in configs:
            if c.remote and self.server_keys is not None:
                base = c.server.partition("#")[0].rstrip("/")
                key = self.server_keys.get(c.server)
                if key:
                    keys[base] = key
        return keys

    def generations_per_row(self) -> int:
        """What one row runs: its warm-up runs, then each sample of each prompt (as ``run_bench`` does)."""
        try:
            prompts = len(load_prompt_set(self.prompt_set_name()).prompts)
        except RedlineError:
            prompts = 1
        return self.warmup_spin.value() + self.samples_spin.value() * max(1, prompts)

    def prompt_tokens_guess(self) -> int:
        """The first prompt's length before its tokenizer is at hand: about 4 characters a token, plus the chat
        template's few tokens. (Each row's own prediction, made when it runs, uses the real count.)"""
        try:
            prompt = load_prompt_set(self.prompt_set_name()).prompts[0]
        except (RedlineError, IndexError):
            return 64
        return max(1, sum(len(str(m.get("content", ""))) for m in prompt.messages) // 4 + 16)
