"""The OpenAI-compatible server, driven by a client Redline did not write: the official ``openai`` package
(and raw httpx for what that client will not send). Every server here listens on 127.0.0.1 on a free port,
is started and stopped by its fixture, and every loop is bounded in count and time."""

from __future__ import annotations

import json
import threading
import time

import httpx
import jsonschema
import openai
import pytest
from served import read_address

from redline.inference import ApiServer, EngineService, ServerConfig, ServerConfigError, parse_precision
from redline.inference.engine import Engine
from redline.inference.sources.starter import STARTER_FOLDER

STARTER_MODEL = STARTER_FOLDER  # the starter's folder, as the server names a model it was given by path

TIMEOUT = 120


def start(model_dir, **config):
    service = EngineService(lambda: Engine("cpu"), max_active=4, max_queued=config.pop("max_queued", 32))
    service.load(str(model_dir), parse_precision("fp32")).result(TIMEOUT)
    server = ApiServer(service, ServerConfig(port=0, **config))
    server.start()
    return service, server


def stop(service, server):
    assert server.stop(10)
    assert service.shutdown(30)


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    service, server = start(tiny_model_dir)
    yield server
    stop(service, server)


@pytest.fixture()
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.address, api_key="unused", max_retries=0, timeout=60)


def ask(client, **kwargs):
    kwargs.setdefault("model", "tiny-llama")
    kwargs.setdefault("messages", [{"role": "user", "content": "The quick brown fox"}])
    kwargs.setdefault("max_tokens", 12)
    return client.chat.completions.create(**kwargs)


def post(server, path, body, headers=None, raw=None):
    with httpx.Client(timeout=60) as http:
        if raw is not None:
            return http.post(server.address + path, content=raw, headers={"content-type": "application/json"})
        return http.post(server.address + path, json=body, headers=headers or {})


def assert_error(response, status, *words):
    assert response.status_code == status, response.text
    body = response.json()
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in response.text
    for word in words:
        assert word in error["message"], error["message"]
    return error


# -- the API, with the official client ------------------------------------------------------------------
def test_models_lists_the_loaded_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-llama"]
    assert models[0].model_extra["max_model_len"] == 512


def test_non_streamed_reply_has_real_usage_and_timings(client):
    reply = ask(client, temperature=0)
    assert reply.object == "chat.completion" and reply.model == "tiny-llama"
    assert reply.choices[0].finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage.prompt_tokens > 0 and 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    timings = reply.model_extra["timings"]
    assert timings["prompt_n"] == usage.prompt_tokens and timings["predicted_n"] == usage.completion_tokens
    assert timings["ttft_ms"] > 0 and timings["prompt_ms"] >= 0
    assert {"draft_n", "draft_n_accepted", "predicted_per_second", "queued_ms"} <= set(timings)


def test_streamed_reply_equals_the_non_streamed_one_and_ends_with_usage(client):
    whole = ask(client, temperature=0, max_tokens=16)
    chunks = list(ask(client, temperature=0, max_tokens=16, stream=True, stream_options={"include_usage": True}))
    assert len(chunks) < 60  # bounded: one chunk per token and a few more
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.model_extra["timings"]["predicted_n"] == whole.usage.completion_tokens


