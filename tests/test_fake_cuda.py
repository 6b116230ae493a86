"""The CUDA path checked without a GPU: every code path the fast decoder runs on CUDA, under torch's fake tensors.

No GPU has been lent to this project, and a device-mismatch bug in the fast path was once found only by reading.
Here a tiny random model is put where a real CUDA load puts it (``loader._load_float``: dense precisions loaded
onto the device, q8/q4 loaded in host memory and packed onto the device in torch's layouts, what stayed
unquantised moved after them), on a fake ``cuda`` device (``torch._subclasses.FakeTensorMode``: tensors with a
device, a shape and a dtype, and no data), then one prefill and a few decode steps run through the real code:
``FastDecoder`` (each precision's weight layout: bf16/fp16/fp32 rows, q8's int8 rows, q4's packed int4 tiles; on
CUDA the reference operators run), the compiled step's eager fallback, the server's ``Batcher`` with several
sequences (the one-page-per-sequence KV cache, its prefix cache of slots, repetition penalties and sampling).

Two checks on top of the fake tensors (``DeviceCheck``): every operator's tensors on one device (a 0-dim CPU
tensor allowed, as CUDA allows it; cross-device copies allowed, as they are transfers), a mixed one failing with
the operator, the CPU tensor's shape and the line of Redline's that made it; and every tensor the decoder, the
KV cache and each sequence hold on the GPU, a CPU one failing with its name (``cpu_tensors``). Reading a value
back to the host (the new token's id) has no data to read under fake tensors: ``DeviceCheck`` answers it with a
token id that is no end-of-sequence, and counts the reads.

What fake tensors cannot reach (CUDA graphs, a seeded generator on the GPU, bitsandbytes, speculative decoding's
data-dependent shapes, the CUDA runtime's memory queries) is listed in ``tools/benchmarks/gpu_check/``'s ``PLAN``
and runs in ``make gpu-check`` on the day a GPU is lent; ``test_every_path_is_checked_here_or_in_the_gpu_check_plan``
keeps the two lists whole.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_leaves, tree_map_only

# A fake cuda device needs a torch built with CUDA (the CPU-only build refuses: "PyTorch is not linked with support
# for cuda devices"). The wheel every Linux user gets from PyPI is such a build, and CI's first pass (make test,
# the newest torch) runs these; the pinned CPU build of its second pass cannot.
pytestmark = pytest.mark.skipif(
    not torch.backends.cuda.is_built(), reason="fake CUDA tensors need a torch built with CUDA (this one is CPU-only)"
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "benchmarks"))

import gpu_check  # noqa: E402 - tools/ is not a package

# Every precision the fast path runs on CUDA (bitsandbytes' int8/nf4/fp4 are refused by fastpath.supports, so
# they run on transformers' generate(): gpu_check's plan), and every strategy × batch shape it has there.
PRECISIONS = ("fp32", "fp16", "bf16", "q8", "q4")
FAST_STRATEGIES = ("fast-eager", "fast-compiled-fallback", "fast-batched")

STANDIN_TOKEN = 7  # what a host read of an integer returns: a real id of the tiny vocabulary, not end-of-sequence


class DeviceCheck(FakeTensorMode):
    """torch's fake tensors, with a fake ``cuda`` device, checked: every operator's tensors on one device, and the
    host's reads of a value answered (there is no data to read). In ``dispatch``, which every operator on a fake
    tensor reaches, inference tensors included (a TorchDispatchMode stacked on top does not see their reads)."""

    def __init__(self):
        super().__init__(allow_non_fake_inputs=True)
        self.mixed: list[str] = []
        self.host_reads = 0

    def dispatch(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            self.host_reads += 1
            t = args[0]
            if t.dtype == torch.bool:
                return False
            return 0.0 if t.dtype.is_floating_point else STANDIN_TOKEN
        if func not in (torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default):
            tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            cpu = [t for t in tensors if t.device.type == "cpu" and t.dim() > 0]
            if cpu and any(t.device.type == "cuda" for t in tensors):
                t = cpu[0]
                text = f"{func} got a CPU tensor {tuple(t.shape)} {t.dtype} beside CUDA ones, at {redline_line()}"
                self.mixed.append(text)
                raise AssertionError(text)
        # A real tensor made under the mode (torch.tensor(list, device=...) under inference_mode builds one on the
        # host, then moves it): faked first, so its move to the fake device does not reach the real CUDA runtime.
        args, kwargs = tree_map_only(torch.Tensor, self._faked, (args, kwargs))
        return super().dispatch(func, types, args, kwargs)

    def _faked(self, t: torch.Tensor) -> torch.Tensor:
        return t if isinstance(t, FakeTensor) else self.from_tensor(t)


def redline_line() -> str:
    """The innermost lines of Redline's own code on the stack (what made the operator run, and its caller)."""
    lines = []
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename)
        # Installed packages are not Redline's, wherever their venv lies (CI's second pass keeps one under build/).
        installed = {"site-packages", "dist-packages"} & set(path.parts) or ".venv" in path.parts
        if ROOT in path.parents and "tests" not in path.parts and not installed:
            lines.append(f"{path.relative_to(ROOT)}:{frame.lineno} `{(frame.line or '').strip()}`")
            if len(lines) == 2:
                break
    return " from ".join(lines) or "(no line of Redline's on the stack)"


