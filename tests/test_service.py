"""The engine as a service: requests in, event streams out, continuous batching, per-request cancel."""

import threading
import time

import pytest
from budget import within

from redline.inference import (
    Busy,
    Completed,
    DecodeOptions,
    EngineService,
    Failed,
    FinishedEvent,
    GenerationRequest,
    Queued,
    Refused,
    SamplingSettings,
    Started,
    TokenEvent,
    parse_precision,
)
from redline.inference.engine import Engine

TIMEOUT = 120


def ask(text: str, tokens: int = 24, **sampling) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": text}],
        sampling=SamplingSettings(max_new_tokens=tokens, temperature=0, **sampling),
        options=DecodeOptions("fast"),
    )


@pytest.fixture()
def service(tiny_model_dir):
    svc = EngineService(lambda: Engine("cpu"), max_active=4, max_queued=8)
    svc.load(str(tiny_model_dir), parse_precision("fp32")).result(TIMEOUT)
    yield svc
    assert svc.shutdown(30)


def solo(service, request) -> list[int]:
    return service.submit(request).result(TIMEOUT).token_ids


def test_concurrent_requests_decode_together_and_one_cancel_touches_no_other(service):
    prompts = ["The quick brown fox", "Paris is the capital", "def add(a, b):"]
    alone = [solo(service, ask(p, 40)) for p in prompts]
    handles = [service.submit(ask(p, 40)) for p in prompts]
    batched = []

    def cancel_after_five(event, seen=[0]):  # noqa: B006 - a counter local to this test
        if isinstance(event, TokenEvent):
            seen[0] += 1
            if seen[0] == 5:
                handles[1].cancel()

    handles[1].subscribe(cancel_after_five)
    results = [h.result(TIMEOUT) for h in handles]
    for h in handles:
        batched.append(any(isinstance(e, Started) and e.batched for e in h.history()))
    assert all(batched)
    assert results[1].finish_reason == "cancelled" and 5 <= results[1].new_tokens < 40
    assert results[1].token_ids == alone[1][: results[1].new_tokens]
    # The others finish with exactly the output they have alone (greedy, fp32).
    assert results[0].token_ids == alone[0] and results[2].token_ids == alone[2]
    assert results[0].finish_reason in ("length", "eos") and results[2].finish_reason in ("length", "eos")


def test_batched_output_equals_the_same_request_alone_for_every_request(service):
    prompts = [f"Question {i}: the quick brown fox jumps" for i in range(6)]  # more than max_active: some queue
    alone = [solo(service, ask(p, 20)) for p in prompts]
    handles = [service.submit(ask(p, 20)) for p in prompts]
    assert [h.result(TIMEOUT).token_ids for h in handles] == alone
    assert any(isinstance(e, Queued) for h in handles[4:] for e in h.history())


def test_seeded_sampling_repeats_inside_a_batch(service):
    req = lambda: ask("Local models run on", 16, seed=11)  # noqa: E731
    req_sampled = [
        GenerationRequest(
            messages=r.messages,
            sampling=SamplingSettings(max_new_tokens=16, temperature=0.9, top_k=20, seed=11),
            options=DecodeOptions("fast"),
        )
        for r in (req(), req())
    ]
    first = solo(service, req_sampled[0])
    others = [service.submit(ask("Something else entirely", 16)) for _ in range(2)]
    second = service.submit(req_sampled[1])
    assert second.result(TIMEOUT).token_ids == first
    for h in others:
        h.result(TIMEOUT)


def test_cancel_before_start_never_runs(service):
    blocker = threading.Event()
    job = service.call(lambda engine, report: blocker.wait(TIMEOUT), "a test job")
    handle = service.submit(ask("never", 8))
    handle.cancel()
    blocker.set()
    job.result(TIMEOUT)
    result = handle.result(TIMEOUT)
    assert result.finish_reason == "cancelled" and result.new_tokens == 0
    assert not any(isinstance(e, TokenEvent) for e in handle.history())


