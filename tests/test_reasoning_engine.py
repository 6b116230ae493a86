"""A reasoning reply through the real engine: the thinking kept apart in the events and in the result, with its own
figures, on the fast path and on transformers' generate(); thinking off; the budget that forces the answer. The model
is a tiny random one with a reasoning model's tokenizer and template, made to write a scripted reply."""

from __future__ import annotations

import pytest
from conftest import build_tiny_model
from reasoning_helpers import Script, harmony_tokenizer, thinking_tokenizer

from redline.inference.decoding.options import DecodeOptions, SamplingSettings
from redline.inference.engine import Engine
from redline.inference.events import TokenEvent
from redline.inference.generation.lifecycle import DirectSink
from redline.inference.generation.request import GenerationRequest
from redline.inference.precision import PrecisionSpec
from redline.inference.reasoning import Thinking

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


def _engine(folder):
    eng = Engine(device="cpu")
    eng.load(str(folder), PrecisionSpec("fp32"))
    return eng


@pytest.fixture(scope="module")
def think_engine(tmp_path_factory, starter_dir):
    tok = thinking_tokenizer(starter_dir)
    return _engine(build_tiny_model(tmp_path_factory.mktemp("think") / "m", tokenizer=tok, layers=1, hidden=32))


@pytest.fixture(scope="module")
def harmony_engine(tmp_path_factory, starter_dir):
    tok = harmony_tokenizer(starter_dir)
    return _engine(build_tiny_model(tmp_path_factory.mktemp("harmony") / "m", tokenizer=tok, layers=1, hidden=32))


def reply(engine, text, strategy="fast", thinking=None, max_new=64, end=True):
    tok = engine.target.tokenizer
    ids = list(tok(text, add_special_tokens=False)["input_ids"]) + ([tok.eos_token_id] if end else [])
    events = []
    request = GenerationRequest(
        messages=QUESTION,
        sampling=SamplingSettings(max_new_tokens=max_new, temperature=0),
        options=DecodeOptions(strategy),
        logits_processor=Script(ids),
        thinking=thinking,
    )
    result = engine.run(request, DirectSink(events.append))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    return result, tokens


@pytest.mark.parametrize("strategy", ["fast", "kv"])
def test_thinking_apart_in_events_and_result(think_engine, strategy):
    result, tokens = reply(think_engine, "<think>\nI add 2 and 2.\n</think>\n\nIt is 4.", strategy)
    assert result.finish_reason == "eos"
    assert (result.reasoning, result.text) == ("I add 2 and 2.", "It is 4.")
    assert "".join(e.text for e in tokens) == result.text  # the answer's deltas
    assert "".join(e.reasoning for e in tokens) == result.reasoning
    assert not any("think>" in e.text or "think>" in e.reasoning for e in tokens)
    tok = think_engine.target.tokenizer
    thought = len(tok("<think>\nI add 2 and 2.\n</think>", add_special_tokens=False)["input_ids"])
    assert result.reasoning_tokens == thought
    assert result.reasoning_tokens + result.answer_tokens == result.new_tokens
    assert result.reasoning_format == "think"
    assert result.ttfat_ms >= result.ttft_ms and result.thinking_ms is not None
    assert result.thinking_tokens_per_s and result.answer_tokens_per_s
    first_answer = next(e for e in tokens if e.text)
    assert first_answer.time_s * 1000 == pytest.approx(result.ttfat_ms)


def test_thinking_off_has_no_reasoning(think_engine):
    result, tokens = reply(think_engine, "It is 4.", thinking=Thinking(enabled=False))
    assert (result.reasoning, result.text, result.reasoning_tokens) == ("", "It is 4.", 0)
    assert result.ttfat_ms == pytest.approx(result.ttft_ms)


