"""Concepts computed once (issue 45, "one of each"): the percentile and the timing figures, the wizard's ranking
(the speed model's, the one ``auto`` loads from), a prediction's texts, the next-turn rule, the precisions' and
blocks' constants, and strategy ``auto``. Each test fails if a copy comes back or the users drift apart."""

from __future__ import annotations

import ast
import dataclasses
import random
import re
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import redline.inference as surface
from redline.inference import stats
from redline.inference.decoding import timing
from redline.inference.estimate.fit import Planner, Target
from redline.inference.estimate.model_shapes import shipped_starter_shape
from redline.inference.events import GenerationResult
from redline.inference.precision import parse_precision
from redline.inference.speed import choose as choose_mod
from redline.inference.speed.arithmetic import Machine, predict
from redline.inference.speed.calibration import SpeedCalibration
from redline.inference.speed.choose import auto_strategy, choose, fastest_that_fits, rank_strategies
from redline.inference.speed.model import NEXT_TURN_TOKENS, SpeedModel
from redline.inference.units import GB

ROOT = Path(__file__).resolve().parents[1]
STARTER = shipped_starter_shape()
CPU = Machine("cpu", 20e9, 100e9, "a test CPU", "cpu")
GPU = Machine("cuda", 900e9, 80e12, "a test GPU", "cuda")


def sources(*folders: str):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ".venv" not in path.parts:
                yield path, path.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- percentile
def test_percentile_is_numpys_linear_and_the_stdlibs_inclusive():
    rng = random.Random(45)
    for n in (1, 2, 3, 7, 20, 101, 256):
        data = [rng.expovariate(0.1) for _ in range(n)]
        for q in (0.0, 0.05, 0.5, 0.9, 0.95, 0.99, 1.0):
            assert stats.percentile(data, q) == pytest.approx(float(np.percentile(data, q * 100)), rel=1e-12)
        if n >= 2:
            cuts = statistics.quantiles(data, n=20, method="inclusive")  # p5, p10, …, p95
            assert stats.percentile(data, 0.95) == pytest.approx(cuts[18], rel=1e-12)
            assert stats.percentile(data, 0.5) == pytest.approx(statistics.median(data), rel=1e-12)
    assert stats.percentile([], 0.95) is None and stats.percentile(iter([3.0]), 0.95) == 3.0
    # Nearest rank (the window's old p95) gives another figure for the same 20 latencies: 19 ms, not 10.45.
    assert stats.percentile([1.0] * 18 + [10.0, 19.0], 0.95) == pytest.approx(10.45)
    with pytest.raises(ValueError, match="fraction from 0 to 1"):
        stats.percentile([1.0, 2.0], 95)


def test_the_windows_saved_figures_are_the_engines_for_the_same_tokens(qtbot):
    """A reply saved from what the window received (Redline closing before the result came) and the engine's result
    for the same tokens: the same p50, p95 and decode tokens/s, a speculative step's tokens arriving together."""
    from redline.inference import TokenEvent
    from redline.ui.chat_session import ChatSession, Reply

    rng = random.Random(7)
    chunks, t = [], 0.3
    for i in range(60):
        t += rng.uniform(0.01, 0.05) * (8 if i == 40 else 1)  # one stall, as a late wake-up
        chunks.append((t, 3 if i % 9 == 4 else 1))  # now and then three tokens accepted together
    engine = GenerationResult("", [], 0, 0, "length", "kv", "fp32")
    timing.fill_timing(engine, chunks)

    reply = Reply(conversation_id=1, message_id=1, model="m")
    session = ChatSession(SimpleNamespace(update_message=lambda *a, **k: None), None, 1)  # its events alone
    events, index = [], 0
    for at, n in chunks:
        for _ in range(n):
            events.append(TokenEvent(index, index, f"w{index} ", at))
            index += 1
    ChatSession._on_events(session, reply, events)
    saved = reply.measured_stats()
    assert saved["p50_ms"] == pytest.approx(engine.p50_ms) and saved["p95_ms"] == pytest.approx(engine.p95_ms)
    assert saved["tokens_per_s"] == pytest.approx(engine.tokens_per_s, abs=0.01)
    assert engine.per_token_ms == stats.token_latencies_ms(at for at, n in chunks for _ in range(n))


def test_one_percentile_function_everywhere():
    from redline.inference.bench import concurrency, lab, sweep
    from redline.ui import chat_session

    for module in (surface, timing, lab, sweep, concurrency, chat_session):
        assert module.percentile is stats.percentile, module.__name__
    # No other definition in the package, the tests or the tools: no `def percentile` / `def p95` beside
    # inference/stats.py, and no nearest-rank indexing (a sorted list indexed at int(0.95 times its length)).
    nearest_rank = re.compile(r"\[\s*(?:min\(\s*len\([^)]*\)\s*-\s*1\s*,\s*)?int\(\s*0?\.\d+\s*\*")
    found = []
    for path, text in sources("inference", "ui", "app", "tools", "tests"):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and re.fullmatch(r"_?(percentile|quantile|p\d\d)", node.name):
                if rel != "inference/stats.py":
                    found.append(f"{rel}: def {node.name}")
        found += [f"{rel}: {m.group(0)}" for m in nearest_rank.finditer(text)]
    assert not found, found


