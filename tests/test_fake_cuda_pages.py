"""The GPU's paged decode step on a fake CUDA device, in any torch build, the CPU-only one included: the same pages as
the native CPU kernels (``kv_cache.PagedKV``), the prefix cache handing a second sequence the first one's pages, a
batched step of four sequences (three at position 100, one at 4,000) through torch's paged attention, eager and
static (what a CUDA graph holds), and every tensor on the device; a CPU tensor mixed in fails with the operator,
its shape and the line of Redline's that made it (``test_fake_cuda.DeviceCheck``).

A CPU-only torch refuses a fake CUDA tensor wherever a Python binding opens a CUDA device guard before dispatch
(``t[i]``, ``t[a:b] = x``, ``copy_``, ``nn.Module.to``): ``Indexing`` sends those to the aten operators themselves
(what the bindings call on a real GPU), and the model is built on ``meta`` and given empty CUDA tensors. No step of
Redline's is changed for it: the operators that run are the GPU's.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.nn.attention.flex_attention
from test_fake_cuda import Fake, cpu_tensors
from torch.overrides import TorchFunctionMode

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _plan(t: torch.Tensor, index):
    """``t[index]`` as view operators (None, ints, slices, Ellipsis) and the tensor indices left for aten.index."""
    index = index if isinstance(index, tuple) else (index,)
    real = sum(1 for i in index if i is not None and i is not Ellipsis)
    out, dim, tensors = t, 0, {}
    for i in index:
        if i is Ellipsis:
            dim += t.dim() - real
        elif i is None:
            out, dim = out.unsqueeze(dim), dim + 1
        elif isinstance(i, slice):
            if (i.start, i.stop, i.step or 1) != (None, None, 1):
                out = torch.ops.aten.slice.Tensor(out, dim, i.start, i.stop, i.step or 1)
            dim += 1
        elif isinstance(i, int):
            out = out.select(dim, i)  # torch applies an int as a select, before any tensor index
        else:
            tensors[dim] = i if isinstance(i, torch.Tensor) else torch.tensor(i, device=t.device)
            dim += 1
    if not tensors:
        return out, None
    return out, [tensors.get(d) for d in range(max(tensors) + 1)]


class Indexing(TorchFunctionMode):
    """Indexing, index assignment and the bindings that open a CUDA device guard, as aten operators."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__:
            out, index = _plan(*args)
            return out if index is None else torch.ops.aten.index.Tensor(out, index)
        if func is torch.Tensor.__setitem__:
            t, index, value = args
            view, index = _plan(t, index)
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value, dtype=t.dtype, device=t.device)
            if index is None:
                torch.ops.aten.copy_.default(view, value)
            else:
                torch.ops.aten.index_put_(view, index, value)
            return None
        try:
            return func(*args, **kwargs)
        except RuntimeError as exc:
            packet = getattr(torch.ops.aten, getattr(func, "__name__", ""), None)
            if "not linked with support for cuda" not in str(exc) or packet is None:
                raise
            return packet(*args, **kwargs)


def test_indexing_gives_what_pythons_indexing_gives():
    t = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(0))
    i, j = torch.tensor([0, 2]), torch.tensor([1, 3])
    reads = [
        lambda x: x[None],
        lambda x: x[1],
        lambda x: x[1:3],
        lambda x: x[:, 2:4],
        lambda x: x[..., 1:],
        lambda x: x[i],
        lambda x: x[i, :, j],
        lambda x: x[0, :, i],
        lambda x: x[:, None, :, 0],
        lambda x: x[i, j],
        lambda x: x[-1],
        lambda x: x[:, -2:],
    ]
    for read in reads:
        with Indexing():
            got = read(t)
        assert torch.equal(got, read(t))
    writes = [
        lambda x: x.__setitem__((i, slice(None), j), torch.ones(2, 5)),
        lambda x: x.__setitem__((1, slice(2, 4)), 7.0),
        lambda x: x.__setitem__((slice(None), 0, i), torch.ones(4, 2)),
        lambda x: x.__setitem__(0, torch.zeros(5, 6)),
    ]
    for write in writes:
        a, b = t.clone(), t.clone()
        write(a)
        with Indexing():
            write(b)
        assert torch.equal(a, b)