def test_streamed_without_include_usage_puts_timings_on_the_final_chunk(client):
    chunks = list(ask(client, temperature=0, stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason and "timings" in chunks[-1].model_extra


def test_cached_prompt_tokens_are_reported_as_the_engine_counted_them(tiny_server, client):
    """usage.prompt_tokens_details.cached_tokens (OpenAI) and timings.cache_n (llama.cpp) in every answer, streamed
    and not, chat and completions: the result's cached_tokens."""
    service = tiny_server.service
    handles = []
    submit = service.submit

    def spy(request):
        handles.append(submit(request))
        return handles[-1]

    messages = [{"role": "user", "content": "The same question twice, the same question twice"}]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service, "submit", spy)
        answers = [ask(client, messages=messages, temperature=0) for _ in range(2)]
        streamed = list(
            ask(client, messages=messages, temperature=0, stream=True, stream_options={"include_usage": True})
        )
        plain = list(ask(client, messages=messages, temperature=0, stream=True))
        completion = client.completions.create(model="tiny-llama", prompt="Paris is", max_tokens=3)
    results = [h.result(TIMEOUT) for h in handles]
    for answer, result in zip(answers + [streamed[-1]], results):
        assert answer.usage.prompt_tokens_details.cached_tokens == result.cached_tokens
        assert answer.model_extra["timings"]["cache_n"] == result.cached_tokens
    assert plain[-1].model_extra["timings"]["cache_n"] == results[3].cached_tokens
    assert completion.usage.prompt_tokens_details.cached_tokens == results[4].cached_tokens
    assert completion.model_extra["timings"]["cache_n"] == results[4].cached_tokens


def test_n_choices_are_decoded_together_each_its_own(client):
    greedy = ask(client, n=3, temperature=0, max_tokens=8)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert len({c.message.content for c in greedy.choices}) == 1  # greedy: the same reply three times
    one = ask(client, temperature=0, max_tokens=8)
    assert greedy.choices[0].message.content == one.choices[0].message.content
    assert greedy.usage.prompt_tokens == one.usage.prompt_tokens
    assert greedy.usage.completion_tokens == 3 * one.usage.completion_tokens
    sampled = ask(client, n=3, temperature=1.0, seed=7, max_tokens=12)
    again = ask(client, n=3, temperature=1.0, seed=7, max_tokens=12)
    texts = [c.message.content for c in sampled.choices]
    assert texts == [c.message.content for c in again.choices] and len(set(texts)) > 1
    completion = client.completions.create(model="tiny-llama", prompt="Paris is", max_tokens=3, n=2, temperature=0)
    assert [c.index for c in completion.choices] == [0, 1]


def test_seeded_sampling_repeats(client):
    a = ask(client, temperature=0.9, top_p=0.95, seed=1234, max_tokens=16)
    b = ask(client, temperature=0.9, top_p=0.95, seed=1234, max_tokens=16)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_completions_endpoint(client):
    reply = client.completions.create(model="tiny-llama", prompt="Paris is the capital", max_tokens=6, temperature=0)
    assert reply.object == "text_completion" and reply.usage.completion_tokens <= 6
    streamed = client.completions.create(
        model="tiny-llama", prompt="Paris is the capital", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == reply.choices[0].text


def test_json_object_output_parses(client):
    reply = ask(client, temperature=0, max_tokens=40, response_format={"type": "json_object"})
    if reply.choices[0].finish_reason == "stop":  # a random model may run out of tokens mid-object
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    assert reply.choices[0].message.content.startswith("{")


# -- errors ----------------------------------------------------------------------------------------------
def test_a_model_other_than_the_loaded_one_names_the_loaded_one(client):
    with pytest.raises(openai.NotFoundError) as info:
        ask(client, model="gpt-4o")
    assert "tiny-llama" in str(info.value) and "Traceback" not in str(info.value)


def test_unknown_and_mistyped_fields_are_400_naming_the_field(tiny_server, client):
    with pytest.raises(openai.BadRequestError, match="Unknown field 'bogus'"):
        ask(client, extra_body={"bogus": 1})
    with pytest.raises(openai.BadRequestError, match="'temperature' is not valid"):
        ask(client, temperature="hot")
    error = assert_error(
        post(tiny_server, "/chat/completions", {"model": "tiny-llama", "messages": [{"role": "user", "content": 3}]}),
        400,
        "messages[0].content",
    )
    assert error["param"] == "messages[0].content" and error["type"] == "invalid_request_error"
    assert_error(post(tiny_server, "/chat/completions", {"model": "tiny-llama"}), 400, "'messages' is required")
    assert_error(post(tiny_server, "/chat/completions", {"model": "tiny-llama", "messages": [], "n": 1}), 400)


def test_malformed_json_is_a_400_error_object(tiny_server):
    assert_error(
        post(tiny_server, "/chat/completions", None, raw=b'{"model": "tiny-llama", "messages": ['), 400, "JSON"
    )
    assert_error(post(tiny_server, "/chat/completions", None, raw=b"[1, 2]"), 400, "JSON object")
    assert_error(post(tiny_server, "/chat/completions", None, raw=b"\xff\xfe"), 400, "JSON")


def test_a_lone_surrogate_is_a_400_naming_the_field_without_a_traceback(tiny_server, capfd, caplog):
    # "a\ud800b" is valid JSON, but its \ud800 is half of a UTF-16 pair: no character, and no tokenizer reads it.
    raw = b'{"model": "tiny-llama", "max_tokens": 2, "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    error = assert_error(post(tiny_server, "/chat/completions", None, raw=raw), 400, "lone UTF-16 surrogate", "\\ud800")
    assert error["param"] == "messages[0].content"
    parts = b'{"model": "tiny-llama", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}'
    assert assert_error(post(tiny_server, "/chat/completions", None, raw=parts), 400)["param"] == (
        "messages[0].content[0].text"
    )
    prompt = b'{"model": "tiny-llama", "prompt": "x\\ud83d", "max_tokens": 2}'
    assert assert_error(post(tiny_server, "/completions", None, raw=prompt), 400)["param"] == "prompt"
    pair = b'{"model": "tiny-llama", "max_tokens": 2, "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    assert post(tiny_server, "/chat/completions", None, raw=pair).status_code == 200  # a whole pair is a character
    assert "Traceback" not in capfd.readouterr().err and "Traceback" not in caplog.text


def test_a_bug_of_the_servers_is_one_sentence_and_one_log_line_never_a_traceback(tiny_server, capfd, caplog):
    def broken(body, chat):
        raise TypeError("a bug")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiny_server._api.preparation, "prepare", broken)
        response = post(
            tiny_server, "/chat/completions", {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]}
        )
    assert_error(response, 500, "Redline's server failed on this request (TypeError).")

    # The line is logged on the server's thread after the 500 has gone out (Starlette answers, then re-raises to
    # the last guard), so the client can read its reply first: wait for it, bounded (it failed a loaded CI once).
    def logged():
        return [r.getMessage() for r in caplog.records if r.name == "redline.server"]

    deadline = time.monotonic() + 5
    while not logged() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert logged() == ["Redline's server failed on a request (TypeError: a bug)."]
    assert "Traceback" not in capfd.readouterr().err and "Traceback" not in caplog.text


