"""The KV cache in 8 bits (``--kv q8``, issue 48): the rows' round trip, attention over 8-bit pages against the same
pages in float (torch's path on every device this machine has, the native kernels on the CPU), the decoder end to
end, the disk pages' form, the flag on the command line and the bytes the cost model counts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from redline.app.cli import build_parser
from redline.inference import cost
from redline.inference.decoding import fastpath
from redline.inference.decoding.disk_pages import DiskPages, page_key
from redline.inference.decoding.fastpath import FastDecoder
from redline.inference.decoding.kv_cache import PagedKV
from redline.inference.estimate.estimator import estimate
from redline.inference.estimate.model_shapes import read_shape
from redline.inference.kernels import kv_quant, ops, paged_torch, reference
from redline.inference.precision import PrecisionSpec

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PAGE = 64
needs_native = pytest.mark.usefixtures("native_kernels")


# -- the rows ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [16, 64, 128])
def test_a_row_comes_back_within_half_a_step_of_its_scale(dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, dim, generator=g) * torch.logspace(-3, 2, 50)[:, None, None]  # rows of every size
    x[7, 1] = 0.0  # a row of zeros: scale 0, values 0
    rows = kv_quant.quantize_rows(x)
    assert rows.dtype == torch.int8 and rows.shape == (50, 3, dim + 2)
    scale = kv_quant.scales(rows).float()
    back = kv_quant.dequantize_rows(rows)
    assert torch.equal(back[7, 1], torch.zeros(dim))
    # each value within half a step (plus the fp16 scale's own rounding of max|x| / 127)
    assert ((back - x).abs() <= scale * 0.5 + x.abs() * 2e-3 + 1e-12).all()
    assert (rows[..., :dim] >= -127).all() and (rows[..., :dim] <= 127).all()
    # the largest value of a row takes the full range, so the step is as fine as 8 bits allow
    assert (rows[..., :dim].abs().amax(-1)[x.abs().amax(-1) > 0] >= 126).all()


def test_the_scale_is_stored_in_the_rows_last_two_bytes_as_fp16():
    x = torch.tensor([[1.0, -2.0, 0.5, 127.0 * 3]])
    rows = kv_quant.quantize_rows(x)
    assert rows[0, 3].item() == 127
    assert kv_quant.scales(rows).item() == pytest.approx(3.0)
    assert rows[0, 4:].contiguous().view(torch.float16).item() == 3.0


def test_the_cost_model_counts_the_rows_the_pool_holds():
    kv = PagedKV(layers=3, kv_heads=2, head_dim=64, dtype=torch.bfloat16, device="cpu", form="q8")
    assert kv.k.dtype == torch.int8 and kv.k.shape[-1] == 66
    per_token = cost.kv_cache_bytes(3, 2, 64, 1, 1, 2, form="q8")
    assert kv.bytes_per_token == per_token == 2 * 3 * 2 * 66
    assert kv.page_bytes == per_token * PAGE
    bf16 = PagedKV(layers=3, kv_heads=2, head_dim=64, dtype=torch.bfloat16, device="cpu")
    assert bf16.bytes_per_token == cost.kv_cache_bytes(3, 2, 64, 1, 1, 2)
    assert 0.475 <= per_token / bf16.bytes_per_token <= 0.525  # halved, within 5 %
    with pytest.raises(ValueError, match="bf16 or q8, not 'q4'"):
        PagedKV(layers=1, kv_heads=1, head_dim=8, dtype=torch.float32, device="cpu", form="q4")


# -- attention over 8-bit pages ----------------------------------------------------------------------------------
def pools(device, kv_heads=2, dim=64, pages=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(pages, kv_heads, PAGE, dim, generator=g)
    v = torch.randn(pages, kv_heads, PAGE, dim, generator=g)
    return k.to(device), v.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_heads,heads,dim", [(2, 6, 64), (1, 4, 16), (4, 4, 128)])
def test_torch_attention_over_q8_pages_is_close_to_the_same_pages_in_float(device, kv_heads, heads, dim):
    k, v = pools(device, kv_heads, dim)
    kq, vq = kv_quant.quantize_rows(k), kv_quant.quantize_rows(v)
    tables, lengths = [[3], [0, 7, 2], [9, 7]], [6, 131, 70]
    width = 3
    pages = torch.tensor([t + [t[0]] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
    pos = torch.tensor([n - 1 for n in lengths], device=device)
    q = torch.randn(3, heads, dim, generator=torch.Generator().manual_seed(1)).to(device)
    step = paged_torch.StepPages.build(pages, pos, tables, pos.tolist(), PAGE)
    exact = paged_torch.attend(q, k, v, step, dim**-0.5)
    got = paged_torch.attend(q, kq, vq, step, dim**-0.5)
    assert got.dtype == q.dtype and torch.isfinite(got).all()
    err = (got - exact).abs().max().item()
    assert err < 0.02, err  # 8 bits of each key and value: a few thousandths of attention's output
    # the same numbers as attention over the dequantised pages (nothing but the rows' rounding differs)
    deq = paged_torch.attend(q, kv_quant.dequantize_rows(kq), kv_quant.dequantize_rows(vq), step, dim**-0.5)
    assert torch.allclose(got, deq, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_write_stores_the_quantised_row_at_its_page_and_offset(device):
    k_pool = torch.zeros(5, 2, PAGE, 18, dtype=torch.int8, device=device)
    v_pool = torch.zeros_like(k_pool)
    pages = torch.tensor([[4, 1]], dtype=torch.int32, device=device)
    k, v = torch.randn(1, 2, 16, device=device), torch.randn(1, 2, 16, device=device)
    paged_torch.write(k_pool, v_pool, pages, torch.tensor([70], device=device), k, v)
    assert torch.equal(k_pool[1, :, 6], kv_quant.quantize_rows(k[0]))
    assert torch.equal(v_pool[1, :, 6], kv_quant.quantize_rows(v[0]))
    assert int((k_pool != 0).sum()) == int((kv_quant.quantize_rows(k[0]) != 0).sum())  # nowhere else


def test_static_attention_refuses_q8_pages_with_the_reason():
    k, v = pools("cpu", 2, 16)
    pages = torch.tensor([[0]], dtype=torch.int32)
    with pytest.raises(ValueError, match="8-bit KV cache is read by the eager step"):
        paged_torch.attend_static(
            torch.randn(1, 4, 16), kv_quant.quantize_rows(k), kv_quant.quantize_rows(v), pages, torch.tensor([3]), 0.25
        )


@needs_native
@pytest.mark.parametrize("dim", [64, 16])  # 64: the grouped kernels (and AVX-512's wide ones); 16: head by head
def test_native_attention_over_q8_pages_matches_the_reference(dim):
    """The kernel writes the rows torch would write (within one step where rotary's rounding differs) and returns
    close to the attention torch computes over them; both close to the float cache's."""
    torch.manual_seed(4)
    heads, kv_heads, page = 9, 3, 16
    k_pool = torch.zeros(80, kv_heads, page, dim + 2, dtype=torch.int8)
    v_pool = torch.zeros_like(k_pool)
    k_ref, v_ref = k_pool.clone(), v_pool.clone()
    k_f, v_f = torch.zeros(80, kv_heads, page, dim), torch.zeros(80, kv_heads, page, dim)
    cos, sin = torch.randn(1100, dim), torch.randn(1100, dim)
    pages = torch.randperm(80).int().view(2, 40)  # each sequence its own pages, out of order
    for t in list(range(30)) + list(range(30, 600, 7)):  # past 512 positions: the kernels split the keys in parts
        qkv = torch.randn(2, (heads + 2 * kv_heads) * dim)
        pos = torch.tensor([t, t + 3])
        got = ops.attend(qkv, cos, sin, k_pool, v_pool, pages, pos, heads, kv_heads, dim**-0.5)
        want = reference.attend(qkv, cos, sin, k_ref, v_ref, pages, pos, heads, kv_heads, dim**-0.5)
        exact = reference.attend(qkv, cos, sin, k_f, v_f, pages, pos, heads, kv_heads, dim**-0.5)
        # the kernel also quantises the query heads (integer dot products for the scores, paged_attention.h
        # q8_scores); the reference keeps them in fp32: a few hundredths apart at most with these random rotary
        # tables (a kernel that dropped a scale would be off by the scale itself)
        assert ((got - want).abs().max() / want.abs().max()).item() < 0.05
        # against the float cache: 8 bits of rows rotated by random tables (larger than rotary's), 16 values a row
        assert ((got - exact).abs().max() / exact.abs().max()).item() < 0.1
    step = kv_quant.scales(k_ref).float().abs() + 1e-12
    assert ((kv_quant.dequantize_rows(k_pool) - kv_quant.dequantize_rows(k_ref)).abs() <= 1.01 * step).all()
    assert float((k_pool != k_ref).float().mean()) < 0.01  # almost every byte the same
    assert torch.equal(v_pool, v_ref)  # values are not rotated: the same fp32 in, the same bytes out


# -- the decoder, end to end -----------------------------------------------------------------------------------
def decoders(folder, device, monkeypatch, native: bool):
    if not native:
        monkeypatch.setattr(fastpath, "native", lambda: None)  # torch's operators and paged_torch on the CPU
    made = []
    for kv in ("bf16", "q8"):
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).to(device).eval()
        made.append(FastDecoder(model, 256, kv=kv))
    return made


