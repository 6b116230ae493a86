"""The whole decode step in one native call (``redline::decode_step``) against the operator-by-operator step."""

import pytest
import torch

from redline.inference.decoding import fastpath
from redline.inference.decoding.fastpath import FastDecoder
from redline.inference.kernels.cpu import library as native
from redline.inference.loading.weight_only import quantize_model

needs_native = pytest.mark.usefixtures("native_kernels")  # conftest: a failed build where one is possible fails
PRECISIONS = ["fp32", "bf16", "q8", "q4"]


def tiny(kind: str, precision: str):
    """A random two-layer model: Llama, Qwen2 (q/k/v biases) or Qwen3 (per-head q/k norms)."""
    import transformers

    torch.manual_seed(0)
    shape = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **shape))
    for p in model.parameters():  # biases and norms away from their initial zeros and ones
        p.data.add_(torch.randn_like(p) * 0.02)
    model.eval()
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    elif precision in ("q8", "q4"):
        model = model.to(torch.bfloat16)
        quantize_model(model, 8 if precision == "q8" else 4, torch.bfloat16)
    return model


PROMPTS = [7, 70, 3, 20, 41]  # the second crosses a 64-token page


def run(dec: FastDecoder, whole_prefill: bool, whole_steps: bool, steps: int = 12, seqs=(0, 1, 2)):
    """Prefill the prompts, then decode them together; each decode step's logits [B, vocab]."""
    dec.release()
    g = torch.Generator().manual_seed(1)
    dec.whole_step = dec.whole_prefill = whole_prefill
    prompts = {s: torch.randint(0, 300, (n,), generator=g) for s, n in enumerate(PROMPTS)}
    for s in seqs:
        dec.prefill(prompts[s], 0, seq=s)
    dec.whole_step = whole_steps
    pos = [PROMPTS[s] for s in seqs]
    tokens = torch.tensor([5 + s for s in seqs])
    out = []
    for _ in range(steps):
        logits = dec.step(tokens, pos, list(seqs))
        out.append(logits)
        tokens, pos = logits.argmax(-1), [p + 1 for p in pos]
    return torch.stack(out)


@needs_native
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_whole_step_computes_what_the_operators_compute(kind, precision):
    dec = FastDecoder(tiny(kind, precision), 256)
    assert dec.whole_step_plan is not None, dec.whole_step_reason
    per_op = run(dec, whole_prefill=False, whole_steps=False)
    whole = run(dec, whole_prefill=False, whole_steps=True)
    if precision == "fp32":  # the operators' fp32 products are torch's BLAS, summed in another order
        torch.testing.assert_close(whole, per_op, rtol=1e-4, atol=1e-4)
    else:  # the same row kernels, norms and attention: bit for bit
        assert torch.equal(whole, per_op)


@needs_native
@pytest.mark.parametrize("precision", PRECISIONS)
def test_short_prefill_in_one_call_matches_the_operators(precision):
    dec = FastDecoder(tiny("qwen3", precision), 256)
    per_op = run(dec, whole_prefill=False, whole_steps=True, steps=3)
    whole = run(dec, whole_prefill=True, whole_steps=True, steps=3)
    torch.testing.assert_close(whole, per_op, rtol=2e-2, atol=2e-2)  # bf16 caches round differently
    assert torch.equal(whole.argmax(-1), per_op.argmax(-1))


@needs_native
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("seqs", [(0, 1), (0, 1, 2), (0, 1, 2, 3, 4)])  # each batch size takes other tiles
def test_a_sequence_decodes_the_same_alone_and_in_a_batch(precision, seqs):
    dec = FastDecoder(tiny("llama", precision), 256)
    batch = run(dec, whole_prefill=True, whole_steps=True, seqs=seqs)
    alone = run(dec, whole_prefill=True, whole_steps=True, seqs=(1,))
    assert torch.equal(batch[:, 1], alone[:, 0])


@needs_native
def test_bad_inputs_are_refused_with_the_reason():
    dec = FastDecoder(tiny("llama", "q4"), 256)
    dec.kv.reserve(0, 10)
    x = dec._embed(torch.tensor([3]))
    pages = dec.kv.table([0])
    with pytest.raises(RuntimeError, match="not in the pool"):
        dec._whole_step(x, pages + 1000, torch.tensor([4]), dec.kv.k, dec.kv.v, dec.cos, dec.sin, 1)
    with pytest.raises(RuntimeError, match="outside the rotary table"):
        dec._whole_step(x, pages, torch.tensor([100_000]), dec.kv.k, dec.kv.v, dec.cos, dec.sin, 1)
    tensors, head, eps = dec.whole_step_plan
    with pytest.raises(RuntimeError, match="eps values"):
        torch.ops.redline.step_plan(tensors, head, eps[:-1], dec.n_heads, dec.n_kv, dec.head_dim)
    torch.ops.redline.drop_plan(dec.whole_step_id)
    with pytest.raises(RuntimeError, match="no step plan"):
        dec._whole_step(x, pages, torch.tensor([4]), dec.kv.k, dec.kv.v, dec.cos, dec.sin, 1)


def test_the_step_says_why_it_runs_operator_by_operator(monkeypatch):
    monkeypatch.setenv("REDLINE_WHOLE_STEP", "0")
    dec = FastDecoder(tiny("llama", "bf16"), 256)
    assert dec.whole_step_plan is None and not dec.whole_step
    if native.native() is not None:
        assert "REDLINE_WHOLE_STEP=0" in dec.whole_step_reason
    else:
        assert "native kernels" in dec.whole_step_reason
    logits = dec.step(torch.tensor([1]), [0], [0])  # and the operator-by-operator step still runs
    assert logits.shape == (1, 300) and fastpath.supports(dec.model) is None


@needs_native
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_long_contexts_split_the_keys_and_merge_to_the_same_attention(precision):
    """Past 512 positions the step splits each head's keys over the threads and merges the parts (as
    flash-decoding does): the same result as one pass (the operator step), and still the same for a sequence
    alone or beside a short one."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # head size 64, two query heads per KV head: the split kernel's shapes
        max_position_embeddings=2048,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    dec = FastDecoder(model, 1024)
    assert dec.whole_step_plan is not None
    g = torch.Generator().manual_seed(2)
    long_prompt, short_prompt = torch.randint(0, 300, (900,), generator=g), torch.randint(0, 300, (5,), generator=g)

    def decode(whole: bool, with_short: bool):
        dec.release()
        dec.whole_step = False
        dec.prefill(long_prompt, 0, seq=0)
        seqs, pos, tokens = [0], [900], [7]
        if with_short:
            dec.prefill(short_prompt, 0, seq=1)
            seqs, pos, tokens = [0, 1], [900, 5], [7, 8]
        dec.whole_step = whole
        out = []
        tok = torch.tensor(tokens)
        for _ in range(3):
            logits = dec.step(tok, pos, seqs)
            out.append(logits[0])
            tok, pos = logits.argmax(-1), [p + 1 for p in pos]
        return torch.stack(out)

    split, one_pass = decode(True, False), decode(False, False)
    torch.testing.assert_close(split, one_pass, rtol=1e-4, atol=1e-4)
    assert torch.equal(decode(True, True), split)
