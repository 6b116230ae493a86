"""The configuration wizard, driven page by page: the starter end to end, the "does not fit" path,
rejected choices, a draft model's compatibility, tooltips."""

import dataclasses
import json
from pathlib import Path

import pytest
from gui_helpers import aloop, open_window, profile, write_settings  # noqa: F401 - fixtures
from PySide6.QtWidgets import QAbstractButton, QAbstractSpinBox, QComboBox, QLineEdit, QSlider, QTableWidget, QWizard

from redline.inference import PRECISIONS

pytestmark = pytest.mark.usefixtures("aloop", "profile")
LLAMA3_8B_CONFIG = Path(__file__).parent / "data" / "llama-3-8b-config.json"


def type_into(qtbot, edit, text):
    edit.clear()
    qtbot.keyClicks(edit, text)  # as a user types: the field's choice becomes the selected one


def next_page(qtbot, wiz, timeout=120_000):
    page = wiz.currentPage()
    qtbot.waitUntil(page.isComplete, timeout=timeout)
    current = wiz.currentId()
    wiz.next()
    assert wiz.currentId() == current + 1


@pytest.mark.starter
def test_wizard_end_to_end_on_starter(qtbot, starter_dir):
    window = open_window(qtbot)  # first start: no model, the starter offer
    [button] = [b for b in window.banner.buttons() if b.text() == "Configure model…"]
    button.click()
    wiz = window.wizard
    assert wiz.isVisible() and wiz.currentId() == 0

    page = wiz.model_page  # 1. model: the starter is preselected and checked off the UI thread
    assert page.picker.kind() == "starter"
    qtbot.waitUntil(page.isComplete, timeout=60_000)
    assert "SmolLM2-135M-Instruct" in page.status.text() and "135 M parameters" in page.status.text()
    assert "available offline" in page.availability.text()
    next_page(qtbot, wiz)

    hw = wiz.hardware_page  # 2. hardware: what this machine has
    qtbot.waitUntil(lambda: wiz.machine is not None, timeout=60_000)
    text = hw.details.text()
    assert "System RAM" in text and "CPU:" in text and "Planning with" in text
    assert ("No GPU" in text) == (not wiz.machine.hardware.gpus)
    next_page(qtbot, wiz)

    cfg = wiz.config_page  # 3. the table with the suggestion preselected, and one sentence why
    assert cfg.context.value() == 8192 and cfg.table.rowCount() == 8
    best = "bf16" if wiz.target.bf16 else "fp16"
    assert cfg.suggestion.precision == best  # the memory suggestion keeps today's order
    # Balanced (the default priority): the fastest predicted here that fits with 8-bit weights or more.
    choice = cfg.choice
    assert cfg.priority.currentData() == "balanced" and choice.fits
    assert choice.precision in ("fp32", best, "q8", "int8") and cfg.selected_precision() == choice.precision
    assert cfg.why.text().startswith(f"auto: {choice.strategy} · {choice.precision} — fastest that fits with 8-bit")
    speeds = [cfg.table.item(r, 8).text() for r in range(8)]
    assert all(t.startswith("≈ ") and " tok/s (" in t for t in speeds), speeds
    # The first token: a new prompt's, and a late turn's (the fast path reads only the new message there).
    firsts = {cfg.shown[r]: cfg.table.item(r, 9).text() for r in range(8)}
    assert all(t.startswith("≈ ") and " · next turn " in t for t in firsts.values()), firsts
    q8_turn, q8_first = cfg.turns["q8"], cfg.speeds["q8"]
    if q8_first.strategy == "fast":
        assert (
            q8_turn.cached_tokens > 0 and "from the prefix cache" in cfg.table.item(cfg.shown.index("q8"), 9).toolTip()
        )
    fastest = max(
        (c for c in choice.candidates if c.fits and c.precision in ("fp32", best, "q8", "int8")),
        key=lambda c: c.tokens_per_s,
    )
    assert (fastest.precision, fastest.strategy) == (choice.precision, choice.strategy)
    cfg.priority.setCurrentIndex(cfg.priority.findData("quality"))  # quality first: today's order
    assert cfg.selected_precision() == best and cfg.why.text().startswith(f"auto: {cfg.choice.strategy} · {best}")
    assert [cfg.table.item(r, 7).text() for r in range(8)].count("fits") >= 3
    kv_8k = cfg.table.item(0, 2).text()
    cfg.context.setValue(2048)  # live: the KV cache column follows the context
    assert cfg.table.item(0, 2).text() != kv_8k and cfg.slider.value() == 2048 // 256
    assert cfg.selected_precision() == best
    next_page(qtbot, wiz)

    assert wiz.draft_page.none.isChecked()  # 4. no draft
    with qtbot.waitSignal(window.model_loaded, timeout=300_000):
        next_page(qtbot, wiz)
    load = wiz.load_page  # 5. load through the window; predicted vs measured afterwards
    qtbot.waitUntil(load.isComplete, timeout=60_000)
    info = load.info
    assert window.loaded is info and info.precision == best and window.settings.context_length == 2048
    assert info.predicted_bytes > 0 and info.measured_bytes > 0
    err = 100 * (info.predicted_bytes - info.measured_bytes) / info.measured_bytes
    assert load.predicted.text().endswith(("MB", "GB")) and load.measured.text().endswith(("MB", "GB"))
    assert load.error.text() == f"{err:+.1f} %" and load.figures.isVisible()
    print(
        f"\nstarter {best} via the wizard: predicted {info.predicted_bytes / 1e6:.0f} MB, measured "
        f"{info.measured_bytes / 1e6:.0f} MB ({err:+.1f} %)"
    )
    next_page(qtbot, wiz)

    preset = wiz.preset_page  # 6. save as a preset
    assert preset.save_box.isChecked() and preset.name.text()
    type_into(qtbot, preset.name, "Starter 2k")
    wiz.button(QWizard.FinishButton).click()
    assert not wiz.isVisible()
    saved = window.presets.get("Starter 2k")
    doc = json.loads(saved.path.read_text(encoding="utf-8"))
    assert doc["settings"]["model"] == "starter" and doc["settings"]["context_length"] == 2048
    assert doc["settings"]["precision"] == best and doc["settings"]["priority"] == "quality"
    assert "Starter 2k" in [
        window.settings_panel.preset.itemText(i) for i in range(window.settings_panel.preset.count())
    ]
    window.shutdown()

    # After a restart with no model configured, the preset is listed and loads.
    write_settings()
    again = open_window(qtbot)
    again.preset_actions.fill_menu()
    [action] = [a for a in again.presets_menu.actions() if a.text() == "Starter 2k"]
    with qtbot.waitSignal(again.model_loaded, timeout=300_000):
        action.trigger()
    assert again.loaded.name == "SmolLM2-135M-Instruct" and again.loaded.precision == best
    assert again.settings.context_length == 2048
    again.shutdown()


