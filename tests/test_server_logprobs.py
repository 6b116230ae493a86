"""Log-probabilities (chat's ``logprobs``/``top_logprobs``, the completions' ``logprobs``) and ``n`` above 1 streamed,
through the official ``openai`` client against servers on 127.0.0.1 with the tiny model (fp32, CPU), checked
against the model's own logits computed here with transformers."""

from __future__ import annotations

import math
import time

import httpx
import openai
import pytest

from tests.test_server import TIMEOUT, ask, start, stop

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    service, server = start(tiny_model_dir)
    yield server
    stop(service, server)


@pytest.fixture()
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.address, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """The tiny model and its tokenizer in transformers, fp32: the direct computation the server is checked against."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def greedy_logprobs(reference, prompt_ids: list[int], steps: int, top: int):
    """Greedy decoding by hand: per step the chosen id, its log-softmax and the ``top`` best (id, log-softmax)."""
    import torch

    model, _ = reference
    ids = list(prompt_ids)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            lp = torch.log_softmax(logits, dim=-1)
            chosen = int(torch.argmax(lp))
            values, best = torch.topk(lp, top)
            out.append((chosen, float(lp[chosen]), list(zip(best.tolist(), values.tolist()))))
            ids.append(chosen)
    return out


def test_chat_logprobs_streamed_and_not_agree_and_join_to_the_text(client):
    whole = ask(client, temperature=0, max_tokens=16, logprobs=True, top_logprobs=5)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    for t in content:
        assert bytes(t.bytes) == t.token.encode("utf-8")
        assert len(t.top_logprobs) == 5
        values = [a.logprob for a in t.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert t.logprob <= 0
        # greedy: the chosen token is the most likely one, so its log-probability is the best of the top list
        assert t.logprob == pytest.approx(values[0], abs=1e-5)
    chunks = list(ask(client, temperature=0, max_tokens=16, logprobs=True, top_logprobs=5, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    # The second request takes all of the prompt but its last token from the prefix cache, so its first logits come
    # from other sums than the first request's (fp32, rounding apart: 1e-6 seen).
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-4)
    for c in chunks:  # each chunk carries the tokens of its own delta
        if c.choices and c.choices[0].delta.content and c.choices[0].logprobs:
            assert "".join(t.token for t in c.choices[0].logprobs.content) == c.choices[0].delta.content


def test_greedy_logprobs_are_the_models_log_softmax_at_each_position(client, reference):
    """The server's numbers against transformers' fp32 forward of the same tokens: the raw model distribution."""
    _, tok = reference
    prompt_ids = tok.encode(PROMPT)
    reply = client.completions.create(model="tiny-llama", prompt=prompt_ids, max_tokens=8, temperature=0, logprobs=5)
    lp = reply.choices[0].logprobs
    n = reply.usage.completion_tokens
    expected = greedy_logprobs(reference, prompt_ids, n, 5)
    assert len(lp.token_logprobs) == n
    chosen = [e[0] for e in expected]
    assert reply.choices[0].text == tok.decode(chosen, skip_special_tokens=True)  # the same greedy tokens
    for i, (_, logprob, top) in enumerate(expected):
        assert lp.token_logprobs[i] == pytest.approx(logprob, abs=1e-4), i
        got = lp.top_logprobs[i]
        # the 5 best, and the chosen token under its text in the reply (a partial character shows differently alone)
        assert len(got) in (5, 6), got
        for _, value in top:
            assert any(abs(v - value) < 1e-4 for v in got.values()), (i, value, got)
    assert sum(lp.token_logprobs) == pytest.approx(sum(e[1] for e in expected), abs=1e-3)
    assert "".join(lp.tokens) == reply.choices[0].text
    offsets = [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]
    assert lp.text_offset == offsets


def test_seeded_sampled_logprobs_repeat_streamed_or_not(client):
    kwargs = dict(
        model="tiny-llama",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        temperature=1.5,
        seed=11,
        logprobs=True,
        top_logprobs=3,
    )
    content = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    streamed = list(client.chat.completions.create(stream=True, **kwargs))
    again = [t.logprob for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert again == [t.logprob for t in content]  # the same seed: the same tokens and numbers, streamed or not
    for t in content:  # the top list is the head of a distribution
        assert sum(math.exp(a.logprob) for a in t.top_logprobs) <= 1 + 1e-5


def test_completions_logprobs_on_the_kv_strategy_equal_the_fast_paths(tiny_model_dir, client, reference):
    """transformers' generate() (kv) scores its tokens with the same numbers as the batched fast path."""
    _, tok = reference
    prompt_ids = tok.encode(PROMPT)
    fast = client.completions.create(model="tiny-llama", prompt=prompt_ids, max_tokens=6, temperature=0, logprobs=3)
    service, server = start(tiny_model_dir, strategy="kv")
    try:
        kv_client = openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=60)
        kv = kv_client.completions.create(
            model="tiny-llama", prompt=prompt_ids, max_tokens=6, temperature=0, logprobs=3
        )
        streamed = list(
            kv_client.completions.create(
                model="tiny-llama", prompt=prompt_ids, max_tokens=6, temperature=0, logprobs=3, stream=True
            )
        )
    finally:
        stop(service, server)
    a, b = fast.choices[0].logprobs, kv.choices[0].logprobs
    assert a.tokens == b.tokens
    assert b.token_logprobs == pytest.approx(a.token_logprobs, abs=1e-4)
    lp = [v for c in streamed if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert lp == pytest.approx(b.token_logprobs, abs=1e-6)


def test_sampled_completion_logprobs_are_the_models_own_not_the_tempered_ones(tiny_server, client, reference):
    """At temperature 1.7 the token is drawn from the tempered distribution, but its log-probability is the model's
    raw log-softmax at that position, recomputed here from the prompt and the tokens the engine wrote."""
    import torch

    model, tok = reference
    prompt_ids = tok.encode(PROMPT)
    service, handles = tiny_server.service, []
    submit = service.submit

    def spy(request):
        handles.append(submit(request))
        return handles[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service, "submit", spy)
        reply = client.completions.create(
            model="tiny-llama", prompt=prompt_ids, max_tokens=6, temperature=1.7, seed=5, logprobs=1
        )
    lp = reply.choices[0].logprobs
    written = handles[0].result(TIMEOUT).token_ids
    assert len(written) == len(lp.token_logprobs)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + written])).logits[0].float()
    raw = torch.log_softmax(logits, dim=-1)
    tempered = torch.log_softmax(logits / 1.7, dim=-1)
    for i, token in enumerate(written):
        position = len(prompt_ids) - 1 + i
        assert lp.token_logprobs[i] == pytest.approx(float(raw[position, token]), abs=1e-4)
    assert any(
        abs(float(tempered[len(prompt_ids) - 1 + i, t]) - lp.token_logprobs[i]) > 1e-3 for i, t in enumerate(written)
    )