# --------------------------------------------------------------------------- the wizard reads choose.py's ranking
def _planner(device: str, available_gb: float, batch: int = 1) -> Planner:
    return Planner(STARTER, Target(device, int(available_gb * GB), "test memory", device), batch)


def _page(qtbot, shape, target, speed, priority, context):
    from redline.ui.wizard.config_page import ConfigPage

    wiz = SimpleNamespace(
        model=SimpleNamespace(shape=shape, name=shape.name), target=target, correction=0, speed_model=lambda: speed
    )
    page = ConfigPage(wiz)
    qtbot.addWidget(page)
    page._filling = True  # set the controls without a refresh each
    page.context.setRange(256, shape.max_positions)
    page.context.setValue(context)
    page.priority.setCurrentIndex(page.priority.findData(priority))
    page._filling = False
    page.refresh()
    return page


def _measure(cal, machine, measured: dict) -> None:
    """Replies measured at these tokens/s per (strategy, precision); five of each, so the calibration learns from
    them even where it sets aside records taken while this (shared, busy) machine was loaded."""
    for (s, p), tps in measured.items():
        for _ in range(5):
            pred = predict(STARTER, parse_precision(p), s, machine, 64, 256)
            cal.record(pred, machine.device, STARTER.name, tps, None, "chat")


CASES = [  # (device, GB available, priority, context, measured tokens/s per (strategy, precision))
    ("cpu", 16, "balanced", 2048, {}),
    ("cpu", 16, "speed", 8192, {("kv", "q8"): 90.0, ("fast", "q8"): 30.0}),  # kv measured faster: kv
    ("cpu", 1.75, "balanced", 8192, {("fast", "fp32"): 80.0}),  # fp32 fastest but does not fit
    ("cuda", 24, "quality", 4096, {}),
    ("cuda", 0.9, "speed", 8192, {}),
]


@pytest.mark.parametrize("device, gb, priority, context, measured", CASES)
def test_the_wizards_rows_are_chooses_ranking(qtbot, tmp_path, monkeypatch, device, gb, priority, context, measured):
    monkeypatch.setattr("redline.inference.speed.choose.bitsandbytes_available", lambda: False)
    cal = SpeedCalibration(tmp_path / "speed.json")
    machine = CPU if device == "cpu" else GPU
    _measure(cal, machine, measured)
    speed = SpeedModel(machine, cal)
    planner = _planner(device, gb)
    page = _page(qtbot, STARTER, planner.target, speed, priority, context)
    auto = choose(STARTER, planner, speed, context, priority)
    assert (page.choice.precision, page.choice.strategy, page.choice.reason) == (
        auto.precision,
        auto.strategy,
        auto.reason,
    )
    for p in page.shown:
        ranked = rank_strategies(STARTER, planner, speed, context, p)
        best = fastest_that_fits(ranked)
        row = page.speeds[p]
        assert (row.strategy, row.tokens_per_s) == (best.strategy, best.tokens_per_s), p
        pinned = choose(STARTER, planner, speed, context, priority, precision=p)
        if pinned.fits:  # what `auto` loads with this precision pinned is the row's strategy
            assert pinned.strategy == row.strategy, p
        assert page.turns[p] == speed.next_turn(STARTER, p, row.strategy, context)
        cell = page.table.item(page.shown.index(p), 8)
        assert cell.text() == row.text(strategy=True) and cell.toolTip().startswith(row.tip())
    if auto.fits and auto.precision in page.shown:
        assert page.selected_precision() == auto.precision  # the row selected is what `auto` would load
    if measured.get(("kv", "q8")) == 90.0:
        assert page.speeds["q8"].strategy == "kv"  # the ranking's pick, even where the fast path runs


def test_the_wizard_follows_the_ranking_not_a_copy_of_it(qtbot, monkeypatch):
    """Narrow the ranking to kv alone in choose.py: the wizard's rows follow (a ranking of its own would not)."""
    speed = SpeedModel(CPU, SpeedCalibration(Path("/nonexistent/never-written.json")))
    planner = _planner("cpu", 16)
    before = _page(qtbot, STARTER, planner.target, speed, "balanced", 2048)
    assert {before.speeds[p].strategy for p in ("fp32", "bf16", "q8")} == {"fast"}
    monkeypatch.setattr(choose_mod, "_strategies", lambda shape, spec, device: ["kv"])
    after = _page(qtbot, STARTER, planner.target, speed, "balanced", 2048)
    assert {pred.strategy for pred in after.speeds.values()} == {"kv"}
    assert after.choice.strategy == "kv"


