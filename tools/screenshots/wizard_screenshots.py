"""Save PNGs of each page of the configuration wizard, run for real on the starter model.

Run with `make screenshots` (or `python tools/screenshots/wizard_screenshots.py`). A throwaway profile, the Qt
offscreen platform unless DISPLAY is set. Before the wizard opens, the speed lab runs four
configurations of the starter once, so the speed column shows what this machine measured beside what it
predicts. The speculative page pairs the starter with a one-layer random draft built here from the
starter's own tokenizer (a real tokenizer check, not a useful draft) and measures its acceptance; the
"does not fit" page uses Llama-3-8B's config.json alone, planned for an RTX 4060 Ti 8GB.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for gui_session (not a package)
from gui_session import OUT, ROOT, qt_app, settle, throwaway_profile, wait_until  # noqa: E402

LLAMA3_8B_CONFIG = ROOT / "tests" / "data" / "llama-3-8b-config.json"


def build_draft(starter: Path, dest: Path) -> Path:
    """One decoder layer on the starter's tokenizer: enough for the wizard's vocabulary check."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(starter)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(cfg).save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


def main() -> int:
    profile = throwaway_profile("redline-wizard-shots-")
    from PySide6.QtWidgets import QWizard

    from redline.app.gui import build_window
    from redline.inference.sources.starter import ensure_starter

    app = qt_app()  # noqa: F841 - the application must stay alive

    def shot(widget, name):
        OUT.mkdir(parents=True, exist_ok=True)
        settle(0.3)
        path = OUT / name
        widget.grab().save(str(path))
        print(f"saved {path.relative_to(ROOT)}")

    starter = ensure_starter()
    draft = build_draft(starter, profile / "draft-1-layer")
    big = profile / "Meta-Llama-3-8B"
    big.mkdir()
    shutil.copy(LLAMA3_8B_CONFIG, big / "config.json")

    window = build_window()
    window.resize(1280, 800)
    window.show()
    window.start()  # no model yet: the starter offer, with "Configure model…"
    shot(window, "wizard-0-empty-state.png")

    # Measure a few configurations once (the speed lab), so the wizard's speed column has "measured here".
    tabs = window.tabs
    titles = [tabs.tabText(i) for i in range(tabs.count())]
    lab = tabs.widget(titles.index("Speed lab")).ensure_built()
    lab.configs_edit.setText("kv:fp32,kv:bf16,fast:q8,fast:q4")
    lab.new_tokens_spin.setValue(32)
    lab.warmup_spin.setValue(0)
    lab.samples_spin.setValue(1)
    measured = []
    lab.run_finished.connect(measured.append)
    lab.start()
    wait_until(lambda: measured, what="the speed lab's run")
    tabs.setCurrentIndex(0)

    wiz = window.open_wizard()
    wait_until(wiz.model_page.isComplete)
    shot(wiz, "wizard-1-model.png")
    wiz.next()
    wait_until(lambda: wiz.machine is not None and wiz.hardware_page.speed_done)
    shot(wiz, "wizard-2-hardware.png")
    wiz.next()
    wiz.config_page.context.setValue(4096)
    shot(wiz, "wizard-3-configuration.png")
    wiz.next()
    dp = wiz.draft_page
    dp.speculative.setChecked(True)
    dp.picker.folder.setText(str(draft))
    dp.picker._edited("folder")
    wait_until(dp.isComplete)
    wait_until(dp.measure_button.isEnabled)
    dp.measure_button.click()  # a real acceptance run: this random draft is accepted almost never
    wait_until(lambda: not dp.measuring and "Measured:" in dp.speed.text(), what="the acceptance run")
    shot(wiz, "wizard-4-speculative.png")
    dp.none.setChecked(True)
    loaded = []
    window.model_loaded.connect(loaded.append)
    wiz.next()
    wait_until(lambda: wiz.load_page.isComplete() or wiz.load_page.retry_button.isVisible())
    if not loaded:
        print(f"the starter did not load: {wiz.load_page.result.text()}", file=sys.stderr)
        return 1
    shot(wiz, "wizard-5-load.png")
    info = loaded[0]
    print(f"predicted {info.predicted_bytes / 1e6:.0f} MB, measured {info.measured_bytes / 1e6:.0f} MB")
    wiz.next()
    shot(wiz, "wizard-6-preset.png")
    wiz.button(QWizard.FinishButton).click()
    settle(0.3)

    # The "does not fit" path: an 8B model's config, planned for an 8 GB card.
    wiz = window.open_wizard()
    mp = wiz.model_page
    mp.picker.folder.setText(str(big))
    mp.picker._edited("folder")
    wait_until(mp.isComplete)
    wiz.next()
    wait_until(lambda: wiz.machine is not None and wiz.hardware_page.speed_done)
    hw = wiz.hardware_page
    hw.gpu_list.setCurrentIndex(hw.gpu_list.findData("RTX 4060 Ti 8GB"))
    wiz.next()
    shot(wiz, "wizard-3-does-not-fit.png")
    wiz.reject()

    dialog = window.preset_actions.manage()
    shot(dialog, "wizard-presets-dialog.png")
    dialog.reject()
    window.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