@contextmanager
def flex_on(fake, monkeypatch):
    """Eager FlexAttention under the device check: the operator's own fake rule, after the same check of its
    inputs (block mask and captured tensors included). Run as the operator, not through dynamo, whose own fake
    tensors would meet the CPU-only build's device guard."""
    from torch._higher_order_ops.flex_attention import flex_attention as hop
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_leaves

    monkeypatch.setattr(torch.nn.attention.flex_attention, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    rule = hop.python_key_table[FakeTensorMode]

    def checked(mode, *args, **kwargs):
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        cpu = [t for t in tensors if t.device.type == "cpu" and t.dim() > 0]
        if cpu:
            fake.check.mixed.append(f"flex_attention got a CPU tensor {tuple(cpu[0].shape)}")
            raise AssertionError(fake.check.mixed[-1])
        with Indexing():  # the rule's own copy_ (this runs inside Indexing's handler, where it is off)
            return rule(mode, *args, **kwargs)

    hop.python_key_table[type(fake.check)] = checked
    try:
        yield
    finally:
        hop.python_key_table.pop(type(fake.check), None)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from conftest import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("fake-pages") / "tiny", max_positions=4096)


def model_on_fake_cuda(folder, dtype):
    """The tiny model's shape on the fake device: built on meta, every weight an empty CUDA tensor."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cuda"), False))
        for name, b in list(module.named_buffers(recurse=False)):
            module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="cuda")
    return model.eval()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_batched_step_runs_on_the_gpus_pages(folder, dtype, monkeypatch):
    from redline.inference.decoding.fastpath import FastDecoder
    from redline.inference.decoding.kv_cache import PAGE_TOKENS

    with Fake(monkeypatch) as fake, Indexing(), flex_on(fake, monkeypatch):
        dec = FastDecoder(model_on_fake_cuda(folder, dtype), 64)
        kv = dec.kv
        assert not dec.native and kv.k.device.type == "cuda" and kv.page == PAGE_TOKENS
        assert kv.k.shape[0] == len(dec.layers) and kv.k.shape[2:] == (dec.n_kv, PAGE_TOKENS, dec.head_dim)
        # The prefix cache on the GPU's pages: a second sequence takes the first one's two full pages and a copy
        # of its partial third.
        kv.set_cache(b"model", 16)
        prompt = list(range(1, 2 * PAGE_TOKENS + 9))
        kv.reserve(1, len(prompt))
        dec.prefill(torch.tensor(prompt, device="cuda"), 0, 1)
        kv.release(1, prompt)
        assert kv.attach(2, prompt + [5, 6]) == len(prompt) and kv.tables[2][2] != kv.tables.get(1, [None] * 3)[2]
        dec.prefill(torch.tensor([5, 6], device="cuda"), len(prompt), 2)
        # The batched step: three sequences at position 100 (one of them the cached one), one at 4,000.
        for seq in (3, 4, 5):
            kv.reserve(seq, 4001 if seq == 5 else 101)
        seqs, positions = [2, 3, 4, 5], [100 + 2 * PAGE_TOKENS, 100, 100, 4000]
        reads = fake.check.host_reads
        logits = dec.step(torch.tensor([1, 2, 3, 4], device="cuda"), positions, seqs)
        assert logits.device.type == "cuda" and logits.shape == (4, dec.embed.shape[0])
        assert fake.check.host_reads == reads  # lengths come from the host's page tables: nothing read back
        # The static step (what a compiled graph and a CUDA graph hold) on the same pages.
        with torch.inference_mode():
            pos = torch.tensor(positions, device="cuda")
            static = dec.decode_graph(pos, pos, kv.table(seqs, 64), kv.k, kv.v, dec.cos, dec.sin)
        assert static.device.type == "cuda" and static.shape == logits.shape
        left = cpu_tensors(dec, "dec") + cpu_tensors(kv, "kv")
        assert not left and not fake.check.mixed, (left, fake.check.mixed)


def test_a_cpu_tensor_in_the_batched_step_fails_with_its_line(folder, monkeypatch):
    from redline.inference.decoding.fastpath import FastDecoder

    with Fake(monkeypatch) as fake, Indexing():
        dec = FastDecoder(model_on_fake_cuda(folder, torch.bfloat16), 64)
        for seq in (1, 2):
            dec.kv.reserve(seq, 101)
        dec.cos = torch.zeros(dec.cos.shape, device="cpu")  # a rotary table built on the host
        with pytest.raises(AssertionError, match=r"CPU tensor \(\d+, 16\).*inference/kernels/paged_torch\.py"):
            dec.step(torch.tensor([1, 2], device="cuda"), [100, 100], [1, 2])
        assert fake.check.mixed