def test_n_streamed_reassembles_to_the_same_choices_as_n_whole(client):
    kwargs = dict(n=3, temperature=1.0, seed=7, max_tokens=12)
    whole = ask(client, **kwargs)
    chunks = list(ask(client, stream=True, stream_options={"include_usage": True}, **kwargs))
    assert len(chunks) < 3 * 12 + 12  # bounded: per choice a role chunk, a chunk per token, a finish chunk
    texts, finishes = ["", "", ""], [[], [], []]
    for c in chunks[:-1]:
        (choice,) = c.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finishes[choice.index].append(choice.finish_reason)
    assert texts == [c.message.content for c in whole.choices]
    assert len(set(texts)) > 1  # seed + i: the choices differ
    assert finishes == [[c.finish_reason] for c in whole.choices]  # each choice ends once, with its own reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert sum(1 for c in chunks if c.usage is not None) == 1
    indices = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.content]
    assert indices != sorted(indices)  # interleaved as the batcher writes them, not one choice after the other
    streamed_completion = list(
        client.completions.create(model="tiny-llama", prompt="Paris is", max_tokens=4, n=2, temperature=0, stream=True)
    )
    joined = ["", ""]
    for c in streamed_completion:
        joined[c.choices[0].index] += c.choices[0].text
    assert joined[0] == joined[1]  # greedy: the same text twice


