"""Redline's native CPU kernels against the same computations written with torch operators."""

import pytest
import torch

from redline.inference.kernels import block_quant, ops, reference
from redline.inference.kernels.cpu import library as native

# Skipped only where the kernels cannot be built (another CPU, no compiler); a failed build on a machine that can
# build them fails every one of these tests (conftest.native_kernels).
needs_native = pytest.mark.usefixtures("native_kernels")


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@needs_native
@pytest.mark.parametrize("rows", [1, 3, 5, 40])
@pytest.mark.parametrize("shape", [(960, 576), (17, 64), (33, 96), (17, 40)])  # 40: not sixteen at a time
def test_bf16_product_matches_fp32(rows, shape):
    torch.manual_seed(0)
    w = (torch.randn(*shape) * 0.05).bfloat16()
    x = torch.randn(rows, shape[1])
    assert rel_error(ops.linear(x, w), x @ w.float().T) < 1e-5
    assert rel_error(ops.bind_linear(w)(x), x @ w.float().T) < 1e-5


@needs_native
@pytest.mark.parametrize("K", [576, 40])  # sixteen weights a load, and eight
def test_a_bf16_row_gives_the_same_numbers_alone_and_in_a_batch(K):
    """Batches of every size take other register tiles; each row's sum runs in the same order in all of them."""
    torch.manual_seed(0)
    w = (torch.randn(962, K) * 0.05).bfloat16()  # 962: a remainder past the groups of four rows
    x = torch.randn(9, K)
    linear = ops.bind_linear(w)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(9)])
    for rows in range(2, 10):
        assert torch.equal(linear(x[:rows]), alone[:rows]), rows


@needs_native
@pytest.mark.parametrize("K", [2048, 2056])  # sixteen weights a load, and eight
def test_a_long_bf16_prompt_read_in_cache_blocks_gives_each_rows_numbers(K):
    """A prompt of 100 rows this wide is read in blocks (simd.h, dense_span: 48 activation rows against 64 weight
    rows at a time at K = 2048), tails of both included; each output is still one row's sum, bit for bit."""
    torch.manual_seed(0)
    w = (torch.randn(962, K) * 0.05).bfloat16()
    x = torch.randn(100, K)
    linear = ops.bind_linear(w)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(100)])
    assert torch.equal(linear(x), alone)
    assert rel_error(alone, x @ w.float().T) < 1e-5


@needs_native
@pytest.mark.parametrize("kind", ["q8", "q4", "q4-symmetric"])
def test_a_block_row_gives_the_same_numbers_alone_and_in_a_batch(kind):
    """Batches of up to eight in tiles of up to four, prompts in tiles of sixteen: the same sums as alone."""
    torch.manual_seed(2)
    w = torch.randn(962, 576) * 0.05
    blocks = block_quant.quantize_q8(w) if kind == "q8" else block_quant.quantize_q4(w, kind == "q4-symmetric")
    linear = ops.bind_blocks(blocks)
    x = torch.randn(20, 576)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(20)])
    for rows in (*range(2, 10), 20):
        assert torch.equal(linear(x[:rows]), alone[:rows]), rows


@needs_native
@pytest.mark.parametrize("rows", [1, 2, 7])
@pytest.mark.parametrize("kind", ["q8", "q4", "q4-symmetric"])
@pytest.mark.parametrize("shape", [(960, 576), (13, 64), (576, 1536)])
def test_block_products_match_their_dequantised_weights(rows, kind, shape):
    """The kernels quantise activations to int8 per block (as llama.cpp does): within 2 % of the exact product
    with the de-quantised weights, and the same for the one-shot and the bound operator."""
    torch.manual_seed(1)
    w = torch.randn(*shape) * 0.05
    blocks = block_quant.quantize_q8(w) if kind == "q8" else block_quant.quantize_q4(w, kind == "q4-symmetric")
    x = torch.randn(rows, shape[1])
    exact = x @ block_quant.dequantize(blocks).T
    assert rel_error(ops.linear_blocks(x, blocks), exact) < 0.02
    assert torch.equal(ops.bind_blocks(blocks)(x), ops.linear_blocks(x, blocks))


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_quantisers_give_the_reference_blocks_bit_for_bit(dtype):
    torch.manual_seed(2)
    w = (torch.randn(64, 576) * 0.05).to(dtype)
    w[0, :32] = 0  # an all-zero block
    w[1, 5] = w[1, 7] = -w[1].abs().max() * 2  # two values of the largest magnitude
    for bits, sym in ((8, False), (4, False), (4, True)):
        a = ops.quantize_blocks(w, bits, sym)
        b = block_quant.quantize_q8(w) if bits == 8 else block_quant.quantize_q4(w, sym)
        assert torch.equal(a.qweight, b.qweight) and torch.equal(a.scales, b.scales)
        assert (a.mins is None and b.mins is None) or torch.equal(a.mins, b.mins)


