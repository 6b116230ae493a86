"""The fast decode path gives transformers' tokens, with its own cache and fused weights."""

import threading

import pytest
import torch

from redline.inference.decoding.options import DecodeOptions, SamplingSettings
from redline.inference.engine import Engine
from redline.inference.events import TokenEvent
from redline.inference.generation.lifecycle import DirectSink
from redline.inference.generation.request import GenerationRequest
from redline.inference.precision import PrecisionSpec, parse_precision

GREEDY = SamplingSettings(max_new_tokens=20, temperature=0)
# The decode loop's tests run on every device this machine has: the CPU, and CUDA when there is one.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module", params=DEVICES)
def engine(tiny_model_dir, request):
    eng = Engine(device=request.param)
    eng.load(str(tiny_model_dir), PrecisionSpec("fp32"))
    return eng


@pytest.mark.parametrize("words", [1, 7, 40, 110])
def test_fast_matches_kv_at_several_prompt_lengths(engine, words):
    msgs = [{"role": "user", "content": " ".join(["quick brown fox"] * words)}]
    kv = engine.chat(msgs, GREEDY, DecodeOptions("kv"))
    fast = engine.chat(msgs, GREEDY, DecodeOptions("fast"))
    assert fast.strategy == "fast" and not any("fast path" in n for n in fast.notes)
    assert fast.token_ids == kv.token_ids
    assert fast.text == kv.text


def test_fast_matches_kv_up_to_a_full_context(engine, monkeypatch):
    # no end-of-sequence token, so both strategies must run until the context is full
    monkeypatch.setattr(engine.target.model.generation_config, "eos_token_id", None)
    prompt = engine.target.tokenizer("lazy dog " * 20)["input_ids"]
    s = SamplingSettings(max_new_tokens=400, temperature=0)
    kv, fast = (
        engine.run(GenerationRequest(input_ids=prompt, sampling=s, options=DecodeOptions(o), context=300), DirectSink())
        for o in ("kv", "fast")
    )
    assert fast.token_ids == kv.token_ids
    assert fast.prompt_tokens + fast.new_tokens == 300  # filled the context exactly
    assert fast.finish_reason == "length"


@pytest.mark.parametrize("device", DEVICES)
def test_fast_cache_grows_between_turns(tiny_model_dir, device):
    engine = Engine(device=device)
    engine.load(str(tiny_model_dir), PrecisionSpec("fp32"))
    short = engine.chat([{"role": "user", "content": "hi"}], GREEDY, DecodeOptions("fast"))
    dec = engine.target.fast_decoder
    before = dec.max_context
    msgs = [{"role": "user", "content": "quick brown fox " * 100}]
    long_fast = engine.chat(msgs, GREEDY, DecodeOptions("fast"))
    assert dec.max_context > before
    assert long_fast.token_ids == engine.chat(msgs, GREEDY, DecodeOptions("kv")).token_ids
    assert short.new_tokens == 20


def test_fast_after_cancel_and_reuse(engine):
    msgs = [{"role": "user", "content": "The quick brown fox"}]
    seen = 0
    stop = threading.Event()

    def on_event(ev):
        nonlocal seen
        if isinstance(ev, TokenEvent):
            seen += 1
            if seen == 4:
                stop.set()

    cancelled = engine.chat(
        msgs,
        SamplingSettings(max_new_tokens=50, temperature=0),
        DecodeOptions("fast"),
        on_event=on_event,
        should_cancel=stop.is_set,
    )
    assert cancelled.finish_reason == "cancelled" and 4 <= cancelled.new_tokens < 50
    again = engine.chat(msgs, GREEDY, DecodeOptions("fast"))
    assert again.token_ids == engine.chat(msgs, GREEDY, DecodeOptions("kv")).token_ids
    assert again.token_ids[: cancelled.new_tokens] == cancelled.token_ids


def test_fast_sampling_matches_generate_with_the_same_seed(engine):
    msgs = [{"role": "user", "content": "The quick brown fox"}]
    s = SamplingSettings(max_new_tokens=16, temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1, seed=7)
    assert engine.chat(msgs, s, DecodeOptions("fast")).token_ids == engine.chat(msgs, s, DecodeOptions("kv")).token_ids