def cpu_tensors(obj, name: str, seen=None, depth: int = 0) -> list[str]:
    """The names of the tensors ``obj`` holds (attributes, lists, dicts, dataclasses, closures) that are not on
    the GPU."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [] if obj.device.type == "cuda" or obj.numel() == 0 else [f"{name} ({tuple(obj.shape)} {obj.dtype})"]
    if isinstance(obj, torch.nn.Module):
        return [
            f"{name}.{n} ({tuple(t.shape)} {t.dtype})"
            for n, t in list(obj.named_parameters()) + list(obj.named_buffers())
            if t.device.type != "cuda"
        ]
    out = []
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += cpu_tensors(v, f"{name}[{i}]", seen, depth + 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out += cpu_tensors(v, f"{name}[{k!r}]", seen, depth + 1)
    elif callable(obj) and getattr(obj, "__closure__", None):
        for var, cell in zip(obj.__code__.co_freevars, obj.__closure__):
            try:
                out += cpu_tensors(cell.cell_contents, f"{name}<{var}>", seen, depth + 1)
            except ValueError:  # an empty cell
                pass
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out += cpu_tensors(getattr(obj, f.name), f"{name}.{f.name}", seen, depth + 1)
    elif type(obj).__module__.startswith(("redline.", "transformers.generation")) and hasattr(obj, "__dict__"):
        for k, v in vars(obj).items():
            if k not in ("dec", "model", "target", "collector", "compiled", "_fn", "_thread", "_lock"):
                out += cpu_tensors(v, f"{name}.{k}", seen, depth + 1)
    return out


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir):
    # conftest's: 2 layers, hidden 64, head size 16 (int4's group of 32 and torch's int4 tiles both fit)
    return tiny_model_dir


class Fake:
    """A fake CUDA device for one test: the fake tensors, the device check, and the CUDA runtime's few host calls
    (synchronize, memory statistics) answered as a machine with nothing allocated would answer them."""

    def __init__(self, monkeypatch):
        self.check = DeviceCheck()
        for fn in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
            monkeypatch.setattr(torch.cuda, fn, lambda *a, **k: None)
        for fn in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
            monkeypatch.setattr(torch.cuda, fn, lambda *a, **k: 0)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a, **k: (8 * 1024**3, 8 * 1024**3))

    def __enter__(self):
        self.check.__enter__()
        return self

    def __exit__(self, *exc):
        self.check.__exit__(*exc)


def load_on_fake_cuda(folder: Path, precision: str):
    """The model as ``loader.load_model`` leaves it on CUDA (``_load_float``), inside the fake mode: a LoadedModel."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from redline.inference.backends.local import LoadedModel
    from redline.inference.loading.weight_only import quantize_model
    from redline.inference.precision import WEIGHT_ONLY, parse_precision, torch_dtype
    from redline.inference.sources.resolve import resolve

    spec = parse_precision(precision)
    tok = AutoTokenizer.from_pretrained(folder)
    if precision in WEIGHT_ONLY:
        # host memory in the compute dtype (device_map "cpu", real tensors), packed onto the device layer by layer
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype(spec.compute_dtype)).eval()
        quantize_model(model, 8 if precision == "q8" else 4, torch_dtype(spec.compute_dtype), device="cuda")
        model.to("cuda")
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype(precision)).eval()
        model.to("cuda")  # device_map "cuda": every weight on the device
    return LoadedModel(model, tok, resolve(str(folder)), spec, "cuda", folder, 0.0, 0, 0)