@needs_native
def test_norm_and_gated_activation_match():
    torch.manual_seed(3)
    x, w = torch.randn(3, 576), torch.rand(576)
    assert rel_error(ops.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5)) < 1e-6
    gate_up = torch.randn(2, 2 * 1536)
    assert rel_error(ops.silu_mul(gate_up), reference.silu_mul(gate_up)) < 1e-6


@needs_native
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_matches_the_reference(cache_dtype):
    """Two sequences at different positions, grouped-query heads, pages out of order: the native step writes
    the same cache and returns the same attention as the torch version."""
    torch.manual_seed(4)
    heads, kv_heads, dim, page = 9, 3, 64, 16
    k_pool = torch.zeros(40, kv_heads, page, dim, dtype=cache_dtype)
    v_pool = torch.zeros_like(k_pool)
    k_ref, v_ref = k_pool.clone(), v_pool.clone()
    cos, sin = torch.randn(256, dim), torch.randn(256, dim)
    pages = torch.randperm(40)[:32].int().view(2, 16)
    for t in range(40):
        qkv = torch.randn(2, (heads + 2 * kv_heads) * dim)
        pos = torch.tensor([t, t + 3])
        got = ops.attend(qkv, cos, sin, k_pool, v_pool, pages, pos, heads, kv_heads, dim**-0.5)
        want = reference.attend(qkv, cos, sin, k_ref, v_ref, pages, pos, heads, kv_heads, dim**-0.5)
    assert rel_error(got, want) < 1e-5
    assert torch.equal(k_pool, k_ref) and torch.equal(v_pool, v_ref)


def test_static_attention_agrees_with_the_paged_reference():
    """The CUDA-graph-friendly step (one page per sequence, masked) computes what the paged reference does."""
    torch.manual_seed(5)
    heads, kv_heads, dim, length = 4, 2, 16, 64
    cos, sin = torch.randn(length, dim), torch.randn(length, dim)
    static_k = torch.zeros(1, kv_heads, length, dim)
    static_v = torch.zeros_like(static_k)
    paged_k, paged_v = static_k.clone(), static_v.clone()
    pages = torch.zeros(1, 1, dtype=torch.int32)
    for t in range(20):
        qkv = torch.randn(1, (heads + 2 * kv_heads) * dim)
        pos = torch.tensor([t])
        a = reference.attend_static(qkv, cos, sin, static_k, static_v, pos, heads, kv_heads, dim**-0.5)
        b = reference.attend(qkv, cos, sin, paged_k, paged_v, pages, pos, heads, kv_heads, dim**-0.5)
    assert rel_error(a, b) < 1e-5


def test_reference_products_without_native_kernels():
    torch.manual_seed(6)
    w = torch.randn(8, 64)
    blocks = block_quant.quantize_q8(w)
    x = torch.randn(2, 64)
    assert rel_error(reference.linear_blocks(x, blocks), x @ block_quant.dequantize(blocks).T) < 1e-6


def test_kernels_turned_off_say_so(monkeypatch):
    """REDLINE_NATIVE_KERNELS=0 is honoured and the reason is reported, not hidden."""
    monkeypatch.setenv("REDLINE_NATIVE_KERNELS", "0")
    assert "REDLINE_NATIVE_KERNELS=0" in native.why_not_here()
    assert not native.buildable_here()


def test_the_kernels_build_where_they_can():
    """On a CPU the kernels are built for, with a shipped library or a C++ compiler, they must load (torch 2.14's
    headers needing C++20 once broke a build that silently left every user on the slow path; the library now uses
    no torch header at all)."""
    if not native.buildable_here():
        pytest.skip(f"this machine cannot build the kernels: {native.will_run()}")
    assert native.native() is not None, native.status()["reason"]
    assert native.will_run() is None
