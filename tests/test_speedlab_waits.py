"""The speed lab as a new user tripped on it (issue 49, item 7): a run waiting behind a chat reply said only
"Starting…" at 0 %; Cancel before any row ran showed 100 %, "finished rows kept" and saved an empty run; with the
chat connected to a server the lab kept its local rows, which then failed; the ladder showed without its naive row."""

from __future__ import annotations

import threading
import time

import pytest
from slow_engine import SlowEngine

from redline.inference import (
    DecodeOptions,
    GenerationRequest,
    SamplingSettings,
    Started,
    for_model,
    ladder,
    parse_configs,
)
from redline.inference.engine import Engine
from redline.ui.bridge import EngineBridge
from redline.ui.speedlab import SpeedLabPanel
from redline.ui.speedlab.configs import STRATEGY
from redline.ui.speedlab.panel import DEFAULT_CONFIGS

SERVER = "http://127.0.0.1:9/v1#served"
TIMEOUT_MS = 60_000


def make_panel(qtbot, bridge, tmp_path, **kwargs) -> SpeedLabPanel:
    p = SpeedLabPanel(bridge, runs_dir=tmp_path / "runs", **kwargs)
    qtbot.addWidget(p)
    p.resize(1300, 900)
    p.show()
    return p


def loaded(qtbot, bridge, model_dir) -> None:
    load = bridge.load(str(model_dir), "fp32")
    qtbot.waitUntil(lambda: load.done, timeout=TIMEOUT_MS)
    load.result()


# -- waiting for a chat reply ------------------------------------------------------------------------------------------
def test_a_run_behind_replies_written_together_says_what_it_waits_for(qtbot, tmp_path, tiny_model_dir, monkeypatch):
    """A chat reply on the fast path is written in the batch; the lab needs the engine to itself, so it waits for
    the batch to end. The engine sends it no reason for that wait: the lab says it itself, and its bar reads
    "waiting", not "0%"."""
    from redline.inference.generation.batch import Batcher

    gate = threading.Event()  # the reply's steps wait here: it stays "being written" until the test lets it go
    original = Batcher.step

    def held_step(self):
        original(self)
        gate.wait(30)

    monkeypatch.setattr(Batcher, "step", held_step)
    bridge = EngineBridge(lambda: Engine("cpu"))
    try:
        loaded(qtbot, bridge, tiny_model_dir)
        panel = make_panel(qtbot, bridge, tmp_path, model=str(tiny_model_dir))
        panel.configs_edit.setText("kv:fp32")
        reply = bridge.generate(
            GenerationRequest(
                messages=[{"role": "user", "content": "Tell me a story"}],
                sampling=SamplingSettings(max_new_tokens=64, temperature=0),
                options=DecodeOptions("fast"),
                client="chat",
            )
        )
        seen = []
        reply.events.connect(seen.extend)
        qtbot.waitUntil(lambda: any(isinstance(e, Started) and e.batched for e in seen), timeout=TIMEOUT_MS)
        run = panel.start()
        qtbot.waitUntil(lambda: "1 reply is being written" in panel.status_label.text(), timeout=10_000)
        assert panel.status_label.text().startswith("Waiting to start:")
        assert panel.progress_bar.text() == "waiting"
        panel.cancel()  # still waiting: it ends at once, and says nothing ran
        qtbot.waitUntil(lambda: run.done, timeout=10_000)
        assert panel.status_label.text() == "Cancelled before it started: nothing ran."
        assert panel.progress_bar.text() != "waiting" and panel.column_texts() == []  # no column left "waiting"
    finally:
        gate.set()
        bridge.shutdown(10_000)


# -- Cancel before any row ran -----------------------------------------------------------------------------------------
class HeldEngine(Engine):
    """The real engine, except that every generation waits for its cancel before it runs: Cancel lands before any
    row has measured anything, on any machine."""

    def run(self, request, sink, submitted=None):
        while not sink.cancelled:
            time.sleep(0.01)
        return super().run(request, sink, submitted)


