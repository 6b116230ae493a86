"""Helpers for the window tests: a qasync loop that pytest-qt drives, and a window on a temp profile."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def aloop(qapp):
    import qasync

    # already_running: pytest-qt runs the Qt event loop; asyncio tasks step inside it.
    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    return loop


@pytest.fixture
def profile(tmp_path, monkeypatch) -> Path:
    """A new user's profile: settings, conversations and Redline's data (the speed calibration, the memory
    correction) of this test alone. The data was the run's shared folder, so what earlier tests measured moved
    what the wizard chose (a kv:q8 measured by another test ranked above an unmeasured fp32:fast)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path / "redline-data"))
    return tmp_path


def write_settings(**values) -> None:
    from redline.app.settings import settings_path

    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values), encoding="utf-8")


def open_window(qtbot, model=None, wait_loaded=True, timeout=120_000):
    from redline.app.gui import build_window

    window = build_window()
    qtbot.addWidget(window)
    window.show()
    if wait_loaded and (model or window.settings.model):
        with qtbot.waitSignal(window.model_loaded, timeout=timeout):
            window.start(model)
    else:
        window.start(model)
    return window


def start_slow_window(qtbot, engine: dict, size=None, activate=False, **settings):
    """The real window on tests/slow_engine.py's stand-in engine (no torch: deterministic timing), its model
    "fake" loaded; ``engine``: the SlowEngine's arguments, ``settings``: the settings file's values."""
    from slow_engine import SlowEngine

    from redline.app.gui import build_window

    write_settings(model="fake", **settings)
    window = build_window(engine_factory=lambda: SlowEngine(**engine))
    qtbot.addWidget(window)
    if size is not None:
        window.resize(*size)
    window.show()
    if activate:
        window.activateWindow()
    with qtbot.waitSignal(window.model_loaded, timeout=30_000):
        window.start()
    return window


def send(qtbot, window, text: str, timeout=120_000):
    window.input.setPlainText(text)
    with qtbot.waitSignal(window.reply_finished, timeout=timeout) as blocker:
        window.send()
    return blocker.args[0]
