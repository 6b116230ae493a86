"""One meaning of the strategy ``auto``: a request that still says it runs what ``choose`` picks for the loaded
model's precision (docs/speed-model.md#auto), not a rule of the backend's own."""

from redline.inference.engine import Engine
from redline.inference.precision import parse_precision
from redline.inference.speed import arithmetic
from redline.inference.speed.arithmetic import Machine
from redline.inference.speed.choose import auto_strategy
from redline.inference.speed.model import SpeedModel


def test_a_request_for_auto_runs_chooses_pick_for_the_loaded_precision(tiny_model_dir, monkeypatch):
    machine = Machine("cpu", 20e9, 100e9, "a test CPU")
    monkeypatch.setattr(arithmetic, "cached_machine", lambda device="cpu", key=None: machine)
    engine = Engine("cpu")
    loaded = engine.load(str(tiny_model_dir), parse_precision("fp32"))
    expected = auto_strategy(loaded.estimate_shape, loaded.precision, SpeedModel(machine))
    assert loaded.auto_strategy == expected
    assert loaded.resolve_strategy("auto") == expected
    loaded.auto_strategy = "kv"  # whatever the ranking says, a request's auto follows it
    assert loaded.resolve_strategy("auto") == "kv"
    engine.unload()


def test_before_this_machine_was_measured_auto_is_the_fast_path_where_it_runs(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(arithmetic, "cached_machine", lambda device="cpu", key=None: None)
    engine = Engine("cpu")
    loaded = engine.load(str(tiny_model_dir), parse_precision("fp32"))
    assert loaded.auto_strategy is None and loaded.resolve_strategy("auto") == "fast"
    engine.unload()
