"""The one decode path: five strategies, same tokens under greedy fp32, streaming, cancel, errors."""

import threading

import pytest
import torch

from redline.inference.decoding.options import DecodeOptions, SamplingSettings
from redline.inference.engine import Engine
from redline.inference.errors import IncompatibleDraft, UnsupportedConfiguration
from redline.inference.events import FinishedEvent, StatsEvent, TokenEvent
from redline.inference.generation.run import generate
from redline.inference.precision import PrecisionSpec

GREEDY = SamplingSettings(max_new_tokens=24, temperature=0)
PROMPT = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. The quick brown fox"}]


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tiny_draft_dir):
    eng = Engine(device="cpu")
    eng.load(str(tiny_model_dir), PrecisionSpec("fp32"))
    eng.load_draft(str(tiny_draft_dir), PrecisionSpec("fp32"))
    return eng


def run(engine, strategy, sampling=GREEDY, **kw):
    return engine.chat(PROMPT, sampling, DecodeOptions(strategy=strategy, **kw))


def test_all_strategies_give_the_same_tokens_greedy_fp32(engine):
    results = {s: run(engine, s) for s in ("naive", "kv", "static", "speculative", "prompt-lookup")}
    reference = results["kv"].token_ids
    assert len(reference) == 24
    for strategy, result in results.items():
        assert result.token_ids == reference, strategy
        assert result.finish_reason == "length"
        assert result.ttft_ms is not None and result.tokens_per_s is not None
        assert len(result.per_token_ms) == result.new_tokens - 1 or strategy in ("speculative", "prompt-lookup")
    spec = results["speculative"]
    assert spec.draft_proposed > 0 and 0 <= spec.acceptance_rate <= 1
    assert len(spec.from_draft) == spec.new_tokens
    assert sum(spec.from_draft) == spec.draft_accepted
    assert results["kv"].acceptance_rate is None


def test_naive_really_recomputes_the_whole_sequence(engine):
    seen = []
    model = engine.target.model
    handle = model.model.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        naive = run(engine, "naive", SamplingSettings(max_new_tokens=5, temperature=0))
        naive_lengths = list(seen)
        seen.clear()
        run(engine, "kv", SamplingSettings(max_new_tokens=5, temperature=0))
        kv_lengths = list(seen)
    finally:
        handle.remove()
    p = naive.prompt_tokens
    assert naive_lengths == [p, p + 1, p + 2, p + 3, p + 4]
    assert kv_lengths == [p, 1, 1, 1, 1]


def test_events_stream_and_deltas_join_to_text(engine):
    events = []
    result = engine.chat(
        [{"role": "user", "content": "你好，世界！ Emoji 😀🚀 café"}],
        SamplingSettings(max_new_tokens=40, temperature=0),
        DecodeOptions("kv"),
        on_event=events.append,
    )
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert isinstance(events[-1], FinishedEvent) and events[-1].result is result
    assert "".join(e.text for e in tokens) == result.text
    assert [e.token_id for e in tokens if e.token_id >= 0] == result.token_ids


def test_sampling_with_seed_is_repeatable(engine):
    s = SamplingSettings(max_new_tokens=16, temperature=1.0, top_k=50, top_p=0.9, seed=123)
    a, b = run(engine, "kv", s), run(engine, "kv", s)
    assert a.token_ids == b.token_ids


def test_cancel_keeps_partial_and_model_stays_usable(engine):
    count = 0
    stop = threading.Event()

    def on_event(ev):
        nonlocal count
        if isinstance(ev, TokenEvent):
            count += 1
            if count == 5:
                stop.set()

    result = engine.chat(
        PROMPT,
        SamplingSettings(max_new_tokens=50, temperature=0),
        DecodeOptions("kv"),
        on_event=on_event,
        should_cancel=stop.is_set,
    )
    assert result.finish_reason == "cancelled"
    assert 5 <= result.new_tokens < 50
    again = run(engine, "kv")
    assert again.finish_reason == "length" and again.new_tokens == 24


def test_cancel_from_another_thread(engine):
    started = threading.Event()

    def on_event(ev):
        if isinstance(ev, TokenEvent):
            started.set()

    stop = threading.Event()
    t = threading.Thread(target=lambda: (started.wait(5), stop.set()))
    t.start()
    result = engine.chat(
        PROMPT,
        SamplingSettings(max_new_tokens=400, temperature=0),
        DecodeOptions("naive"),
        on_event=on_event,
        context=500,
        should_cancel=stop.is_set,
    )
    t.join()
    assert result.finish_reason == "cancelled" and result.new_tokens < 400


def test_context_overflow_drops_oldest_turns_keeps_system(engine):
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(30):
        messages.append({"role": "user", "content": f"Question {i}: the quick brown fox jumps over the lazy dog"})
        messages.append({"role": "assistant", "content": f"Answer {i}: Paris is the capital of France."})
    messages.append({"role": "user", "content": "Last question?"})
    result = engine.chat(messages, SamplingSettings(max_new_tokens=8, temperature=0), DecodeOptions("kv"), context=200)
    assert result.dropped_messages > 0
    assert any("did not fit" in n for n in result.notes)
    assert result.prompt_tokens + 8 <= 200
    from redline.inference.decoding.prompt import build_prompt

    prompt = build_prompt(engine.target.tokenizer, messages, 200, 8)
    text = engine.target.tokenizer.decode(prompt.input_ids)
    assert "You are terse." in text and "Last question?" in text and "Question 0:" not in text


