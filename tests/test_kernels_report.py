"""Never silently slow: where Redline's CPU kernels cannot run (REDLINE_NATIVE_KERNELS=0 forces it here), the speed
model predicts the path that will really run, and `redline estimate`, `redline bench`'s machine line and Help → About
say so once, in the same words (``KernelsReport.sentence``): why, what it costs, how to fix it."""

import json

import pytest
from gui_helpers import aloop, profile  # noqa: F401 - fixtures

from redline.inference import KernelsReport, read_shape
from redline.inference.kernels.cpu import library as native
from redline.inference.speed.arithmetic import Machine
from redline.inference.speed.model import SpeedModel

MACHINE = Machine("cpu", 20e9, 200e9, "this CPU", None)  # fixed figures: nothing measured, nothing learned


@pytest.fixture
def kernels_off(monkeypatch):
    """REDLINE_NATIVE_KERNELS=0, with library.py's state as in a fresh process (another test may have loaded them)."""
    monkeypatch.setenv("REDLINE_NATIVE_KERNELS", "0")
    monkeypatch.setattr(native, "_state", {"loaded": False, "reason": "not loaded yet"})
    assert native.will_run() == "turned off (REDLINE_NATIVE_KERNELS=0)"
    return native


def test_the_speed_model_predicts_the_path_that_will_run(kernels_off):
    shape = read_shape("starter")
    speed = SpeedModel(MACHINE)
    here = speed.predict(shape, "q8", "fast", 64, 128)
    without = speed.predict(shape, "q8", "fast", 64, 128, kernels=False)
    with_ = speed.predict(shape, "q8", "fast", 64, 128, kernels=True)
    assert here.tokens_per_s == without.tokens_per_s < with_.tokens_per_s
    assert any("kernels do not run here" in n for n in here.notes)
    assert not any("kernels" in n for n in with_.notes)
    # transformers' path and a GPU are not the kernels' business
    assert speed.predict(shape, "q8", "kv", kernels=False).tokens_per_s == speed.predict(shape, "q8", "kv").tokens_per_s


def test_the_report_says_why_what_it_costs_and_the_fix(kernels_off):
    rep = KernelsReport.here("cpu", precision="q4", machine=MACHINE, shape=read_shape("starter"))
    assert (
        not rep.on and rep.why == "turned off (REDLINE_NATIVE_KERNELS=0)" and rep.fix == "unset REDLINE_NATIVE_KERNELS"
    )
    assert rep.without_tokens_per_s < rep.with_tokens_per_s
    sentence = rep.sentence()
    assert sentence.startswith("Redline's CPU kernels cannot run here: turned off (REDLINE_NATIVE_KERNELS=0); cost: ≈ ")
    assert f"≈ {rep.without_tokens_per_s:.1f} tok/s instead of ≈ {rep.with_tokens_per_s:.1f}" in sentence
    assert "fast · q4, SmolLM2-135M-Instruct" in sentence and sentence.endswith("fix: unset REDLINE_NATIVE_KERNELS.")
    assert rep.to_dict()["sentence"] == sentence
    assert KernelsReport.here("cuda:0").on  # a GPU runs its own kernels: nothing to say


def test_a_report_where_the_kernels_run_says_nothing(monkeypatch):
    monkeypatch.setattr(native, "summary", lambda: {"on": True, "text": "Redline's CPU kernels on (avx2, shipped)"})
    rep = KernelsReport.here("cpu", machine=MACHINE)
    assert rep.on and rep.sentence() == "" and rep.clause() == "on" and rep.with_tokens_per_s is None