def test_n_streamed_with_logprobs_carries_each_choices_own(client):
    whole = ask(client, n=2, temperature=0, max_tokens=8, logprobs=True, top_logprobs=2)
    chunks = list(ask(client, n=2, temperature=0, max_tokens=8, logprobs=True, top_logprobs=2, stream=True))
    per = [[], []]
    for c in chunks:
        if c.choices and c.choices[0].logprobs:
            per[c.choices[0].index] += [t.logprob for t in c.choices[0].logprobs.content]
    assert per == [[t.logprob for t in ch.logprobs.content] for ch in whole.choices]


def test_a_client_that_leaves_a_streamed_n_cancels_every_choice(tiny_server):
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "Tell me everything"}],
        "max_tokens": 400,
        "stream": True,
        "temperature": 0.8,
        "seed": 3,
        "n": 3,
        "logit_bias": {str(tiny_server.service.engine.target.tokenizer.eos_token_id): -100},  # no early end
    }
    before = len(tiny_server.stats.recent)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", tiny_server.address + "/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = 0
            for line in response.iter_lines():
                lines += line.startswith("data:")
                if lines >= 8:
                    break
    deadline = time.monotonic() + 30
    while len(tiny_server.stats.recent) < before + 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    ended = list(tiny_server.stats.recent)[before:]
    assert [r[0] for r in ended] == ["cancelled"] * 3
    assert all(r[1] < 400 and r[2] for r in ended)
    assert tiny_server.stats.active == 0


def test_refused_logprobs_values_are_one_sentence_400s(client, tiny_model_dir):
    cases = [
        (dict(logprobs=True, top_logprobs=21), "top_logprobs must be between 0 and 20 (got 21)."),
        (dict(top_logprobs=3), "top_logprobs needs logprobs: true."),
        (dict(logprobs=False, top_logprobs=3), "top_logprobs needs logprobs: true."),
    ]
    for kwargs, message in cases:
        with pytest.raises(openai.BadRequestError) as info:
            ask(client, **kwargs)
        assert info.value.body["message"] == message and info.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny-llama", prompt="Paris is", max_tokens=2, logprobs=6)
    assert info.value.body["message"] == "logprobs must be between 0 and 5 (got 6)."
    with pytest.raises(openai.BadRequestError, match="'logprobs' is not valid"):
        client.completions.create(model="tiny-llama", prompt="Paris is", max_tokens=2, logprobs=True)
    service, server = start(tiny_model_dir, strategy="prompt-lookup")
    try:
        other = openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="not available with the prompt-lookup strategy"):
            ask(other, logprobs=True)
        assert ask(other, temperature=0, max_tokens=2).choices[0].logprobs is None  # not asked: none, and it runs
    finally:
        stop(service, server)


def test_without_logprobs_none_are_computed(tiny_server, client):
    """A request that does not ask carries none in its events or its result (the fast path skips the work)."""
    service = tiny_server.service
    handles = []
    submit = service.submit

    def spy(request):
        handles.append(submit(request))
        return handles[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service, "submit", spy)
        reply = ask(client, temperature=0, max_tokens=4)
    assert reply.choices[0].logprobs is None
    assert handles[0].result(TIMEOUT).logprobs is None


def test_a_stop_string_cuts_the_tokens_text_as_it_cuts_the_reply(client):
    """The token that holds the stop string shows only the text before it; held-back text comes with its tokens."""
    free = ask(client, temperature=0, max_tokens=16).choices[0].message.content
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    assert len(stop) == 2 and stop.strip()  # a cut in the middle of the reply, not at its start
    whole = ask(client, temperature=0, max_tokens=16, stop=[stop], logprobs=True)
    content = whole.choices[0].logprobs.content
    text = whole.choices[0].message.content
    assert stop not in text and free.startswith(text) and len(text) < len(free)
    assert "".join(t.token for t in content) == text
    chunks = list(ask(client, temperature=0, max_tokens=16, stop=[stop], logprobs=True, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    # The second request takes all of the prompt but its last token from the prefix cache, so its first logits come
    # from other sums than the first request's (fp32, rounding apart: 1e-6 seen).
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-4)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
