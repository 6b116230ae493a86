"""The service's one admission object (inference/service/admission.py) against backends made up for the test: it
decides from what a backend reports (running(), kv_room(), batchable()), never from what kind of backend it is."""

from dataclasses import dataclass

import pytest

from redline.inference import DecodeOptions, GenerationRequest, SamplingSettings
from redline.inference.backends.base import Backend, Capabilities, KvRoom
from redline.inference.errors import Busy, Refused
from redline.inference.service.admission import Admission


@dataclass
class Prepared:
    tokens: int


class Made(Backend):
    """A backend whose answers the test sets."""

    def __init__(self, concurrency="batch", running=0, room=None, batchable=True, context=512):
        self.name, self.device, self.context_limit = "made", "cpu", context
        self._concurrency, self._running, self._room, self._batchable = concurrency, running, room, batchable

    @property
    def capabilities(self):
        return Capabilities(("fast", "kv"), True, False, True, True, self._concurrency)

    def reload_spec(self):
        return "made", None, None

    def batchable(self, request):
        return self._batchable and request.options.strategy == "fast"

    def admit(self, request):
        return Prepared(len(request.input_ids or []) + request.sampling.max_new_tokens)

    def running(self):
        return self._running

    def kv_room(self):
        return self._room

    def generate(self, request, sink, submitted=None):
        raise AssertionError("admission never runs anything")

    def release(self):
        pass


def ask(new=8, strategy="fast", ids=(1, 2, 3)):
    return GenerationRequest(
        input_ids=list(ids), sampling=SamplingSettings(max_new_tokens=new), options=DecodeOptions(strategy)
    )


def test_a_full_queue_is_busy_and_a_request_for_no_tokens_is_refused():
    admission = Admission(max_queued=2)
    admission.check_queue(1)
    with pytest.raises(Busy, match="2 requests are waiting"):
        admission.check_queue(2)
    with pytest.raises(Refused, match="no new tokens"):
        admission.check_request(ask(new=0), Made())
    with pytest.raises(Refused, match="context"):
        admission.check_request(ask(new=8, ids=range(600)), Made(context=512))
    admission.check_request(ask(new=8), None)  # no model yet: its load decides later


def test_how_follows_the_backend_and_the_resolved_strategy():
    admission, target = Admission(), Made()
    assert admission.how(target.resolved(ask(strategy="auto")), target) == "batch"  # auto: the target's first
    assert admission.how(ask(strategy="kv"), target) == "exclusive"
    assert admission.how(None, target) == "exclusive"  # a job that is not a generation
    assert admission.how(ask(), None) == "exclusive"  # no model loaded: its run says so


def test_room_is_counted_per_kind_of_concurrency_not_per_kind_of_backend():
    admission = Admission(max_active=2, max_in_flight=3)
    assert admission.has_room(Made(running=1)) and not admission.has_room(Made(running=2))
    assert admission.has_room(Made("threads", running=2)) and not admission.has_room(Made("threads", running=3))
    assert "2 replies are being written" in admission.wait_reason(Prepared(1), Made(running=2))
    assert "in flight to the server" in admission.wait_reason(Prepared(1), Made("threads", running=3))


def test_the_kv_budget_refuses_what_never_fits_and_holds_what_must_wait():
    admission = Admission()
    target = Made(room=KvRoom(budget_tokens=100, reserved_tokens=60, bytes_per_token=1000))
    with pytest.raises(Refused, match=r"needs up to 203 tokens of KV cache \(203 KB\).*holds 100"):
        admission.admit(ask(new=200), target)
    prepared = admission.admit(ask(new=50), target)  # 53 tokens: fits the budget, not beside the 60 reserved
    assert admission.wait_reason(prepared, target) == "waiting for memory for the KV cache"
    assert admission.wait_reason(Prepared(40), target) is None
    assert admission.wait_reason(Prepared(10_000), Made(room=None)) is None  # no KV cache here (a server)
