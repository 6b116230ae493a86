"""A long prompt read beside streaming replies (issue 27.5): chunks sized so the streaming replies' wait stays
within GAP_STEPS of their step, and, where the whole step runs, read in the same pass as their decode step."""

from __future__ import annotations

import pytest
import torch

from redline.inference import DecodeOptions, Engine, GenerationRequest, SamplingSettings
from redline.inference.generation.batch import (
    GAP_STEPS,
    MIN_MIXED_CHUNK,
    MIN_PREFILL_CHUNK,
    PREFILL_CHUNK,
    Batcher,
    PrefillPace,
)
from redline.inference.generation.lifecycle import DirectSink
from redline.inference.kernels import ops
from redline.inference.precision import parse_precision


def test_alone_a_prompt_is_read_in_full_chunks_and_fixed_stays_fixed():
    pace = PrefillPace()
    pace.measured_step(0.010)
    assert pace.next_chunk(others_streaming=False) == PREFILL_CHUNK
    fixed = PrefillPace(fixed=256)
    fixed.measured_step(0.010)
    fixed.measured_wait(256, 5.0, mixed=True)
    assert fixed.next_chunk(True) == 256


def test_the_chunk_shrinks_when_the_wait_is_over_budget_and_grows_when_under():
    pace = PrefillPace()
    pace.measured_step(0.010)  # budget beside a 10 ms step: 25 ms mixed, 15 ms when the step comes after
    start = pace.next_chunk(True)
    pace.measured_wait(start, 0.100, mixed=True)  # four times the budget: halved at most
    assert pace.next_chunk(True) == start // 2
    for _ in range(10):
        pace.measured_wait(pace.next_chunk(True), 0.100, mixed=False)
    assert pace.next_chunk(True) == MIN_PREFILL_CHUNK  # read alone, a chunk is a pass over the weights
    for _ in range(10):
        pace.measured_wait(pace.next_chunk(True), 0.100, mixed=True)
    assert pace.next_chunk(True) == MIN_MIXED_CHUNK  # in the streaming replies' own pass, down to a token
    for _ in range(20):
        n = pace.next_chunk(True)
        pace.measured_wait(n, n * 1e-6, mixed=True)  # far under budget: doubles each time, up to the cap
    assert pace.next_chunk(True) == PREFILL_CHUNK
    assert pace.next_chunk(True, most=100) == 100
    pace.chunk = 64
    pace.measured_wait(64, GAP_STEPS * 0.010 - 0.010, mixed=False)  # exactly the budget: kept
    assert pace.next_chunk(True) == 64


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from conftest import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("pace") / "tiny-2k", max_positions=2048)


def load(folder):
    engine = Engine("cpu")
    engine.record_memory = False
    engine.load(str(folder), parse_precision("fp32"))
    return engine.target


@pytest.fixture(scope="module")
def target(folder):
    return load(folder)


def request(ids, new):
    return GenerationRequest(
        input_ids=ids,
        sampling=SamplingSettings(max_new_tokens=new, min_new_tokens=new, temperature=0),
        options=DecodeOptions("fast", reuse_prefix=False),
        record=False,
    )


def alone(target, ids, new):
    sink = DirectSink()
    return Batcher(target, 2).run_one(sink, request(ids, new), 0.0).token_ids


def test_a_prompt_read_beside_a_streaming_reply_changes_neither_answer(target, native_kernels, monkeypatch):
    g = torch.Generator().manual_seed(3)
    short = torch.randint(5, 350, (12,), generator=g).tolist()
    long = torch.randint(5, 350, (700,), generator=g).tolist()
    expected_stream, expected_long = alone(target, short, 300), alone(target, long, 6)

    batcher = Batcher(target, 2)
    mixed = []
    real = batcher.dec.mixed_step
    monkeypatch.setattr(
        batcher.dec, "mixed_step", lambda chunk, *a, **k: mixed.append(len(chunk)) or real(chunk, *a, **k)
    )
    stream, newcomer = DirectSink(), DirectSink()
    batcher.add(stream, request(short, 300), 0.0)
    for _ in range(6):
        batcher.step()
    batcher.add(newcomer, request(long, 6), 0.0)
    read_while_streaming = None
    for _ in range(2000):
        if not len(batcher):
            break
        batcher.step()
        if stream.result is not None and read_while_streaming is None:
            read_while_streaming = sum(mixed)
    assert stream.result.token_ids == expected_stream  # fp32, greedy: token for token
    assert newcomer.result.token_ids == expected_long
    # The prompt was read in mixed steps, in paced chunks, while the stream ran. The chunks follow the measured
    # step time, so on a busy machine (small chunks) the stream may end first: the rest is then read alone.
    assert mixed and (sum(mixed) == len(long) or sum(mixed) == read_while_streaming < len(long))
    assert len(mixed) > 1 and max(mixed) < ops.GEMM_ROWS


