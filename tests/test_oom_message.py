"""A load that runs out of memory names the context the chat asked for (issue 48): the estimator's figure is for
that context, with the KV cache's form the load keeps, not for a fixed 4,096-token chat. No weights, no torch load."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from gui_helpers import aloop, profile, write_settings  # noqa: F401 - fixtures

from redline.inference.engine import Engine, LoadRequest
from redline.inference.estimate.model_shapes import shipped_starter_shape
from redline.inference.loading.loader import out_of_memory
from redline.inference.precision import parse_precision
from redline.inference.service.scheduler import EngineService

STARTER = shipped_starter_shape()


@pytest.fixture(autouse=True)
def kernels_run(monkeypatch):
    """Redline's CPU kernels run here (the fast path keeps the 8-bit cache), whatever this machine has."""
    monkeypatch.setattr("redline.inference.cost.will_run", lambda: None)


def _said(context=None, kv="bf16") -> str:
    source = SimpleNamespace(name="starter")
    exc = MemoryError()
    return out_of_memory(source, parse_precision("q8"), "cpu", Path("."), exc, STARTER, context, kv).hint


def test_the_message_names_the_context_asked_for():
    assert "for a chat of 3,000 tokens)" in _said(3000)
    assert "4,096" not in _said(3000) and "4096" not in _said(3000)
    # None asked: the model's own context, at most 8,192 (what auto plans with); more than the model allows: its limit.
    assert "for a chat of 8,192 tokens)" in _said() and "for a chat of 8,192 tokens)" in _said(100_000)
    # The 8-bit cache the load keeps is counted: a smaller total at the same length.
    assert _said(8192, "q8") != _said(8192, "bf16")


def test_the_context_reaches_the_loader(monkeypatch):
    seen = {}

    def fake_load_model(*args, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr("redline.inference.engine.load_model", fake_load_model)
    engine = Engine(device="cpu")
    engine.limits.kv = "q8"
    with pytest.raises(RuntimeError, match="stop here"):
        engine.load_all(LoadRequest("starter", "q8", context=3000), lambda ev: None)
    assert seen["context"] == 3000 and seen["kv"] == "q8"
    # The service's load hands it on in its request.
    requests = []
    engine = SimpleNamespace(load_all=lambda request, *a, **kw: requests.append(request))
    fake = SimpleNamespace(call=lambda job, *a: job(engine, SimpleNamespace(cancelled=lambda: False)))
    EngineService.load(fake, "starter", "q8", context=3000)
    assert requests[0].context == 3000


@pytest.mark.usefixtures("aloop", "profile")
def test_the_windows_context_setting_reaches_the_load(qtbot):
    """Settings → context goes with the window's load (``ModelController`` → ``EngineBridge.load`` → the engine's
    ``LoadRequest``), so a load that runs out of memory names the context the chat asked for."""
    from slow_engine import SlowEngine

    from redline.app.gui import build_window
    from redline.inference import OutOfMemory

    seen = []

    class RecordingLoads(SlowEngine):
        def load_all(self, request, report, should_cancel=None):
            seen.append(request.context)
            raise OutOfMemory(f"Not enough memory for a {request.context:,}-token context.", "Lower the context.")

    write_settings(model="/models/anything", precision="fp32", strategy="kv", context_length=3000)
    w = build_window(engine_factory=RecordingLoads)
    qtbot.addWidget(w)
    w.show()
    w.start()
    try:
        qtbot.waitUntil(lambda: w.banner.isVisible() and not w.loading, timeout=30_000)
        assert seen == [3000]
        assert "3,000-token context" in w.banner.label.text()
    finally:
        w.shutdown()