def run(dec, prompt, steps, device):
    logits = [dec.prefill(torch.tensor(prompt, device=device), 0, seq=0)]
    tokens = list(prompt)
    for _ in range(steps):
        tokens.append(int(logits[-1].argmax()))
        logits.append(dec.step(torch.tensor([tokens[-1]], device=device), [len(tokens) - 1], [0])[0])
    return torch.stack(logits).float().cpu(), tokens


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("native", [True, False])
def test_the_decoder_with_q8_kv_stays_close_to_its_float_cache(tiny_model_dir, device, native, monkeypatch):
    if native and device != "cpu":
        pytest.skip("the native kernels are the CPU's")
    bf, q8 = decoders(tiny_model_dir, device, monkeypatch, native)
    assert q8.kv.k.dtype == torch.int8 and bf.kv.k.dtype != torch.int8
    assert bool(q8.whole_step) == bool(bf.whole_step)  # the 8-bit cache takes the same kernels
    prompt = [(i * 37) % 390 + 3 for i in range(150)]  # three pages, the last partial
    a, tokens = run(bf, prompt, 30, device)
    b, _ = run(q8, tokens[: len(prompt)], 30, device)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    assert cos.min().item() > 0.99, cos.min().item()
    assert not torch.equal(a, b)  # the cache really is another form