def test_estimate_says_it_once(kernels_off, monkeypatch, capsys):
    from redline.app import cli_estimate
    from redline.app.cli import main

    monkeypatch.setattr(cli_estimate, "speed_machine", lambda args, target: MACHINE)
    assert main(["estimate", "starter", "--free-gb", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("Redline's CPU kernels cannot run here: turned off (REDLINE_NATIVE_KERNELS=0); cost:") == 1, out
    assert "fix: unset REDLINE_NATIVE_KERNELS." in out
    assert main(["estimate", "starter", "--free-gb", "4", "--json"]) == 0
    kernels = json.loads(capsys.readouterr().out)["speed"]["kernels"]
    assert not kernels["on"] and kernels["without_tokens_per_s"] < kernels["with_tokens_per_s"]
    # the table's fast rows are the no-kernel prediction, what will really run
    assert main(["estimate", "starter", "--free-gb", "4", "--precision", "q8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["speed"]["predictions"]
    fast = next(r for r in rows if r["strategy"] == "fast")
    assert any("kernels do not run here" in n for n in fast["notes"])


def test_estimate_where_they_run_says_nothing(monkeypatch, capsys):
    from redline.app import cli_estimate
    from redline.app.cli import main

    monkeypatch.setattr(native, "will_run", lambda: None)
    monkeypatch.setattr(native, "summary", lambda: {"on": True, "text": "Redline's CPU kernels on"})
    monkeypatch.setattr(cli_estimate, "speed_machine", lambda args, target: MACHINE)
    assert main(["estimate", "starter", "--free-gb", "4"]) == 0
    assert "kernels cannot run" not in capsys.readouterr().out


def test_bench_machine_line_says_it_once(kernels_off, monkeypatch):
    from types import SimpleNamespace

    from redline.app import cli_bench
    from redline.inference import parse_configs
    from redline.inference.bench.export import machine_summary
    from redline.inference.jobs import KernelsReport as Report

    real = Report.here.__func__
    monkeypatch.setattr(Report, "here", classmethod(lambda cls, *a, **k: real(cls, *a, **dict(k, machine=MACHINE))))
    machine = {
        "device": "cpu",
        "cpu_kernels": "off (turned off (REDLINE_NATIVE_KERNELS=0))",
        "ram_total_bytes": 1 << 30,
    }
    report = SimpleNamespace(machine=machine)
    spec = SimpleNamespace(model="starter", configs=parse_configs("kv:bf16,fast:q4"))
    cli_bench._say_kernels(report, spec)
    line = machine_summary(machine)
    assert line.count("Redline's CPU kernels off: turned off (REDLINE_NATIVE_KERNELS=0); cost: ≈ ") == 1, line
    assert "(fast · q4, SmolLM2-135M-Instruct" in line and "fix: unset REDLINE_NATIVE_KERNELS" in line
    assert machine["cpu_kernels_report"]["precision"] == "q4"
    on = {"device": "cpu", "cpu_kernels": "on"}
    cli_bench._say_kernels(SimpleNamespace(machine=on), spec)
    assert on == {"device": "cpu", "cpu_kernels": "on"}


def test_about_says_it(kernels_off, qtbot):
    from redline.ui.about import AboutDialog, AboutInfo

    dialog = AboutDialog(AboutInfo(version="0", licence="x", paths=[]))
    qtbot.addWidget(dialog)
    rep = KernelsReport.here("cpu", machine=MACHINE, shape=read_shape("starter"))
    dialog.set_kernels(rep)
    assert dialog.value("CPU kernels") == rep.sentence() != ""


def test_status_bar_says_it_once(kernels_off, qtbot, profile, aloop):
    """The window's status bar: a short note that stays, the whole sentence on hover and once as a message."""
    from gui_helpers import open_window

    window = open_window(qtbot)
    rep = KernelsReport.here("cpu", machine=MACHINE, shape=read_shape("starter"))
    window._show_kernels(rep)
    label = window.kernels_label
    assert label.isVisibleTo(window) and label.toolTip() == rep.sentence()
    assert label.text() == (
        f"CPU kernels off: slower (≈ {rep.without_tokens_per_s:.0f} instead of ≈ {rep.with_tokens_per_s:.0f} tok/s)"
    )
    assert window.statusBar().currentMessage() == rep.sentence()
    window._show_kernels(KernelsReport(on=True, text="Redline's CPU kernels on"))
    assert not label.isVisibleTo(window)
    window.shutdown()


def test_will_run_answers_from_memory_and_follows_the_variables_it_reads(monkeypatch):
    """The estimator asks will_run for every layer of every precision; it finds the library once per setting of
    REDLINE_NATIVE_KERNELS, REDLINE_KERNELS_VARIANT, CXX and PATH, and a changed setting is answered afresh."""
    monkeypatch.setattr(native, "_state", {"loaded": False, "reason": "not loaded yet"})
    monkeypatch.setattr(native, "_answers", {})
    monkeypatch.delenv("REDLINE_NATIVE_KERNELS", raising=False)
    asked = []
    real = native._will_run_now
    monkeypatch.setattr(native, "_will_run_now", lambda: asked.append(1) or real())
    first = native.will_run()
    assert native.will_run() == first and len(asked) == 1
    monkeypatch.setenv("REDLINE_NATIVE_KERNELS", "0")
    assert native.will_run() == "turned off (REDLINE_NATIVE_KERNELS=0)" and len(asked) == 2
    monkeypatch.delenv("REDLINE_NATIVE_KERNELS")
    assert native.will_run() == first and len(asked) == 2
