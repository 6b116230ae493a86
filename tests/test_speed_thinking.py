"""Measured apart (issue 47, item 5): the speed model's time to the first answer token of a reasoning model — the
TTFT plus a typical thinking length it learns per model from the replies recorded here — and the speed lab's rows
with thinking on against off, their time to first answer, thinking and answer tokens/s filled from real runs of a
tiny model made to write a scripted reasoning reply."""

from __future__ import annotations

import json

import pytest
from conftest import build_tiny_model
from reasoning_helpers import Script, thinking_tokenizer

from redline.inference.bench import lab as lab_mod
from redline.inference.bench.configs import BenchConfig, format_config, parse_config, parse_configs
from redline.inference.bench.export import REASONING_COLUMNS, table_rows, to_csv, to_text
from redline.inference.bench.lab import BenchSpec, run_bench
from redline.inference.bench.prompts import prompt_set_from_dict
from redline.inference.bench.results import BenchReport
from redline.inference.decoding.options import DecodeOptions, SamplingSettings
from redline.inference.engine import Engine
from redline.inference.errors import UnsupportedConfiguration
from redline.inference.estimate.model_shapes import shipped_starter_shape
from redline.inference.events import GenerationResult
from redline.inference.generation.lifecycle import DirectSink
from redline.inference.generation.request import GenerationRequest
from redline.inference.precision import PrecisionSpec, parse_precision
from redline.inference.reasoning import Thinking
from redline.inference.speed.arithmetic import Machine, predict
from redline.inference.speed.calibration import SpeedCalibration
from redline.inference.speed.model import SpeedModel
from redline.inference.speed.thinking import LEARN_FROM, median_thinking, reply_thinking

STARTER = shipped_starter_shape()
CPU = Machine(device="cpu", label="test CPU", bandwidth_bytes_per_s=20e9, flops=200e9, calibration_key="cpu")
THOUGHT = "<think>\nI add 2 and 2, which makes 4.\n</think>\n\n"
ANSWER = "It is 4."
LONG_ANSWER = "It is 4, because two and two make four when they are added together."


# --------------------------------------------------------------------------- the learned thinking length
def test_the_median_of_complete_thinkings():
    rows = [{"thinking_tokens": n, "thinking_cut": False} for n in (100, 300, 200, 5000)]
    assert median_thinking(rows) == (250, 4)  # one very long thinking does not move it far
    assert median_thinking([]) == (None, 0)


def test_a_reply_cut_off_while_thinking_counts_as_at_least_its_length():
    # Three replies thought 100, 120 and 140 tokens; three were cut off at a cap of 64 while still thinking. Counted as
    # 64 each, the median would be 64 + a bit (82); as lower bounds it stays among the complete ones.
    rows = [{"thinking_tokens": n, "thinking_cut": False} for n in (100, 120, 140)]
    rows += [{"thinking_tokens": 64, "thinking_cut": True}] * 3
    naive = sorted(r["thinking_tokens"] for r in rows)
    assert (naive[2] + naive[3]) / 2 == 82
    assert median_thinking(rows) == (120, 6)
    # Most replies cut off later than the one complete thinking: no length is known to end half of them, not learned.
    rows = [{"thinking_tokens": 100, "thinking_cut": False}] + [{"thinking_tokens": 200, "thinking_cut": True}] * 3
    assert median_thinking(rows) == (None, 4)


def _record(cal, model, thinking, key="cpu", strategy="fast", precision="q8", measured=30.0):
    pred = predict(STARTER, parse_precision(precision), strategy, CPU, 32, 64)
    return cal.record(pred, key, model, measured, 200.0, "chat", thinking=thinking)


def test_prediction_before_anything_is_learned_says_so(tmp_path):
    speed = SpeedModel(CPU, SpeedCalibration(tmp_path / "s.json"))
    on = speed.predict(STARTER, "q8", "fast", 32, 64, thinking=True)
    assert on.thinking_tokens is None and on.thinking_samples == 0 and on.ttfat_ms is None
    assert on.to_dict()["ttfat_ms"] is None
    default = speed.predict(STARTER, "q8", "fast", 32, 64)
    assert default.ttfat_ms is None
    off = speed.predict(STARTER, "q8", "fast", 32, 64, thinking=False)
    assert off.ttfat_ms == off.ttft_ms  # thinking off: the first token is the answer's


