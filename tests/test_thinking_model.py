"""A real reasoning model through ``redline serve``'s server and the official ``openai`` client: the starter, cut and
fine-tuned to answer in Qwen3's format (``tools/accuracy/make_thinking_model.py``; built once per machine and cached,
about ten minutes on two busy cores), writes its own ``<think>…</think>`` and the server returns the two parts apart.
Nothing here is scripted: what the model wrote is what is split."""

from __future__ import annotations

import openai
import pytest
from reasoning_helpers import make_thinking_model

from redline.inference import ApiServer, EngineService, ServerConfig, parse_precision
from redline.inference.engine import Engine

pytestmark = [pytest.mark.slow, pytest.mark.starter]
TIMEOUT = 120
QUESTION = [{"role": "user", "content": "What is 12 + 30?"}]


@pytest.fixture(scope="module")
def client(starter_dir):
    folder = make_thinking_model.ensure_thinking_model()
    service = EngineService(lambda: Engine("cpu"), max_active=2, max_queued=8)
    service.load(str(folder), parse_precision("fp32")).result(TIMEOUT)
    server = ApiServer(service, ServerConfig(port=0))
    server.start()
    yield openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=TIMEOUT)
    assert server.stop(10)
    assert service.shutdown(30)


def ask(client, **kwargs):
    name = client.models.list().data[0].id
    return client.chat.completions.create(model=name, messages=QUESTION, max_tokens=80, temperature=0, **kwargs)


def test_a_real_thinking_model_answers_apart(client):
    reply = ask(client)
    message = reply.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and message.content
    assert reasoning not in message.content and message.content not in reasoning
    for marker in ("<think>", "</think>"):
        assert marker not in message.content and marker not in reasoning
    details = reply.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < reply.usage.completion_tokens
    assert reply.choices[0].finish_reason == "stop"

    chunks = list(ask(client, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == message.content
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning


def test_thinking_off_gives_no_reasoning(client):
    for reply in (
        ask(client, reasoning_effort="none"),
        ask(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}}),
    ):
        message = reply.choices[0].message
        assert message.content and "think>" not in message.content
        assert not message.model_extra.get("reasoning_content")
        assert reply.usage.completion_tokens_details.reasoning_tokens == 0