def test_cut_off_while_thinking(think_engine):
    result, tokens = reply(think_engine, "<think>\nStill going and going", max_new=5, end=False)
    assert result.finish_reason == "length"
    assert result.text == "" and result.reasoning.startswith("Still")
    assert result.reasoning_tokens == result.new_tokens == 5 and result.ttfat_ms is None


@pytest.mark.parametrize("strategy", ["fast", "kv"])
def test_budget_forces_the_answer(think_engine, strategy):
    long = "<think>\n" + " la" * 40 + "\n</think>\n\nDone."
    result, _ = reply(think_engine, long, strategy, Thinking(budget=6), max_new=80)
    assert "</think>" not in result.text and result.text  # the answer came after the forced close
    assert 6 <= result.reasoning_tokens <= 6 + 3  # the budget, then the close's own tokens
    assert any("budget of 6 tokens" in n for n in result.notes)
    unlimited, _ = reply(think_engine, long, strategy, max_new=80)
    assert unlimited.reasoning_tokens > 40 and unlimited.text == "Done."


def test_harmony_reply(harmony_engine):
    text = "<|channel|>analysis<|message|>Two and two.<|end|><|start|>assistant<|channel|>final<|message|>Four."
    result, tokens = reply(harmony_engine, text)
    assert (result.reasoning, result.text) == ("Two and two.", "Four.")
    assert "".join(e.text for e in tokens) == "Four."
    assert result.reasoning_tokens + result.answer_tokens == result.new_tokens
    assert result.reasoning_format == "harmony"


def test_model_without_reasoning_is_untouched(tiny_model_dir):
    eng = _engine(tiny_model_dir)
    result, tokens = reply(eng, "Hello world")
    assert result.reasoning == "" and result.reasoning_format is None and result.reasoning_tokens == 0
    assert "".join(e.text for e in tokens) == result.text


def test_prefix_cache_after_a_template_drops_the_thinking(think_engine, native_kernels):
    """Turn 1 writes thinking and an answer; the template shows turn 2 only the answer. The cache serves turn 2 up to
    where its prompt and turn 1's written tokens part (never a page holding the dropped thinking), and turn 2's
    reply is token for token the one a cold cache gives."""
    from redline.inference.decoding.kv_cache import PAGE_TOKENS
    from redline.inference.generation.request import prepare

    system = {"role": "system", "content": "Answer briefly about arithmetic and nothing else at all. " * 10}
    first_turn = [system, {"role": "user", "content": "What is 2 + 2?"}]
    tok = think_engine.target.tokenizer
    thought = "<think>\n" + "I add two and two, carefully, step by step. " * 8 + "\n</think>\n\nIt is 4."
    ids = list(tok(thought, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
    sampling = SamplingSettings(max_new_tokens=len(ids) + 4, temperature=0)
    first = think_engine.run(
        GenerationRequest(
            messages=first_turn, sampling=sampling, options=DecodeOptions("fast"), logits_processor=Script(ids)
        ),
        DirectSink(),
    )
    assert first.reasoning and first.text == "It is 4."
    second_turn = first_turn + [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    written = prepare(tok, 4096, GenerationRequest(messages=first_turn)).prompt + first.token_ids
    prompt = prepare(tok, 4096, GenerationRequest(messages=second_turn)).prompt
    common = next(i for i, (a, b) in enumerate(zip(prompt, written)) if a != b)
    assert common <= len(written) - len(ids)  # they part where the thinking began: it is not in turn 2's prompt

    def turn_two(reuse):
        options = DecodeOptions("fast", reuse_prefix=reuse)
        request = GenerationRequest(messages=second_turn, sampling=SamplingSettings(max_new_tokens=16, temperature=0))
        request.options = options
        return think_engine.run(request, DirectSink())

    warm, cold = turn_two(True), turn_two(False)
    assert common // PAGE_TOKENS * PAGE_TOKENS - PAGE_TOKENS <= warm.cached_tokens <= common
    assert warm.cached_tokens > 0 and cold.cached_tokens == 0
    assert warm.token_ids == cold.token_ids
