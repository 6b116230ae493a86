"""Remote engines: a model behind an OpenAI-compatible server, used through the engine service like a local one.

Against Redline's own server (the tiny model), against a fault-injecting server (each failure: one sentence,
the partial reply kept) and against a server Redline did not write, ``transformers serve`` on the starter.
Every server listens on 127.0.0.1 on a free port, is started and stopped here, and every wait is bounded."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from redline.inference import (
    ApiServer,
    DecodeOptions,
    EngineService,
    GenerationRequest,
    RemoteError,
    SamplingSettings,
    ServerConfig,
    TokenEvent,
    parse_precision,
    parse_server_spec,
)
from redline.inference.engine import Engine

TIMEOUT = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat(text: str, tokens: int = 12, **sampling) -> GenerationRequest:
    sampling.setdefault("temperature", 0)
    return GenerationRequest(
        messages=[{"role": "user", "content": text}],
        sampling=SamplingSettings(max_new_tokens=tokens, **sampling),
        options=DecodeOptions("kv"),
        client="chat",
    )


def connect(service: EngineService, spec: str, api_key=None):
    return service.call(lambda engine, report: engine.load(spec, None, api_key=api_key), "a connection").result(60)


@pytest.fixture(scope="module")
def redline_server(tiny_model_dir):
    service = EngineService(lambda: Engine("cpu"))
    service.load(str(tiny_model_dir), parse_precision("fp32")).result(TIMEOUT)
    server = ApiServer(service, ServerConfig(port=0, api_key="remote-test-key"))
    server.start()
    yield server
    assert server.stop(10)
    assert service.shutdown(30)


@pytest.fixture()
def client_service():
    service = EngineService(lambda: Engine("cpu"))
    yield service
    assert service.shutdown(30)


def test_server_specs():
    assert parse_server_spec("http://127.0.0.1:8080/v1/") == ("http://127.0.0.1:8080/v1", None)
    assert parse_server_spec("http://box:8000/v1#Qwen/Qwen2.5-7B") == ("http://box:8000/v1", "Qwen/Qwen2.5-7B")
    with pytest.raises(RemoteError, match="not a server address"):
        parse_server_spec("http://")


def test_a_remote_model_chats_through_the_service_with_measured_figures(redline_server, client_service):
    target = connect(client_service, redline_server.address, "remote-test-key")
    assert not target.capabilities.measured_here and target.name == f"tiny-llama @ 127.0.0.1:{redline_server.port}"
    assert target.context_limit == 512 and target.memory_bytes == 0
    assert "remote-test-key" not in repr(target)
    handles = [client_service.submit(chat(f"Question {i}", 16)) for i in range(3)]  # concurrently, not in turn
    results = [h.result(TIMEOUT) for h in handles]
    for h, r in zip(handles, results):
        assert r.finish_reason in ("length", "eos") and r.error is None
        assert r.new_tokens == r.server_timings["completion_tokens"] and r.prompt_tokens > 0
        assert r.ttft_ms > 0 and r.strategy == "remote" and r.device == "remote"
        assert "predicted_per_second" in r.server_timings  # Redline's server sends llama.cpp-style timings
        tokens = [e for e in h.history() if isinstance(e, TokenEvent)]
        assert "".join(e.text for e in tokens) == r.text
    assert client_service.status()["model"] == target.name


def test_cancelling_a_remote_reply_keeps_its_text_and_stops_the_server_side(redline_server, client_service):
    connect(client_service, redline_server.address, "remote-test-key")
    before = len(redline_server.stats.recent)
    handle = client_service.submit(chat("Tell me a long story", 300, temperature=0.9, seed=1))
    seen = 0
    for event in handle.events(TIMEOUT):
        if isinstance(event, TokenEvent):
            seen += 1
            if seen == 4:
                handle.cancel()
    result = handle.result(TIMEOUT)
    assert result.finish_reason == "cancelled" and 4 <= result.new_tokens < 300 and result.text
    deadline = time.monotonic() + 30
    while len(redline_server.stats.recent) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert redline_server.stats.recent[-1][0] == "cancelled"  # the server stopped generating too


def test_each_connection_failure_is_one_sentence(redline_server, client_service):
    port = free_port()  # nothing listens there
    with pytest.raises(RemoteError, match=f"Could not reach the server at 127.0.0.1:{port}"):
        connect(client_service, f"http://127.0.0.1:{port}/v1")
    with pytest.raises(RemoteError, match="refused the API key \\(401"):
        connect(client_service, redline_server.address, "wrong-key-here")
    with pytest.raises(RemoteError, match="has no model 'gpt-9'; it offers: tiny-llama"):
        connect(client_service, redline_server.address + "#gpt-9", "remote-test-key")


# -- a server that fails on purpose -----------------------------------------------------------------------
def _fault_app():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def models(request):
        names = ("fail", "drop", "slow", "error-event", "tools")
        return JSONResponse({"object": "list", "data": [{"id": m} for m in names]})

    async def tool_stream(body):
        # OpenAI's streamed call: id and name first, then the arguments in pieces; the request's tools echoed in
        # the call's name, so the test sees they were passed through
        name = body["tools"][0]["function"]["name"]
        assert body["messages"][-1].get("tool_call_id") == "c0"
        first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": ""}}
        for piece in (
            first,
            {"index": 0, "function": {"arguments": '{"city": '}},
            {"index": 0, "function": {"arguments": '"Paris"}'}},
        ):
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [piece]}}]}) + "\n\n"
        yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}) + "\n\n"
        yield "data: [DONE]\n\n"

    def chunk(text):
        return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}) + "\n\n"

    async def completions(request):
        body = await request.json()
        model = body["model"]
        if model == "fail":
            return JSONResponse({"error": {"message": "CUDA error: device-side assert"}}, status_code=500)
        if model == "tools":
            return StreamingResponse(tool_stream(body), media_type="text/event-stream")

        async def stream():
            for word in ("partial ", "reply ", "so far"):
                yield chunk(word)
                await asyncio.sleep(0.02)
            if model == "drop":
                raise RuntimeError("the connection drops here")  # uvicorn closes the socket mid-stream
            if model == "error-event":
                yield "data: " + json.dumps({"error": {"message": "out of KV cache"}}) + "\n\n"
                return
            await asyncio.sleep(30)  # slow: longer than the client's read timeout

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", completions, methods=["POST"])])


@pytest.fixture(scope="module")
def fault_server():
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_fault_app(), log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.mark.parametrize(
    "model, words",
    [
        ("fail", ["failed (500: CUDA error: device-side assert)"]),
        ("drop", ["dropped mid-reply"]),
        ("error-event", ["stopped the reply: out of KV cache"]),
        ("slow", ["took too long to send the next token"]),
    ],
)
def test_server_failures_keep_the_partial_reply(fault_server, client_service, model, words):
    target = connect(client_service, f"{fault_server}#{model}")
    target.read_timeout = 1.0
    started = time.monotonic()
    result = client_service.submit(chat("hi")).result(TIMEOUT)
    assert time.monotonic() - started < 15
    assert result.finish_reason == "error"
    for word in words:
        assert word in result.error
    assert result.error.count(". ") <= 1 and "Traceback" not in result.error
    if model != "fail":
        assert result.text == "partial reply so far"
        assert any("text that had arrived is kept" in n for n in result.notes)


# -- a server Redline did not write: transformers serve ---------------------------------------------------
@pytest.fixture(scope="module")
def transformers_serve(starter_dir):
    """``transformers serve`` on the starter (fp32, CPU), on a free loopback port; its base URL."""
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "transformers")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.Popen(
        [exe, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32",
         str(starter_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode(errors="replace")[-2000:]
            try:
                if httpx.get(base + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def redline_chat_default(base: str):
    """``redline chat "Hi" --model BASE``: the README's command, with every other argument at its default."""
    return subprocess.run(
        [sys.executable, "-m", "redline", "chat", "Hi", "--model", base],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, REDLINE_REMOTE_API_KEY=""),
    )


