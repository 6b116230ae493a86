"""The speed lab panel drives a real (tiny) run on the engine thread: columns, table, charts, exports, history."""

import csv
import json

import pytest
from PySide6.QtGui import QImage

from redline.ui.bridge import EngineBridge
from redline.ui.speedlab import SpeedLabPanel


@pytest.fixture
def panel(qtbot, tmp_path):
    bridge = EngineBridge()
    p = SpeedLabPanel(bridge, runs_dir=tmp_path / "runs")
    qtbot.addWidget(p)
    p.resize(1200, 900)
    p.show()
    yield p
    bridge.shutdown(10000)


def test_small_run_fills_table_charts_and_exports(qtbot, panel, tiny_model_dir, tmp_path):
    panel.model_edit.setText(str(tiny_model_dir))
    panel.configs_edit.setText("naive:fp32,kv:fp32")
    panel.baseline_spin.setValue(2)
    panel.new_tokens_spin.setValue(8)
    panel.warmup_spin.setValue(0)
    panel.samples_spin.setValue(1)
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as blocker:
        panel.run_button.click()
        assert panel.running() and not panel.run_button.isEnabled()
    report = blocker.args[0]
    assert [r.status for r in report.results] == ["ok", "ok"]
    assert not panel.running() and panel.run_button.isEnabled()

    # Columns streamed the outputs as they ran.
    assert panel.column_texts() == [r.outputs[0] for r in report.results]
    assert all(panel.column_texts())
    # The table: one row per configuration, baseline marked, sortable by number.
    headers = [panel.table.horizontalHeaderItem(j).text() for j in range(panel.table.columnCount())]
    assert panel.table.rowCount() == 2
    col = {h: j for j, h in enumerate(headers)}
    assert [panel.table.item(i, col["config"]).text() for i in range(2)] == ["naive:fp32", "kv:fp32"]
    assert panel.table.item(1, col["matches"]).text() == "baseline"
    assert panel.table.item(0, col["matches"]).text() == "yes"
    assert panel.table.item(1, col["speedup"]).text() == "1.00×"
    panel.table.sortItems(col["tok/s"])
    speeds = [float(panel.table.item(i, col["tok/s"]).text()) for i in range(2)]
    assert speeds == sorted(speeds)
    # The charts plot the measured numbers.
    data = panel.chart_data()
    assert [c for c, *_ in data["tokens_per_s"]] == ["naive:fp32", "kv:fp32"]
    assert [v for _, v, *_ in data["tokens_per_s"]] == [r.tokens_per_s for r in report.results]
    assert [v for _, v in data["ttft_ms"]] == [r.ttft_ms for r in report.results]
    assert len(data["latency_by_position"]["kv:fp32"]) == 7
    assert len(panel.tps_plot.getPlotItem().items) == 2  # bars + error bars

    # Exports.
    out = tmp_path / "out"
    out.mkdir()
    rows = list(csv.DictReader(open(panel.export("csv", out / "r.csv"), encoding="utf-8")))
    assert [r["config"] for r in rows] == ["naive:fp32", "kv:fp32"]
    data = json.loads(panel.export("json", out / "r.json").read_text())
    assert data["machine"]["versions"]["torch"] and data["results"][0]["matches_baseline"] is True
    assert "| naive:fp32 |" in panel.export("markdown", out / "r.md").read_text()
    img = QImage(str(panel.export("png", out / "charts.png")))
    assert not img.isNull() and img.width() > 200

    # The run was kept; reopening it, and comparing two runs, shows their rows.
    assert panel.history.count() == 1
    panel.table.setRowCount(0)
    panel.history.item(0).setSelected(True)
    panel.open_selected()
    assert panel.table.rowCount() == 2
    panel.show_reports([report, report])
    assert panel.table.rowCount() == 4 and len(panel.chart_data()["tokens_per_s"]) == 4


def test_bad_configuration_is_reported_and_nothing_runs(panel):
    panel.configs_edit.setText("kv:fp32,turbo:fp8")
    assert panel.start() is None
    assert "Unknown strategy" in panel.status_label.text()
    assert panel.configs_edit.text() == "kv:fp32,turbo:fp8"  # the user's input is kept
    assert panel.run_button.isEnabled() and not panel.running()


def test_cancel_keeps_finished_rows(qtbot, panel, tiny_model_dir):
    panel.model_edit.setText(str(tiny_model_dir))
    panel.configs_edit.setText("kv:fp32,naive:fp32,static:fp32")
    panel.new_tokens_spin.setValue(6)
    panel.warmup_spin.setValue(0)
    panel.samples_spin.setValue(1)
    # Cancel as soon as the first row lands, as a user pressing Cancel would.
    panel.row_done.connect(lambda _result: panel.cancel())
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as blocker:
        panel.start()
    report = blocker.args[0]
    assert report.cancelled and report.results[0].status == "ok"
    assert [r.status for r in report.results[1:]] == ["cancelled", "cancelled"]
    assert panel.table.rowCount() == 3 and "Cancelled" in panel.status_label.text()


def test_speed_lab_is_a_tab_of_the_main_window_built_on_first_open(qtbot, tmp_path):
    from redline.app.gui import build_window
    from redline.app.store import Store
    from redline.ui.lazy_panel import LazyPanel
    from redline.ui.speedlab import SpeedLabPanel

    window = build_window(store=Store(tmp_path / "db.sqlite3"))
    qtbot.addWidget(window)
    tabs = window.tabs
    titles = [tabs.tabText(i) for i in range(tabs.count())]
    assert "Speed lab" in titles
    lazy = tabs.widget(titles.index("Speed lab"))
    assert isinstance(lazy, LazyPanel) and lazy.inner is None
    assert isinstance(lazy.ensure_built(), SpeedLabPanel)
    window.shutdown()


def test_textbook_protocol_button_names_what_it_sets(panel):
    from redline.inference import SEED_PRESET

    warmup, samples = SEED_PRESET["warmup"], SEED_PRESET["samples"]
    button = panel.protocol_button
    assert button.text() == f"Textbook protocol ({warmup} warm-up / {samples} samples)"
    assert button.toolTip().startswith(f"The textbook measurement protocol: {warmup} warm-up runs, then {samples}")
    button.click()
    assert (panel.warmup_spin.value(), panel.samples_spin.value()) == (warmup, samples)