def test_prediction_learns_the_typical_thinking_per_model_from_its_replies(tmp_path):
    path = tmp_path / "speed-calibration.json"
    cal = SpeedCalibration(path)
    name = STARTER.name
    # Twelve replies that thought, the oldest two far longer: only the last LEARN_FROM count.
    lengths = [4000, 4000] + [200, 220, 240, 260, 280, 300, 320, 340, 360, 380]
    for n in lengths:
        _record(cal, name, {"thinking_tokens": n, "thinking_cut": False})
    _record(cal, name, None)  # a reply with thinking off teaches no length
    _record(cal, "another-model", {"thinking_tokens": 9000, "thinking_cut": False})
    # Replies on other classes and another device are the same model's habit.
    _record(cal, name, {"thinking_tokens": 290, "thinking_cut": False}, key="cuda:0", strategy="kv", precision="bf16")
    stored = json.loads(path.read_text())["devices"]["cpu"]["fast:q8"]
    assert stored[-1]["model"] == "another-model" and stored[-2].get("thinking_tokens") is None
    assert stored[0]["thinking_tokens"] == 4000 and stored[0]["thinking_cut"] is False

    speed = SpeedModel(CPU, SpeedCalibration(path))  # a new process reads the file
    pred = speed.predict(STARTER, "q8", "fast", 32, 64, thinking=True)
    recent = sorted(lengths[3:] + [290])  # the last LEARN_FROM of the model's thinking replies, in time order
    assert len(recent) == LEARN_FROM
    assert pred.thinking_samples == LEARN_FROM
    assert pred.thinking_tokens == (recent[4] + recent[5]) / 2
    assert pred.ttfat_ms == pytest.approx(pred.ttft_ms + 1000 * pred.thinking_tokens / pred.tokens_per_s)
    assert pred.ttfat_ms > pred.ttft_ms
    # The model's default, once it is known to think: the same; thinking off: the TTFT.
    assert speed.predict(STARTER, "q8", "fast", 32, 64).ttfat_ms == pytest.approx(pred.ttfat_ms)
    off = speed.predict(STARTER, "q8", "fast", 32, 64, thinking=False)
    assert off.ttfat_ms == off.ttft_ms and off.thinking_tokens == pred.thinking_tokens


def test_reply_thinking_from_a_result():
    def result(**kw):
        base = dict(text="", token_ids=[], prompt_tokens=5, new_tokens=40, finish_reason="eos", strategy="kv")
        return GenerationResult(precision="fp32", **{**base, **kw})

    assert reply_thinking(result()) is None  # a model that does not reason
    assert reply_thinking(result(reasoning_format="think", reasoning_tokens=0)) is None  # thinking off
    done = result(reasoning_format="think", reasoning_tokens=30, ttfat_ms=12.0)
    assert reply_thinking(done) == {"thinking_tokens": 30, "thinking_cut": False}
    cut = result(reasoning_format="think", reasoning_tokens=40, finish_reason="length")
    assert reply_thinking(cut) == {"thinking_tokens": 40, "thinking_cut": True}


# --------------------------------------------------------------------------- the configurations
def test_thinking_is_a_configuration_dimension():
    on, off, default = parse_configs("fast:fp32+think=on,fast:fp32+think=off,fast:fp32")
    assert (on.thinking, off.thinking, default.thinking) == (True, False, None)
    assert parse_config("kv:bf16/think=off").thinking is False
    assert format_config(BenchConfig("fast", "fp32", thinking=False)) == "fast:fp32+think=off"
    assert parse_config(format_config(BenchConfig("fast", "fp32", thinking=True))).thinking is True
    with pytest.raises(UnsupportedConfiguration, match="think= takes on or off"):
        parse_config("fast:fp32+think=maybe")


# --------------------------------------------------------------------------- real replies, real rows
@pytest.fixture(scope="module")
def think_dir(tmp_path_factory, starter_dir):
    tok = thinking_tokenizer(starter_dir)
    return build_tiny_model(tmp_path_factory.mktemp("think-speed") / "m", tokenizer=tok, layers=1, hidden=32)