def test_the_windows_texts_for_a_prediction_are_the_predictions_own(tmp_path):
    """`SpeedPrediction.text`/`tip` are the words; the wizard and the lab hold no copy of them."""
    # An empty calibration of its own: the shared one holds what other tests measured, and a learned factor
    # would move the figure this test spells out.
    pred = SpeedModel(CPU, SpeedCalibration(tmp_path / "speed.json")).predict(STARTER, "q8", "fast", 64, 256)
    assert pred.text() == f"≈ {pred.tokens_per_s:.0f} tok/s"
    assert pred.text(strategy=True) == f"≈ {pred.tokens_per_s:.0f} tok/s (fast)"
    slow = dataclasses.replace(pred, uncorrected_tokens_per_s=4.25, measured_tokens_per_s=4.31)
    assert slow.text(strategy=True) == "≈ 4.2 tok/s (fast) · measured here 4.3"
    assert "read per token" in pred.tip() and "not yet corrected" in pred.tip()
    for rel in ("ui/wizard/config_page.py", "ui/speedlab/configs.py"):
        text = (ROOT / rel).read_text(encoding="utf-8")
        for phrase in ("bytes_per_token", "roofline_tokens_per_s", "measured here {", "calibration_samples"):
            assert phrase not in text, (rel, phrase)


# --------------------------------------------------------------------------- the next turn
def test_the_next_turn_rule_is_the_speed_models():
    speed = SpeedModel(CPU)
    fast = speed.next_turn(STARTER, "bf16", "fast", 4096)
    kv = speed.next_turn(STARTER, "bf16", "kv", 4096)
    assert fast.prompt_tokens == kv.prompt_tokens == 4096 - 256
    assert fast.cached_tokens == 4096 - 256 - NEXT_TURN_TOKENS and kv.cached_tokens == 0
    windowed = dataclasses.replace(STARTER, layer_windows=[1024] * STARTER.layers)  # the fast path refuses it
    assert speed.next_turn(windowed, "bf16", "fast", 4096).cached_tokens == 0  # transformers' path: no cache
    for path, text in sources("ui", "app"):
        assert not re.search(r"^\s*NEXT_TURN_TOKENS\s*=|cached_tokens=cached", text, re.M), path


# --------------------------------------------------------------------------- constants
def test_precision_and_block_constants_are_defined_once():
    import redline.inference.cost as cost
    from redline.inference import precision
    from redline.inference.kernels import block_quant
    from redline.inference.loading import weight_only

    assert cost.WEIGHT_ONLY is precision.WEIGHT_ONLY and cost.AS_FILE is precision.AS_FILE
    assert surface.AS_FILE is precision.AS_FILE
    # block_quant imports torch and cost.py must not: the one copy left, held equal here.
    assert cost.BLOCK == block_quant.BLOCK == weight_only.INT4_GROUP
    allowed = {
        "WEIGHT_ONLY": {"inference/precision.py"},
        "AS_FILE": {"inference/precision.py"},
        "BLOCK": {"inference/cost.py", "inference/kernels/block_quant.py"},
    }
    found = []
    for path, text in sources("inference", "ui", "app"):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant | ast.Tuple):
                for target in node.targets:
                    name = getattr(target, "id", None)
                    if name in allowed and rel not in allowed[name]:
                        found.append(f"{rel}: {name}")
                    if name in ("Q4_GROUP", "INT4_GROUP") and isinstance(node.value, ast.Constant):
                        found.append(f"{rel}: {name} = {node.value.value}")
    assert not found, found


def test_block_bytes_are_counted_by_one_formula():
    import torch
    from gguf import GGMLQuantizationType as T

    from redline.inference.cost import packed_layer_bytes
    from redline.inference.kernels.block_quant import quantize_q4, quantize_q8
    from redline.inference.sources import gguf_tensors

    w = torch.randn(48, 96)
    q8, q4_1, q4_0 = quantize_q8(w), quantize_q4(w), quantize_q4(w, symmetric=True)
    assert q8.nbytes == packed_layer_bytes(8, 96, 48, "bfloat16", blocks=True)
    assert q4_1.nbytes == packed_layer_bytes(4, 96, 48, "bfloat16", blocks=True, mins=True)
    assert q4_0.nbytes == packed_layer_bytes(4, 96, 48, "bfloat16", blocks=True, mins=False)
    for qtype, blocks in ((T.Q8_0, q8), (T.Q4_1, q4_1), (T.Q4_0, q4_0)):
        assert gguf_tensors.block_weights_bytes(qtype, 48, 96) == blocks.nbytes


# --------------------------------------------------------------------------- strategy `auto`
@pytest.mark.parametrize("machine, measured", [(CPU, {}), (CPU, {("kv", "bf16"): 500.0}), (GPU, {})])
def test_auto_strategy_is_what_choose_takes_for_the_precision(tmp_path, machine, measured):
    cal = SpeedCalibration(tmp_path / "speed.json")
    _measure(cal, machine, measured)
    speed = SpeedModel(machine, cal)
    planner = _planner(machine.device, 64)  # everything fits: the choice is the ranking's alone
    for p in ("fp32", "bf16", "q8", "q4"):
        pinned = choose(STARTER, planner, speed, 2048, "speed", precision=p)
        assert auto_strategy(STARTER, p, speed) == pinned.strategy, p
    if measured:
        assert auto_strategy(STARTER, "bf16", speed) == "kv"  # the ranking said kv: auto is kv, fast path or not
