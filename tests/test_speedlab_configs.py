"""The speed lab driven by clicking: the configuration table, its ready-made sets, the text form in step with
it (both ways, the same runs), predicted vs measured per row, the resizable outputs with live speed, and the
window's gauges following a run."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from PySide6.QtWidgets import QSplitter

from redline.inference import BenchConfig, every_precision, ladder, parse_configs
from redline.ui.bridge import EngineBridge
from redline.ui.speedlab import SpeedLabPanel
from redline.ui.speedlab.configs import COMPILE, DRAFT, DRAFT_PRECISION, MEASURED, PRECISION, PREDICTED, STRATEGY, K


def runs(configs):
    """What a configuration runs: everything but its label."""
    return [dataclasses.replace(c, text="") for c in configs]


@pytest.fixture
def panel(qtbot, tmp_path):
    bridge = EngineBridge()
    presets = [
        SimpleNamespace(name="fast one", values={"precision": "q8", "strategy": "fast"}),
        SimpleNamespace(
            name="drafted",
            values={"precision": "fp32", "strategy": "speculative", "draft_model": "starter", "num_draft_tokens": 3},
        ),
    ]
    p = SpeedLabPanel(bridge, runs_dir=tmp_path / "runs", presets=lambda: presets)
    qtbot.addWidget(p)
    p.resize(1300, 950)
    p.show()
    yield p
    bridge.shutdown(10000)


def cell(panel, row, col):
    return panel.configs_editor.table.cellWidget(row, col)


def test_clicked_rows_run_what_the_text_form_runs(qtbot, panel):
    ed = panel.configs_editor
    ed.table.selectAll()
    ed.remove_button.click()
    assert ed.configs() == [] and panel.configs_edit.text() == ""
    ed.add_button.click()  # row 1: naive, fp32
    cell(panel, 0, STRATEGY).setCurrentText("naive")
    cell(panel, 0, PRECISION).setCurrentText("fp32")
    ed.add_button.click()  # row 2: kv at the last row's precision
    assert ed.configs()[1] == BenchConfig(strategy="kv", precision="fp32")
    ed.table.selectRow(1)
    ed.duplicate_button.click()  # row 3: a copy of row 2, then one change
    cell(panel, 2, PRECISION).setCurrentText("q8")
    ed.add_button.click()  # row 4: speculative with a draft
    cell(panel, 3, STRATEGY).setCurrentText("speculative")
    cell(panel, 3, PRECISION).setCurrentText("fp32")
    assert cell(panel, 3, DRAFT).isEnabled() and not cell(panel, 3, COMPILE).isEnabled()
    qtbot.keyClicks(cell(panel, 3, DRAFT), "starter")
    cell(panel, 3, DRAFT_PRECISION).setCurrentText("q8")
    cell(panel, 3, K).setValue(4)
    ed.add_button.click()  # row 5: static, compiled
    assert ed.configs()[4].precision == "fp32"  # the last row's precision
    cell(panel, 4, STRATEGY).setCurrentText("static")
    cell(panel, 4, COMPILE).setCurrentIndex(1)  # on
    written = "naive:fp32,kv:fp32,kv:q8,speculative:fp32+draft=starter@q8/k=4,static:fp32+compile"
    assert panel.configs_edit.text() == written  # the text form follows the table
    spec = panel.build_spec()
    assert runs(spec.configs) == runs(parse_configs(written))
    # And back: typing in the text form rebuilds the rows.
    panel.configs_edit.setText("kv:bf16, fast:q4,speculative:fp32+draft=starter@int8/k=6")
    assert [cell(panel, r, STRATEGY).currentText() for r in range(3)] == ["kv", "fast", "speculative"]
    assert [cell(panel, r, PRECISION).currentText() for r in range(3)] == ["bf16", "q4", "fp32"]
    assert cell(panel, 2, DRAFT).text() == "starter" and cell(panel, 2, K).value() == 6
    assert runs(panel.build_spec().configs) == runs(parse_configs(panel.configs_edit.text()))
    # A row the text form would refuse is refused the same way, naming the row.
    ed.add_button.click()
    cell(panel, 3, STRATEGY).setCurrentText("speculative")
    assert panel.start() is None and "Row 4" in panel.status_label.text() and "draft" in panel.status_label.text()


def test_half_typed_text_keeps_the_rows(panel):
    panel.configs_edit.setText("kv:fp32,fast:q8")
    panel.configs_edit.setText("kv:fp32,fast:q8,tur")  # mid-typing
    assert runs(panel.configs_editor.configs()) == runs(parse_configs("kv:fp32,fast:q8"))
    assert panel.start() is None  # the text form is what the user sees: its error, not the old rows, is shown
    assert "Cannot run" in panel.status_label.text() and "tur" in panel.status_label.text()


def test_ready_made_sets(panel):
    ed = panel.configs_editor
    # Before a set is used, the combo names none (it showed the ladder over the default rows: "no naive row").
    assert ed.set_combo.currentData() is None and not ed.use_set_button.isEnabled()
    assert "naive" not in [c.strategy for c in ed.configs()]
    ed.set_combo.setCurrentIndex(ed.set_combo.findData("ladder"))
    assert ed.use_set_button.isEnabled()
    ed.use_set_button.click()
    assert runs(ed.configs()) == runs(ladder("cpu", "starter"))
    strategies = [c.strategy for c in ed.configs()]
    assert strategies[0] == "naive" and "speculative" in strategies and strategies[-1] == "static"
    assert ed.configs()[strategies.index("speculative")].draft == "starter"
    ed.use_set("every precision")
    assert [c.precision for c in ed.configs()] == [c.precision for c in every_precision()]
    ed.use_set("kv forms")  # the fast path with its KV cache in 16 and 8 bits, each q8 row after its bf16 one
    assert [(c.strategy, c.precision, c.kv) for c in ed.configs()] == [
        ("fast", "q8", "bf16"),
        ("fast", "q8", "q8"),
        ("fast", "bf16", "bf16"),
        ("fast", "bf16", "q8"),
    ]
    ed.use_set("my presets")
    assert [(c.strategy, c.precision, c.draft, c.k) for c in ed.configs()] == [
        ("fast", "q8", None, 5),
        ("speculative", "fp32", "starter", 3),
    ]
    assert panel.configs_edit.text() == "fast:q8,speculative:fp32+draft=starter@auto/k=3"


def test_rows_show_predicted_then_measured(qtbot, panel, tiny_model_dir):
    panel.model_edit.setText(str(tiny_model_dir))
    panel.configs_edit.setText("kv:fp32,fast:fp32")
    panel.new_tokens_spin.setValue(8)
    panel.warmup_spin.setValue(0)
    panel.samples_spin.setValue(1)
    table = panel.configs_editor.table
    ed = panel.configs_editor
    # Rows changed while the engine thread was answering: what comes back is for the rows shown, not stale.
    panel.request_predictions()
    panel.configs_edit.setText("kv:fp32,fast:fp32")

    def predicted_for_rows():
        preds = [ed.prediction(r) for r in range(len(ed.configs()))]
        return all(getattr(p, "config", None) == c.label for p, c in zip(preds, ed.configs()))

    qtbot.waitUntil(predicted_for_rows, timeout=60_000)
    assert table.item(1, PREDICTED).text().startswith("≈")
    predicted = [float(table.item(r, PREDICTED).text().split()[1]) for r in range(2)]
    assert all(p > 0 for p in predicted)
    tip = table.item(0, PREDICTED).toolTip()
    assert "read per token" in tip and tip == ed.prediction(0).tip()  # the prediction's own words (the wizard's)
    # Outputs: a horizontal splitter the user can resize, inside the panel's vertical one.
    assert isinstance(panel.outputs.splitter, QSplitter) and panel.splitter.count() == 3
    lives = []
    panel.live_speed.connect(lambda tps, ttft, n: lives.append(tps))
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as blocker:
        panel.start()
    report = blocker.args[0]
    assert [r.status for r in report.results] == ["ok", "ok"]
    assert panel.outputs.splitter.count() == 2
    for r, result in enumerate(report.results):
        assert result.predicted_tokens_per_s and result.prediction_error_pct is not None
        measured = table.item(r, MEASURED).text()
        assert measured.startswith(f"{result.tokens_per_s:.1f} (") and measured.endswith("%)")
        # Beside it, the prediction the row had before it ran.
        assert table.item(r, PREDICTED).text() == f"≈ {result.predicted_tokens_per_s:.1f}"
        col = panel.outputs.column(r)
        assert col.speed.text() == (
            f"{result.tokens_per_s:.1f} tok/s measured · predicted {result.predicted_tokens_per_s:.1f}"
        )
    # The results table has the predicted column beside the measured one.
    headers = [panel.table.horizontalHeaderItem(j).text() for j in range(panel.table.columnCount())]
    assert "pred. tok/s" in headers and "pred. error" in headers
    # The run taught the speed model: the next predictions are corrected by this configuration's measurement.
    qtbot.waitUntil(lambda: not panel.predicting(), timeout=60_000)
    qtbot.waitUntil(
        lambda: "measurement(s) of kv:fp32 on this machine" in table.item(0, PREDICTED).toolTip(), timeout=60_000
    )


def test_window_gauges_follow_the_lab(qtbot, tmp_path, tiny_model_dir):
    from redline.app.gui import build_window
    from redline.app.store import Store

    window = build_window(store=Store(tmp_path / "db.sqlite3"))
    qtbot.addWidget(window)
    titles = [window.tabs.tabText(i) for i in range(window.tabs.count())]
    panel = window.tabs.widget(titles.index("Speed lab")).ensure_built()
    panel.model_edit.setText(str(tiny_model_dir))
    panel.configs_edit.setText("kv:fp32")
    panel.new_tokens_spin.setValue(24)
    panel.warmup_spin.setValue(0)
    panel.samples_spin.setValue(1)
    gauges = window.gauges
    sources = []
    panel.row_started.connect(lambda _label: sources.append(gauges.source_label.text()))
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as blocker:
        panel.start()
    result = blocker.args[0].results[0]
    assert sources == ["speed lab: kv:fp32"]
    assert gauges.gauge.value == pytest.approx(result.tokens_per_s)
    assert gauges.source_label.text() == "speed lab: kv:fp32 (ok)"
    window.shutdown()