def _ids(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_a_chat_reply_that_thought_keeps_its_thinking_in_its_record(think_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    engine = Engine(device="cpu")
    engine.load(str(think_dir), PrecisionSpec("fp32"))
    tok = engine.target.tokenizer

    def reply(text, thinking=None, max_new=48):
        request = GenerationRequest(
            messages=[{"role": "user", "content": "What is 2 + 2?"}],
            sampling=SamplingSettings(max_new_tokens=max_new, temperature=0),
            options=DecodeOptions("kv"),
            logits_processor=Script(_ids(tok, text) + [tok.eos_token_id]),
            thinking=thinking,
        )
        return engine.run(request, DirectSink(lambda e: None))

    first = reply(THOUGHT + ANSWER)
    assert first.reasoning_tokens == len(_ids(tok, THOUGHT.rstrip()))
    assert engine.speed_check.thinking is True and engine.speed_check.ttfat_ms is None  # nothing learned before it
    path = tmp_path / "speed-calibration.json"
    [rec] = json.loads(path.read_text())["devices"]["cpu"]["kv:fp32"]
    assert rec["thinking_tokens"] == first.reasoning_tokens and rec["thinking_cut"] is False

    reply(LONG_ANSWER, thinking=Thinking(enabled=False))  # thinking off: recorded, but no thinking length
    records = json.loads(path.read_text())["devices"]["cpu"]["kv:fp32"]
    assert len(records) == 2 and "thinking_tokens" not in records[1]
    assert engine.speed_check.thinking is False and engine.speed_check.ttfat_ms == engine.speed_check.ttft_ms

    # A reply cut off while it still thought: a lower bound.
    cut = reply("<think>\n" + "and then I think some more " * 6, max_new=16)
    assert cut.finish_reason == "length" and cut.answer_tokens == 0
    records = json.loads(path.read_text())["devices"]["cpu"]["kv:fp32"]
    assert records[-1]["thinking_tokens"] == 16 and records[-1]["thinking_cut"] is True

    # The next reply's prediction knows how long this model thinks: its first answer after that many tokens.
    reply(THOUGHT + ANSWER)
    pred = engine.speed_check  # made before this reply was recorded: from the three above
    assert pred.thinking_samples == 2 and pred.thinking_tokens == first.reasoning_tokens
    assert pred.ttfat_ms == pytest.approx(pred.ttft_ms + 1000 * first.reasoning_tokens / pred.tokens_per_s)


@pytest.fixture
def scripted_lab(monkeypatch, think_dir):
    """The lab's requests made to write a reasoning reply with thinking on (the thinking, then the answer) and the
    answer alone with thinking off, as a real model of that format would; the rest of the run is the lab's own."""
    real = lab_mod.GenerationRequest

    def scripted(**kw):
        tok = scripted.tok
        off = kw.get("thinking") is not None and kw["thinking"].enabled is False
        kw["logits_processor"] = Script(_ids(tok, ANSWER if off else THOUGHT + ANSWER))
        return real(**kw)

    monkeypatch.setattr(lab_mod, "GenerationRequest", scripted)
    return scripted


def _lab(engine, think_dir, configs, new_tokens=40):
    prompts = prompt_set_from_dict({"name": "q", "prompts": [{"messages": [{"role": "user", "content": "2 + 2?"}]}]})
    spec = BenchSpec(str(think_dir), parse_configs(configs), prompts, new_tokens=new_tokens, warmup=0, samples=2)
    return run_bench(engine, spec)


def test_the_lab_compares_thinking_on_against_off(think_dir, scripted_lab, tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    engine = Engine(device="cpu")
    engine.load(str(think_dir), PrecisionSpec("fp32"))
    tok = scripted_lab.tok = engine.target.tokenizer
    report = _lab(engine, think_dir, "fast:fp32+think=on,fast:fp32+think=off")
    on, off = report.results
    assert [on.status, off.status] == ["ok", "ok"], [on.error, off.error]
    assert (on.thinking, off.thinking) == ("on", "off")
    assert on.reasoning_format == off.reasoning_format == "think"
    # Thinking on: the answer comes after the thinking's tokens, measured by the thinking's and the answer's rates.
    assert on.thinking_tokens == len(_ids(tok, THOUGHT.rstrip()))
    assert on.answered == on.samples == 2
    assert on.ttfat_ms >= on.ttft_ms and on.thinking_tokens_per_s > 0 and on.answer_tokens_per_s > 0
    assert on.outputs[0].startswith(ANSWER)  # the answer alone, the thinking apart
    # Thinking off: no thinking; the first token is the answer's.
    assert off.thinking_tokens == 0 and off.thinking_tokens_per_s is None and off.answer_tokens_per_s > 0
    assert off.ttfat_ms == pytest.approx(off.ttft_ms, rel=0.05)
    # Predicted before the run: thinking off is its TTFT; thinking on is not learned yet on a fresh machine.
    assert off.predicted_ttfat_ms == off.predicted_ttft_ms and on.predicted_ttfat_ms is None
    # The rows' thinking taught the speed model: the next run predicts the time to first answer.
    records = [
        r for rs in json.loads((tmp_path / "speed-calibration.json").read_text())["devices"]["cpu"].values() for r in rs
    ]
    assert [r.get("thinking_tokens") for r in records] == [on.thinking_tokens, None]
    again = _lab(engine, think_dir, "fast:fp32+think=on").results[0]
    assert again.predicted_ttfat_ms == pytest.approx(
        again.predicted_ttft_ms + 1000 * on.thinking_tokens / again.predicted_tokens_per_s, abs=0.15
    )  # the row's figures are rounded to 0.1 ms and 0.01 tok/s
    # The columns: shown for a reasoning model's rows, in every export.
    headers, rows = table_rows(report)
    assert REASONING_COLUMNS <= set(headers)
    col = {h: j for j, h in enumerate(headers)}
    assert rows[0][col["thinking"]] == "on" and rows[1][col["thinking"]] == "off"
    assert rows[0][col["TTFA p50 ms"]] == f"{on.ttfat_ms:.1f}"
    assert rows[0][col["think tok/s"]] == f"{on.thinking_tokens_per_s:.1f}"
    assert rows[1][col["answer tok/s"]] == f"{off.answer_tokens_per_s:.1f}"
    assert "TTFA p50 ms" in to_text(report) and "thinking_tokens_per_s" in to_csv(report).splitlines()[0]


def test_a_row_whose_thinking_outruns_its_tokens_says_so(think_dir, scripted_lab, tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    engine = Engine(device="cpu")
    engine.load(str(think_dir), PrecisionSpec("fp32"))
    scripted_lab.tok = engine.target.tokenizer
    [row] = _lab(engine, think_dir, "kv:fp32+think=on", new_tokens=8).results
    assert row.status == "ok" and row.answered == 0 and row.ttfat_ms is None and row.thinking_tokens == 8
    assert any("still thinking" in n for n in row.notes)
    headers, rows = table_rows(_report_of(row))
    assert rows[0][headers.index("TTFA p50 ms")] == "no answer"
    [rec] = [
        r for rs in json.loads((tmp_path / "speed-calibration.json").read_text())["devices"]["cpu"].values() for r in rs
    ]
    assert rec["thinking_tokens"] == 8 and rec["thinking_cut"] is True


def test_a_model_that_does_not_reason_keeps_its_table(tiny_model_dir):
    prompts = prompt_set_from_dict({"name": "q", "prompts": [{"messages": [{"role": "user", "content": "Hi"}]}]})
    spec = BenchSpec(
        str(tiny_model_dir), parse_configs("kv:fp32"), prompts, new_tokens=8, warmup=0, samples=1, record_speed=False
    )
    report = run_bench(Engine("cpu"), spec)
    [row] = report.results
    assert row.status == "ok" and row.thinking is None and row.reasoning_format is None and row.ttfat_ms is None
    headers, _ = table_rows(report)
    assert not REASONING_COLUMNS & set(headers)


def _report_of(row):
    return BenchReport(spec={}, machine={}, model="m", device="cpu", started_at="", results=[row])