def assert_on_gpu(fake: Fake, **objects) -> None:
    left = [n for name, obj in objects.items() for n in cpu_tensors(obj, name)]
    assert not left, "tensors left on the CPU: " + "; ".join(left)
    assert not fake.check.mixed, fake.check.mixed


def prompt_ids(target, text: str) -> list[int]:
    rendered = target.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return target.tokenizer(rendered, add_special_tokens=False)["input_ids"]


# -- the decoder alone: a prefill and decode steps in each precision's layout --------------------------------
@pytest.mark.parametrize("precision", PRECISIONS)
def test_fast_decoder_prefill_and_steps_stay_on_the_gpu(tiny_dir, precision, monkeypatch):
    from redline.inference.decoding.fastpath import FastDecoder

    with Fake(monkeypatch) as fake:
        target = load_on_fake_cuda(tiny_dir, precision)
        assert_on_gpu(fake, model=target.model)
        dec = FastDecoder(target.model, 64)
        assert dec.device.type == "cuda" and not dec.native and dec.whole_step_plan is None
        assert dec.kv.page == 64  # the native kernels' pages (kv_cache.PAGE_TOKENS), not a slot per sequence
        ids = prompt_ids(target, "Paris is the capital of France.")
        logits = dec.prefill(torch.tensor(ids, device="cuda"), 0, 0)
        assert logits.device.type == "cuda" and logits.dtype == torch.float32
        pos = len(ids)
        for _ in range(3):  # a decode step after a prefill, then more, one sequence
            out = dec.step(torch.argmax(logits, -1).view(1), [pos], [0])
            assert out.device.type == "cuda" and out.shape == (1, dec.embed.shape[0])
            logits, pos = out[0], pos + 1
        # a second chunk of a long prompt (the prefill's mask for positions after the first chunk)
        more = dec.prefill(torch.tensor(ids[:5], device="cuda"), pos, 0)
        assert more.device.type == "cuda"
        assert_on_gpu(fake, dec=dec, kv=dec.kv)
        if precision in ("q8", "q4"):
            layouts = {m.layout for m in target.model.modules() if type(m).__name__ == "PackedLinear"}
            assert layouts == {"torch"}  # CUDA's layout: torch's packed int8 rows / int4 tiles, not GGUF blocks


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_a_gguf_files_blocks_on_cuda_become_torch_layouts_on_the_gpu(kind, monkeypatch):
    """A converted GGUF loaded on CUDA (``packed.load_packed`` → ``PackedLinear.from_blocks``): its Q8_0/Q4_0/Q4_1
    blocks, read on the host, become torch's layouts on the device, and the layer's product runs there."""
    from redline.inference.kernels import block_quant
    from redline.inference.loading.weight_only import PackedLinear

    torch.manual_seed(0)
    w, bias = torch.randn(48, 64), torch.randn(48)
    blocks = {
        "Q8_0": lambda: block_quant.quantize_q8(w),
        "Q4_0": lambda: block_quant.quantize_q4(w, symmetric=True),
        "Q4_1": lambda: block_quant.quantize_q4(w),
    }[kind]()
    with Fake(monkeypatch) as fake:
        layer = PackedLinear.from_blocks(blocks, bias, torch.bfloat16, device="cuda")
        assert layer.layout == "torch" and layer.blocks is None
        y = layer(torch.randn(3, 64, device="cuda", dtype=torch.bfloat16))
        assert y.device.type == "cuda" and y.shape == (3, 48)
        assert_on_gpu(fake, layer=layer)