def test_unsupported_fields_are_refused_not_ignored(client):
    with pytest.raises(openai.BadRequestError, match="n must be between 1 and 8"):
        ask(client, n=9)
    with pytest.raises(openai.BadRequestError, match="top_logprobs must be between 0 and 20"):
        ask(client, logprobs=True, top_logprobs=21)
    with pytest.raises(openai.BadRequestError, match="stop takes at most 16 strings"):
        ask(client, stop=[str(i) for i in range(17)])
    with pytest.raises(openai.BadRequestError, match="schema"):
        ask(client, response_format={"type": "json_schema", "json_schema": {"name": "x"}})


def test_max_tokens_beyond_the_context_or_the_limit_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="exceed the model's context of 512"):
        ask(client, max_tokens=600)
    with pytest.raises(openai.BadRequestError, match="max_completion_tokens 5000 is above this server's limit"):
        ask(client, max_completion_tokens=5000)
    with pytest.raises(openai.BadRequestError, match="fills the model's context"):
        ask(client, messages=[{"role": "user", "content": "fox " * 700}])


def test_a_body_over_the_limit_is_413(tiny_model_dir):
    service, server = start(tiny_model_dir, max_body_bytes=2048)
    try:
        big = {"model": "tiny-llama", "messages": [{"role": "user", "content": "x" * 5000}]}
        assert_error(post(server, "/chat/completions", big), 413, "larger than this server's limit")
        ok = post(
            server,
            "/chat/completions",
            {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert ok.status_code == 200
    finally:
        stop(service, server)


def test_unknown_path_and_method_are_error_objects(tiny_server):
    with httpx.Client(timeout=30) as http:
        assert_error(http.get(tiny_server.address + "/nothing"), 404, "/v1/chat/completions")
        assert_error(http.get(tiny_server.address + "/chat/completions"), 405)


def test_a_full_queue_answers_429_with_retry_after(tiny_model_dir):
    service, server = start(tiny_model_dir, max_queued=1)
    blocker, running = threading.Event(), threading.Event()
    job = service.call(lambda engine, report: (running.set(), blocker.wait(TIMEOUT)), "a test job")
    try:
        assert running.wait(TIMEOUT)
        body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        results = []
        waiting = threading.Thread(target=lambda: results.append(post(server, "/chat/completions", body)))
        waiting.start()
        deadline = time.monotonic() + 30
        while service.status()["queued"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        refused = post(server, "/chat/completions", body)
        assert_error(refused, 429, "busy")
        assert refused.headers["retry-after"] == "1"
        blocker.set()
        waiting.join(TIMEOUT)
        assert results and results[0].status_code == 200
    finally:
        blocker.set()
        job.result(TIMEOUT)
        stop(service, server)


def test_a_client_that_disconnects_mid_stream_cancels_its_generation(tiny_server):
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "Tell me everything"}],
        "max_tokens": 400,
        "stream": True,
        "temperature": 0.8,
        "seed": 3,
    }
    before = len(tiny_server.stats.recent)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", tiny_server.address + "/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = 0
            for line in response.iter_lines():
                lines += line.startswith("data:")
                if lines >= 4:
                    break
    deadline = time.monotonic() + 30
    while len(tiny_server.stats.recent) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    finish_reason, new_tokens, streamed = tiny_server.stats.recent[-1]
    assert finish_reason == "cancelled" and streamed
    assert new_tokens < 400
    assert tiny_server.stats.active == 0


