"""Anthropic's Messages API (/v1/messages) with the official ``anthropic`` client, and /v1/embeddings with the
official ``openai`` client (issue 51, item 6): a message and its usage, the streamed events adding up to the same
message, system prompts, a forced tool call as a tool_use block and its tool_result answered, stop sequences on the
starter, Anthropic's error shape; embeddings mean-pooled, of length 1, the same for the same text, base64 as floats."""

from __future__ import annotations

import base64
import math
import struct

import anthropic
import openai
import pytest

from tests.test_server import STARTER_MODEL, post, start, stop
from tests.test_tool_calls import WEATHER

TOOL = {
    "name": WEATHER["function"]["name"],
    "description": WEATHER["function"]["description"],
    "input_schema": WEATHER["function"]["parameters"],
}


@pytest.fixture(scope="module")
def tiny_long(tmp_path_factory):
    """A tiny model with room for a tool's definition (its byte-level tokenizer spends ~540 tokens on one)."""
    from conftest import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("messages") / "tiny-llama", max_positions=2048)


@pytest.fixture(scope="module")
def tiny(tiny_long):
    service, server = start(tiny_long, api_key="messages-key")
    client = anthropic.Anthropic(base_url=server.address.removesuffix("/v1"), api_key="messages-key", max_retries=0)
    yield client, server
    stop(service, server)


def test_a_message_and_its_stream_are_the_same_reply(tiny):
    client, _ = tiny
    # The 2.x client has no temperature argument (the hosted models set their own); an older one sends it, as here.
    ask = dict(model="tiny-llama", max_tokens=8, extra_body={"temperature": 0}, system="Be brief.")
    messages = [{"role": "user", "content": "The quick brown fox"}]
    whole = client.messages.create(messages=messages, **ask)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 8 and whole.usage.input_tokens > 0
    assert [b.type for b in whole.content] == ["text"]
    with client.messages.stream(messages=messages, **ask) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    blocks = [{"type": "text", "text": "The quick "}, {"type": "text", "text": "brown fox"}]
    same = client.messages.create(messages=[{"role": "user", "content": blocks}], **ask)
    assert same.content[0].text == whole.content[0].text  # text blocks join as one message


def test_a_forced_tool_call_is_a_tool_use_block_and_its_result_is_answered(tiny):
    client, _ = tiny
    ask = dict(model="tiny-llama", max_tokens=120, extra_body={"temperature": 0}, tools=[TOOL])
    first = client.messages.create(
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tool_choice={"type": "tool", "name": "get_weather"},
        **ask,
    )
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and set(use.input) == {"city", "unit"} and use.id.startswith("toolu_")
    with client.messages.stream(
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tool_choice={"type": "tool", "name": "get_weather"},
        **ask,
    ) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content if b.type == "tool_use"] == ["tool_use"]
    assert streamed.content[-1].input == use.input and streamed.stop_reason == "tool_use"
    turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C, sunny"}]},
    ]
    again = client.messages.create(messages=turns, tool_choice={"type": "none"}, **{**ask, "max_tokens": 6})
    assert again.stop_reason in ("max_tokens", "end_turn") and again.content[0].type == "text"
    plain = client.messages.create(messages=turns[:1], tool_choice={"type": "none"}, **{**ask, "max_tokens": 6})
    assert again.usage.input_tokens > plain.usage.input_tokens + 10  # the call and its result were read


def test_what_the_messages_api_refuses_comes_in_anthropics_shape(tiny):
    client, server = tiny
    with pytest.raises(anthropic.BadRequestError, match="not fetched"):
        client.messages.create(
            model="tiny-llama",
            max_tokens=4,
            messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}
            ],
        )
    r = post(
        server,
        "/messages",
        {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": "messages-key"},
    )
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in r.json()["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(
            base_url=server.address.removesuffix("/v1"), api_key="wrong", max_retries=0
        ).messages.create(model="tiny-llama", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    odd = [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "y"}]}]
    with pytest.raises(anthropic.BadRequestError, match="tool_result"):
        client.messages.create(model="tiny-llama", max_tokens=2, messages=odd)


@pytest.mark.starter
def test_the_starter_answers_and_stops_at_a_stop_sequence(starter_dir):
    service, server = start(starter_dir)
    try:
        client = anthropic.Anthropic(base_url=server.address.removesuffix("/v1"), api_key="unused", max_retries=0)
        ask = dict(model=STARTER_MODEL, max_tokens=40, extra_body={"temperature": 0})
        ask["messages"] = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.messages.create(**ask)
        assert "Paris" in reply.content[0].text and reply.stop_reason == "end_turn"
        cut = client.messages.create(stop_sequences=["Paris"], **ask)
        assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == "Paris"
        assert cut.content[0].text == reply.content[0].text[: reply.content[0].text.index("Paris")]
    finally:
        stop(service, server)


# -- embeddings ------------------------------------------------------------------------------------------------
def test_embeddings_are_mean_pooled_unit_vectors_through_the_openai_client(tiny, tiny_long):
    from transformers import AutoConfig

    _, server = tiny
    client = openai.OpenAI(base_url=server.address, api_key="messages-key", max_retries=0, timeout=60)
    out = client.embeddings.create(model="tiny-llama", input=["a red apple", "a green pear", "a red apple"])
    vectors = [d.embedding for d in out.data]
    hidden = AutoConfig.from_pretrained(tiny_long).hidden_size
    assert [d.index for d in out.data] == [0, 1, 2] and all(len(v) == hidden for v in vectors)
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4) for v in vectors)
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert out.usage.prompt_tokens > 6 and out.model == "tiny-llama"
    packed = client.embeddings.create(model="tiny-llama", input="a red apple", encoding_format="base64")
    floats = struct.unpack(f"<{hidden}f", base64.b64decode(packed.data[0].embedding))  # little-endian float32
    assert list(floats) == pytest.approx(vectors[0], rel=1e-6)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="tiny-llama", input="x", dimensions=8)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.embeddings.create(model="tiny-llama", input="word " * 5000)
