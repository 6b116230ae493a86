"""The speed lab beside remote engines and a new user's time (issue 28, items 10, 11 and 14): a remote row made in
the configuration table, named "remote" (never "naive") and "running" while it runs; the default rows and the
duration predicted before Run; a run cancelled while it waits reads as cancelled, never as failed."""

from __future__ import annotations

import threading

import pytest
from gui_helpers import aloop  # noqa: F401 - fixture
from slow_engine import SlowEngine

from redline.inference import BenchPhase
from redline.ui.bridge import EngineBridge
from redline.ui.speedlab import SpeedLabPanel
from redline.ui.speedlab.configs import DRAFT, PRECISION, STRATEGY
from redline.ui.speedlab.panel import DEFAULT_CONFIGS

SERVER = "http://127.0.0.1:9/v1#served"


@pytest.fixture
def slow_panel(qtbot, tmp_path):
    bridge = EngineBridge(lambda: SlowEngine(interval_s=0.01))
    p = SpeedLabPanel(bridge, runs_dir=tmp_path / "runs")
    qtbot.addWidget(p)
    p.resize(1300, 900)
    p.show()
    yield p
    bridge.shutdown(5000)


def test_a_remote_row_is_made_in_the_table_and_named_remote(slow_panel):
    ed = slow_panel.configs_editor
    table = ed.table
    ed.add_row()
    r = len(ed.configs()) - 1
    table.cellWidget(r, STRATEGY).setCurrentText("remote")
    draft = table.cellWidget(r, DRAFT)
    assert draft.isEnabled() and draft.placeholderText().startswith("http://")
    draft.setText(SERVER)
    draft.textEdited.emit(SERVER)
    assert ed.configs()[r].strategy == "remote" and ed.configs()[r].server == SERVER
    assert slow_panel.configs_edit.text().endswith(f",remote:{SERVER}")
    assert table.cellWidget(r, PRECISION).currentText() == "server"
    assert not table.cellWidget(r, PRECISION).isEnabled()
    assert ed.validated()[r].label == f"remote:{SERVER}"
    # Typed in the text form, the row reads "remote" in the table too (it read "naive").
    slow_panel.configs_edit.setText(f"kv:fp32,remote:{SERVER}")
    assert table.cellWidget(1, STRATEGY).currentText() == "remote"
    assert table.cellWidget(1, DRAFT).text() == SERVER
    # Back to a local strategy: a precision of ours again.
    table.cellWidget(1, STRATEGY).setCurrentText("kv")
    assert ed.configs()[1].strategy == "kv" and ed.configs()[1].precision == "auto"


def test_a_running_row_says_running_not_waiting(slow_panel):
    slow_panel.configs_edit.setText(f"remote:{SERVER}")
    slow_panel.runs.reset_outputs(slow_panel.build_spec())
    col = slow_panel.outputs.column(0)
    assert col.speed.text() == "waiting"
    slow_panel.runs.on_progress(BenchPhase(0.1, 0, f"remote:{SERVER}: sample 1/3, prompt 1/4"))
    assert col.speed.text() == "running · sample 1/3, prompt 1/4"


def test_a_run_cancelled_while_it_waits_reads_as_cancelled(qtbot, slow_panel):
    hold = threading.Event()
    job = slow_panel.bridge.run(lambda engine, report: hold.wait(30), label="a chat reply")
    try:
        run = slow_panel.start()
        qtbot.waitUntil(lambda: "Waiting to start" in slow_panel.status_label.text(), timeout=5_000)
        slow_panel.cancel()
        qtbot.waitUntil(lambda: run.done, timeout=2_000)
        assert slow_panel.status_label.text() == "Cancelled before it started: nothing ran."
        assert "failed" not in slow_panel.status_label.text()
    finally:
        hold.set()
        qtbot.waitUntil(lambda: job.done, timeout=10_000)


# A fixed machine profile (a 2-core laptop's CPU, as the speed model sees one): the duration's arithmetic is tested
# with it, never this machine's speed (a busy machine measured a slower one, and the bound failed: issue 49).
PROFILE_BANDWIDTH, PROFILE_FLOPS = 20e9, 100e9


def test_the_default_rows_are_predicted_to_take_about_a_minute_and_say_so_before_run(qtbot, tmp_path, monkeypatch):
    """The predictions are the speed model's for the starter (its shape read from the packaged config, nothing
    downloaded or loaded) on a fixed machine profile with nothing learned: the duration said before Run is the sum
    over the rows of (TTFT + the new tokens at the predicted tokens/s) × the generations per row, whatever machine
    runs the test and however busy it is."""
    from redline.inference.estimate.model_shapes import read_shape
    from redline.inference.speed import arithmetic
    from redline.inference.speed.calibration import SpeedCalibration
    from redline.inference.speed.model import SpeedModel

    profile = arithmetic.Machine("cpu", PROFILE_BANDWIDTH, PROFILE_FLOPS, "a test profile", "cpu")
    from redline.inference import jobs

    for module in (arithmetic, jobs):  # where the engine thread's predictions job finds it
        monkeypatch.setattr(module, "this_machine", lambda device="cpu": profile, raising=False)
    monkeypatch.setattr(arithmetic, "kernels_run", lambda device: True)  # the profile's: Redline's kernels run
    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path / "nothing-learned"))
    bridge = EngineBridge()
    panel = SpeedLabPanel(bridge, runs_dir=tmp_path / "runs")
    qtbot.addWidget(panel)
    try:
        assert panel.configs_edit.text() == DEFAULT_CONFIGS
        assert not DEFAULT_CONFIGS.startswith("naive")
        qtbot.waitUntil(lambda: "predicted to take about" in panel.duration_label.text(), timeout=60_000)
        seconds, unknown = panel.predicted_seconds()
        rows = panel.configs_editor.configs()
        speed = SpeedModel(profile, SpeedCalibration(tmp_path / "empty.json"))
        shape, new_tokens, n = read_shape("starter"), panel.new_tokens_spin.value(), 13
        prompt = panel.form.prompt_tokens_guess()
        expected = 0.0
        for config in rows:
            p = speed.predict_config(shape, config, prompt, new_tokens)
            expected += n * (p.ttft_ms / 1000 + new_tokens / p.tokens_per_s)
        assert unknown == 0 and seconds == pytest.approx(expected, rel=1e-9)
        # On this profile the default rows take about a minute or less (never the tens of minutes naive:fp32 took).
        assert 0 < seconds < 120, seconds
        assert f"{len(rows)} configurations × {n} generations" in panel.duration_label.text()
        panel.samples_spin.setValue(50)  # the textbook protocol's samples: said at once, before Run
        longer, _ = panel.predicted_seconds()
        generations = panel.form.generations_per_row()
        assert longer == pytest.approx(seconds * generations / n, rel=1e-9) and "min" in panel.duration_label.text()
    finally:
        bridge.shutdown(10_000)


def test_the_model_field_follows_the_chat_to_a_server(slow_panel):
    """The window connected to a server: the lab's Model field says that server (it said "starter"), unless the
    user typed a model of their own there."""
    assert slow_panel.model_edit.text() == "starter"
    slow_panel.follow_model(SERVER)
    assert slow_panel.model_edit.text() == SERVER
    slow_panel.model_edit.setText("my-model")
    slow_panel.follow_model("starter")
    assert slow_panel.model_edit.text() == "my-model"
