"""Reasoning models: the format found from the template, the one streaming parser on scripted token streams (every
edge case), and the thinking switch mapped onto real chat templates rendered by transformers."""

from __future__ import annotations

import random

import pytest
from reasoning_helpers import (
    DEEPSEEK_TEMPLATE,
    HARMONY_NO_EFFORT_TEMPLATE,
    QWEN3_PREFILL_TEMPLATE,
    harmony_tokenizer,
    magistral_tokenizer,
    starter_tokenizer,
    thinking_tokenizer,
)

from redline.inference.decoding.tool_calls import read_calls
from redline.inference.reasoning import ReasoningStream, Thinking, detect, plan, prompt_state
from redline.inference.reasoning.formats import by_name


def run(fmt: str, pieces, thinking: bool = False):
    """Feed ``pieces`` one token each; (reasoning, answer, reasoning tokens, answer tokens, still thinking), after
    checking the deltas join to the totals."""
    s = ReasoningStream(by_name(fmt), thinking)
    reasoning = answer = ""
    for p in pieces:
        out = s.feed(p)
        reasoning += out.reasoning
        answer += out.answer
    out = s.finish()
    reasoning += out.reasoning
    answer += out.answer
    assert (reasoning, answer) == (s.reasoning, s.answer)
    assert s.reasoning_tokens + s.answer_tokens == len(pieces)
    return reasoning, answer, s.reasoning_tokens, s.answer_tokens, s.thinking


# -- the parser -------------------------------------------------------------------------------------------
def test_think_tags_split_and_counted():
    got = run("think", ["<think>", "\nI am", " thinking\n", "</think>", "\n\nThe answer", " is 4."])
    assert got == ("I am thinking", "The answer is 4.", 4, 2, False)


def test_a_tag_split_across_tokens_never_shows_half():
    pieces = ["<", "th", "ink", ">", "hmm", "</", "thi", "nk", ">", "ok"]
    s = ReasoningStream(by_name("think"))
    shown = []
    for p in pieces:
        out = s.feed(p)
        shown.append((out.reasoning, out.answer))
    assert all("<" not in r and "<" not in a for r, a in shown)
    s.finish()
    assert (s.reasoning, s.answer) == ("hmm", "ok")


@pytest.mark.parametrize("seed", range(20))
def test_any_chunking_of_the_same_reply_gives_the_same_split(seed):
    text = "<think>\nStep 1: 2+2.\nStep 2: </thin is not a tag.\n</think>\n\nIt is <b>4</b>.<tool_call>{}</tool_call>"
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 30)))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
    reasoning, answer, *_ = run("think", pieces)
    assert reasoning == "Step 1: 2+2.\nStep 2: </thin is not a tag."
    assert answer == "It is <b>4</b>.<tool_call>{}</tool_call>"


def test_prefilled_opening_tag_output_holds_only_the_closing_one():
    got = run("think", ["Let me", " see.", "\n", "</think>", "\n\n", "Four."], thinking=True)
    assert got == ("Let me see.", "Four.", 4, 2, False)


def test_cut_off_while_thinking_is_all_reasoning():
    reasoning, answer, r, a, thinking = run("think", ["<think>", "First", " I", " wil"])
    assert (reasoning, answer, r, a, thinking) == ("First I wil", "", 4, 0, True)


def test_cut_off_inside_the_closing_tag_keeps_the_text():
    reasoning, answer, *_ = run("think", ["hmm", "</thi"], thinking=True)
    assert (reasoning, answer) == ("hmm</thi", "")


def test_model_without_reasoning_text_is_untouched():
    assert run("think", ["Hello", " <b>world</b>", "!"])[:2] == ("", "Hello <b>world</b>!")


def test_tool_call_after_thinking_goes_to_the_answer_and_is_read():
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    reasoning, answer, *_ = run("think", ["<think>", "Need weather.", "</think>", "\n\n", call])
    assert reasoning == "Need weather."
    content, calls = read_calls(answer)
    assert [c.name for c in calls] == ["get_weather"] and content == ""


def test_tool_call_inside_thinking_ends_the_thinking():
    call = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    reasoning, answer, *_ = run("think", ["<think>", "I should call it.\n", "<tool", "_call>", call[11:]])
    assert reasoning == "I should call it."
    assert answer == call and read_calls(answer)[1][0].name == "get_weather"


def test_thinking_off_prefill_and_stray_closing_tags_leave_no_tag_in_the_answer():
    assert run("think", ["<think>\n\n</think>\n\n", "Hi"])[:2] == ("", "Hi")
    assert run("think", ["Hi", "</think>", " there"])[:2] == ("", "Hi there")


def test_magistral():
    assert run("magistral", ["[THINK]", "ok so", "[/THINK]", "Answer"])[:3] == ("ok so", "Answer", 3)


