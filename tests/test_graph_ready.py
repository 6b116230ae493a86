"""A static decode step that really replays (inference/decoding/compiled.py), checked on a CPU: what CUDA graphs need
of the graph torch.compile makes, read from the graph itself, and no recompile as a conversation grows.

- **Every mutated input static, the rest small.** torch skips CUDA graphs for a graph that mutates an input whose
  address it cannot take as fixed ("skipping cudagraphs due to mutated inputs"), and a replay copies every
  non-static input into the graph's own buffers. A capture backend (``aot_module_simplified``) reads AOT's
  metadata (``TracingContext.fw_metadata``: ``static_input_indices``, ``input_info[i].mutates_data``) for the
  GPU's branch of the step (the native kernels off: torch's operators, torch's q8/q4 layouts as on CUDA) in bf16,
  q8 and q4 at every batch bucket, the page table padded to the bucket. (The step as compiled before, on scratch
  pools passed as arguments with its weights in closures, mutated two non-static inputs: the KV pools.)
- **No recompile from position 64 to 4,096**: the same graph, ``torch.compiler.set_stance("fail_on_recompile")``,
  with an eager backend, as sequences grow across pages.
"""

from __future__ import annotations

import pytest
import torch

from redline.inference.decoding.compiled import BUCKETS, SCRATCH_SEQ, StaticStep

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
MB = 1 << 20


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from conftest import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("graph") / "tiny", max_positions=4096)


def portable_decoder(folder, precision: str, monkeypatch):
    """The GPU's branch on this CPU: the native kernels off, so the step runs torch's operators over the pages."""
    from redline.inference.decoding.fastpath import FastDecoder
    from redline.inference.engine import Engine
    from redline.inference.kernels.cpu import library as native
    from redline.inference.precision import parse_precision

    monkeypatch.setenv("REDLINE_NATIVE_KERNELS", "0")
    monkeypatch.setattr(native, "_state", {"loaded": False, "reason": "not loaded yet"})
    engine = Engine("cpu")
    engine.record_memory = False
    engine.load(str(folder), parse_precision(precision))
    dec = FastDecoder(engine.target.model, 256)
    assert not dec.native and dec.whole_step_plan is None
    return dec


class Capture:
    """A torch.compile backend that keeps what AOT says of the graph's inputs and runs nothing compiled."""

    def __init__(self):
        self.graphs: list[dict] = []

    def __call__(self, gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._guards import TracingContext

        def forward_compiler(graph, inputs):
            meta = TracingContext.try_get().fw_metadata
            static = set(meta.static_input_indices)
            loose = [t for i, t in enumerate(inputs) if i not in static and isinstance(t, torch.Tensor)]
            self.graphs.append(
                {
                    "mutated": [i for i, info in enumerate(meta.input_info) if info.mutates_data],
                    "static": static,
                    "loose_bytes": sum(t.numel() * t.element_size() for t in loose),
                    "loose": [(tuple(t.shape), t.dtype) for t in loose],
                }
            )
            return graph

        return aot_module_simplified(gm, example_inputs, fw_compiler=forward_compiler)


@pytest.mark.parametrize("precision", ["bf16", "q8", "q4"])
def test_every_mutated_input_is_static_and_the_rest_is_small(folder, precision, monkeypatch):
    dec = portable_decoder(folder, precision, monkeypatch)
    for batch in BUCKETS:
        torch._dynamo.reset()
        capture = Capture()
        tokens = torch.tensor([3] * (batch // 2 + 1))  # fewer rows than the bucket: padded
        for seq in range(1, len(tokens) + 1):
            dec.kv.reserve(seq, 100 * seq)
        with torch.inference_mode():
            step = StaticStep(dec, batch)
            inputs = step.inputs(
                tokens, [100 * s - 1 for s in range(1, len(tokens) + 1)], list(range(1, len(tokens) + 1))
            )
            assert inputs[2].shape == (batch, step.width) and (inputs[2][len(tokens) :] == step.scratch).all()
            torch.compile(step.forward, backend=capture, fullgraph=True, dynamic=False)(*inputs)
        (graph,) = capture.graphs
        assert graph["mutated"], "the step writes the KV pools: AOT must see them mutated"
        assert set(graph["mutated"]) <= graph["static"], (precision, batch, graph)
        assert graph["loose_bytes"] < MB, (precision, batch, graph["loose"])
        assert len(graph["loose"]) == 3  # tokens, positions, the page table: nothing else is copied per replay
        for seq in range(1, len(tokens) + 1):
            dec.kv.release(seq)


def test_no_recompile_from_position_64_to_4096(folder, monkeypatch):
    dec = portable_decoder(folder, "bf16", monkeypatch)
    torch._dynamo.reset()
    seqs = [1, 2]
    for seq in seqs:
        dec.kv.reserve(seq, 4096)  # the pool holds them whole: it does not grow (a grown pool is a new graph)
    with torch.inference_mode():
        step = StaticStep(dec, 2)
        fn = torch.compile(step.forward, backend="eager", fullgraph=True, dynamic=False)
        tokens = torch.tensor([5, 6])
        first = fn(*step.inputs(tokens, [64, 64], seqs))
        assert torch.isfinite(first).all()
        with torch.compiler.set_stance("fail_on_recompile"):
            for pos in (65, 127, 128, 500, 1000, 2047, 2048, 3000, 4095):
                out = fn(*step.inputs(tokens, [pos, pos - 40], seqs))
                assert out.shape == first.shape
    assert step.current() and dec.kv.tables[SCRATCH_SEQ] == [step.scratch]


def test_the_compiled_step_really_runs_and_gives_the_eager_tokens(folder, monkeypatch):
    """Through the decoder's own switch (FastDecoder.step → CompiledStep.run), with an eager backend: the graph's
    guards must hold for a reply's steps (inference tensors), or every step would quietly fall back to eager."""
    from redline.inference.decoding.compiled import CompiledStep

    def greedy(dec, n=12):
        tok = int(dec.prefill(torch.tensor([1, 2, 3, 4, 5]), 0, 7).argmax())
        out = []
        for pos in range(5, 5 + n):
            tok = int(dec.step(torch.tensor([tok]), [pos], [7])[0].argmax())
            out.append(tok)
        dec.kv.release(7)
        return out

    dec = portable_decoder(folder, "fp32", monkeypatch)
    torch._dynamo.reset()
    eager = greedy(dec)
    dec.compiled = CompiledStep(dec, 1, backend="eager")
    dec.compiled.start()
    assert dec.compiled.wait(600), dec.compiled.status()
    assert greedy(dec) == eager
    assert dec.compiled.runs == 12 and dec.compiled.state == "ready"


def test_the_pool_is_allocated_at_its_budget_so_the_graph_stays_current(folder, monkeypatch):
    dec = portable_decoder(folder, "bf16", monkeypatch)
    dec.kv.set_cache(b"model", 8, budget_pages=40)  # what the batcher sets from the memory free
    with torch.inference_mode():
        step = StaticStep(dec, 1)
    assert dec.kv.pages == 40 and step.current()
    dec.kv.reserve(1, 30 * dec.kv.page)  # a long reply within the budget: no growth, the same tensors
    assert step.current()