# -- the server's batched requests, through the Batcher, with the prefix cache ------------------------------
def _request(target, text: str, **sampling):
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.generation.request import GenerationRequest

    return GenerationRequest(
        input_ids=prompt_ids(target, text),
        sampling=SamplingSettings(max_new_tokens=3, **sampling),
        options=DecodeOptions(strategy="fast", compile=False),
        record=False,
    )


@pytest.mark.parametrize("precision", PRECISIONS)
def test_batched_requests_with_penalties_and_sampling_stay_on_the_gpu(tiny_dir, precision, monkeypatch):
    from redline.inference.generation.batch import Batcher
    from redline.inference.generation.lifecycle import DirectSink

    with Fake(monkeypatch) as fake:
        target = load_on_fake_cuda(tiny_dir, precision)
        batcher = Batcher(target, max_active=3, kv_budget_tokens=2048, prefix_cache_bytes=1 << 20)
        system = "You are a helpful assistant who answers in one short sentence. " * 3  # two full pages and more
        requests = [
            _request(target, system + "Hello there"),  # greedy
            _request(target, system + "What is two and two?", temperature=0.8, top_p=0.9, top_k=20),
            _request(target, system + "Name a colour.", repetition_penalty=1.3, temperature=0),
        ]
        sinks = [DirectSink() for _ in requests]
        for sink, req in zip(sinks, requests):
            batcher.add(sink, req, 0.0)
        assert_on_gpu(fake, kv=batcher.dec.kv, **{f"seq{i}": a.seq for i, a in enumerate(batcher.active)})
        steps = 0
        while batcher.active and steps < 20:
            batcher.step()
            steps += 1
        for sink in sinks:
            assert sink.result is not None and sink.result.finish_reason != "error", sink.result.error
            assert sink.result.new_tokens == 3
        assert not fake.check.mixed, fake.check.mixed
        # A later turn of the first chat: the prefix cache hands it the first sequence's full pages.
        again = DirectSink()
        batcher.add(again, _request(target, system + "Hello there"), 0.0)
        assert again.id in batcher.dec.kv.tables and batcher.active[-1].seq.cached > 0
        while batcher.active:
            batcher.step()
        assert again.result.finish_reason != "error", again.result.error
        assert_on_gpu(fake, dec=batcher.dec, kv=batcher.dec.kv)


def test_one_host_read_per_token_and_sequence(tiny_dir, monkeypatch):
    """FastSequence's promise on a GPU: the one host synchronisation per token is reading the new id (it was two
    reads of the same id: ``int(next_id)`` for the stop check, then the collector's ``tolist()`` for streaming)."""
    from redline.inference.generation.batch import Batcher
    from redline.inference.generation.lifecycle import DirectSink

    with Fake(monkeypatch) as fake:
        target = load_on_fake_cuda(tiny_dir, "bf16")
        batcher = Batcher(target, max_active=2, kv_budget_tokens=1024)
        sinks = [DirectSink(), DirectSink()]
        for sink, text in zip(sinks, ("Hello there", "Name a colour.")):
            batcher.add(sink, _request(target, text), 0.0)
        while any(a.seq.prefilling for a in batcher.active):
            batcher.step()
        before = fake.check.host_reads
        batcher.step()  # one decode step of two sequences
        assert fake.check.host_reads - before == 2