# -- pages on disk ---------------------------------------------------------------------------------------------
def test_a_disk_page_says_its_form_and_one_of_another_form_is_ignored(tmp_path):
    ns = b"\x01" * 16
    store = DiskPages(tmp_path, ns)
    tokens = list(range(PAGE))
    key = page_key(ns, tokens)
    k = kv_quant.quantize_rows(torch.randn(2, 2, PAGE, 16))
    v = kv_quant.quantize_rows(torch.randn(2, 2, PAGE, 16))
    store.save(key, ns, tokens, k, v)
    store.flush()
    assert b'"form":"q8"' in store.path(key).read_bytes()[:4096]
    # asked for as a bf16 page of the same bytes' size ([.., 9] bf16 = [.., 18] int8), it is refused by its form
    assert store.load(key, ns, tokens, torch.bfloat16, (2, 2, PAGE, 9)) is None
    assert "KV form q8, the cache holds bfloat16" in store.last_error
    assert not store.path(key).exists()
    store.save(key, ns, tokens, k, v)
    store.flush()
    loaded = store.load(key, ns, tokens, torch.int8, (2, 2, PAGE, 18))
    assert loaded is not None and torch.equal(loaded[0], k) and torch.equal(loaded[1], v)


def test_q8_pages_go_to_disk_and_come_back_into_a_fresh_pool(tmp_path):
    def pool():
        kv = PagedKV(layers=2, kv_heads=2, head_dim=16, dtype=torch.float32, device="cpu", form="q8")
        kv.set_cache(b"ns", 8)
        kv.disk = DiskPages(tmp_path, b"ns")
        return kv

    first = pool()
    tokens = list(range(2 * PAGE + 5))
    first.reserve(0, len(tokens))
    for layer in range(2):
        first.write(layer, 0, 0, torch.randn(len(tokens), 2, 16), torch.randn(len(tokens), 2, 16))
    want = [first.read(layer, 0, 2 * PAGE) for layer in range(2)]
    first.release(0, tokens)
    assert first.persist() == 2
    second = pool()
    assert second.attach(1, tokens) == 2 * PAGE and second.disk_hits == 2
    for layer in range(2):
        got = second.read(layer, 1, 2 * PAGE)
        assert torch.equal(got[0], want[layer][0]) and torch.equal(got[1], want[layer][1])


