"""The wizard's last page: keep the configuration as a named preset."""

from __future__ import annotations

import dataclasses

from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QLineEdit, QVBoxLayout, QWizardPage

from ..signals import emit
from .labels import BAD, CLOSE, colored, wrap_label
from .tips import with_tip


class PresetPage(QWizardPage):
    def __init__(self, wizard):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Save as preset")
        self.setSubTitle("Keep this configuration under a name, to load it again in one step.")
        v = QVBoxLayout(self)
        self.save_box = with_tip(QCheckBox("&Save as a preset"), "save_preset")
        self.save_box.setChecked(wizard.presets is not None)
        self.save_box.setEnabled(wizard.presets is not None)
        v.addWidget(self.save_box)
        row = QHBoxLayout()
        name_label = QLabel("&Name:")
        self.name = with_tip(QLineEdit(), "preset_name")
        self.name.setObjectName("presetName")
        name_label.setBuddy(self.name)
        row.addWidget(name_label)
        row.addWidget(self.name, 1)
        v.addLayout(row)
        self.note = wrap_label(name="presetNote")
        v.addWidget(self.note)
        self.contents = wrap_label(name="presetContents")
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
            colored(self.note, "Nothing is saved; Finish closes the wizard.")
        elif not name:
            colored(self.note, "Type a name.", CLOSE)
        elif presets.get(name) is not None:
            colored(self.note, f"A preset named “{name}” exists; Finish replaces it.", CLOSE)
        else:
            colored(self.note, "Finish saves the preset.")

    def validatePage(self):  # noqa: N802
        presets = self.wiz.presets
        if presets is None or not self.save_box.isChecked():
            return True
        try:
            self.saved = presets.save(self.name.text(), dataclasses.asdict(self.wiz.host.settings))
        except ValueError as exc:  # PresetError: a name that cannot be used
            colored(self.note, str(exc), BAD)
            return False
        emit(self.wiz.preset_saved, self.saved.name)
        return True