# -- the compiled step's eager fallback ---------------------------------------------------------------------
def test_compiled_step_falls_back_to_the_eager_step_on_the_gpu(tiny_dir, monkeypatch):
    """compile defaults to on for CUDA: until the compiled step is ready, and when it would need a recompile, the
    eager step runs — on the GPU. (Compiling itself, CUDA graphs, is in gpu_check's plan.)"""
    from redline.inference.decoding.compiled import CompiledStep
    from redline.inference.decoding.fast_loop import wants_compile
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.generation.batch import Batcher
    from redline.inference.generation.lifecycle import DirectSink
    from redline.inference.generation.request import GenerationRequest

    starts = []
    monkeypatch.setattr(CompiledStep, "start", lambda self: starts.append(self.state))
    assert wants_compile(None, "cuda")
    with Fake(monkeypatch) as fake:
        target = load_on_fake_cuda(tiny_dir, "bf16")
        batcher = Batcher(target, max_active=1, kv_budget_tokens=1024)
        request = GenerationRequest(
            input_ids=prompt_ids(target, "Hello there"),
            sampling=SamplingSettings(max_new_tokens=3, temperature=0),
            options=DecodeOptions(strategy="fast"),  # compile=None: on, on CUDA
            record=False,
        )
        sink = DirectSink()
        batcher.add(sink, request, 0.0)
        compiled = batcher.dec.compiled
        assert compiled is not None and starts == ["idle"] and not compiled.ready()
        batcher.step()  # prefill
        batcher.step()  # a decode step while compiling: the eager step

        def needs_recompile(*inputs):
            raise RuntimeError("Detected recompile when torch.compile stance is 'fail_on_recompile'")

        compiled.state, compiled._fn, compiled.static = "ready", needs_recompile, compiled._prepare()
        while batcher.active:
            batcher.step()  # ready, but its shapes outgrew the graph: eager, and a new compile started
        assert sink.result.finish_reason != "error", "\n".join(sink.result.notes)
        assert sink.result.new_tokens == 3 and starts[-1] == "idle" and len(starts) >= 2
        assert_on_gpu(fake, dec=batcher.dec, kv=batcher.dec.kv)


# -- the checks themselves ----------------------------------------------------------------------------------
def test_a_tensor_left_on_the_cpu_fails_with_its_name(tiny_dir, monkeypatch):
    from redline.inference.decoding.fastpath import FastDecoder

    with Fake(monkeypatch) as fake:
        target = load_on_fake_cuda(tiny_dir, "bf16")
        dec = FastDecoder(target.model, 64)
        dec.cos = dec.cos.to("cpu")  # as a rotary table built on the host would be
        assert cpu_tensors(dec, "dec") == ["dec.cos ((256, 16) torch.float32)"]
        where = r"CPU tensor \(3, 1, 16\).*inference/kernels/reference\.py:\d+ .* from inference/decoding/fastpath\.py"
        with pytest.raises(AssertionError, match=where):
            dec.prefill(torch.tensor([1, 2, 3], device="cuda"), 0, 0)
        assert fake.check.mixed


def test_every_path_is_checked_here_or_in_the_gpu_check_plan():
    """The CUDA paths are listed once: what this file runs (gpu_check.FAKE_CUDA_COVERED, which `make gpu-check`'s
    report quotes) and what only a GPU can (gpu_check.PLAN)."""
    assert gpu_check.FAKE_CUDA_COVERED == {
        "fast-eager": PRECISIONS,
        "fast-batched": PRECISIONS,
        "fast-compiled-fallback": ("bf16",),
    }
    assert set(FAST_STRATEGIES) == set(gpu_check.FAKE_CUDA_COVERED)
    planned = {row["path"] for row in gpu_check.PLAN}
    for path in ("cuda-graphs", "seeded-sampling", "bitsandbytes", "speculative", "int4-packing", "memory-figures"):
        assert path in planned
    assert all(row["why"] and row["cells"] for row in gpu_check.PLAN)