def test_cors_is_off_unless_origins_are_listed(tiny_server, tiny_model_dir):
    headers = {"Origin": "http://evil.example"}
    with httpx.Client(timeout=30) as http:
        assert "access-control-allow-origin" not in http.get(tiny_server.address + "/models", headers=headers).headers
    service, server = start(tiny_model_dir, cors_origins=["http://localhost:3000"])
    try:
        with httpx.Client(timeout=30) as http:
            got = http.get(server.address + "/models", headers={"Origin": "http://localhost:3000"})
            assert got.headers["access-control-allow-origin"] == "http://localhost:3000"
            assert "access-control-allow-origin" not in http.get(server.address + "/models", headers=headers).headers
    finally:
        stop(service, server)


def test_an_api_key_is_required_when_set_and_for_any_address_but_loopback(tiny_model_dir, caplog):
    # Only validated, never served: 192.0.2.1 (TEST-NET-1) stands for any address other machines could reach.
    with pytest.raises(ServerConfigError, match="needs an API key"):
        ServerConfig(host="192.0.2.1").validate()
    ServerConfig(host="192.0.2.1", api_key="a-long-enough-key").validate()
    key = "s3cret-key-for-tests"
    assert key not in repr(ServerConfig(api_key=key))
    service, server = start(tiny_model_dir, api_key=key)
    try:
        wrong = openai.OpenAI(base_url=server.address, api_key="wrong-key", max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError, match="Missing or wrong API key"):
            wrong.models.list()
        right = openai.OpenAI(base_url=server.address, api_key=key, max_retries=0, timeout=30)
        assert right.models.list().data[0].id == "tiny-llama"
    finally:
        stop(service, server)
    assert key not in caplog.text


def test_a_port_in_use_is_one_clear_sentence(tiny_server):
    other = ApiServer(None, ServerConfig(port=tiny_server.port))
    with pytest.raises(ServerConfigError, match=f"Port {tiny_server.port} on 127.0.0.1 is already in use"):
        other.start()


# -- the real starter model --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def starter_client(starter_dir):
    service, server = start(starter_dir)
    yield openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=120)
    stop(service, server)