@pytest.mark.slow
@pytest.mark.starter
def test_the_cli_default_arguments_against_transformers_serve(transformers_serve):
    run = redline_chat_default(transformers_serve)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip(), run.stderr  # the reply
    assert "error" not in run.stderr.lower() and "Traceback" not in run.stderr
    assert "Unknown strategy" not in run.stderr


@pytest.mark.slow
def test_the_cli_default_arguments_against_redline_serve(redline_server):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("REDLINE_REMOTE_API_KEY", "remote-test-key")
        run = subprocess.run(
            [sys.executable, "-m", "redline", "chat", "Hi", "--model", redline_server.address],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() and "Traceback" not in run.stderr and "error" not in run.stderr.lower()


@pytest.mark.slow
@pytest.mark.starter
def test_against_transformers_serve(starter_dir, transformers_serve, client_service):
    base = transformers_serve
    target = connect(client_service, base)
    assert target.model_id == str(starter_dir) and not target.capabilities.measured_here
    handle = client_service.submit(chat("What is the capital of France? Answer in one word.", 12))
    result = handle.result(TIMEOUT)
    assert result.error is None and result.finish_reason in ("eos", "length", "stop")
    assert "Paris" in result.text
    assert result.prompt_tokens > 10  # the server's usage
    assert result.new_tokens == result.server_timings["completion_tokens"]
    assert result.ttft_ms > 0
    tokens = [e.text for e in handle.history() if isinstance(e, TokenEvent)]
    assert "".join(tokens) == result.text


# -- the speed lab with a remote row ------------------------------------------------------------------------
def test_the_speed_lab_runs_a_remote_row_beside_a_local_one(redline_server, tiny_model_dir, client_service):
    from redline.inference import BenchSpec, load_prompt_set, parse_configs, run_bench

    configs = parse_configs(f"fast:fp32, remote:{redline_server.address}#tiny-llama")
    assert configs[1].strategy == "remote" and configs[1].label == f"remote:{redline_server.address}#tiny-llama"
    spec = BenchSpec(
        model=str(tiny_model_dir),
        configs=configs,
        prompts=load_prompt_set("short"),
        new_tokens=8,
        warmup=0,
        samples=1,
        server_keys={redline_server.address: "remote-test-key"},
    )
    assert "remote-test-key" not in json.dumps(spec.to_dict())
    report = client_service.call(lambda engine, report: run_bench(engine, spec), "the speed lab").result(600)
    local, remote = report.results
    assert local.status == "ok" and remote.status == "ok", (local.error, remote.error)
    assert remote.ttft_ms > 0 and remote.tokens_per_s > 0 and remote.device == "remote"
    assert remote.matches_baseline is None and remote.model_memory_bytes is None
    assert any("measured on this client" in n for n in remote.notes)
    assert remote.outputs and all(isinstance(o, str) for o in remote.outputs)


def test_a_remote_reply_that_is_tool_calls_comes_back_as_calls(fault_server, client_service):
    """Tools and a conversation's past calls go to the server as they are; streamed call deltas come back
    reassembled in result.tool_calls, not as text."""
    connect(client_service, fault_server + "#tools")
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "rain"},
    ]
    request = GenerationRequest(
        messages=messages, sampling=SamplingSettings(max_new_tokens=20), options=DecodeOptions("kv"), tools=[tool]
    )
    result = client_service.submit(request).result(TIMEOUT)
    assert result.error is None and result.text == ""
    assert result.tool_calls == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