def test_a_short_rest_is_read_whole_beside_streaming_replies_and_a_long_one_is_paced():
    from redline.inference.generation.batch import WHOLE_PROMPT_S

    pace = PrefillPace()
    assert pace.next_chunk(True, rest=40) == 16  # nothing measured yet: paced
    pace.measured_rows(44, 44 * 0.002)  # a prompt read alone: 2 ms a token
    assert pace.next_chunk(True, rest=40) == 40  # 80 ms: read whole
    assert pace.next_chunk(True, most=30, rest=40) == 30  # never more rows than the step can take
    long = int(WHOLE_PROMPT_S / 0.002) + 1
    assert pace.next_chunk(True, rest=long) == 16  # over WHOLE_PROMPT_S: paced chunks
    pace.measured_step(0.010)
    pace.measured_wait(16, 0.010 + 16 * 0.004, mixed=True)  # the mixed pass's own share: 4 ms a token
    assert pace.row_s == pytest.approx(0.003)  # averaged with the 2 ms measured before
    assert pace.next_chunk(True, rest=40) < 40


def test_the_first_chunk_beside_a_streaming_reply_is_small_then_steered():
    """The first mixed chunk is read before anything is measured: MIN_PREFILL_CHUNK rows, not the 16 a chunk read
    alone starts at (where it costs a pass over the weights)."""
    pace = PrefillPace()
    pace.measured_step(0.004)
    assert pace.next_chunk(True, mixed=True) == MIN_PREFILL_CHUNK
    assert pace.next_chunk(True) == 16
    pace.measured_wait(MIN_PREFILL_CHUNK, 0.005, mixed=True)  # under the 10 ms budget: grown from there
    assert MIN_PREFILL_CHUNK < pace.next_chunk(True, mixed=True) <= 2 * MIN_PREFILL_CHUNK


def test_a_long_prompt_grows_the_pool_once_on_admission(target, native_kernels, monkeypatch):
    """Its pages, and the streaming reply's for the tokens it makes while the prompt is read, are taken when the
    prompt is admitted: one growth of the pool (a copy of all of it), not one every eighth of the way, each a gap
    in the streaming reply."""
    g = torch.Generator().manual_seed(5)
    short = torch.randint(5, 350, (12,), generator=g).tolist()
    long = torch.randint(5, 350, (1200,), generator=g).tolist()
    batcher = Batcher(target, 2)
    kv = batcher.dec.kv
    stream = DirectSink()
    batcher.add(stream, request(short, 1500), 0.0)
    for _ in range(4):
        batcher.step()
    grown = []
    real = kv._allocate
    monkeypatch.setattr(kv, "_allocate", lambda pages: grown.append(pages) or real(pages))
    newcomer = DirectSink()
    batcher.add(newcomer, request(long, 2), 0.0)
    assert len(grown) <= 1
    streaming = next(a for a in batcher.active if a.sink is stream).seq
    assert len(kv.tables[stream.id]) * kv.page >= streaming.position + 1 + len(long)
    for _ in range(3000):  # bounded: the prompt takes a few hundred paced steps
        if newcomer.result is not None and newcomer.result.finish_reason:
            break
        batcher.step()
    assert newcomer.result is not None and newcomer.result.finish_reason not in (None, "error"), newcomer.result
    assert len(grown) <= 1
    batcher.cancel_all("test over")
    while len(batcher):
        batcher.step()


def test_a_reply_decodes_to_its_limit_without_growing_the_pool(folder, native_kernels, monkeypatch):
    """Room for the reply's whole limit is made when it is admitted: grown by an eighth as it decoded, the pool
    was copied every 128 tokens, a stall longer each time (20 ms at 1,900 tokens beside a 4.7 ms step). The room
    not written is address space only: ``touched_bytes`` counts the pages handed out."""
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(5, 350, (20,), generator=g).tolist()
    batcher = Batcher(load(folder), 2)  # a pool of its own, as small as a new model's
    kv = batcher.dec.kv
    assert kv.pages * kv.page < 600
    grown = []
    real = kv._allocate
    monkeypatch.setattr(kv, "_allocate", lambda pages: grown.append(pages) or real(pages))
    sink = DirectSink()
    batcher.add(sink, request(prompt, 600), 0.0)
    assert len(grown) <= 1 and (len(kv.free) + len(kv.tables[sink.id])) * kv.page >= len(prompt) + 600
    for _ in range(700):  # bounded: 600 tokens
        if sink.result is not None and sink.result.finish_reason:
            break
        batcher.step()
    assert sink.result is not None and sink.result.new_tokens == 600, sink.result
    assert len(grown) <= 1


def test_room_made_is_address_space_until_pages_are_handed_out():
    from redline.inference.decoding.kv_cache import PagedKV

    kv = PagedKV(2, 2, 16, torch.float32, "cpu", tokens=64)
    kv.make_room({1: 10 * kv.page})
    assert kv.pages >= 10 and kv.touched_bytes() == 0
    kv.reserve(1, 3 * kv.page)
    assert kv.touched_bytes() == 3 * kv.page_bytes
    pages = kv.tables[1]
    kv.k[:, pages] = 1.5
    kv.make_room({1: 10 * kv.page, 2: 30 * kv.page})  # a growth copies the pages handed out, and keeps them
    assert kv.pages >= 40 and kv.touched_bytes() == 3 * kv.page_bytes
    assert torch.equal(kv.k[:, pages], torch.full_like(kv.k[:, pages], 1.5))
    kv.set_cache(b"", 0, budget_pages=kv.pages + 5)
    kv.make_room({3: 1000 * kv.page})  # never past the budget
    assert kv.pages == kv.budget_pages
