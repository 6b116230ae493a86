"""OpenAI's Responses API (/v1/responses) with the official client: input as a string and as items, instructions,
function tools and their round trip, the streamed events in order, max_output_tokens, text.format, usage, what is
refused; and an agent framework (the OpenAI Agents SDK, which speaks this API) finishing a two-step tool task."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.test_server import STARTER_MODEL, post, start, stop
from tests.test_tool_calls import WEATHER

FUNCTION = {"type": "function", **WEATHER["function"]}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    service, server = start(tiny_model_dir)
    yield openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=180), server
    stop(service, server)


@pytest.fixture(scope="module")
def starter(starter_dir):
    service, server = start(starter_dir)
    yield openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=600), server
    stop(service, server)


def test_a_string_input_is_answered_with_text_and_usage(tiny):
    client, _ = tiny
    r = client.responses.create(model="tiny-llama", input="The quick brown fox", max_output_tokens=6, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 6 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + 6
    assert r.output[0].type == "message" and r.output_text == r.output[0].content[0].text


def test_streamed_events_come_in_order_and_add_up_to_the_whole_response(tiny):
    client, _ = tiny
    ask = dict(model="tiny-llama", instructions="Be brief.", max_output_tokens=8, temperature=0)
    items = [{"role": "user", "content": [{"type": "input_text", "text": "The quick brown fox"}]}]
    whole = client.responses.create(input=items, **ask)
    events = list(client.responses.create(input=items, stream=True, **ask))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_what_the_responses_api_refuses_is_one_sentence(tiny):
    client, server = tiny
    with pytest.raises(openai.BadRequestError, match="previous_response_id is not supported.*input items"):
        client.responses.create(model="tiny-llama", input="hi", previous_response_id="resp_123")
    with pytest.raises(openai.BadRequestError, match="function tools only"):
        client.responses.create(model="tiny-llama", input="hi", tools=[{"type": "web_search"}])
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]
    with pytest.raises(openai.BadRequestError, match=r"input\[0\].content\[0\].image_url' must be a base64 data URL"):
        client.responses.create(model="tiny-llama", input=image)
    r = post(server, "/responses", {"model": "tiny-llama", "input": [{"type": "computer_call"}]})
    assert r.status_code == 400 and "'input[0]' is a 'computer_call' item" in r.json()["error"]["message"]


def test_function_call_items_and_their_outputs_reach_the_prompt(tiny):
    """A conversation sent back as items (a call, its output) is read, not refused; forced, the reply is a call."""
    client, _ = tiny
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
    ]
    r = client.responses.create(model="tiny-llama", input=items, tools=[tool], tool_choice="none", max_output_tokens=4)
    assert r.output[0].type == "message"


@pytest.mark.starter
def test_starter_function_tool_round_trip_streamed_and_not(starter):
    client, _ = starter
    schema = WEATHER["function"]["parameters"]
    ask = dict(model=STARTER_MODEL, input="What is the weather in Paris?", tools=[FUNCTION], temperature=0)
    r = client.responses.create(tool_choice="required", max_output_tokens=80, **ask)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), schema)
    events = list(client.responses.create(tool_choice="required", max_output_tokens=80, stream=True, **ask))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    first = next(e.output_index for e in events if e.type == "response.output_item.added")
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta" and e.output_index == first
    )
    assert arguments == calls[0].arguments
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(c.name, c.arguments) for c in done] == [(c.name, c.arguments) for c in calls]
    answer = client.responses.create(
        model=STARTER_MODEL,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature": 18}'},
        ],
        tools=[FUNCTION],
        tool_choice="none",
        temperature=0,
        max_output_tokens=40,
    )
    assert answer.output[0].type == "message" and answer.output_text
    schema_out = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    }
    js = client.responses.create(
        model=STARTER_MODEL,
        input="Name a city in France as JSON.",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema_out}},
        temperature=0,
        max_output_tokens=40,
    )
    jsonschema.validate(json.loads(js.output_text), schema_out)


@pytest.mark.starter
def test_starter_an_agent_framework_finishes_a_two_step_tool_task(starter):
    """The OpenAI Agents SDK (Responses API): the agent calls the tool, gets its result, answers in text."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    _, server = starter
    agents.set_tracing_disabled(True)
    seen = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        seen.append(city)
        return f"It is 18 degrees and sunny in {city}."

    model = agents.OpenAIResponsesModel(
        model=STARTER_MODEL, openai_client=AsyncOpenAI(base_url=server.address, api_key="unused", max_retries=0)
    )
    agent = agents.Agent(
        name="weather",
        instructions="Answer with the tool's result.",
        tools=[get_weather],
        model=model,
        model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=400, store=False),
        tool_use_behavior="run_llm_again",
        reset_tool_choice=True,
    )
    # On a thread with an event loop of its own: in one pytest process an earlier test (Qt's, qasync's) may
    # leave the main thread's loop running, where Runner.run_sync refuses to start.
    import asyncio
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        result = pool.submit(
            asyncio.run, agents.Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        ).result(timeout=900)
    assert len(seen) >= 1 and all(isinstance(c, str) for c in seen)
    assert isinstance(result.final_output, str) and result.final_output.strip()
