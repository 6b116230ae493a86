"""Tool calls in /v1/chat/completions: each family's parser on the text its own chat template renders for an
assistant's calls (tests/data/tool_calls/*.txt, rendered with transformers' apply_chat_template from the Hermes /
Qwen 2.5, Llama 3.2 JSON and Mistral 7B v0.3 tool templates), the streamed hold-back, and the official ``openai``
client's full round trip with the starter (named, required, the result sent back, a text answer)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest
from served import read_address

from redline.inference.decoding.tool_calls import (
    FAMILIES,
    CallStream,
    calls_text,
    conversation,
    family_of,
    grammar,
    parse,
    read_calls,
)

DATA = Path(__file__).parent / "data" / "tool_calls"
NAMES = {"get_weather"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


# -- the parsers, on real template output -------------------------------------------------------------------
@pytest.mark.parametrize(
    "family, cities", [("hermes", ["Paris", "Zürich"]), ("llama3", ["Paris"]), ("mistral", ["Paris", "Zürich"])]
)
def test_each_family_reads_its_templates_rendering_of_calls(family, cities):
    text = (DATA / f"{family}.txt").read_text(encoding="utf-8")
    content, calls = parse(FAMILIES[family], text, NAMES)
    assert content == ""
    assert [c.name for c in calls] == ["get_weather"] * len(cities)
    assert [json.loads(c.arguments) for c in calls] == [{"city": c, "unit": "celsius"} for c in cities]
    assert len({c.id for c in calls}) == len(calls)


def test_text_before_a_hermes_call_is_the_content():
    text = "Let me check.\n" + (DATA / "hermes.txt").read_text(encoding="utf-8")
    content, calls = parse(FAMILIES["hermes"], text, NAMES)
    assert content == "Let me check." and len(calls) == 2


@pytest.mark.parametrize(
    "family, text",
    [
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),  # cut off
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>'),  # not JSON
        ("hermes", '<tool_call>\n{"name": "launch_missiles", "arguments": {}}\n</tool_call>'),  # not offered
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call> and then some text'),
        ("llama3", '{"name": "get_weather", "parameters": "Paris"}'),
        ("llama3", "The weather is {sunny}."),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}'),
    ],
)
def test_a_malformed_or_unknown_call_is_text_never_a_call(family, text):
    assert parse(FAMILIES[family], text, NAMES) == (text, [])


# -- the window's reading: no tools offered, any family ------------------------------------------------------
@pytest.mark.parametrize("family", ["hermes", "llama3", "mistral"])
def test_the_window_reads_every_familys_calls_without_a_list_of_tools(family):
    text = (DATA / f"{family}.txt").read_text(encoding="utf-8")
    before, calls = read_calls("Let me check.\n" + text if family != "llama3" else text)
    assert before == ("Let me check." if family != "llama3" else "")
    assert calls and {c.name for c in calls} == {"get_weather"}
    assert json.loads(calls[0].arguments) == {"city": "Paris", "unit": "celsius"}


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "Alice", "age": 3}',  # JSON with a "name" is not a call: no arguments key
        '{"name": "Alice", "parameters": {}, "age": 3}',  # nor with keys beside them
        '{"name": "two words", "parameters": {}}',  # not a function's name
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',  # not JSON
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',  # not closed
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>\nIt will rain.',  # prose after it
        "Use <tool_call> tags to call a tool.",
    ],
)
def test_the_window_keeps_what_is_not_wholly_a_call_as_text(text):
    assert read_calls(text) == (text, [])


def test_a_remote_servers_calls_are_stored_as_hermes_text_that_reads_back():
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    text = calls_text(calls)
    assert text.startswith('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>')
    assert parse(FAMILIES["hermes"], text, {"get_weather", "get_time"})[1]  # the server's own parser reads it too
    before, read = read_calls(text)
    assert before == "" and [(c.name, json.loads(c.arguments)) for c in read] == [
        ("get_weather", {"city": "Zürich"}),
        ("get_time", {}),
    ]
    broken = calls_text([{"function": {"name": "get_weather", "arguments": '{"city": "Par'}}])
    assert read_calls(broken) == (broken, []) and '{\\"city\\": \\"Par' in broken  # kept, shown as text


def test_families_are_told_from_the_templates():
    class Tok:
        def __init__(self, template):
            self.chat_template = template

    assert family_of(Tok("{{ tools }} <tool_call>"))[0].name == "hermes"
    assert family_of(Tok("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"))[0].name == "mistral"
    assert family_of(Tok('{{ tools }} "parameters": <|python_tag|>'))[0].name == "llama3"
    assert family_of(Tok("{{ messages }}")) == (FAMILIES["hermes"], False)  # no tools support: the fallback


def test_the_fallback_writes_calls_and_results_as_hermes_text():
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
    ]
    out = conversation(messages, [WEATHER], FAMILIES["hermes"], native=False)
    assert out[0]["role"] == "system" and '"get_weather"' in out[0]["content"] and "<tools>" in out[0]["content"]
    # Each function's own JSON on its line, compact: what every turn's prompt holds and every token attends over.
    listed = out[0]["content"].split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line) for line in listed] == [WEATHER["function"]]
    assert '"type":"function"' not in listed[0] and ", " not in listed[0].replace(
        WEATHER["function"]["description"], ""
    )
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    }
    assert out[3]["role"] == "user" and '"name": "get_weather", "content": "18 C"' in out[3]["content"]
    native = conversation(messages, [WEATHER], FAMILIES["hermes"], native=True)
    assert native[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert native[2] == {"role": "tool", "content": "18 C", "tool_call_id": "c1", "name": "get_weather"}


def test_a_streamed_reply_holds_back_only_what_may_be_a_call():
    text = "Let me check. " + (DATA / "hermes.txt").read_text(encoding="utf-8")
    held = CallStream(FAMILIES["hermes"], NAMES, forced=False)
    sent = "".join(held.feed(text[i : i + 3]) for i in range(0, len(text), 3))
    rest, calls = held.finish()
    assert sent + rest == "Let me check." and len(calls) == 2  # as the non-streamed content
    plain = CallStream(FAMILIES["hermes"], NAMES, forced=False)
    words = "Use a <b>tag</b> or <tool_ but no call."
    sent = "".join(plain.feed(words[i : i + 2]) for i in range(0, len(words), 2))
    assert sent + plain.finish()[0] == words and plain.finish()[1] == []
    llama = CallStream(FAMILIES["llama3"], NAMES, forced=False)
    assert llama.feed("  It is") == "  It is" and llama.feed(" sunny {x}") == " sunny {x}"


def test_the_call_grammar_takes_a_call_and_refuses_another_name():
    import llguidance
    import llguidance.hf

    from tests.conftest import build_tokenizer

    tok = build_tokenizer()
    lltok = llguidance.hf.from_tokenizer(tok)
    for family in ("hermes", "llama3", "mistral"):
        fam = FAMILIES[family]
        text = grammar(fam, [WEATHER, TIME], parallel=True)
        call = fam.render_call("get_time", {"city": "Paris"})
        good = llguidance.LLMatcher(lltok, text)
        assert all(good.consume_token(t) for t in tok.encode(call)), (family, good.get_error())
        assert good.is_accepting()
        bad = llguidance.LLMatcher(lltok, text)
        wrong = fam.render_call("get_date", {"city": "Paris"})
        assert not all(bad.consume_token(t) for t in tok.encode(wrong)), family


@pytest.mark.parametrize("parallel", [True, False])
def test_the_call_grammar_lets_the_reply_end_after_a_calls_newline(parallel):
    """A Hermes model writes a newline after ``</tool_call>`` before its end of turn: the grammar must let it end
    there (it wanted another call after the newline, so the starter began a second one and ran to max_tokens)."""
    import llguidance
    import llguidance.hf

    from tests.conftest import build_tokenizer

    tok = build_tokenizer()
    lltok = llguidance.hf.from_tokenizer(tok)
    for family in ("hermes", "llama3", "mistral"):
        fam = FAMILIES[family]
        matcher = llguidance.LLMatcher(lltok, grammar(fam, [WEATHER], parallel))
        call = fam.render_call("get_weather", {"city": "Paris", "unit": "celsius"}) + "\n"
        assert all(matcher.consume_token(t) for t in tok.encode(call)), (family, matcher.get_error())
        assert matcher.is_accepting(), family


PARIS = {"city": "Paris", "unit": "celsius"}
# Each family's reply cut by max_tokens in its second call, after a complete first one.
CUT = {
    "hermes": FAMILIES["hermes"].render_call("get_weather", PARIS) + '\n<tool_call>\n{"name": "get_weather", "argu',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, {"name": "ge',
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; {"name": "get_w',
}


@pytest.mark.parametrize("family", sorted(CUT))
def test_a_reply_cut_in_its_second_call_keeps_the_complete_call(family):
    fam, text = FAMILIES[family], CUT[family]
    assert parse(fam, text, NAMES) == (text, [])  # not cut: such a text is text, as before
    content, calls = parse(fam, text, NAMES, cut=True)
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", PARIS)]
    held = CallStream(fam, NAMES, forced=True)
    assert "".join(held.feed(text[i : i + 5]) for i in range(0, len(text), 5)) == ""
    rest, streamed = held.finish(cut=True)
    assert rest == "" and [c.name for c in streamed] == ["get_weather"]
    # Only an unfinished *call* is dropped: a first call cut short, or prose after a call, is still text.
    first = text[: len(text) // 4]
    assert parse(fam, first, NAMES, cut=True) == (first, [])
    prose = fam.render_call("get_weather", PARIS) + " and then some words"
    assert parse(fam, prose, NAMES, cut=True) == (prose, [])


# -- the server, with the official client and the starter ---------------------------------------------------
@pytest.fixture(scope="module")
def starter(starter_dir):
    from tests.test_server import start, stop

    service, server = start(starter_dir)
    yield openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=600), server
    stop(service, server)


def chat(client, **kwargs):
    from tests.test_server import STARTER_MODEL

    kwargs.setdefault("model", STARTER_MODEL)
    kwargs.setdefault("max_tokens", 80)
    return client.chat.completions.create(**kwargs)


def streamed_message(client, **kwargs):
    """A streamed reply reassembled: (content, [(id, name, arguments)], finish_reason)."""
    content, calls, finish = "", {}, None
    for chunk in chat(client, stream=True, **kwargs):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            slot = calls.setdefault(d.index, ["", "", ""])
            slot[0] = d.id or slot[0]
            slot[1] = (d.function.name if d.function else None) or slot[1]
            slot[2] += (d.function.arguments if d.function else None) or ""
        finish = choice.finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


USER = [{"role": "user", "content": "What is the weather in Paris right now? Use the tools."}]


@pytest.mark.starter
def test_starter_full_round_trip_named_then_required_then_the_answer(starter):
    client, _ = starter
    schema = WEATHER["function"]["parameters"]
    named = chat(
        client,
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
    )
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), schema)
    required = chat(client, messages=USER, tools=[WEATHER, TIME], tool_choice="required", temperature=0)
    assert required.choices[0].finish_reason == "tool_calls"
    for c in required.choices[0].message.tool_calls:
        assert c.function.name in ("get_weather", "get_time")
        jsonschema.validate(
            json.loads(c.function.arguments),
            (WEATHER if c.function.name == "get_weather" else TIME)["function"]["parameters"],
        )
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})},
    ]
    answer = chat(client, messages=history, tools=[WEATHER, TIME], tool_choice="none", temperature=0, max_tokens=40)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content
    # streamed: the same calls and the same answer, reassembled from the deltas
    content, calls, finish = streamed_message(
        client,
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
    )
    assert finish == "tool_calls" and content == ""
    assert [(n, a) for _, n, a in calls] == [(call.function.name, call.function.arguments)]
    content, calls, finish = streamed_message(
        client, messages=history, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=40
    )
    assert content == answer.choices[0].message.content and calls == []


@pytest.mark.starter
def test_starter_auto_is_a_valid_call_or_plain_text(starter):
    client, _ = starter
    for seed in range(3):
        reply = chat(client, messages=USER, tools=[WEATHER], temperature=0.8, seed=seed)
        message = reply.choices[0].message
        if message.tool_calls:
            assert reply.choices[0].finish_reason == "tool_calls"
            for c in message.tool_calls:
                jsonschema.validate(json.loads(c.function.arguments), WEATHER["function"]["parameters"])
        else:
            assert reply.choices[0].finish_reason in ("stop", "length") and message.content is not None


@pytest.mark.starter
def test_starter_parallel_calls_only_when_allowed(starter):
    client, _ = starter
    two = [{"role": "user", "content": "Weather in Paris and in Rome? Call the tool once per city."}]
    single = chat(
        client, messages=two, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, temperature=0
    )
    assert len(single.choices[0].message.tool_calls) == 1
    many = chat(client, messages=two, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=120)
    calls = many.choices[0].message.tool_calls or []
    assert calls and all(c.function.name == "get_weather" for c in calls)
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.starter
@pytest.mark.slow
def test_starter_sampled_calls_always_validate(starter):
    """20 sampled runs at temperature 1, one call each (with parallel calls allowed, a small model sampling at 1
    may go on adding calls until max_tokens cuts the last one: that reply is text, finish_reason length)."""
    client, _ = starter
    schema = WEATHER["function"]["parameters"]
    for seed in range(20):
        reply = chat(
            client,
            messages=USER,
            tools=[WEATHER, TIME],
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=160,
        )
        assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0]
        for c in reply.choices[0].message.tool_calls:
            params = schema if c.function.name == "get_weather" else TIME["function"]["parameters"]
            jsonschema.validate(json.loads(c.function.arguments), params)


# -- what is refused, in one sentence -----------------------------------------------------------------------
def test_tool_requests_the_server_cannot_run_are_one_sentence(tiny_server_client):
    client = tiny_server_client
    ask = dict(model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="'nope', which is not among the tools"):
        client.chat.completions.create(
            **ask, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}
        )
    with pytest.raises(openai.BadRequestError, match="'required' but the request has no tools"):
        client.chat.completions.create(**ask, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="same name"):
        client.chat.completions.create(**ask, tools=[WEATHER, WEATHER])
    with pytest.raises(openai.BadRequestError, match="cannot both constrain"):
        client.chat.completions.create(**ask, tools=[WEATHER], response_format={"type": "json_object"})
    with pytest.raises(openai.BadRequestError, match="without the tool_call_id"):
        client.chat.completions.create(**{**ask, "messages": [{"role": "tool", "content": "x"}]})
    image = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    with pytest.raises(
        openai.BadRequestError,
        match=r"messages\[0\].content\[1\].image_url.url' must be a base64 data URL",
    ):
        client.chat.completions.create(**{**ask, "messages": [{"role": "user", "content": image}]})


def test_tool_calls_on_the_tiny_model_come_back_as_calls_that_parse(tiny_server_client):
    """A model that knows nothing of tools: forced, its reply is still a call to one of the tools, whose arguments
    validate; with "none" the reply is text."""
    client = tiny_server_client
    messages = [{"role": "user", "content": "The quick brown fox"}]
    tiny = {"type": "function", "function": {"name": "f", "parameters": TIME["function"]["parameters"]}}
    reply = client.chat.completions.create(
        model="tiny-llama", messages=messages, tools=[tiny], tool_choice="required", max_tokens=60, temperature=0
    )
    choice = reply.choices[0]
    if choice.finish_reason == "tool_calls":
        jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), TIME["function"]["parameters"])
    else:  # ran out of tokens mid-call: the text, never a broken call
        assert choice.finish_reason == "length" and choice.message.tool_calls is None
    none = client.chat.completions.create(
        model="tiny-llama", messages=messages, tools=[tiny], tool_choice="none", max_tokens=8
    )
    assert none.choices[0].message.tool_calls is None


@pytest.fixture()
def tiny_server_client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.address, api_key="unused", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    from tests.test_server import start, stop

    service, server = start(tiny_model_dir)
    yield server
    stop(service, server)


# -- penalties and logit_bias --------------------------------------------------------------------------------
def test_penalties_and_logit_bias_change_the_scores_as_openai_defines_them():
    import torch

    from redline.inference.server.structured import Penalties

    p = Penalties(frequency=0.5, presence=1.0, bias={3: 100.0, 4: -100.0})
    prompt = torch.tensor([[7, 7, 7]])
    first = p(prompt, torch.zeros(1, 8))  # the prompt's tokens are not penalised
    assert first[0].tolist() == [0, 0, 0, 100, -100, 0, 0, 0]
    later = p(torch.tensor([[7, 7, 7, 2, 2, 5]]), torch.zeros(1, 8))
    assert later[0, 2].item() == -(0.5 * 2 + 1.0) and later[0, 5].item() == -(0.5 + 1.0)
    assert later[0, 7].item() == 0 and later[0, 3].item() == 100


def test_logit_bias_steers_the_reply_and_bad_values_are_one_sentence(tiny_server_client, tiny_model_dir):
    from transformers import AutoTokenizer

    client = tiny_server_client
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    ask = dict(model="tiny-llama", messages=[{"role": "user", "content": "The quick brown fox"}], temperature=0)
    forced = client.chat.completions.create(**ask, max_tokens=3, logit_bias={"42": 100})
    assert forced.choices[0].message.content == tok.decode([42, 42, 42])
    plain = client.chat.completions.create(**ask, max_tokens=12)
    penalised = client.chat.completions.create(**ask, max_tokens=12, frequency_penalty=2.0, presence_penalty=2.0)
    ids = tok(penalised.choices[0].message.content, add_special_tokens=False)["input_ids"]
    assert len(set(ids)) >= len(set(tok(plain.choices[0].message.content, add_special_tokens=False)["input_ids"]))
    with pytest.raises(openai.BadRequestError, match="between -2 and 2"):
        client.chat.completions.create(**ask, max_tokens=2, presence_penalty=3)
    with pytest.raises(openai.BadRequestError, match="keys are token ids"):
        client.chat.completions.create(**ask, max_tokens=2, logit_bias={"hello": 1})
    with pytest.raises(openai.BadRequestError, match="beyond this model's vocabulary"):
        client.chat.completions.create(**ask, max_tokens=2, logit_bias={"99999": 1})


def test_a_request_without_tools_or_penalties_carries_no_logits_processor(tiny_server, tiny_server_client):
    """Nothing masks or rescores the logits of a plain request (the engine's step is what it was); with tools,
    the grammar's processor is there, lazy under auto."""
    from redline.inference.decoding.tool_calls import ToolGrammar

    service = tiny_server.service
    seen = []
    submit = service.submit

    def spy(request):
        seen.append(request)
        return submit(request)

    ask = dict(model="tiny-llama", messages=[{"role": "user", "content": "The quick brown fox"}], max_tokens=2)
    tiny = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service, "submit", spy)
        tiny_server_client.chat.completions.create(**ask)
        tiny_server_client.chat.completions.create(**ask, tools=[tiny])
    assert seen[0].logits_processor is None and seen[0].tools is None
    assert isinstance(seen[1].logits_processor, ToolGrammar) and seen[1].logits_processor.lazy


