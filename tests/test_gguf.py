"""GGUF conversion: streamed, bf16, quantised layers kept as Redline blocks, loaded as the file is.

GGUFs are made here with the ``gguf`` package (``tests/gguf_helpers.py``: llama.cpp's layout, Q/K rows
permuted); the starter's own GGUF comes from its wheel on the package index (``starter`` tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_helpers import random_kquant_blocks, write_llama_gguf

from redline.inference.backends.local import load_model
from redline.inference.errors import Cancelled, ModelLoadError, UnsupportedConfiguration
from redline.inference.kernels.block_quant import dequantize as blocks_to_float
from redline.inference.precision import PrecisionSpec, resolve_precision
from redline.inference.sources.gguf import convert_gguf
from redline.inference.sources.gguf_tensors import dequantize, llama_row_permutation, to_blocks
from redline.inference.sources.resolve import resolve

MIXED = {  # every kind of tensor the conversion handles, in one small file
    "attn_q": "Q4_0",
    "attn_k": "Q4_1",
    "attn_v": "Q8_0",
    "attn_output": "F16",
    "ffn_gate": "Q4_0",
    "ffn_up": "Q8_0",
    "ffn_down": "Q4_1",
    "token_embd": "Q8_0",
    "output.": "Q8_0",
}
PROBE = Path(__file__).with_name("convert_probe.py")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A tiny Llama (4 heads, 2 KV heads, so the Q/K permutation matters) as a GGUF of mixed types."""
    from conftest import build_tiny_model

    root = tmp_path_factory.mktemp("gguf")
    folder = build_tiny_model(root / "tiny", hidden=128, layers=2, heads=4, kv_heads=2)
    return write_llama_gguf(folder, root / "tiny-mixed.gguf", MIXED)


def load(folder, precision="auto"):
    return load_model(resolve(str(folder)), resolve_precision(precision, "cpu"), "cpu")


# --------------------------------------------------------------------------- the mapping, tensor by tensor
def test_q8_0_q4_0_q4_1_blocks_are_the_files_bytes(mixed):
    """Redline's blocks de-quantise to exactly what the gguf package de-quantises (fp16 scales included)."""
    import gguf

    seen = set()
    for t in gguf.GGUFReader(str(mixed)).tensors:
        if t.tensor_type.name not in ("Q8_0", "Q4_0", "Q4_1"):
            continue
        rows, cols = int(t.shape[1]), int(t.shape[0])
        reference = dequantize(t.data, t.tensor_type).reshape(rows, cols)
        ours = blocks_to_float(to_blocks(t.data, t.tensor_type, rows, cols)).numpy()
        assert np.array_equal(ours, reference), t.name
        seen.add(t.tensor_type.name)
    assert seen == {"Q8_0", "Q4_0", "Q4_1"}


# Measured on these random blocks and on blocks encoded from real weights (docs/models.md); the tests hold
# the mapping to the tolerance documented there.
K_TOLERANCE = {"Q4_K": (4, 1e-3), "Q5_K": (8, 1e-2), "Q6_K": (8, 1e-2)}  # bits kept, max RMS error / RMS


@pytest.mark.parametrize("name", sorted(K_TOLERANCE))
def test_k_quants_map_within_the_documented_error(name):
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, name)
    rows, cols = 64, 512
    data = random_kquant_blocks(name, rows, cols)
    reference = dequantize(data, qtype).reshape(rows, cols)
    blocks = to_blocks(data, qtype, rows, cols)
    bits, tolerance = K_TOLERANCE[name]
    assert blocks.bits == bits
    error = blocks_to_float(blocks).numpy() - reference
    assert np.sqrt((error**2).mean()) / np.sqrt((reference**2).mean()) < tolerance
    if name == "Q4_K":  # exact but for rounding d·sc and dmin·m to fp16: within half an fp16 step of each
        assert np.abs(error).max() <= np.abs(reference).max() * 2**-10