def test_does_not_fit_names_the_fix(qtbot, tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(LLAMA3_8B_CONFIG.read_text(encoding="utf-8"), encoding="utf-8")
    window = open_window(qtbot)
    wiz = window.open_wizard()
    page = wiz.model_page
    type_into(qtbot, page.picker.folder, str(folder))
    assert page.picker.kind() == "folder"
    qtbot.waitUntil(page.isComplete, timeout=120_000)  # the meta-device count runs on the engine thread
    assert "8.03 B parameters" in page.status.text() and "no weight files" in page.availability.text()
    next_page(qtbot, wiz)

    hw = wiz.hardware_page
    qtbot.waitUntil(lambda: wiz.machine is not None, timeout=60_000)
    hw.gpu_list.setCurrentIndex(hw.gpu_list.findData("RTX 4060 Ti 8GB"))
    assert hw.other.isChecked() and "RTX 4060 Ti 8GB" in hw.note.text()
    next_page(qtbot, wiz)

    cfg = wiz.config_page
    assert cfg.context.value() == 8192
    assert all(cfg.table.item(r, 7).text() != "fits" for r in range(cfg.table.rowCount()))
    assert cfg.selected_row() is None and not cfg.isComplete()
    why = cfg.why.text()
    assert why.startswith("Nothing fits at 8192 tokens") and "RTX 4060 Ti 8GB" in why
    fix = cfg.fix_context
    assert fix and 256 <= fix < 8192 and f"With a context of {fix} tokens instead of 8192, nf4 fits." in why
    assert cfg.fix_button.isVisible() and str(fix) in cfg.fix_button.text()
    cfg.fix_button.click()  # the one change, applied
    assert cfg.context.value() == fix and cfg.selected_precision() == "nf4"
    assert cfg.table.item(PRECISIONS.index("nf4"), 7).text() == "fits" and cfg.why.text().startswith("nf4 fits with")
    assert cfg.isComplete() and not cfg.fix_button.isVisible()
    wiz.reject()
    window.shutdown()


def test_rejected_choices_draft_check_and_tooltips(
    qtbot, tmp_path, tiny_model_dir, tiny_draft_dir, tiny_other_tokenizer_dir
):
    window = open_window(qtbot)
    wiz = window.open_wizard()
    page = wiz.model_page
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    type_into(qtbot, page.picker.folder, str(empty))
    qtbot.waitUntil(lambda: "cannot be used" in page.status.text(), timeout=60_000)
    assert "no config.json" in page.status.text() and not page.isComplete()
    assert not wiz.button(QWizard.NextButton).isEnabled()
    type_into(qtbot, page.picker.gguf, str(tmp_path / "missing.gguf"))
    qtbot.waitUntil(lambda: "GGUF file not found" in page.status.text(), timeout=60_000)
    type_into(qtbot, page.picker.folder, str(tiny_model_dir))
    assert page.picker.kind() == "folder"
    next_page(qtbot, wiz)
    qtbot.waitUntil(lambda: wiz.machine is not None, timeout=60_000)
    next_page(qtbot, wiz)
    cfg = wiz.config_page
    assert cfg.context.value() == 512 and cfg.selected_precision() == cfg.choice.precision
    cfg.table.selectRow(
        PRECISIONS.index("fp32")
    )  # the user prefers fp32 over the suggestion; moving the context keeps it
    cfg.context.setValue(256)
    assert cfg.selected_precision() == "fp32"
    next_page(qtbot, wiz)

    draft = wiz.draft_page
    assert not draft.draft_box.isEnabled() and draft.tokens.value() == 5
    draft.speculative.setChecked(True)
    assert draft.draft_box.isEnabled() and draft.draft_precision.currentText() == "fp32"
    type_into(qtbot, draft.picker.folder, str(tiny_other_tokenizer_dir))
    try:
        qtbot.waitUntil(draft.isComplete, timeout=60_000)
    except Exception:
        raise AssertionError("draft page never completed: " + draft.status.text()) from None
    assert "universal assisted decoding" in draft.status.text()
    type_into(qtbot, draft.picker.folder, str(tiny_draft_dir))
    qtbot.waitUntil(draft.isComplete, timeout=60_000)
    assert "shared vocabulary" in draft.status.text() and "With the draft" in draft.memory.text()
    with qtbot.waitSignal(window.model_loaded, timeout=120_000):
        next_page(qtbot, wiz)
    load = wiz.load_page
    qtbot.waitUntil(load.isComplete, timeout=60_000)
    assert window.loaded.draft_name == "tiny-draft" and window.settings.strategy == "speculative"
    assert window.settings.precision == "fp32" and load.info.predicted_bytes and load.info.measured_bytes
    next_page(qtbot, wiz)

    # Every control on every page explains itself in a tooltip.
    missing = []
    for pid in wiz.pageIds():
        p = wiz.page(pid)
        for w in (
            p.findChildren(QAbstractButton)
            + p.findChildren(QComboBox)
            + p.findChildren(QLineEdit)
            + p.findChildren(QAbstractSpinBox)
            + p.findChildren(QSlider)
            + p.findChildren(QTableWidget)
        ):
            if isinstance(w.parent(), (QAbstractSpinBox, QComboBox, QTableWidget)):
                continue  # parts of another control (a spin box's editor, the table's corner button)
            if not w.toolTip():
                missing.append(f"{type(p).__name__}: {type(w).__name__} {getattr(w, 'text', lambda: '')()!r}")
    assert not missing, missing
    wiz.preset_page.save_box.setChecked(False)
    wiz.button(QWizard.FinishButton).click()
    assert window.presets.presets() == []
    window.shutdown()


def test_config_table_lists_every_engine_precision(qtbot, tiny_model_dir):
    window = open_window(qtbot)
    wiz = window.open_wizard()
    type_into(qtbot, wiz.model_page.picker.folder, str(tiny_model_dir))
    next_page(qtbot, wiz)
    qtbot.waitUntil(lambda: wiz.machine is not None, timeout=60_000)
    next_page(qtbot, wiz)
    cfg = wiz.config_page
    # Every engine precision but "gguf" (as the file is), which only a GGUF folder with quantised layers offers.
    everything_but_as_file = [p for p in PRECISIONS if p != "gguf"]
    assert [cfg.table.item(r, 0).text() for r in range(cfg.table.rowCount())] == everything_but_as_file
    draft = wiz.draft_page.draft_precision
    assert [draft.itemText(i) for i in range(draft.count())] == everything_but_as_file
    wiz.reject()
    window.shutdown()


def test_the_precision_the_model_browser_fetched_is_the_configuration_row(qtbot, tiny_model_dir):
    window = open_window(qtbot)
    wiz = window.open_wizard()
    wiz.model_page._found(str(tiny_model_dir), "q4")  # what a fetch from the browser hands over
    next_page(qtbot, wiz)
    qtbot.waitUntil(lambda: wiz.machine is not None, timeout=60_000)
    next_page(qtbot, wiz)
    cfg = wiz.config_page
    own = {cfg.choice.precision, cfg.suggestion.precision}  # what the page itself would start on
    assert cfg.selected_precision() == "q4" and "q4" not in own  # the browser's, not the page's own
    wiz.back()
    wiz.back()
    type_into(qtbot, wiz.model_page.picker.folder, str(tiny_model_dir) + "/")  # another choice forgets it
    next_page(qtbot, wiz)
    next_page(qtbot, wiz)
    assert cfg.selected_precision() in own
    wiz.reject()
    window.shutdown()


def test_load_page_judges_the_prediction_with_the_estimators_margin(qtbot):
    """Within 10 % or 300 MB, whichever is larger: the estimator's own accuracy target, not a copy of it."""
    from redline.inference import MB, LoadReport, accuracy_margin

    window = open_window(qtbot)
    page = window.open_wizard().load_page

    def within(predicted_mb, measured_mb):
        sizes = dict(predicted_bytes=predicted_mb * MB, measured_bytes=measured_mb * MB)
        page.show_figures(LoadReport("m", "cuda", "bf16", 0, 1.0, **sizes))
        note = page.note.text()
        assert note.startswith(("Within the estimator's target", "Outside the estimator's target"))
        return note.startswith("Within")

    assert accuracy_margin(1000 * MB) == 300 * MB  # a small model: 300 MB is the larger
    assert within(1250, 1000) and within(750, 1000) and not within(1350, 1000)
    assert accuracy_margin(10_000 * MB) == 1000 * MB  # a big one: 10 %
    assert within(10_900, 10_000) and not within(11_100, 10_000) and not within(8_900, 10_000)
    assert page.error.text() == "-11.0 %"
    window.shutdown()


def test_presets_menu_dialog_and_settings_panel(qtbot):
    window = open_window(qtbot)
    store = window.presets
    base = dataclasses.asdict(window.settings)
    store.save("Tiny fp32", {**base, "model": "/models/tiny", "precision": "fp32", "context_length": 512})
    store.save("Starter nf4", {**base, "model": "starter", "precision": "nf4", "strategy": "prompt-lookup"})
    window.preset_actions.fill_menu()
    assert [a.text() for a in window.presets_menu.actions() if a.text()][:2] == ["Starter nf4", "Tiny fp32"]

    dialog = window.preset_actions.manage()
    assert dialog.list.count() == 2 and "starter · nf4" in dialog.detail.text()
    assert dialog.rename("Tiny fp32", "Tiny exact")
    assert not dialog.rename("Tiny exact", "Starter nf4")  # taken: refused in place, nothing lost
    assert "exists already" in dialog.detail.text() and store.get("Tiny exact") is not None
    dialog.delete("Starter nf4")
    assert [p.name for p in store.presets()] == ["Tiny exact"]
    panel = window.settings_panel  # the model selector lists presets; choosing one fills every field
    assert [panel.preset.itemText(i) for i in range(panel.preset.count())][1:] == ["Tiny exact"]
    panel.preset.setCurrentIndex(1)
    panel.preset.activated.emit(1)
    assert panel.model.currentText() == "/models/tiny" and panel.precision.currentText() == "fp32"
    assert panel.context_length.value() == 512 and panel.apply_button.isEnabled()
    assert "reloaded" in panel.reload_note.text()
    dialog.reject()
    window.shutdown()


def test_gguf_rows_start_with_the_file_as_it_is(qtbot, tmp_path, monkeypatch):
    """A GGUF whose layers stay quantised: 'gguf (as the file is)' is the first row and the suggestion;
    bitsandbytes rows are not offered (the loader refuses them for such a file)."""
    from conftest import build_tiny_model
    from gguf_helpers import write_llama_gguf

    monkeypatch.setenv("REDLINE_CACHE_DIR", str(tmp_path / "cache"))
    folder = build_tiny_model(tmp_path / "tiny", hidden=128, layers=1, heads=4, kv_heads=2)
    gguf_file = write_llama_gguf(folder, tmp_path / "tiny-q4.gguf", {"attn_": "Q4_0", "ffn_": "Q8_0"})
    window = open_window(qtbot)
    wiz = window.open_wizard()
    page = wiz.model_page
    type_into(qtbot, page.picker.gguf, str(gguf_file))
    qtbot.waitUntil(page.isComplete, timeout=120_000)
    next_page(qtbot, wiz)
    qtbot.waitUntil(lambda: wiz.machine is not None, timeout=60_000)
    next_page(qtbot, wiz)
    cfg = wiz.config_page
    rows = [cfg.table.item(r, 0).text() for r in range(cfg.table.rowCount())]
    assert rows == ["gguf (as the file is)", "bf16", "fp16", "fp32", "q8", "q4"]
    assert cfg.selected_precision() == "gguf" and "gguf fits with" in cfg.why.text()
    wiz.reject()
    window.shutdown()
