"""A reasoning model behind ``redline serve``'s server, through the official ``openai`` client: ``reasoning_content``
apart from ``content`` (whole and streamed), ``usage.completion_tokens_details.reasoning_tokens``, ``reasoning_effort``
and ``chat_template_kwargs`` reaching the model's template. The model is a tiny random one with a Qwen3-style
tokenizer and template, made to write a scripted reply (the engine service is wrapped so each request carries the
script); servers listen on 127.0.0.1 on a free port and every loop is bounded."""

from __future__ import annotations

import httpx
import openai
import pytest
from conftest import build_tiny_model
from reasoning_helpers import Script, thinking_tokenizer

from redline.inference import ApiServer, EngineService, ServerConfig, parse_precision
from redline.inference.engine import Engine

TIMEOUT = 120
THOUGHT = "<think>\nI add 2 and 2.\n</think>\n\n"
ANSWER = "It is 4."
QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, starter_dir):
    tok = thinking_tokenizer(starter_dir)
    folder = build_tiny_model(tmp_path_factory.mktemp("served") / "thinker", tokenizer=tok, layers=1, hidden=32)
    service = EngineService(lambda: Engine("cpu"), max_active=4, max_queued=32)
    service.load(str(folder), parse_precision("fp32")).result(TIMEOUT)
    script = {"text": THOUGHT + ANSWER}
    submit = service.submit

    def scripted(request):
        ids = tok(script["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        request.logits_processor = Script(ids, request.logits_processor)
        return submit(request)

    service.submit = scripted
    server = ApiServer(service, ServerConfig(port=0))
    server.start()
    client = openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=60)
    yield client, script, server, tok
    assert server.stop(10)
    assert service.shutdown(30)


def ask(client, **kwargs):
    kwargs.setdefault("model", "thinker")
    kwargs.setdefault("messages", QUESTION)
    kwargs.setdefault("max_tokens", 64)
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(**kwargs)


def test_reasoning_content_apart_from_content(served):
    client, script, _, tok = served
    script["text"] = THOUGHT + ANSWER
    reply = ask(client)
    message = reply.choices[0].message
    assert message.content == ANSWER
    assert message.model_extra["reasoning_content"] == "I add 2 and 2."
    thought = len(tok(THOUGHT.rstrip(), add_special_tokens=False)["input_ids"])
    details = reply.usage.completion_tokens_details
    assert details.reasoning_tokens == thought
    assert reply.usage.completion_tokens == len(tok(THOUGHT + ANSWER, add_special_tokens=False)["input_ids"]) + 1
    assert reply.choices[0].finish_reason == "stop"


def test_streamed_deltas_reassemble_to_the_same_two_strings(served):
    client, script, _, _ = served
    script["text"] = THOUGHT + ANSWER
    whole = ask(client).choices[0].message
    chunks = list(ask(client, stream=True, stream_options={"include_usage": True}))
    assert len(chunks) < 80
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = "".join(d.content or "" for d in deltas)
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert (reasoning, content) == (whole.model_extra["reasoning_content"], whole.content)
    assert not any("think>" in (d.content or "") for d in deltas)
    # the thinking streams before the answer begins
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not (d.model_extra or {}).get("reasoning_content") for d in deltas[first_answer:])
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens > 0


def test_thinking_off_by_reasoning_effort_and_by_template_kwargs(served):
    client, script, _, _ = served
    script["text"] = ANSWER
    on = ask(client)
    for off in (
        ask(client, reasoning_effort="none"),
        ask(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}}),
    ):
        message = off.choices[0].message
        assert message.content == ANSWER and not message.model_extra.get("reasoning_content")
        assert off.usage.completion_tokens_details.reasoning_tokens == 0
        # the template pre-filled the closed, empty thinking block: the prompt is longer by it
        assert off.usage.prompt_tokens > on.usage.prompt_tokens


def test_earlier_reasoning_content_is_accepted_and_not_sent(served):
    client, script, _, _ = served
    script["text"] = THOUGHT + ANSWER
    history = QUESTION + [
        {"role": "assistant", "content": ANSWER, "reasoning_content": "I add 2 and 2."},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    plain = QUESTION + [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": "And 3 + 3?"}]
    assert ask(client, messages=history).usage.prompt_tokens == ask(client, messages=plain).usage.prompt_tokens


def test_tool_call_after_thinking(served):
    client, script, _, _ = served
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    script["text"] = "<think>\nI need the weather.\n</think>\n\n" + call
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    reply = ask(client, tools=tools)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls[0].function.name == "get_weather"
    assert message.model_extra["reasoning_content"] == "I need the weather."
    assert not message.content


def test_a_reserved_template_argument_is_refused(served):
    _, _, server, _ = served
    with httpx.Client(timeout=60) as http:
        body = {"model": "thinker", "messages": QUESTION, "chat_template_kwargs": {"tokenize": False}}
        response = http.post(server.address + "/chat/completions", json=body)
    assert response.status_code == 400
    assert "chat_template_kwargs" in response.json()["error"]["message"]


def test_a_remote_reasoning_model_is_read_apart(served):
    """Redline connected to this server as a remote engine: the streamed ``reasoning_content`` becomes the events'
    and the result's thinking, as a local model's does."""
    from redline.inference import GenerationRequest, SamplingSettings, TokenEvent

    client, script, server, _ = served
    script["text"] = THOUGHT + ANSWER
    remote = EngineService(lambda: Engine("cpu"))
    try:
        remote.call(lambda engine, report: engine.load(server.address, None), "a connection").result(60)
        request = GenerationRequest(messages=QUESTION, sampling=SamplingSettings(max_new_tokens=64, temperature=0))
        handle = remote.submit(request)
        events = [e for e in handle.events() if isinstance(e, TokenEvent)]
        result = handle.result(TIMEOUT)
    finally:
        remote.shutdown(30)
    assert (result.reasoning, result.text) == ("I add 2 and 2.", ANSWER)
    assert "".join(e.reasoning for e in events) == result.reasoning
    assert "".join(e.text for e in events) == result.text
    assert result.reasoning_tokens == ask(client).usage.completion_tokens_details.reasoning_tokens
    assert result.ttfat_ms >= result.ttft_ms


def test_responses_api_returns_a_reasoning_item(served):
    client, script, _, tok = served
    script["text"] = THOUGHT + ANSWER
    response = client.responses.create(model="thinker", input="What is 2 + 2?", temperature=0)
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]
    assert response.output[0].content[0].text == "I add 2 and 2."
    assert response.output_text == ANSWER
    thought = len(tok(THOUGHT.rstrip(), add_special_tokens=False)["input_ids"])
    assert response.usage.output_tokens_details.reasoning_tokens == thought

    events = list(client.responses.create(model="thinker", input="What is 2 + 2?", temperature=0, stream=True))
    names = [e.type for e in events]
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thinking, answer) == ("I add 2 and 2.", ANSWER)
    assert names.index("response.reasoning_text.done") < names.index("response.output_text.delta")
    done = [e.item.type for e in events if e.type == "response.output_item.done"]
    assert done == ["reasoning", "message"]
    assert [o.type for o in events[-1].response.output] == ["reasoning", "message"]

    script["text"] = ANSWER
    off = client.responses.create(model="thinker", input="What is 2 + 2?", reasoning={"effort": "none"})
    assert [item.type for item in off.output] == ["message"] and off.output_text == ANSWER