def test_queued_requests_say_what_they_wait_for(service):
    blocker = threading.Event()
    job = service.call(lambda engine, report: blocker.wait(TIMEOUT), "the speed lab")
    handle = service.submit(ask("wait", 4))
    queued = [e for e in handle.history() if isinstance(e, Queued)]
    blocker.set()
    job.result(TIMEOUT)
    handle.result(TIMEOUT)
    assert queued and "the speed lab" in queued[0].reason


def test_a_job_behind_replies_written_together_says_it_waits_for_them(service):
    """A job that needs the engine alone (the speed lab, a load) waits for the batch's replies to end, and says so
    at once, not only once something ahead of it in the queue moves."""
    streaming = service.submit(ask("a long reply", 200))
    first = streaming.events(TIMEOUT)
    while not isinstance(next(first), TokenEvent):  # the reply is being written
        pass
    job = service.call(lambda engine, report: "ran", "the speed lab")
    queued = [e for e in job.history() if isinstance(e, Queued)]
    streaming.cancel()
    assert job.result(TIMEOUT) == "ran"
    assert queued and "1 reply being written" in queued[0].reason


def test_a_full_queue_answers_busy_at_once(service):
    blocker, running = threading.Event(), threading.Event()
    job = service.call(lambda engine, report: (running.set(), blocker.wait(TIMEOUT)), "a test job")
    assert running.wait(TIMEOUT)  # the job has the engine; the queue is empty
    waiting = [service.submit(ask("x", 2)) for _ in range(service.max_queued)]
    started = time.monotonic()
    with pytest.raises(Busy, match="busy"):
        service.submit(ask("one too many", 2))
    assert time.monotonic() - started < within(1.0)
    blocker.set()
    job.result(TIMEOUT)
    for h in waiting:
        h.result(TIMEOUT)


def test_a_request_that_can_never_fit_is_refused(service):
    too_long = GenerationRequest(input_ids=[1] * 600, sampling=SamplingSettings(max_new_tokens=4))
    with pytest.raises(Refused, match="fills the context"):
        service.submit(too_long)


def test_out_of_memory_in_a_batched_step_fails_that_step_and_the_engine_goes_on(service, monkeypatch):
    from redline.inference.decoding import fastpath

    original = fastpath.FastDecoder.step
    calls = {"n": 0}

    def failing_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(fastpath.FastDecoder, "step", failing_step)
    handles = [service.submit(ask(p, 20)) for p in ("one", "two")]
    results = [h.result(TIMEOUT) for h in handles]
    assert all(r.finish_reason == "error" and r.error.startswith("Out of memory") for r in results)
    monkeypatch.setattr(fastpath.FastDecoder, "step", original)
    assert service.engine.target is not None  # the model stays loaded
    assert service.submit(ask("again", 6)).result(TIMEOUT).finish_reason in ("length", "eos")


def test_load_with_interrupt_stops_running_replies_with_a_note(service, tiny_model_dir):
    handle = service.submit(ask("a long answer please", 400))
    for e in handle.events(TIMEOUT):
        if isinstance(e, TokenEvent):
            break
    load = service.load(str(tiny_model_dir), parse_precision("fp32"), interrupt=True)
    result = handle.result(TIMEOUT)
    assert isinstance(load.wait(TIMEOUT), Completed)
    assert result.finish_reason == "cancelled" and any("the model to load" in n for n in result.notes)


def test_non_batchable_strategies_run_one_at_a_time_in_order(service):
    kv = GenerationRequest(
        messages=[{"role": "user", "content": "hi"}],
        sampling=SamplingSettings(max_new_tokens=6, temperature=0),
        options=DecodeOptions("kv"),
    )
    handles = [service.submit(kv), service.submit(ask("hi", 6)), service.submit(kv)]
    results = [h.result(TIMEOUT) for h in handles]
    assert [r.strategy for r in results] == ["kv", "fast", "kv"]
    assert results[0].token_ids == results[2].token_ids


def test_a_failing_job_fails_alone(service):
    def broken(engine, report):
        raise ValueError("boom")

    assert isinstance(service.call(broken).wait(TIMEOUT), Failed)
    assert service.submit(ask("still here", 4)).result(TIMEOUT).new_tokens == 4


def test_events_arrive_in_order_and_end_with_the_result(service):
    handle = service.submit(ask("stream me", 12))
    events = list(handle.events(TIMEOUT))
    assert isinstance(events[-1], FinishedEvent)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert "".join(e.text for e in tokens) == events[-1].result.text


