"""A server stopped while replies stream (the window's Server switch turned off, ``redline serve`` sent SIGTERM):
every client in flight gets an error event (503, saying the server stopped) and ``[DONE]``, a non-streamed one a
503 error object; nothing reaches stderr (no uvicorn "Cancel … running task(s)", no CancelledError traceback); the
server is down within about a second; and Redline's own remote client says the server stopped the reply, not that
the connection dropped. Loopback only, free ports, every wait bounded."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from budget import within
from served import read_address
from slow_engine import SlowEngine

from redline.inference import ApiServer, EngineService, ServerConfig, parse_precision
from redline.inference.engine import Engine

TIMEOUT = 60


class SlowServedEngine(SlowEngine):
    """The slow stand-in engine (a word every ``interval_s``, for thousands of words) with a real tokenizer's
    folder, so the server can build and count prompts for it."""

    def __init__(self, folder, **kwargs):
        super().__init__(**kwargs)
        self.folder = folder

    def load(self, model, precision, **kwargs):
        target = super().load(model, precision, **kwargs)
        target.folder, target.model, target.source = self.folder, None, None
        return target


@pytest.fixture()
def slow_server(tiny_model_dir):
    service = EngineService(lambda: SlowServedEngine(tiny_model_dir, interval_s=0.02, tokens=5000))
    service.load("model", parse_precision("fp32")).result(TIMEOUT)
    server = ApiServer(service, ServerConfig(port=0))
    server.start()
    yield server
    server.stop(5)
    assert service.shutdown(10)


BODY = {"model": "slow-model", "messages": [{"role": "user", "content": "Tell me everything"}], "max_tokens": 3000}


def stop_after(server, event: threading.Event, took: list, **kwargs):
    def run():
        event.wait(TIMEOUT)
        started = time.monotonic()
        took.append(server.stop(5, **kwargs))
        took.append(time.monotonic() - started)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def read_stream(address: str, chunks_before_stop: int, ready: threading.Event) -> list[str]:
    """The ``data:`` payloads of one streamed reply; ``ready`` is set after ``chunks_before_stop`` of them."""
    payloads: list[str] = []
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", address + "/chat/completions", json={**BODY, "stream": True}) as response:
            assert response.status_code == 200
            for line in response.iter_lines():  # ends when the server closes the stream (bounded by the timeout)
                if line.startswith("data:"):
                    payloads.append(line[5:].strip())
                    if len(payloads) == chunks_before_stop:
                        ready.set()
                assert len(payloads) < 5000
    return payloads


def assert_quiet(capfd, caplog):
    err = capfd.readouterr().err
    assert "Traceback" not in err and "CancelledError" not in err and "Cancel " not in err, err
    noisy = [
        r for r in caplog.records if r.name.startswith(("uvicorn", "sse_starlette")) and r.levelno >= logging.WARNING
    ]
    assert not noisy, [r.getMessage() for r in noisy]


def test_stopping_the_server_mid_stream_sends_an_error_event_then_done(slow_server, capfd, caplog):
    ready, took = threading.Event(), []
    stopper = stop_after(slow_server, ready, took)
    payloads = read_stream(slow_server.address, 5, ready)
    stopper.join(TIMEOUT)
    assert payloads[-1] == "[DONE]", payloads[-3:]
    error = json.loads(payloads[-2])["error"]
    assert "server was stopped" in error["message"] and error["type"] == "server_error"
    assert error["message"].count(". ") <= 1
    assert took[0] is True and took[1] < within(1.5), took
    assert not slow_server.running
    assert_quiet(capfd, caplog)


def test_the_official_client_raises_the_servers_sentence(slow_server, capfd, caplog):
    ready, took = threading.Event(), []
    stopper = stop_after(slow_server, ready, took, reason="Redline is closing")
    client = openai.OpenAI(base_url=slow_server.address, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.APIError, match="Redline is closing"):
        for i, _ in enumerate(client.chat.completions.create(**BODY, stream=True)):
            if i == 3:
                ready.set()
    stopper.join(TIMEOUT)
    assert took[0] is True and took[1] < within(1.5), took
    assert_quiet(capfd, caplog)


def test_a_non_streamed_request_in_flight_gets_a_503(slow_server, capfd, caplog):
    service = slow_server.service
    ready, took = threading.Event(), []
    stopper = stop_after(slow_server, ready, took)
    answers = []
    asker = threading.Thread(target=lambda: answers.append(httpx.post(slow_server.address + "/chat/completions",
                                                                      json=BODY, timeout=30)))  # fmt: skip
    asker.start()
    deadline = time.monotonic() + TIMEOUT
    while service.status()["running"] is None and time.monotonic() < deadline:  # the reply is being written
        time.sleep(0.01)
    time.sleep(0.1)
    ready.set()
    asker.join(TIMEOUT)
    stopper.join(TIMEOUT)
    assert answers[0].status_code == 503
    assert "server was stopped" in answers[0].json()["error"]["message"]
    assert took[0] is True and took[1] < within(1.5)
    deadline = time.monotonic() + 10
    while service.status()["running"] is not None and time.monotonic() < deadline:  # its generation was cancelled
        time.sleep(0.02)
    assert service.status()["running"] is None
    assert_quiet(capfd, caplog)


def test_redlines_remote_client_says_the_server_stopped_the_reply(slow_server):
    from redline.inference import DecodeOptions, GenerationRequest, SamplingSettings, TokenEvent

    client_service = EngineService(lambda: Engine("cpu"))
    try:
        client_service.call(lambda engine, report: engine.load(slow_server.address, None), "a connection").result(30)
        handle = client_service.submit(
            GenerationRequest(
                messages=[{"role": "user", "content": "Tell me everything"}],
                sampling=SamplingSettings(max_new_tokens=3000),
                options=DecodeOptions("auto"),
                client="chat",
            )
        )
        seen = 0
        for event in handle.events(TIMEOUT):
            if isinstance(event, TokenEvent):
                seen += 1
                if seen == 5:
                    threading.Thread(target=slow_server.stop, args=(5,)).start()
        result = handle.result(TIMEOUT)
    finally:
        assert client_service.shutdown(30)
    assert result.finish_reason == "error"
    assert f"The server at 127.0.0.1:{slow_server.port} stopped the reply" in result.error
    assert "server was stopped" in result.error and "dropped" not in result.error
    assert result.text.startswith("word0 word1 word2 word3 word4")


@pytest.mark.slow
@pytest.mark.starter
def test_redline_serve_sigterm_mid_stream_ends_streams_cleanly_and_quietly(starter_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "redline", "serve", "--model", str(starter_dir), "--precision", "fp32",
         "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        address, lines = read_address(proc, 180)
        while not lines[-1].startswith("Ctrl+C"):
            lines.append(proc.stderr.readline())
        ready, sent = threading.Event(), []

        def terminate():
            ready.wait(TIMEOUT)
            sent.append(time.monotonic())
            proc.send_signal(signal.SIGTERM)

        killer = threading.Thread(target=terminate)
        killer.start()
        model = httpx.get(address + "/models", timeout=10).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_tokens": 1000, "temperature": 0.8, "seed": 1, "stream": True}  # fmt: skip
        payloads = []
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", address + "/chat/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        payloads.append(line[5:].strip())
                        if len(payloads) == 4:
                            ready.set()
        killer.join(TIMEOUT)
        rest = proc.communicate(timeout=30)[1]
        exited = time.monotonic() - sent[0]
        assert payloads[-1] == "[DONE]", payloads[-3:]
        error = json.loads(payloads[-2])["error"]
        assert "Redline is closing" in error["message"]
        assert proc.returncode == 0 and rest.strip() == "Server stopped.", rest
        assert exited < within(3.0), exited  # the server within about a second; the engine's shutdown after it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