def test_cancel_before_any_row_ran_says_so_and_saves_nothing(qtbot, tmp_path, tiny_model_dir):
    bridge = EngineBridge(lambda: HeldEngine("cpu"))
    try:
        panel = make_panel(qtbot, bridge, tmp_path, model=str(tiny_model_dir))
        panel.configs_edit.setText("kv:fp32,naive:fp32,static:fp32")
        panel.new_tokens_spin.setValue(4)
        panel.warmup_spin.setValue(0)
        panel.samples_spin.setValue(1)
        finished = []
        panel.run_finished.connect(finished.append)
        run = panel.start()
        qtbot.waitUntil(lambda: "sample 1/1" in panel.status_label.text(), timeout=TIMEOUT_MS)  # row 1 is running
        panel.cancel()
        qtbot.waitUntil(lambda: run.done and not panel.running(), timeout=TIMEOUT_MS)
        assert panel.status_label.text() == "Cancelled before any configuration ran: nothing was saved."
        assert panel.progress_bar.value() == 0  # not 100 %
        assert panel.history.count() == 0 and not list((tmp_path / "runs").glob("*.json"))
        assert panel.table.rowCount() == 0 and panel.report is None and not finished
        assert panel.run_button.isEnabled() and not panel.cancel_button.isEnabled()
    finally:
        bridge.shutdown(10_000)


# -- a server as the lab's model ---------------------------------------------------------------------------------------
@pytest.fixture
def slow_panel(qtbot, tmp_path):
    bridge = EngineBridge(lambda: SlowEngine(interval_s=0.01))
    yield make_panel(qtbot, bridge, tmp_path)
    bridge.shutdown(5000)


def labels(panel) -> list[str]:
    return [c.label for c in panel.configs_editor.configs()]


def test_a_server_as_the_model_gets_the_rows_a_server_runs(slow_panel):
    """The chat connects to a server: the lab's rows become the one a server runs (its remote row; the local
    rows failed there), and the ladder is not offered as rows it cannot run. Back to a local model, the defaults."""
    panel = slow_panel
    assert panel.configs_edit.text() == DEFAULT_CONFIGS
    panel.follow_model(SERVER)
    assert labels(panel) == [f"remote:{SERVER}"]
    assert f"remote:{SERVER}" in panel.status_label.text()
    panel.configs_editor.use_set("ladder")
    assert labels(panel) == [f"remote:{SERVER}"]
    assert "cannot run 8 of the set's rows (naive:fp32, kv:fp32, kv:bf16, …)" in panel.status_label.text()
    panel.follow_model("starter")
    assert panel.configs_edit.text() == DEFAULT_CONFIGS
    assert panel.build_spec().configs[0].strategy == "kv"


def test_the_users_own_rows_keep_what_a_server_can_run(slow_panel):
    panel = slow_panel
    panel.configs_edit.setText(f"kv:fp32,remote:{SERVER}")
    panel.follow_model(SERVER)
    assert labels(panel) == [f"remote:{SERVER}"]  # the kv row would fail on a server; the remote row runs


def test_a_lab_opened_on_a_server_starts_with_its_row(qtbot, tmp_path):
    bridge = EngineBridge(lambda: SlowEngine(interval_s=0.01))
    try:
        panel = make_panel(qtbot, bridge, tmp_path, model=SERVER)
        assert labels(panel) == [f"remote:{SERVER}"]
    finally:
        bridge.shutdown(5000)


def test_for_model_keeps_what_the_models_backend_runs():
    rows = parse_configs(f"naive:fp32,kv:q8,remote:{SERVER}")
    assert for_model(rows, "starter") == rows  # a model loaded here runs every strategy, and a remote row its own
    assert [c.label for c in for_model(rows, SERVER)] == [f"remote:{SERVER}"]
    assert [c.label for c in for_model(ladder("cpu", SERVER), SERVER)] == [f"remote:{SERVER}"]
    assert [c.label for c in for_model(ladder("cpu", "starter"), "starter")][0] == "naive:fp32"


# -- the ladder, from its naive row ------------------------------------------------------------------------------------
def test_the_ladder_is_shown_from_its_naive_row(slow_panel):
    """Add scrolls the table to the new row; the ladder used after it kept that scroll (and the selection), so it
    showed from its fourth row, without its naive row."""
    ed = slow_panel.configs_editor
    for _ in range(4):
        ed.add_button.click()
    assert ed.table.rowAt(0) > 0  # scrolled down to the last row added
    ed.use_set("ladder")
    assert ed.table.cellWidget(0, STRATEGY).currentText() == "naive"
    assert ed.table.rowAt(0) == 0 and ed.selected_rows() == []