def test_the_kv_budget_refuses_what_can_never_fit_and_queues_what_must_wait(tiny_model_dir):
    """The batch's KV memory is a budget of positions: a request larger than all of it is refused at once with
    the reason; one that fits only once others end waits, and says so."""
    svc = EngineService(lambda: Engine("cpu"), max_active=4, kv_budget_tokens=120)
    try:
        svc.load(str(tiny_model_dir), parse_precision("fp32")).result(TIMEOUT)
        huge = svc.submit(ask("hello", 400))
        with pytest.raises(Refused, match="KV cache"):
            huge.result(TIMEOUT)
        first, second = svc.submit(ask("one", 80)), svc.submit(ask("two", 80))
        assert first.result(TIMEOUT).new_tokens > 0 and second.result(TIMEOUT).new_tokens > 0
        waited = [e for e in second.history() if isinstance(e, Queued)]
        assert any("memory for the KV cache" in e.reason for e in waited)
    finally:
        assert svc.shutdown(30)


def test_a_reply_that_ran_alone_feeds_the_machines_corrections_and_a_batched_one_does_not(
    service, tmp_path, monkeypatch
):
    """A reply decoded alone is a fair sample of this machine's speed and memory; one that shared its steps
    with others is not, so only the first carries (and records) predicted-vs-measured figures."""
    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    alone = service.submit(ask("The quick brown fox", 16)).result(TIMEOUT)
    assert alone.predicted_tokens_per_s and alone.predicted_memory_bytes
    handles = [service.submit(ask(p, 40)) for p in ("Paris is the capital", "def add(a, b):")]
    together = [h.result(TIMEOUT) for h in handles]
    assert all(any(isinstance(e, Started) and e.batched for e in h.history()) for h in handles)
    assert all(r.predicted_tokens_per_s is None and r.predicted_memory_bytes is None for r in together)


@pytest.mark.parametrize("strategy", ["fast", "kv"])
def test_a_reply_that_waited_keeps_its_wait_apart_and_teaches_only_its_own_prefill(
    service, tmp_path, monkeypatch, strategy
):
    """A reply queued behind another job (the speed lab, another chat's reply) waited before its own work began:
    that wait is its ``queued_ms``, its TTFT counts from its own start (the prefill, as docs/speed-lab.md defines
    it), and the speed calibration records that TTFT, never the wait (a reply that waited 34 s for a 39-token
    prompt taught the model a prefill 87x too slow)."""
    from redline.inference.speed.calibration import SpeedCalibration

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    hold, running = threading.Event(), threading.Event()
    job = service.call(lambda engine, report: (running.set(), hold.wait(TIMEOUT)), "the speed lab")
    assert running.wait(TIMEOUT)
    request = ask("The quick brown fox", 16)
    request.options = DecodeOptions(strategy)
    first_seen: list[float] = []

    def watch(handle):  # when the caller sees the first token: after the reply's wait and its own prefill
        first_seen.append(next(time.perf_counter() for e in handle.events(TIMEOUT) if isinstance(e, TokenEvent)))

    sent = time.perf_counter()
    handle = service.submit(request)
    watcher = threading.Thread(target=watch, args=(handle,))
    watcher.start()
    time.sleep(1.0)  # the reply waits this long at least
    hold.set()
    job.result(TIMEOUT)
    result = handle.result(TIMEOUT)
    watcher.join(TIMEOUT)
    assert result.queued_ms >= 1000
    # The wait and the own TTFT are two parts of what the caller waited for the first token, not one counted twice
    # (with the wait inside the TTFT too, their sum was a whole wait more than the caller waited).
    assert result.ttft_ms + result.queued_ms <= (first_seen[0] - sent) * 1000
    assert result.submitted_ttft_ms == result.ttft_ms + result.queued_ms
    [record] = [r for rs in SpeedCalibration().data["devices"]["cpu"].values() for r in rs]
    assert record["measured_ttft_ms"] == result.ttft_ms
    assert record["cpus"] >= 1 and "others_cpu_share" in record and "load_average" in record