def test_single_message_longer_than_context_keeps_its_start_and_end(engine):
    """'Summarize this text:' and a long paste: the instruction at the start and the end both reach the
    model, the middle is left out with a marker, and the user is told how much — before the reply starts."""
    from redline.inference.decoding.prompt import build_prompt
    from redline.inference.events import Notice

    long = "Summarize this text: " + "lazy dog " * 400 + "FINAL WORDS"
    events = []
    result = engine.chat(
        [{"role": "user", "content": long}],
        SamplingSettings(max_new_tokens=4, temperature=0),
        DecodeOptions("kv"),
        on_event=events.append,
        context=128,
    )
    assert result.prompt_tokens <= 124
    [cut] = [n for n in result.notes if "left out" in n]
    assert "first" in cut and "last" in cut
    notices = [i for i, e in enumerate(events) if isinstance(e, Notice)]
    tokens = [i for i, e in enumerate(events) if type(e).__name__ == "TokenEvent"]
    assert notices and tokens and notices[0] < tokens[0]  # said before the first token
    sent = engine.target.tokenizer.decode(
        build_prompt(engine.target.tokenizer, [{"role": "user", "content": long}], 128, 4).input_ids
    )
    assert "Summarize this text" in sent and "FINAL WORDS" in sent and "left out to fit the context" in sent


def test_a_system_prompt_that_leaves_no_room_says_so_and_never_sends_negative_halves(engine):
    from redline.inference.decoding.prompt import build_prompt

    system = {"role": "system", "content": "Be brief. " * 60}
    with pytest.raises(UnsupportedConfiguration, match="system prompt"):
        build_prompt(engine.target.tokenizer, [system, {"role": "user", "content": "word " * 200}], 160, 4)


def test_stop_string_ends_reply_before_it(engine):
    first = run(engine, "kv")
    stop = first.text[5:8]
    assert stop.strip()
    events = []
    s = SamplingSettings(max_new_tokens=24, temperature=0, stop=(stop,))
    result = engine.chat(PROMPT, s, DecodeOptions("kv"), on_event=events.append)
    assert result.finish_reason == "stop"
    assert stop not in result.text and first.text.startswith(result.text)
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == result.text


def test_out_of_memory_mid_generation_is_an_error_result(engine, monkeypatch):
    model = engine.target.model
    calls = {"n": 0}
    original = model.forward

    def failing_forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "forward", failing_forward)
    result = run(engine, "kv")
    assert result.finish_reason == "error"
    assert "Out of memory" in result.error and "max new tokens" in result.error
    assert result.new_tokens == 2  # what streamed before the failure is kept
    monkeypatch.undo()
    assert run(engine, "kv").finish_reason == "length"


def test_speculative_without_draft_is_refused(tiny_model_dir):
    eng = Engine(device="cpu")
    eng.load(str(tiny_model_dir), PrecisionSpec("fp32"))
    with pytest.raises(IncompatibleDraft, match="needs a draft"):
        eng.chat(PROMPT, GREEDY, DecodeOptions("speculative"))


def test_draft_with_other_tokenizer_uses_universal_assisted(tiny_model_dir, tiny_other_tokenizer_dir):
    eng = Engine(device="cpu")
    eng.load(str(tiny_model_dir), PrecisionSpec("fp32"))
    eng.load_draft(str(tiny_other_tokenizer_dir), PrecisionSpec("fp32"))
    kv = eng.chat(PROMPT, GREEDY, DecodeOptions("kv"))
    spec = eng.chat(PROMPT, GREEDY, DecodeOptions("speculative", num_draft_tokens=3))
    assert any("universal assisted" in n for n in spec.notes)
    assert spec.token_ids == kv.token_ids
    assert spec.draft_proposed is not None


def test_draft_with_same_vocab_size_but_other_tokens_is_refused(tiny_model_dir, tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import build_tiny_model, build_tokenizer
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(tiny_model_dir))
    for size in range(n, n + 40):  # train until the vocabulary has the same size but other tokens
        tok = build_tokenizer(size, seed_text="zebra quagga okapi " * 50)
        if len(tok) == n:
            break
    else:
        pytest.skip("could not build a same-size tokenizer")
    other = build_tiny_model(tmp_path / "same-size", tokenizer=tok, seed=3)
    eng = Engine(device="cpu")
    eng.load(str(tiny_model_dir), PrecisionSpec("fp32"))
    with pytest.raises(IncompatibleDraft, match="different tokens"):
        eng.load_draft(str(other), PrecisionSpec("fp32"))
    assert eng.draft is None and eng.target is not None


def test_prompt_fills_context_is_refused(engine):
    from redline.inference.errors import UnsupportedConfiguration

    with pytest.raises(UnsupportedConfiguration, match="fills the context"):
        generate(engine.target, list(range(10, 60)), GREEDY, DecodeOptions("kv"), context_limit=50)


def test_stats_events_during_long_generation(engine, monkeypatch):
    from redline.inference.decoding import timing

    # Every 20 ms instead of 0.5 s: on a fast CPU (Zen 5) the tiny model's 300 naive tokens took under 0.5 s and
    # no stats event came, which is right but made this test depend on the machine's speed.
    monkeypatch.setattr(timing, "STATS_INTERVAL_S", 0.02)
    events = []
    engine.chat(
        PROMPT,
        SamplingSettings(max_new_tokens=300, temperature=0),
        DecodeOptions("naive"),
        on_event=events.append,
        context=500,
    )
    stats = [e for e in events if isinstance(e, StatsEvent)]
    assert stats and all(s.tokens_per_s_1s > 0 for s in stats)