def test_harmony_channels():
    pieces = ["<|channel|>", "analysis", "<|message|>", "Let me", " think.", "<|end|>"]
    pieces += ["<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "It is", " 4.", "<|return|>"]
    reasoning, answer, r, a, _ = run("harmony", pieces)
    assert (reasoning, answer) == ("Let me think.", "It is 4.")
    assert (r, a) == (6, 8)  # the analysis header's tokens are the thinking's, the final one's the answer's


def test_harmony_tool_call_becomes_a_call_the_tool_parser_reads():
    pieces = ["<|channel|>", "analysis", "<|message|>", "Need weather.", "<|end|>", "<|start|>", "assistant"]
    pieces += [" to=functions.get_weather", "<|channel|>", "commentary", " ", "<|constrain|>", "json", "<|message|>"]
    pieces += ['{"city":', ' "Paris"}', "<|call|>"]
    reasoning, answer, *_ = run("harmony", pieces)
    assert reasoning == "Need weather."
    content, calls = read_calls(answer)
    assert content == "" and calls[0].name == "get_weather" and calls[0].arguments == '{"city": "Paris"}'


def test_harmony_without_any_header_is_an_answer():
    assert run("harmony", ["Plain", " text"])[:2] == ("", "Plain text")


def test_harmony_cut_off_in_analysis():
    assert run("harmony", ["<|channel|>", "analysis", "<|message|>", "Hmm"])[:2] == ("Hmm", "")


def test_prompt_state():
    think = by_name("think")
    assert prompt_state(think, "<|im_start|>assistant\n<think>\n")
    assert not prompt_state(think, "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_state(think, "<|im_start|>assistant\n")


# -- the format, from real templates ---------------------------------------------------------------------------
def test_detect(starter_dir, tiny_model_dir):
    from transformers import AutoTokenizer

    assert detect(AutoTokenizer.from_pretrained(starter_dir)) is None  # the starter does not reason
    assert detect(AutoTokenizer.from_pretrained(tiny_model_dir)) is None
    assert detect(thinking_tokenizer(starter_dir)).name == "think"
    assert detect(thinking_tokenizer(starter_dir, QWEN3_PREFILL_TEMPLATE)).name == "think"
    assert detect(starter_tokenizer(starter_dir, DEEPSEEK_TEMPLATE)).name == "think"
    assert detect(harmony_tokenizer(starter_dir)).name == "harmony"
    assert detect(magistral_tokenizer(starter_dir)).name == "magistral"


def _prompt(tok, thinking=None, kwargs=None, messages=None):
    from redline.inference.generation.request import GenerationRequest, prepare

    messages = messages or [{"role": "user", "content": "What is 2 + 2?"}]
    req = GenerationRequest(messages=messages, thinking=thinking, template_kwargs=kwargs)
    prepared = prepare(tok, 4096, req)
    return tok.decode(prepared.prompt, skip_special_tokens=False), prepared


def test_qwen3_switch_is_enable_thinking(starter_dir):
    tok = thinking_tokenizer(starter_dir)
    on, _ = _prompt(tok)
    off, _ = _prompt(tok, Thinking(enabled=False))
    assert on.endswith("<|im_start|>assistant\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_state(by_name("think"), off)
    # a request's own template variables win
    assert _prompt(tok, Thinking(enabled=False), {"enable_thinking": True})[0] == on


def test_prefilled_template_starts_inside_the_thinking(starter_dir):
    tok = thinking_tokenizer(starter_dir, QWEN3_PREFILL_TEMPLATE)
    on, _ = _prompt(tok)
    assert on.endswith("<think>\n") and prompt_state(by_name("think"), on)
    off, _ = _prompt(tok, Thinking(enabled=False))
    assert not prompt_state(by_name("think"), off)


def test_template_without_a_switch_closes_the_thinking_after_the_prompt(starter_dir):
    tok = starter_tokenizer(starter_dir, DEEPSEEK_TEMPLATE)
    on, _ = _prompt(tok)
    off, _ = _prompt(tok, Thinking(enabled=False))
    assert on.endswith("assistant\n<think>\n")
    assert off == on + "\n</think>\n\n"


def test_earlier_thinking_is_dropped_as_the_template_wants(starter_dir):
    tok = thinking_tokenizer(starter_dir)
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ]
    text, _ = _prompt(tok, messages=history)
    assert "<think>" not in text and "Hello!" in text


def test_harmony_effort_and_off(starter_dir):
    tok = harmony_tokenizer(starter_dir)
    default, _ = _prompt(tok)
    high, _ = _prompt(tok, Thinking(effort="high"))
    assert "Reasoning: medium" in default and "Reasoning: high" in high
    off, prepared = _prompt(tok, Thinking(enabled=False))
    assert "Reasoning: low" in off
    assert any("always reasons" in n for n in prepared.notes)
    plain = harmony_tokenizer(starter_dir, HARMONY_NO_EFFORT_TEMPLATE)
    line, _ = _prompt(plain, Thinking(effort="high"))
    assert "Instructions\n\nReasoning: high" in line  # the system message's own effort line


def test_model_without_reasoning_prompt_is_unchanged(starter_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(starter_dir)
    assert _prompt(tok, Thinking(enabled=False, effort="high", budget=3))[0] == _prompt(tok)[0]


def test_reasoning_effort_values():
    assert Thinking.from_effort("none").enabled is False
    assert Thinking.from_effort("minimal").effort == "low"
    assert Thinking.from_effort("high") == Thinking(enabled=True, effort="high")
    with pytest.raises(ValueError, match="reasoning_effort"):
        Thinking.from_effort("max")


def test_plan_for_a_model_without_reasoning_passes_template_kwargs():
    got = plan(None, "", Thinking(enabled=False), {"custom": 1})
    assert got.template_kwargs == {"custom": 1} and not got.close_thinking


def test_decoder_keeps_harmony_markers_and_drops_other_special_tokens(starter_dir):
    from redline.inference.decoding.textstream import DeltaDecoder
    from redline.inference.reasoning.formats import kept_token_ids

    tok = harmony_tokenizer(starter_dir)
    ids = tok("<|channel|>final<|message|>Hi<|im_end|>", add_special_tokens=False)["input_ids"]
    plain = DeltaDecoder(tok)
    kept = DeltaDecoder(tok, keep=kept_token_ids(tok, detect(tok)))
    assert plain.finish(ids)[0] == "finalHi"
    assert kept.finish(ids)[0] == "<|channel|>final<|message|>Hi"