@pytest.mark.starter
def test_starter_stop_strings_end_the_reply_before_them(starter_client):
    messages = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    full = ask(starter_client, model=STARTER_MODEL, messages=messages, temperature=0, max_tokens=40)
    text = full.choices[0].message.content
    assert "4" in text
    cut = ask(starter_client, model=STARTER_MODEL, messages=messages, temperature=0, max_tokens=40, stop=["4"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index("4")]
    assert cut.usage.completion_tokens < full.usage.completion_tokens


@pytest.mark.starter
def test_starter_json_schema_output_parses_and_validates(starter_client):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "country": {"type": "string", "maxLength": 40},
            "population_millions": {"type": "number"},
        },
        "required": ["city", "country", "population_millions"],
        "additionalProperties": False,
    }
    for temperature in (0, 0.8):
        reply = ask(
            starter_client,
            model=STARTER_MODEL,
            messages=[{"role": "user", "content": "Describe Paris as JSON with city, country and population."}],
            temperature=temperature,
            seed=5,
            max_tokens=80,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        )
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


@pytest.mark.starter
def test_starter_concurrent_streams_each_get_their_whole_answer(starter_client):
    alone = ask(starter_client, model=STARTER_MODEL, temperature=0, max_tokens=20).choices[0].message.content
    texts = [None] * 3

    def one(i):
        chunks = ask(starter_client, model=STARTER_MODEL, temperature=0, max_tokens=20, stream=True)
        texts[i] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert texts == [alone] * 3


# -- `redline serve` -------------------------------------------------------------------------------------
def test_serve_refuses_a_network_address_without_a_key_before_loading(tmp_path):
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "redline", "serve", "--model", str(tmp_path / "nothing-here"), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "REDLINE_API_KEY": ""},
    )
    assert run.returncode == 2
    assert "needs an API key" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
def test_redline_serve_serves_until_sigterm(tiny_model_dir, tmp_path):
    import signal
    import subprocess
    import sys

    key_file = tmp_path / "key"
    key_file.write_text("a-key-for-this-test\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "redline", "serve", "--model", str(tiny_model_dir), "--precision", "fp32",
         "--port", "0", "--api-key-file", str(key_file)],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        address, lines = read_address(proc, 120)
        client = openai.OpenAI(base_url=address, api_key="a-key-for-this-test", max_retries=0, timeout=60)
        reply = ask(client, max_tokens=4, temperature=0)
        assert reply.usage.completion_tokens >= 1
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[1]
        assert proc.returncode == 0 and "Server stopped." in rest
        assert "a-key-for-this-test" not in "".join(lines) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_request_for_another_model_loads_it_when_the_server_allows(tiny_model_dir, tiny_draft_dir):
    service, server = start(tiny_model_dir, load_on_request=True, precision="fp32")
    try:
        client = openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=120)
        reply = ask(client, model=str(tiny_draft_dir), max_tokens=4, temperature=0)
        assert reply.model == "tiny-draft" and reply.usage.completion_tokens >= 1
        assert [m.id for m in client.models.list().data] == ["tiny-draft"]
        with pytest.raises(openai.NotFoundError, match="could not be loaded"):
            ask(client, model="/no/such/model/folder")
    finally:
        stop(service, server)


@pytest.mark.starter
def test_starter_streamed_and_whole_replies_agree_with_real_usage_and_seeds_repeat(starter_client):
    kwargs = dict(model=STARTER_MODEL, messages=[{"role": "user", "content": "Name two planets."}])
    whole = ask(starter_client, **kwargs, temperature=0, max_tokens=24)
    chunks = list(
        ask(starter_client, **kwargs, temperature=0, max_tokens=24, stream=True, stream_options={"include_usage": True})
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    streamed_usage, whole_usage = chunks[-1].usage.model_dump(), whole.usage.model_dump()
    # The same prompt again: the streamed reply took all of it but its last token from the prefix cache.
    assert streamed_usage["prompt_tokens_details"].pop("cached_tokens") == whole.usage.prompt_tokens - 1
    whole_usage["prompt_tokens_details"].pop("cached_tokens")
    assert streamed_usage == whole_usage
    assert whole.usage.prompt_tokens > 20  # the chat template's system turn and the question
    sampled = [ask(starter_client, **kwargs, temperature=1.0, seed=42, max_tokens=24) for _ in range(2)]
    assert sampled[0].choices[0].message.content == sampled[1].choices[0].message.content
