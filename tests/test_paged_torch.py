"""torch's paged decode attention (inference/kernels/paged_torch.py), what a GPU and a CPU without the native kernels
run over the native kernel's pages: against dense attention, reading only the pages in use, and the decoder's
portable step against the native one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from redline.inference.kernels import paged_torch

PAGE = 64
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # the dense check itself


def dense(q, k_pool, v_pool, tables, lengths, scale):
    """Each sequence's keys laid end to end, every query head against its KV head's copy (repeat_interleave)."""
    B, H, D = q.shape
    rep = H // k_pool.shape[1]
    out = []
    for b in range(B):
        idx = torch.tensor(tables[b])
        keys = k_pool[idx].transpose(0, 1).reshape(k_pool.shape[1], -1, D)[:, : lengths[b]].float()
        values = v_pool[idx].transpose(0, 1).reshape(k_pool.shape[1], -1, D)[:, : lengths[b]].float()
        keys, values = keys.repeat_interleave(rep, 0), values.repeat_interleave(rep, 0)
        out.append(F.scaled_dot_product_attention(q[b].float()[:, None], keys, values, scale=scale)[:, 0])
    return torch.stack(out)


def batch(dtype, kv_heads=2, heads=6, dim=16, pages=12, nan_outside=False):
    g = torch.Generator().manual_seed(0)
    k_pool = torch.randn(pages, kv_heads, PAGE, dim, generator=g).to(dtype)
    v_pool = torch.randn(pages, kv_heads, PAGE, dim, generator=g).to(dtype)
    # three sequences: one page; three pages out of order; two pages, one of them shared with the second
    tables = [[3], [0, 7, 2], [9, 7]]
    lengths = [6, 131, 70]
    if nan_outside:  # whatever no sequence uses is NaN: a read of it would show
        used = torch.zeros(pages, PAGE, dtype=torch.bool)
        for t, n in zip(tables, lengths):
            for i, p in enumerate(t):
                used[p, : max(0, min(PAGE, n - i * PAGE))] = True
        k_pool[~used[:, None].expand(-1, kv_heads, -1)] = float("nan")
        v_pool[~used[:, None].expand(-1, kv_heads, -1)] = float("nan")
    q = torch.randn(len(tables), heads, dim, generator=g).to(dtype)
    width = max(map(len, tables))
    pages_t = torch.tensor([t + [t[0]] * (width - len(t)) for t in tables], dtype=torch.int32)
    pos = torch.tensor([n - 1 for n in lengths])
    return q, k_pool, v_pool, tables, lengths, pages_t, pos


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_attention_matches_dense_and_reads_only_the_pages_in_use(dtype):
    q, k_pool, v_pool, tables, lengths, pages, pos = batch(dtype, nan_outside=True)
    step = paged_torch.StepPages.build(pages, pos, tables, pos.tolist(), PAGE)
    assert [type(u) for u in step.used] == [int, list, list]  # a CPU copies pages by the host's numbers
    # the GPU's gather (an index tensor of the pages in use), run here on the same pages
    on_device = paged_torch.StepPages(pages, pos, lengths, [3, pages[1, :3], pages[2, :2]])
    ref = dense(q, k_pool, v_pool, tables, lengths, 0.25)
    for s in (step, on_device):
        out = paged_torch.attend(q, k_pool, v_pool, s, 0.25)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert torch.allclose(out.float(), ref, atol=1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("kv_heads,heads", [(2, 6), (1, 4), (4, 4)])
def test_static_attention_matches_dense(kv_heads, heads):
    q, k_pool, v_pool, tables, lengths, pages, pos = batch(torch.float32, kv_heads, heads)
    out = paged_torch.attend_static(q, k_pool, v_pool, pages, pos, 0.25)
    assert torch.allclose(out, dense(q, k_pool, v_pool, tables, lengths, 0.25), atol=1e-5)


def test_static_attention_refuses_a_cache_of_another_dtype():
    q, k_pool, v_pool, _, _, pages, pos = batch(torch.float32)
    with pytest.raises(ValueError, match="must match"):
        paged_torch.attend_static(q.bfloat16(), k_pool, v_pool, pages, pos, 0.25)


def test_write_puts_each_rows_key_at_its_page_and_offset():
    k_pool, v_pool = torch.zeros(5, 2, PAGE, 4), torch.zeros(5, 2, PAGE, 4)
    pages = torch.tensor([[4, 1], [2, 2]], dtype=torch.int32)
    pos = torch.tensor([70, 3])
    k = torch.arange(16.0).reshape(2, 2, 4)
    paged_torch.write(k_pool, v_pool, pages, pos, k, -k)
    assert torch.equal(k_pool[1, :, 6], k[0]) and torch.equal(v_pool[2, :, 3], -k[1])
    assert k_pool.count_nonzero() == k.count_nonzero()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from conftest import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("paged") / "tiny", max_positions=4096)


def decoder(folder, monkeypatch, native: bool):
    from redline.inference.decoding.fastpath import FastDecoder
    from redline.inference.engine import Engine
    from redline.inference.kernels.cpu import library as native_mod
    from redline.inference.precision import parse_precision

    if not native:
        monkeypatch.setenv("REDLINE_NATIVE_KERNELS", "0")
        monkeypatch.setattr(native_mod, "_state", {"loaded": False, "reason": "not loaded yet"})
    engine = Engine("cpu")
    engine.record_memory = False
    engine.load(str(folder), parse_precision("fp32"))
    dec = FastDecoder(engine.target.model, 256)
    assert dec.native == native
    return dec


def greedy_batch(dec, prompts, steps=12):
    out = {s: [int(dec.prefill(torch.tensor(p), 0, s).argmax())] for s, p in enumerate(prompts)}
    pos = {s: len(p) for s, p in enumerate(prompts)}
    for _ in range(steps):
        seqs = list(out)
        logits = dec.step(torch.tensor([out[s][-1] for s in seqs]), [pos[s] for s in seqs], seqs)
        for i, s in enumerate(seqs):
            out[s].append(int(logits[i].argmax()))
            pos[s] += 1
    return out


PROMPTS = [[1, 2, 3, 4, 5], list(range(10, 150)), list(range(200, 330))]


def test_the_portable_step_gives_the_native_steps_tokens_in_fp32(folder, monkeypatch, native_kernels):
    native = greedy_batch(decoder(folder, monkeypatch, True), PROMPTS)
    portable_dec = decoder(folder, monkeypatch, False)
    assert portable_dec.kv.page == PAGE and portable_dec.whole_step_plan is None
    assert greedy_batch(portable_dec, PROMPTS) == native


def test_the_static_step_gives_the_eager_steps_logits(folder, monkeypatch):
    dec = decoder(folder, monkeypatch, False)
    assert dec.kv.cleared  # the static attention loads a last page whole, behind a mask: never garbage there
    for s, p in enumerate(PROMPTS):
        dec.prefill(torch.tensor(p), 0, s)
    seqs, positions = [0, 1, 2], [len(p) for p in PROMPTS]
    for s, n in zip(seqs, positions):
        dec.kv.reserve(s, n + 1)
    tokens = torch.tensor([7, 8, 9])
    pos = torch.tensor(positions)
    pages = dec.kv.table(seqs)
    step = paged_torch.StepPages.build(pages, pos, [dec.kv.tables[s] for s in seqs], positions, PAGE)
    with torch.inference_mode():
        eager = dec.decode_graph(tokens, pos, pages, dec.kv.k, dec.kv.v, dec.cos, dec.sin, step)
        static = dec.decode_graph(tokens, pos, pages, dec.kv.k, dec.kv.v, dec.cos, dec.sin)
    assert torch.allclose(eager, static, atol=1e-4)


def test_two_conversations_taking_turns_both_stay_cached_on_the_portable_path(folder, monkeypatch):
    """The GPU's branch (the native kernels off) keeps many conversations' pages, as the CPU kernels' branch does:
    with one slot per sequence, the prefix cache kept one idle slot, and each turn re-read its whole history once
    the other conversation had run."""
    from test_prefix_cache import SYSTEM, ask, user

    from redline.inference import Engine, EngineService
    from redline.inference.kernels.cpu import library as native_mod
    from redline.inference.precision import parse_precision

    monkeypatch.setenv("REDLINE_NATIVE_KERNELS", "0")
    monkeypatch.setattr(native_mod, "_state", {"loaded": False, "reason": "not loaded yet"})
    svc = EngineService(lambda: Engine("cpu"))
    try:
        svc.load(str(folder), parse_precision("fp32")).result(120)
        other = {"role": "system", "content": "Another persona entirely, with its own long instructions. " * 10}
        a, b, before = [SYSTEM, user(1)], [other, user(2)], None
        for turn in range(3):
            ra, rb = ask(svc, a, new=8), ask(svc, b, new=8)
            if before:  # each turn takes the pages of the last one's prompt (the reply's text may tokenize anew)
                assert ra.cached_tokens >= before[0] // PAGE * PAGE - PAGE > 0
                assert rb.cached_tokens >= before[1] // PAGE * PAGE - PAGE > 0
            before = ra.prompt_tokens, rb.prompt_tokens
            a = a + [{"role": "assistant", "content": ra.text}, user(10 + turn)]
            b = b + [{"role": "assistant", "content": rb.text}, user(20 + turn)]
    finally:
        svc.shutdown()