def test_row_permutation_is_transformers_reverse_permutation():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    w = np.arange(24 * 3, dtype=np.float32).reshape(24, 3)
    for heads, kv in ((4, 4), (4, 2)):
        processor = LlamaTensorProcessor(config={"num_attention_heads": heads, "num_key_value_heads": kv})
        want = processor.process(w, "blk.0.attn_k.weight").weights
        assert np.array_equal(w[llama_row_permutation(24, kv)], want)


# --------------------------------------------------------------------------- the converted folder
def test_fp32_conversion_equals_transformers_own_gguf_loader(mixed, tmp_path):
    """Names, the Q/K permutation and every value, against transformers' whole-model GGUF load."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(mixed.parent), gguf_file=mixed.name, dtype=torch.float32)
    ref = reference.state_dict()
    for keep in (True, False):
        folder = convert_gguf(mixed, tmp_path / f"fp32-{keep}", keep_quantised=keep, dtype="float32")
        ours = load(folder, "fp32").model.state_dict()
        assert set(ours) == set(ref)
        for key, value in ref.items():
            assert torch.equal(ours[key], value), key


def test_folder_layout_manifest_and_tokenizer(mixed, tmp_path):
    from safetensors import safe_open

    folder = convert_gguf(mixed, tmp_path / "keep")
    config = json.loads((folder / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["architectures"] == ["LlamaForCausalLM"]
    manifest = json.loads((folder / "redline_quantization.json").read_text())
    assert manifest["format"] == "redline-blocks" and manifest["block_size"] == 32
    kept = manifest["modules"]
    assert kept["model.layers.0.self_attn.q_proj"] == {
        "bits": 4,
        "mins": False,
        "in_features": 128,
        "out_features": 128,
        "from": "Q4_0",
        "how": "bytes copied",
    }
    assert kept["model.layers.1.mlp.down_proj"]["mins"] and kept["lm_head"]["bits"] == 8
    assert "model.layers.0.self_attn.o_proj" not in kept  # an F16 tensor stays a float tensor
    tensors = {}
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), "pt") as sf:
            tensors.update({k: sf.get_slice(k) for k in sf.keys()})
    q = tensors["model.layers.0.self_attn.q_proj.weight.qweight"]
    assert q.get_dtype() == "U8" and q.get_shape() == [128, 64]
    assert tensors["model.layers.0.self_attn.v_proj.weight.qweight"].get_dtype() == "I8"
    assert tensors["model.layers.0.self_attn.k_proj.weight.mins"].get_dtype() == "F16"
    assert tensors["model.embed_tokens.weight"].get_dtype() == "BF16"  # embeddings stay a float lookup
    assert tensors["model.norm.weight"].get_dtype() == "F32"  # 1-D float32 tensors stay float32
    assert (folder / "chat_template.jinja").is_file() and (folder / "generation_config.json").is_file()
    tok = load(folder).tokenizer
    text = "The quick brown fox jumps over the lazy dog."
    assert tok.decode(tok(text).input_ids) == text


def test_fp16_file_gives_an_fp16_folder(tmp_path, mixed):
    from conftest import build_tiny_model

    folder = build_tiny_model(tmp_path / "f16", hidden=64, layers=1, heads=2, kv_heads=1)
    out = convert_gguf(write_llama_gguf(folder, tmp_path / "f16.gguf", {}), tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    assert not (out / "redline_quantization.json").exists()


def test_precisions_on_a_packed_folder(mixed, tmp_path):
    from redline.inference.loading.weight_only import PackedLinear

    folder = convert_gguf(mixed, tmp_path / "keep")
    auto = load(folder, "auto")
    assert auto.precision.name == "gguf" and auto.precision.label() == "gguf (as the file is)"
    layers = auto.model.model.layers[0]
    assert isinstance(layers.self_attn.q_proj, PackedLinear) and layers.self_attn.q_proj.bits == 4
    assert isinstance(layers.self_attn.v_proj, PackedLinear) and layers.self_attn.v_proj.bits == 8
    assert type(layers.self_attn.o_proj) is torch.nn.Linear  # F16 in the file: a float layer
    bf16 = load(folder, "bf16").model
    assert type(bf16.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    q8 = load(folder, "q8").model
    assert all(m.bits == 8 for m in q8.modules() if isinstance(m, PackedLinear))
    assert isinstance(q8.model.layers[0].self_attn.o_proj, PackedLinear)
    with pytest.raises(UnsupportedConfiguration, match="keeps the GGUF's quantised weights"):
        load(folder, "nf4")


def test_conversion_cancel_leaves_nothing(mixed, tmp_path):
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(Cancelled):
        convert_gguf(mixed, tmp_path / "out", should_cancel=cancel)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".converting-*"))


def test_truncated_gguf_is_reported_as_truncated(mixed, tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(mixed.read_bytes()[: mixed.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf.*truncated"):
        convert_gguf(bad, tmp_path / "out")


def test_progress_reports_bytes_and_time_left(mixed, tmp_path):
    seen = []
    convert_gguf(mixed, tmp_path / "out", lambda f, p: seen.append((f, p)))
    phases = [p for _, p in seen if p.startswith("Converting GGUF")]
    assert phases and phases[-1].endswith(f"of {phases[-1].split(' of ')[1]}")
    assert all(" of " in p for p in phases)
    assert [f for f, _ in seen] == sorted(f for f, _ in seen) and seen[-1] == (1.0, "Converted")


# --------------------------------------------------------------------------- the estimator
def test_estimator_reads_the_files_tensor_types(mixed, tmp_path, monkeypatch):
    from redline.inference.cost import weights_bytes
    from redline.inference.estimate.model_shapes import read_shape
    from redline.inference.loading.weight_only import PackedLinear

    monkeypatch.setenv("REDLINE_CACHE_DIR", str(tmp_path / "cache"))
    shape = read_shape(str(mixed))
    assert shape.file_types == {"Q4_0": 4, "Q4_1": 4, "Q8_0": 6, "F16": 2, "F32": 5}
    bits = {row[0]: row[3] for row in shape.packed}
    assert bits["model.layers.0.self_attn.q_proj"] == 4 and bits["lm_head"] == 8 and len(bits) == 13
    assert not any((tmp_path / "cache").rglob("*.safetensors"))  # nothing was converted
    # The prediction for "as the file is" is what the loaded model holds, byte for byte, in the layout this
    # machine loads (GGUF's blocks where Redline's kernels run, torch's packed layouts where they do not): the
    # estimator asks the question the loader asks (kernels.cpu.library.will_run).
    model = load(convert_gguf(mixed, tmp_path / "keep"), "auto").model
    held = sum(t.numel() * t.element_size() for t in model.parameters())
    held += sum(m.weight_bytes for m in model.modules() if isinstance(m, PackedLinear))
    assert weights_bytes(shape, PrecisionSpec("gguf")).total == held
    # and the predicted folder size is the safetensors' payload (their JSON headers aside)
    on_disk = sum(f.stat().st_size for f in (tmp_path / "keep").glob("*.safetensors"))
    assert 0 <= on_disk - shape.checkpoint_bytes < 64 * 1024


def test_redline_estimate_shows_the_gguf_row(mixed, tmp_path, monkeypatch, capsys):
    from redline.app.cli import main

    monkeypatch.setenv("REDLINE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["estimate", str(mixed), "--free-gb", "8", "--context", "512"]) == 0
    out = capsys.readouterr().out
    assert "gguf (as the file is)" in out and "gguf fits" in out and "nf4" not in out
    assert "tensors Q8_0 ×6, F32 ×5, Q4_0 ×4, Q4_1 ×4, F16 ×2; layers kept quantised: q4 ×8, q8 ×5" in out


# --------------------------------------------------------------------------- greedy output
@pytest.mark.slow
def test_greedy_output_as_the_file_is_equals_the_dequantised_model(tmp_path):
    """A tiny Llama trained until it is sure of its text (random weights tie their logits, so any rounding
    flips a token), as a GGUF of mixed types: loaded as the file is (PackedLinear from the blocks, bf16
    compute) it writes what the de-quantised bf16 conversion writes."""
    from conftest import CORPUS, build_tiny_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = build_tiny_model(tmp_path / "tiny", hidden=128, layers=2, heads=4, kv_heads=2)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(0.1)
    texts = sorted(set(CORPUS))
    rows = [tok(t).input_ids for t in texts]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    mask = ids != tok.pad_token_id
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(200):
        loss = model(input_ids=ids, attention_mask=mask.long(), labels=ids.masked_fill(~mask, -100)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.05:
            break
    assert loss.item() < 0.05
    model.save_pretrained(str(folder))
    gguf_file = write_llama_gguf(folder, tmp_path / "trained.gguf", MIXED)
    as_file = load(convert_gguf(gguf_file, tmp_path / "keep"), "auto")
    dequantised = load(convert_gguf(gguf_file, tmp_path / "plain", keep_quantised=False), "bf16")
    assert as_file.precision.name == "gguf" and dequantised.precision.name == "bf16"
    for prompt in ("The quick brown", "def add(a", "Emoji test", "Local models run"):
        x = tok(prompt, return_tensors="pt").input_ids
        a = as_file.model.generate(x, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
        b = dequantised.model.generate(x, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert a.tolist() == b.tolist(), (prompt, tok.decode(a[0]), tok.decode(b[0]))


# --------------------------------------------------------------------------- memory, in a fresh process
def probe(src: Path, out: Path, mode: str = "keep") -> dict:
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(src), str(out), mode], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_bound(result: dict, model_f32_bytes: int) -> None:
    if not result["hwm_reset"]:
        pytest.skip("this kernel does not let a process reset its peak-RSS counter")
    bound = 3 * result["largest_tensor_f32_bytes"]
    assert bound < model_f32_bytes, "the bound must be below what holding the model in float32 takes"
    grown = result["tensor_phase_peak_rss"] - result["tensor_phase_baseline_rss"]
    assert grown <= bound, result


@pytest.mark.slow
def test_conversion_memory_stays_bounded_by_a_few_tensors(tmp_path):
    """An F16 / Q8_0 / Q4_0 model of about 300 MB in float32: the tensor phase's peak grows by at most three
    times the largest tensor (its float32 de-quantisation), far below the model."""
    from conftest import build_tiny_model, build_tokenizer

    folder = build_tiny_model(
        tmp_path / "mid",
        hidden=1024,
        layers=6,
        heads=16,
        kv_heads=4,
        tokenizer=build_tokenizer(400),
        max_positions=1024,
    )
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 2816
    (folder / "config.json").write_text(json.dumps(cfg))
    from transformers import AutoModelForCausalLM, LlamaConfig

    model = AutoModelForCausalLM.from_config(LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"}))
    model.save_pretrained(str(folder))
    params = sum(p.numel() for p in model.parameters())
    del model
    types = {"attn_q": "Q4_0", "attn_k": "Q8_0", "attn_v": "F16", "attn_output": "Q8_0", "ffn_": "Q4_0"}
    src = write_llama_gguf(folder, tmp_path / "mid.gguf", types)
    for mode in ("keep", "dequantise"):
        check_bound(probe(src, tmp_path / f"out-{mode}", mode), params * 4)


@pytest.mark.slow
@pytest.mark.starter
def test_starter_gguf_converts_to_bf16_within_the_bound(tmp_path):
    from redline.inference.sources.starter import fetch_starter_gguf

    src = fetch_starter_gguf(tmp_path)
    plain = probe(src, tmp_path / "bf16", "dequantise")
    check_bound(plain, 134_515_008 * 4)
    assert 265e6 < plain["weights_bytes"] < 275e6  # bf16: 2 bytes × 134.5 M parameters (was 538 MB in fp32)
    kept = probe(src, tmp_path / "keep", "keep")
    check_bound(kept, 134_515_008 * 4)
    assert kept["weights_bytes"] < 0.6 * plain["weights_bytes"]
    answer = load(tmp_path / "keep", "auto")
    ids = answer.tokenizer.apply_chat_template(
        # A prompt this 4-bit file answers well: llama.cpp on the same Q4_1 file answers it "The capital of France is
        # Paris." (the bare "What is the capital of France?" gets "L'Étoile, la Marseillaise," from llama.cpp and from
        # Redline alike: the file's own quality, not the loader's)
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        add_generation_prompt=True,
        return_tensors="pt",
    )
    ids = ids if torch.is_tensor(ids) else ids["input_ids"]
    out = answer.model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in answer.tokenizer.decode(out[0, ids.shape[1] :])


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's mappings (Linux)")
def test_a_converted_gguf_loads_as_views_of_its_files_and_the_estimate_counts_them_once(tmp_path, monkeypatch):
    """safetensors hands out tensors backed by its mapping and the blocks are used as stored, so a converted
    GGUF at ``gguf`` holds its weights once: the estimate adds no load copy, only the fast path's fused blocks
    (copies beside the mapped originals). Both facts are checked here, so a loader that starts copying fails."""
    from conftest import build_tiny_model

    from redline.inference.cost import weights_bytes
    from redline.inference.decoding.fastpath import get_decoder
    from redline.inference.estimate.calibration import loaded_shape, predict_loaded
    from redline.inference.estimate.estimator import fast_path_copy_bytes, loading_bytes, packed_views
    from redline.inference.memory.policy import releases_pages

    # Converted in the test's own folder: in the user's models folder each run left one more "tiny.Q8_0-…" model
    # that `redline models` listed.
    monkeypatch.setenv("REDLINE_MODELS_DIR", str(tmp_path / "models"))
    folder = build_tiny_model(tmp_path / "tiny", hidden=128, layers=2, heads=4, kv_heads=2)
    path = write_llama_gguf(folder, tmp_path / "tiny.Q8_0.gguf", {"attn": "Q8_0", "ffn": "Q8_0"})
    loaded = load(path, "gguf")
    mapped = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[5].endswith(".safetensors"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            mapped.append((lo, hi))
    q = loaded.model.model.layers[0].self_attn.q_proj.blocks
    assert any(lo <= q.qweight.data_ptr() < hi for lo, hi in mapped)  # a view of the file, not a copy
    shape, spec = loaded_shape(loaded), loaded.precision
    wb = weights_bytes(shape, spec, "cpu")
    assert packed_views(shape, spec, "cpu") and loading_bytes(shape, spec, "cpu", wb, 0) == 0
    assert predict_loaded(loaded, 32).fast_path_bytes == 0
    get_decoder(loaded, 32)
    fused = 0
    for layer in loaded.model.model.layers:
        for module in (layer.self_attn.q_proj, layer.mlp.gate_proj):  # views into the fused blocks
            fused += module.blocks.qweight.untyped_storage().nbytes() + module.blocks.scales.untyped_storage().nbytes()
    assert fast_path_copy_bytes(shape, spec, "cpu", wb, pages_released=False) == fused
    assert predict_loaded(loaded, 32).fast_path_bytes == (0 if releases_pages() else fused)
    # De-quantised to a float precision, every layer is a copy: the old rule (the mapping's pages on top).
    bf16 = resolve_precision("bf16", "cpu")
    assert not packed_views(shape, bf16, "cpu") and loading_bytes(shape, bf16, "cpu", weights_bytes(shape, bf16), 0)


def test_conversions_go_where_redline_models_dir_says(tmp_path, monkeypatch):
    # A benchmark converts into its own folder (tests/model_browser_accuracy.py), never into the user's models.
    from redline.inference.sources.gguf import cache_folder_for

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("REDLINE_MODELS_DIR", str(tmp_path / "elsewhere"))
    assert cache_folder_for(gguf).parent == tmp_path / "elsewhere" / "gguf"
    monkeypatch.delenv("REDLINE_MODELS_DIR")
    assert cache_folder_for(gguf).parent.parent != tmp_path / "elsewhere"