def test_other_strategies_still_work_after_fusing(engine):
    msgs = [{"role": "user", "content": "The quick brown fox"}]
    engine.chat(msgs, GREEDY, DecodeOptions("fast"))  # fuses weights in place (views)
    results = {s: engine.chat(msgs, GREEDY, DecodeOptions(s)).token_ids for s in ("naive", "kv", "prompt-lookup")}
    assert len({tuple(v) for v in results.values()}) == 1


@pytest.mark.parametrize("precision,min_cosine", [("q8", 0.995), ("q4", 0.9)])
def test_weight_only_precisions_stay_close_to_bf16(tiny_model_dir, precision, min_cosine):
    """q8/q4 are lossy. Token agreement on a random tiny model says little (one flip changes everything
    after it), so compare next-token logits; the starter's token agreement is reported in the README."""
    ids = torch.tensor([[5, 17, 42, 99, 123, 7, 64]])
    ref = Engine(device="cpu")
    ref.load(str(tiny_model_dir), PrecisionSpec("bf16"))
    base = ref.target.model(ids).logits[0, -1].float()
    eng = Engine(device="cpu")
    loaded = eng.load(str(tiny_model_dir), parse_precision(precision))
    from redline.inference.loading.weight_only import PackedLinear

    assert isinstance(loaded.model.model.layers[0].mlp.up_proj, PackedLinear)
    with torch.inference_mode():
        quant = loaded.model(ids).logits[0, -1].float()
    fast = eng.chat([{"role": "user", "content": "quick brown fox"}], GREEDY, DecodeOptions("fast"))
    assert fast.strategy == "fast" and fast.new_tokens == 20
    cos = torch.nn.functional.cosine_similarity(base, quant, dim=0)
    assert cos >= min_cosine, float(cos)


def test_q8_with_fp32_compute_matches_kv_exactly(tiny_model_dir):
    eng = Engine(device="cpu")
    eng.load(str(tiny_model_dir), parse_precision("q8+compute=fp32"))
    msgs = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog"}]
    assert (
        eng.chat(msgs, GREEDY, DecodeOptions("fast")).token_ids == eng.chat(msgs, GREEDY, DecodeOptions("kv")).token_ids
    )


def test_unsupported_model_falls_back_and_says_so(tiny_model_dir):
    eng = Engine(device="cpu")
    eng.load(str(tiny_model_dir), PrecisionSpec("int8"))
    r = eng.chat([{"role": "user", "content": "hi"}], GREEDY, DecodeOptions("fast"))
    assert r.strategy == "kv" and any("fast path unavailable" in n for n in r.notes)
    assert r.new_tokens == 20


def test_packed_int8_linear_is_close_to_float():
    from redline.inference.loading.weight_only import PackedLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    x = torch.randn(3, 64)
    ref = lin(x)
    for bits, tol in ((8, 0.02), (4, 0.25)):
        src = torch.nn.Linear(64, 48)
        src.load_state_dict(lin.state_dict())
        packed = PackedLinear(src, bits, torch.bfloat16 if bits == 4 else torch.float32)
        err = (packed(x) - ref).abs().max() / ref.abs().max()
        assert err < tol, (bits, float(err))


def test_fast_honours_a_fixed_output_length(engine):
    """The speed lab suppresses end-of-sequence to compare equal work; fast must do as generate() does."""
    # a prompt after which this tiny model ends its reply early, so suppression has something to do
    for words in range(1, 60):
        msgs = [{"role": "user", "content": " ".join(["lazy dog"] * words)}]
        free = engine.chat(msgs, SamplingSettings(max_new_tokens=60, temperature=0), DecodeOptions("fast"))
        if free.finish_reason == "eos":
            break
    else:
        pytest.skip("the tiny model never ended a reply early")
    s = SamplingSettings(max_new_tokens=60, temperature=0, min_new_tokens=60)
    kv = engine.chat(msgs, s, DecodeOptions("kv"))
    fast = engine.chat(msgs, s, DecodeOptions("fast"))
    assert kv.new_tokens == fast.new_tokens == 60
    assert fast.token_ids == kv.token_ids
