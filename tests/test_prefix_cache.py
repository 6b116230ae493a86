"""The prefix cache in the fast path's paged KV pool (inference/decoding/kv_cache.py): pages addressed by their
content, counted by the sequences that use them, kept least recently used first out; and the conversation
flows that must hit it, through the engine service."""

from __future__ import annotations

import pytest
import torch

from redline.inference import DecodeOptions, Engine, EngineService, GenerationRequest, SamplingSettings
from redline.inference.decoding.kv_cache import PAGE_TOKENS, PagedKV, chain_keys
from redline.inference.precision import parse_precision

P = PAGE_TOKENS
TIMEOUT = 120


def pool(cache_pages: int = 8, namespace: bytes = b"model-a", tokens: int = 256) -> PagedKV:
    kv = PagedKV(1, 1, 8, torch.float32, "cpu", tokens=tokens)
    kv.set_cache(namespace, cache_pages)
    return kv


def run_sequence(kv: PagedKV, seq: int, tokens: list[int], written: int | None = None) -> int:
    """A sequence that takes what the cache holds of ``tokens``, writes the rest (a mark per position: its
    token id), and ends having written ``written`` of them (all by default). Returns the cached positions."""
    cached = kv.attach(seq, tokens)
    n = len(tokens) if written is None else written
    kv.reserve(seq, max(n, 1))
    for pos in range(cached, n):
        page, off = kv.tables[seq][pos // kv.page], pos % kv.page
        kv.k[0, page, 0, off, 0] = tokens[pos]
    kv.release(seq, tokens[:n])
    return cached


def read_back(kv: PagedKV, seq: int, n: int) -> list[int]:
    return [int(kv.k[0, kv.tables[seq][p // kv.page], 0, p % kv.page, 0]) for p in range(n)]


def test_equal_prefixes_have_equal_keys_and_a_different_page_changes_every_later_key():
    a = list(range(3 * P))
    b = a[:P] + [9999] + a[P + 1 :]
    ka, kb = chain_keys(b"ns", a, P, 3), chain_keys(b"ns", b, P, 3)
    assert ka[0] == kb[0] and ka[1] != kb[1] and ka[2] != kb[2]  # page 2 is equal but follows a changed page
    assert chain_keys(b"other", a, P, 1)[0] != ka[0]  # the model, precision and KV dtype start the chain


def test_a_sequence_takes_the_full_pages_of_its_cached_prefix_and_reads_them_back():
    kv = pool()
    first = list(range(1, 3 * P + 10))
    assert run_sequence(kv, 1, first) == 0
    second = first + [7] * 40  # the next turn: the whole first sequence, then more
    assert kv.attach(2, second) == len(first)  # its three full pages and the partial fourth (a copy)
    assert read_back(kv, 2, len(first)) == first
    kv.release(2, None)


def test_the_partial_last_page_is_copied_and_the_cached_one_stays_as_it_was():
    kv = pool()
    first = list(range(1, P + 30))  # a page and 29 tokens
    run_sequence(kv, 1, first)
    tail = next(p for p in kv.idle if p not in kv.key_of)  # the 29 tokens' page: cached, not addressed by a key
    assert kv.cached_tokens() == P + 29 and kv.cached_bytes() == 2 * kv.page_bytes
    second = first + [5000 + i for i in range(20)]
    assert kv.attach(2, second) == len(first) and kv.tables[2][1] != tail  # its own copy of the tail
    assert read_back(kv, 2, len(first)) == first
    kv.reserve(2, len(second))
    for pos in range(len(first), len(second)):  # writes positions 93.. into the copy
        kv.k[0, kv.tables[2][1], 0, pos % P, 0] = second[pos]
    assert [int(kv.k[0, tail, 0, o, 0]) for o in range(29)] == first[P:]  # the cached tail is unchanged
    kv.release(2, second)
    assert tail not in kv.origin and tail in kv.free  # the first turn's tail: the second's holds it and more
    third = second + [1]
    assert kv.attach(3, third) == len(second)  # the second turn's tail (49 tokens)
    assert read_back(kv, 3, len(second)) == second
    kv.release(3, None)


def test_a_prompt_that_differs_inside_a_page_takes_the_tokens_before_the_difference():
    kv = pool()
    first = list(range(1, 3 * P + 1))
    run_sequence(kv, 1, first)
    edited = first[: P + 20] + [9999] * 50  # a regenerated or edited message: differs 20 tokens into page 2
    assert kv.attach(2, edited) == P + 20
    assert read_back(kv, 2, P + 20) == edited[: P + 20]
    kv.release(2, None)
    assert kv.attach(3, [4242] + first[1:]) == 0  # a first token that differs: nothing in common
    kv.release(3, None)


def test_tails_are_evicted_with_the_pages_and_leave_no_listing_behind():
    kv = pool(cache_pages=3)
    for s in range(1, 9):  # eight conversations of a page and a tail each, in a cache of three pages
        run_sequence(kv, s, [1000 * s + i for i in range(P + 10)])
    assert len(kv.idle) <= 3
    listed = [p for pages in kv.after.values() for p in pages]
    assert sorted(listed) == sorted(kv.origin) and set(kv.idle) <= set(kv.origin)
    assert all(pages for pages in kv.after.values())
    kv.forget_cache()
    assert kv.after == {} and kv.origin == {}
    same = list(range(1, P + 10))
    run_sequence(kv, 20, same)
    assert run_sequence(kv, 21, same) == P + 8  # all but the last token; the same tail again is not listed twice
    assert len(kv.origin) == 2 and kv.attach(22, same + [3]) == P + 9


def test_the_last_prompt_token_is_always_computed():
    kv = pool()
    tokens = list(range(1, 2 * P + 1))  # exactly two pages
    run_sequence(kv, 1, tokens)
    assert kv.attach(2, tokens) == 2 * P - 1  # the same prompt again: its last token is read again


def test_a_changed_key_misses():
    kv = pool()
    run_sequence(kv, 1, list(range(1, 3 * P)))
    edited = [42] + list(range(2, 3 * P))  # the first token differs (a new system prompt, say)
    assert kv.attach(2, edited) == 0
    other_model = pool(namespace=b"model-b")
    run_sequence(other_model, 1, list(range(1, 3 * P)))
    other_model.set_cache(b"model-c", 8)  # another model or precision: nothing of the old one is reused
    assert other_model.attach(2, list(range(1, 3 * P))) == 0


def test_a_page_shared_by_two_live_sequences_is_not_freed_while_either_uses_it():
    kv = pool(cache_pages=2)  # room for the prefix's two pages while idle, no more
    prefix = list(range(1, 2 * P + 5))
    run_sequence(kv, 1, prefix)
    a = kv.attach(2, prefix + [5, 6])
    b = kv.attach(3, prefix + [8, 9])
    shared = kv.tables[2][:2]
    assert a == b == 2 * P and kv.tables[3][:2] == shared
    assert all(kv.refs[p] == 2 for p in shared) and not any(p in kv.free for p in shared)
    kv.release(2, None)
    assert all(kv.refs[p] == 1 for p in shared) and not any(p in kv.free or p in kv.idle for p in shared)
    kv.reserve(4, 20 * P)  # a large request: it must not be handed a page sequence 3 still reads
    assert not set(shared) & set(kv.tables[4])
    assert read_back(kv, 3, 2 * P) == prefix[: 2 * P]


def test_idle_pages_are_evicted_least_recently_used_first():
    kv = pool(cache_pages=4)
    # Two whole pages each (no partial last page, which would take a cached page of its own).
    convs = {name: [base + i for i in range(2 * P)] for name, base in (("a", 1000), ("b", 2000), ("c", 3000))}
    run_sequence(kv, 1, convs["a"])
    run_sequence(kv, 2, convs["b"])
    assert kv.attach(3, convs["a"] + [1]) == 2 * P  # a was used again: now b is the oldest
    kv.release(3, convs["a"][: 2 * P])
    run_sequence(kv, 4, convs["c"])  # four pages fit: b's go
    assert kv.cached_tokens() == 4 * P
    assert kv.attach(5, convs["b"] + [1]) == 0
    kv.release(5, None)
    assert kv.attach(6, convs["a"] + [1]) == 2 * P and kv.attach(7, convs["c"] + [1]) == 2 * P


def test_a_full_budget_evicts_cached_pages_before_growing():
    kv = pool(cache_pages=100, tokens=4 * P)
    kv.set_cache(b"ns", 100, budget_pages=4)
    run_sequence(kv, 1, list(range(1, 4 * P + 1)))  # fills the pool: four cached pages
    assert kv.pages == 4 and len(kv.idle) == 4
    kv.reserve(2, 3 * P)  # a new request within the budget: takes cached pages, the pool does not grow
    assert kv.pages == 4 and len(kv.idle) == 1


def test_cancel_mid_prefill_leaves_no_half_written_page_reachable():
    kv = pool()
    tokens = list(range(1, 4 * P))
    run_sequence(kv, 1, tokens, written=P + P // 2)  # stopped after a page and a half
    tail = next(p for p in kv.idle if p not in kv.key_of)  # the half page: kept with the tokens written, no key
    assert len(kv.idle) == 2 and kv.origin[tail][1] == tuple(tokens[P : P + P // 2]) and len(kv.page_of) == 1
    assert kv.attach(2, tokens) == P + P // 2  # what was written, and not a position more


def test_a_failed_sequence_registers_nothing():
    kv = pool()
    cached = kv.attach(1, list(range(1, 3 * P)))
    kv.reserve(1, 3 * P)
    kv.release(1, None)
    assert cached == 0 and not kv.idle and not kv.page_of


# -- the conversation flows, through the engine service --------------------------------------------------------
@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from conftest import build_tiny_model

    folder = build_tiny_model(tmp_path_factory.mktemp("long") / "tiny-2k", max_positions=2048)
    svc = EngineService(lambda: Engine("cpu"))
    svc.load(str(folder), parse_precision("fp32")).result(TIMEOUT)
    yield svc
    svc.shutdown()


def ask(svc, messages, reuse=True, new=24, **sampling):
    request = GenerationRequest(
        messages=list(messages),
        sampling=SamplingSettings(max_new_tokens=new, temperature=0, **sampling),
        options=DecodeOptions("fast", reuse_prefix=reuse),
    )
    return svc.submit(request).result(TIMEOUT)


SYSTEM = {"role": "system", "content": "Answer about local models and their speed. " * 12}


def user(i: int) -> dict:
    return {"role": "user", "content": f"Question {i}: how fast is int8 on a consumer GPU? " * 4}


def test_the_next_turn_hits_and_writes_what_it_would_without_the_cache(service, native_kernels):
    messages = [SYSTEM, user(0)]
    first = ask(service, messages)
    messages += [{"role": "assistant", "content": first.text}, user(1)]
    warm = ask(service, messages)
    cold = ask(service, messages, reuse=False)
    # The whole first prompt at least (its partial last page too), not only its whole pages.
    assert warm.cached_tokens >= first.prompt_tokens > 0 and cold.cached_tokens == 0
    assert first.prompt_tokens % P
    assert warm.token_ids == cold.token_ids  # greedy fp32: token for token, with or without the cached prefix


def test_regenerate_and_edit_reuse_up_to_the_point_that_changed(service, native_kernels):
    base = [SYSTEM, user(10), {"role": "assistant", "content": "It depends on the card."}, user(11)]
    first = ask(service, base)
    assert ask(service, base).cached_tokens == first.prompt_tokens - 1  # regenerate: all but the last token
    edited = base[:-1] + [{"role": "user", "content": "Something else entirely."}]
    again = ask(service, edited)
    unchanged = first.prompt_tokens - 40  # the edit changes only the last message
    assert unchanged // P * P - P <= again.cached_tokens < first.prompt_tokens


def test_two_chats_with_the_same_system_prompt_share_it(service, native_kernels):
    ask(service, [SYSTEM, user(20)])
    other = ask(service, [SYSTEM, {"role": "user", "content": "A different first question."}])
    assert other.cached_tokens >= P


def test_switching_back_to_a_recent_conversation_hits(service, native_kernels):
    a = [SYSTEM, user(30), {"role": "assistant", "content": "Yes."}, user(31)]
    b = [{"role": "system", "content": "Another persona entirely. " * 20}, user(40)]
    ask(service, a)
    ask(service, b)
    assert ask(service, a + [{"role": "assistant", "content": "No."}, user(32)]).cached_tokens >= P


def test_a_changed_system_prompt_never_reuses_a_stale_page(service, native_kernels):
    ask(service, [SYSTEM, user(50)])
    changed = {"role": "system", "content": "Z" + SYSTEM["content"][1:]}
    template = service.target.tokenizer.apply_chat_template
    same = [template([m], add_generation_prompt=True, return_dict=False) for m in (SYSTEM, changed)]
    before_change = next(i for i, (x, y) in enumerate(zip(*same)) if x != y)  # the template's opening tokens
    assert before_change < 8
    assert ask(service, [changed, user(50)]).cached_tokens <= before_change  # nothing from the change on


def test_a_client_resending_the_history_as_ids_hits(service, native_kernels):
    """What every OpenAI client does: the whole history again, each time (here as the server sends it: ids)."""
    ids = list(range(5, 5 + 3 * P))
    request = GenerationRequest(input_ids=ids, sampling=SamplingSettings(max_new_tokens=8, temperature=0))
    request.options = DecodeOptions("fast")
    service.submit(request).result(TIMEOUT)
    again = GenerationRequest(input_ids=ids + [7, 8, 9], sampling=SamplingSettings(max_new_tokens=8, temperature=0))
    again.options = DecodeOptions("fast")
    assert service.submit(again).result(TIMEOUT).cached_tokens == 3 * P


def test_the_started_event_says_what_came_from_the_cache(service, native_kernels):
    from redline.inference import Started

    messages = [SYSTEM, user(60)]
    ask(service, messages)
    request = GenerationRequest(
        messages=messages, sampling=SamplingSettings(max_new_tokens=4, temperature=0), options=DecodeOptions("fast")
    )
    handle = service.submit(request)
    result = handle.result(TIMEOUT)
    started = [e for e in handle.history() if isinstance(e, Started)]
    assert started and started[-1].cached_tokens == result.cached_tokens > 0
