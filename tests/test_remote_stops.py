"""Stop strings beyond the 4 an OpenAI-compatible server takes: the first 4 go to the server, the rest end the
reply here, on the streamed text, also where a stop string spans two streamed pieces. The stand-in server
listens on 127.0.0.1 on a free port and is started and stopped here; every wait is bounded."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from redline.inference import DecodeOptions, EngineService, GenerationRequest, SamplingSettings
from redline.inference.backends.remote import SERVER_STOPS, first_stop
from redline.inference.engine import Engine

TIMEOUT = 60
PIECES = ("Hello", " wor", "ld. E", "ND and", " more text")
received: list[dict] = []


def _app():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "words"}]})

    async def completions(request):
        received.append(await request.json())

        async def stream():
            for piece in PIECES:
                yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]}) + "\n\n"
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", completions, methods=["POST"])])


@pytest.fixture(scope="module")
def words_server():
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_app(), log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture()
def service(words_server):
    service = EngineService(lambda: Engine("cpu"))
    service.call(lambda engine, report: engine.load(words_server + "#words", None), "a connection").result(TIMEOUT)
    yield service
    assert service.shutdown(30)


def ask(service, stops) -> object:
    request = GenerationRequest(
        messages=[{"role": "user", "content": "hi"}],
        sampling=SamplingSettings(max_new_tokens=50, temperature=0, stop=tuple(stops)),
        options=DecodeOptions("kv"),
    )
    return service.submit(request).result(TIMEOUT)


def test_the_fifth_stop_string_ends_the_reply_here(service):
    received.clear()
    stops = ["never-1", "never-2", "never-3", "never-4", "END"]
    result = ask(service, stops)
    assert received[-1]["stop"] == stops[:SERVER_STOPS]  # what OpenAI's API accepts
    # "END" spans two pieces ("ld. E" + "ND and"): the reply ends before it, and is a stop, not a length.
    assert result.error is None and result.text == "Hello world. " and result.finish_reason == "stop"


def test_a_later_stop_string_found_early_cuts_the_reply_there(service):
    result = ask(service, ["a1", "a2", "a3", "a4", "zzz", " wor"])
    assert result.text == "Hello" and result.finish_reason == "stop"


def test_stops_the_server_takes_are_left_to_it(service):
    received.clear()
    result = ask(service, ["never"])
    assert received[-1]["stop"] == ["never"]
    assert result.text == "".join(PIECES) and result.finish_reason == "length"


def test_first_stop_counts_only_what_ends_in_the_new_text():
    assert first_stop("Hello world", ["wor"], 0) == 6
    assert first_stop("Hello world", ["Hel"], 5) is None  # ended before the new text: checked already
    assert first_stop("Hello world", ["lo w", "d"], 5) == 3  # began before, ends in it
    assert first_stop("abc", ["x"], 0) is None