@pytest.mark.starter
@pytest.mark.slow
def test_required_with_the_official_client_against_redline_serve_returns_the_complete_calls(starter_dir, tmp_path):
    """The starter, one tool, ``tool_choice: "required"``, a token limit that cuts its second call: ``redline serve``
    (a process of its own, on 127.0.0.1, a free port) answers the complete call as ``tool_calls`` with finish_reason
    "tool_calls", streamed and not; before, the whole text came back as content with finish_reason "length"."""
    import signal
    import subprocess
    import sys

    key_file = tmp_path / "key"
    key_file.write_text("a-key-for-this-test\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "redline", "serve", "--model", str(starter_dir), "--precision", "fp32",
         "--host", "127.0.0.1", "--port", "0", "--api-key-file", str(key_file)],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        address, _ = read_address(proc, 180)
        client = openai.OpenAI(base_url=address, api_key="a-key-for-this-test", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        schema = WEATHER["function"]["parameters"]
        # 40 tokens: the first call takes 31 of them, the second is cut (measured with greedy decoding).
        ask = dict(model=model, messages=USER, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=40)
        reply = client.chat.completions.create(**ask)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert not choice.message.content and choice.message.tool_calls
        for call in choice.message.tool_calls:
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), schema)
        content, calls, finish = streamed_message(client, **ask)
        assert finish == "tool_calls" and content == ""
        assert [(n, a) for _, n, a in calls] == [
            (c.function.name, c.function.arguments) for c in choice.message.tool_calls
        ]
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