# -- the setting -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["chat", "serve", "bench"])
def test_the_kv_flag_is_read_by_chat_serve_and_bench(command, capsys):
    parser = build_parser()
    assert parser.parse_args([command]).kv == "bf16"
    assert parser.parse_args([command, "--kv", "q8"]).kv == "q8"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([command, "--kv", "q4"])
    assert exc.value.code == 2
    assert "invalid choice: 'q4'" in capsys.readouterr().err


def test_the_estimator_counts_q8_kv_at_half_the_bytes(tiny_model_dir):
    # the tiny model's shape with heads of 64 (the starter's; the 1B-shaped model's are 64 too): D + 2 bytes a row
    # against 2·D is within 5 % of half from D = 40 on (the tiny model's own 16 would be 0.5625)
    shape = dataclasses.replace(read_shape(str(tiny_model_dir)), head_dim=64)
    spec = PrecisionSpec("bf16")
    bf16 = estimate(shape, spec, 4096)
    q8 = estimate(shape, spec, 4096, kv="q8")
    ratio = q8.kv_cache_bytes / bf16.kv_cache_bytes
    assert 0.475 <= ratio <= 0.525, ratio
    assert q8.kv_cache_bytes == cost.kv_cache_bytes(shape.layers, shape.kv_heads, shape.head_dim, 4096, 1, 2, form="q8")
    assert q8.total_bytes < bf16.total_bytes
    fast = cost.kv_read_bytes(shape, spec, "cpu", "fast", 4000, kv="q8")
    assert fast == cost.kv_cache_bytes(shape.layers, shape.kv_heads, shape.head_dim, 4000, 1, 2, form="q8")
    # only the fast path keeps 8-bit rows: transformers' cache stays in its dtype
    assert cost.kv_read_bytes(shape, spec, "cpu", "kv", 4000, kv="q8") == cost.kv_read_bytes(
        shape, spec, "cpu", "kv", 4000
    )


def test_the_settings_keep_the_kv_form_and_a_change_reloads():
    from redline.app.settings import Settings

    base = Settings()
    assert base.kv_cache == "bf16"
    q8 = dataclasses.replace(base, kv_cache="q8")
    q8.validate()
    assert base.needs_reload(q8)
    with pytest.raises(ValueError, match="kv_cache must be one of bf16, q8, not 'q4'"):
        dataclasses.replace(base, kv_cache="q4").validate()


def test_the_settings_panel_offers_the_kv_form(qtbot):
    from redline.app.settings import Settings
    from redline.ui.settings_panel import SettingsPanel

    panel = SettingsPanel(dataclasses.replace(Settings(), kv_cache="q8"))
    qtbot.addWidget(panel)
    assert panel.values()["kv_cache"] == "q8"
    panel.kv_cache.setCurrentIndex(panel.kv_cache.findData("bf16"))
    assert panel.candidate().kv_cache == "bf16"
    assert "reloaded" in panel.reload_note.text()


def test_the_kv_form_job_reaches_the_next_loads_decoder(tiny_model_dir):
    from redline.inference import DecodeOptions, Engine, SamplingSettings, kv_form_job

    engine = Engine("cpu")
    assert kv_form_job("q8")(engine, None) == "q8"
    engine.load(str(tiny_model_dir), PrecisionSpec("fp32"))
    reply = engine.chat(
        [{"role": "user", "content": "hi"}], SamplingSettings(max_new_tokens=5, temperature=0), DecodeOptions("fast")
    )
    assert reply.strategy == "fast" and reply.new_tokens == 5
    assert engine.target.fast_decoder.kv.form == "q8" and engine.target.fast_decoder.kv.k.dtype == torch.int8
    with pytest.raises(ValueError, match="bf16 or q8, not 'fp8'"):
        kv_form_job("fp8")
