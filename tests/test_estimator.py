"""Memory estimator: exact parameter counts, KV cache arithmetic, weights per precision, fit and suggestion,
bad configs, the per-machine correction, the CLI, and the engine's predicted-vs-measured hook."""

from __future__ import annotations

import functools
import json
import re

import pytest

from redline.inference.cost import kv_cache_bytes, should_convert, weights_bytes
from redline.inference.errors import ModelLoadError, UnsupportedConfiguration
from redline.inference.estimate.estimator import (
    GB,
    MB,
    ModelShape,
    estimate,
    shape_from_config,
)
from redline.inference.estimate.model_shapes import STARTER_CONFIG, read_shape
from redline.inference.precision import parse_precision

# Configs as published on the models' pages (only the fields that shape the network).
GPT2 = {
    "model_type": "gpt2",
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
    "tie_word_embeddings": True,
}
LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "dtype": "float16",
}
LLAMA3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}
QWEN2_05B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}
MISTRAL_7B = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "dtype": "bfloat16",
}


def shape_of(cfg: dict) -> ModelShape:
    return _shape_of(json.dumps(cfg, sort_keys=True))


@functools.lru_cache(maxsize=None)
def _shape_of(cfg_json: str) -> ModelShape:  # building a 7B model on the meta device takes a second
    from transformers import AutoConfig

    data = json.loads(cfg_json)
    return shape_from_config(AutoConfig.for_model(data.pop("model_type"), **data))


def llama_formula(h, i, layers, heads, kv, vocab, tied, head_dim=None, qkv_bias=False):
    """Hand count for the Llama/Qwen2 family, to check the meta-device count against."""
    hd = head_dim or h // heads
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if qkv_bias:
        attn += heads * hd + 2 * kv * hd
    per_layer = attn + 3 * h * i + 2 * h
    return vocab * h * (1 if tied else 2) + layers * per_layer + h


@pytest.mark.parametrize(
    "cfg,expected",
    [
        (GPT2, 124_439_808),  # multi-head, attention biases, tied embeddings, Conv1D layers
        (LLAMA2_7B, 6_738_415_616),  # multi-head
        (LLAMA3_8B, 8_030_261_248),  # grouped-query
        (QWEN2_05B, 494_032_768),  # grouped-query, q/k/v biases, tied embeddings
        (STARTER_CONFIG, 134_515_008),  # SmolLM2-135M: grouped-query, tied embeddings
    ],
)
def test_exact_parameter_counts(cfg, expected):
    assert shape_of(cfg).parameters == expected


def test_meta_count_matches_hand_formula():
    assert shape_of(LLAMA3_8B).parameters == llama_formula(4096, 14336, 32, 32, 8, 128256, tied=False)
    assert shape_of(QWEN2_05B).parameters == llama_formula(896, 4864, 24, 14, 2, 151936, tied=True, qkv_bias=True)
    assert shape_of(STARTER_CONFIG).parameters == llama_formula(576, 1536, 30, 9, 3, 49152, tied=True)


def test_seed_kv_cache_example_is_4_gib():
    # 2 × 32 layers × 32 KV heads × 128 head dim × 2048 tokens × batch 4 × 2 bytes (fp16): not "≈ 42 GB".
    assert kv_cache_bytes(32, 32, 128, 2048, 4, 2) == 4_294_967_296


def test_grouped_query_kv_cache_uses_kv_heads():
    shape = shape_of(LLAMA3_8B)
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (32, 8, 128)
    e = estimate(shape, parse_precision("bf16"), 8192, device="cuda")
    assert e.kv_cache_bytes == 2 * 32 * 8 * 128 * 8192 * 2 == 1_073_741_824
    mha = estimate(shape_of(LLAMA2_7B), parse_precision("fp16"), 4096, device="cuda")
    assert mha.kv_cache_bytes == 2 * 32 * 32 * 128 * 4096 * 2


def test_sliding_window_layers_capped_at_window():
    shape = shape_of(MISTRAL_7B)
    assert set(shape.layer_windows) == {4096}
    full = kv_cache_bytes(32, 8, 128, 8192, 1, 2)
    assert estimate(shape, parse_precision("bf16"), 8192, device="cuda").kv_cache_bytes == full // 2
    # Alternating layers (Gemma-2 style): only the sliding ones are capped.
    assert kv_cache_bytes(4, 1, 1, 100, 1, 1, [10, None, 10, None]) == 2 * (10 + 100 + 10 + 100)


def test_multi_query_flag():
    from transformers import AutoConfig

    from redline.inference.estimate.estimator import kv_geometry

    cfg = AutoConfig.for_model(
        "falcon",
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        multi_query=True,
        new_decoder_architecture=False,
        vocab_size=100,
    )
    assert kv_geometry(cfg)["kv_heads"] == 1


def test_weights_per_precision_starter():
    shape = shape_of(STARTER_CONFIG)
    p = shape.parameters
    assert weights_bytes(shape, parse_precision("fp32")).total == 4 * p
    assert weights_bytes(shape, parse_precision("bf16")).total == 2 * p
    # bitsandbytes quantises every decoder Linear (q,k,v,o,gate,up,down), keeps the tied embedding/lm_head.
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    q = 30 * per_layer
    int8 = weights_bytes(shape, parse_precision("int8"), "cpu")
    assert int8.quantised_params == q == 106_168_320
    out_rows = 30 * (576 + 192 + 192 + 576 + 1536 + 1536 + 576)
    assert int8.constants == out_rows * 4  # one fp32 scale per output row
    assert int8.unquantised == (p - q) * 4  # int8 on CPU keeps the rest in fp32 (inference/precision.py)
    assert weights_bytes(shape, parse_precision("int8"), "cuda").unquantised == (p - q) * 2
    nf4 = weights_bytes(shape, parse_precision("nf4"))
    assert nf4.quantised == q // 2 and nf4.unquantised == (p - q) * 2
    no_dq = weights_bytes(shape, parse_precision("nf4+dq=0"))
    blocks = sum(-(-a * b // 64) for name, a, b, _bias in shape.linears if name != "lm_head")
    assert no_dq.constants == blocks * 4  # one fp32 absmax per 64 weights
    assert nf4.constants < no_dq.constants / 3  # double quantisation: 8-bit absmax + a few fp32 scales
    # Mixed precision: keeping the MLPs unquantised moves their bytes to bf16. (transformers matches
    # a pattern from the start of the name or as its suffix, so a bare "mlp" would keep nothing.)
    assert weights_bytes(shape, parse_precision("nf4+keep=mlp")).quantised_params == q
    keep = weights_bytes(shape, parse_precision("nf4+keep=gate_proj,up_proj,down_proj"))
    assert keep.quantised_params == 30 * (2 * 576 * 576 + 2 * 576 * 192)
    assert keep.total > nf4.total


def test_attention_bias_stays_unquantised():
    shape = shape_of(QWEN2_05B)
    wb = weights_bytes(shape, parse_precision("int8"), "cuda")
    linear_weights = sum(a * b for name, a, b, _ in shape.linears if name != "lm_head")
    assert wb.quantised_params == linear_weights
    assert wb.unquantised == (shape.parameters - linear_weights) * 2  # embeddings, norms and q/k/v biases


def test_should_convert_matches_transformers():
    from transformers.quantizers.quantizers_utils import should_convert_module

    names = ["lm_head", "model.layers.1.mlp.gate_proj", "model.layers.11.self_attn.q_proj", "model.norm"]
    for patterns in (["lm_head"], ["mlp"], ["model.layers.1"], ["layers.*.self_attn"], ["mlp.gate"]):
        for n in names:
            assert should_convert(n, patterns) == should_convert_module(n, patterns), (n, patterns)


# ------------------------------------------------------------------ bad configs
def write_config(folder, text):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(text)
    return folder


def test_missing_field_names_file_and_field(tmp_path):
    cfg = dict(STARTER_CONFIG)
    del cfg["num_hidden_layers"]
    folder = write_config(tmp_path / "m", json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"config\.json has no 'num_hidden_layers' field") as err:
        read_shape(str(folder))
    assert str(folder) in str(err.value)


def test_not_json_names_file(tmp_path):
    folder = write_config(tmp_path / "m", "{not json")
    with pytest.raises(ModelLoadError, match=r"config\.json is not valid JSON \(line 1"):
        read_shape(str(folder))


def test_unknown_architecture_names_file_and_type(tmp_path):
    folder = write_config(tmp_path / "m", json.dumps(dict(STARTER_CONFIG, model_type="no-such-arch")))
    with pytest.raises(ModelLoadError, match=r"config\.json: model_type 'no-such-arch'"):
        read_shape(str(folder))


def test_missing_model_type(tmp_path):
    cfg = dict(STARTER_CONFIG)
    del cfg["model_type"]
    folder = write_config(tmp_path / "m", json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="'model_type'"):
        read_shape(str(folder))


def test_config_only_folder(tmp_path):
    folder = write_config(tmp_path / "qwen", json.dumps(QWEN2_05B))
    shape = read_shape(str(folder))
    assert shape.parameters == 494_032_768 and shape.stored_dtype == "bfloat16"
    assert shape.checkpoint_size() == 2 * 494_032_768  # no weight files: derived from the config's dtype


# ------------------------------------------------------------------ fit and suggestion
def planner_for(cfg, available, device="cuda", draft=None, bf16=True):
    from redline.inference.estimate.fit import Planner, Target

    return Planner(
        shape_of(cfg), Target(device, int(available), "this GPU", None, bf16, None, "this GPU has free"), draft=draft
    )


def test_suggestion_picks_highest_precision_that_fits():
    from redline.inference.estimate.fit import suggest

    s = suggest(planner_for(LLAMA3_8B, 13 * GB), 4096)  # bf16 needs ~17 GB: int8 is the best that fits
    assert s.precision == "int8" and s.context == 4096
    assert re.match(r"int8 fits with \d+\.\d+ GB to spare at 4096 tokens", s.text)
    assert re.search(r"bf16 would need 1\d\.\d GB, \d\.\d+ GB more than this GPU has free", s.text)
    assert [o.precision for o in s.options] == ["nf4"]
    assert s.max_context >= 4096


def test_suggestion_fp16_on_cards_without_bf16():
    from redline.inference.estimate.fit import suggest

    assert suggest(planner_for(STARTER_CONFIG, 8 * GB, bf16=False), 2048).precision == "fp16"


def test_nothing_fits_names_one_change():
    from redline.inference.estimate.fit import suggest

    # nf4 weights ~5.7 GB, KV cache 4.3 GB at 32768 tokens: with 8 GB free only a shorter context fits.
    p = planner_for(LLAMA3_8B, 8 * GB)
    s = suggest(p, 32768)
    assert s.change == "context" and s.precision == "nf4" and 256 <= s.context < 32768
    assert p.fits(parse_precision("nf4"), s.context) and not p.fits(parse_precision("nf4"), s.context + 1)
    assert f"With a context of {s.context} tokens instead of 32768, nf4 fits." in s.text
    assert s.text.startswith("Nothing fits at 32768 tokens: even nf4 needs")
    # With a draft model, dropping it is a single change too.
    draft = shape_of(dict(LLAMA3_8B, num_hidden_layers=16, hidden_size=2048, intermediate_size=8192))
    alone = estimate(shape_of(LLAMA3_8B), parse_precision("nf4"), 8192, device="cuda")
    s = suggest(planner_for(LLAMA3_8B, alone.total_bytes + alone.margin_bytes + 50 * MB, draft=draft), 8192)
    assert s.change == "draft" and s.precision == "nf4" and s.context == 8192 and not s.draft
    assert "Without the draft model, nf4 fits at 8192 tokens" in s.text
    assert [o.change for o in s.options] == ["context"]  # the other single change, in its own sentence
    # Nothing at all: name a card that would run it.
    s = suggest(planner_for(LLAMA3_8B, 2 * GB), 8192)
    assert s.change == "hardware" and s.precision is None and "such as an RTX" in s.text


def test_fixed_precision_that_does_not_fit_suggests_lower():
    from redline.inference.estimate.fit import suggest

    s = suggest(planner_for(LLAMA3_8B, 13 * GB), 4096, precision="bf16")
    assert s.precision == "int8" and s.change == "precision"


def test_the_cpu_ladder_has_q8_where_the_kernels_run(monkeypatch, capsys, tmp_path):
    """Where Redline's kernels run, q8 is among the precisions the memory suggestion tries, placed by its weights'
    bytes (the starter: bf16, int8, q8, nf4): without it the suggestion said "Nothing fits" while its own table
    showed q8 fitting (on a CPU q8 is the smallest total: bf16 is a view of the file, bitsandbytes quantises from a
    16-bit copy)."""
    from redline.app.cli import main
    from redline.inference.estimate.fit import Planner, Target, suggest, suggested_ladder

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    monkeypatch.setattr("redline.inference.cost.will_run", lambda: None)
    starter = read_shape("starter")
    assert suggested_ladder(starter, "cpu") == ["bf16", "int8", "q8", "nf4"]
    q8 = estimate(starter, parse_precision("q8"), 4096)
    need = {p: estimate(starter, parse_precision(p), 4096) for p in ("bf16", "int8", "nf4")}
    assert all(e.total_bytes > q8.total_bytes for e in need.values())
    room = q8.total_bytes + q8.margin_bytes + 2 * MB  # q8 fits, none of the others does
    s = suggest(Planner(starter, Target("cpu", room, "test RAM", "cpu")), 4096)
    assert s.precision == "q8" and s.change is None and s.text.startswith("q8 fits with")
    assert main(["estimate", "starter", "--free-gb", str(room / GB), "--context", "4096", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["suggestion"]["precision"] == "q8" and "Nothing fits" not in report["suggestion"]["text"]
    # A user's q8: it and what is smaller; no kernels (or a GPU): the ladder as before.
    assert suggest(Planner(starter, Target("cpu", room, "test RAM", "cpu")), 4096, "q8").precision == "q8"
    assert suggested_ladder(starter, "cuda") == ["bf16", "int8", "nf4"]
    monkeypatch.setattr("redline.inference.cost.will_run", lambda: "no kernels here")
    assert suggested_ladder(starter, "cpu") == ["bf16", "int8", "nf4"]


def test_longest_context_is_monotonic_boundary():
    p = planner_for(LLAMA3_8B, 8 * GB)
    spec = parse_precision("nf4")
    ctx = p.longest_context(spec)
    assert 0 < ctx < 8192
    assert p.fits(spec, ctx) and not p.fits(spec, ctx + 1)


def test_gpu_list_lookup():
    from redline.inference.hardware.gpus import find_gpu, gpu_for_memory

    assert find_gpu("3060").name == "RTX 3060 12GB"
    assert find_gpu("rtx 4060 ti 16").memory_bytes == 16 << 30
    assert find_gpu("RTX 4090").memory_bytes == 24 << 30
    assert find_gpu("5090").memory_bytes == 32 << 30
    with pytest.raises(UnsupportedConfiguration, match="several"):
        find_gpu("4060 Ti")
    with pytest.raises(UnsupportedConfiguration, match="not in the built-in list"):
        find_gpu("Voodoo 2")
    assert gpu_for_memory(20 * GB).memory_bytes == 24 << 30


# ------------------------------------------------------------------ correction
def test_correction_learns_median_residual(tmp_path):
    from redline.inference.estimate.calibration import MemoryCheck, correction_bytes, record

    path = tmp_path / "cal.json"
    assert correction_bytes("cpu", path) == 0
    for residual in (100, 120, 900):  # one odd load must not swing it
        record(MemoryCheck("m", "bf16", "cpu", 10, 1000 * MB, (1000 + residual) * MB, 0), path)
    assert correction_bytes("cpu", path) == 120 * MB
    path.write_text("{broken")
    assert correction_bytes("cpu", path) == 0  # a damaged file is ignored, not fatal
    check = MemoryCheck("m", "bf16", "cpu", 10, 1100 * MB, 1000 * MB, 50 * MB)
    assert check.residual_bytes == -50 * MB and round(check.error_pct) == 10 and check.within_target


def test_correction_is_added_to_overhead():
    shape = shape_of(STARTER_CONFIG)
    base = estimate(shape, parse_precision("bf16"), 100)
    corrected = estimate(shape, parse_precision("bf16"), 100, correction_bytes=123 * MB)
    assert corrected.overhead_bytes - base.overhead_bytes == 123 * MB
    assert corrected.total_bytes - base.total_bytes == 123 * MB


def test_a_correction_learned_on_a_larger_model_takes_back_the_overhead_and_no_more(tmp_path):
    """The correction is one figure for the machine: -1.06 GB learned from a 1B-shaped model served in q8 made the
    starter's estimate a negative overhead and a total of 0 MB. It may cancel this estimate's overhead, never
    more, and the check records what was applied, so the residual it learns from stays the uncorrected one."""
    from redline.inference.estimate.calibration import MemoryCheck

    shape = shape_of(STARTER_CONFIG)
    base = estimate(shape, parse_precision("bf16"), 8192)
    corrected = estimate(shape, parse_precision("bf16"), 8192, correction_bytes=-1063 * MB)
    assert base.overhead_bytes < 1063 * MB
    assert corrected.overhead_bytes == 0 and corrected.correction_bytes == -base.overhead_bytes
    assert corrected.total_bytes == base.total_bytes - base.overhead_bytes > base.weights_bytes
    check = MemoryCheck("m", "bf16", "cpu", 8192, corrected.total_bytes, 700 * MB, corrected.correction_bytes, 0.0)
    assert check.residual_bytes == 700 * MB - base.total_bytes


def test_draft_adds_weights_and_kv():
    shape = shape_of(LLAMA3_8B)
    draft = shape_of(STARTER_CONFIG)
    e = estimate(shape, parse_precision("bf16"), 4096, device="cuda", draft=draft)
    assert e.draft_bytes == 2 * draft.parameters + kv_cache_bytes(30, 3, 64, 4096, 1, 2)
    assert e.total_bytes == (
        e.weights_bytes + e.kv_cache_bytes + e.activation_bytes + e.overhead_bytes + e.draft_bytes + e.loading_bytes
    )


# ------------------------------------------------------------------ CLI and engine
def test_cli_json(capsys, tmp_path):
    from redline.app.cli import main

    folder = write_config(tmp_path / "qwen", json.dumps(QWEN2_05B))
    assert main(["estimate", str(folder), "--gpu", "RTX 3060 12GB", "--context", "4096", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("model", "parameters", "context", "batch", "available_bytes", "estimates", "suggestion"):
        assert key in data
    assert data["parameters"] == 494_032_768 and data["available_bytes"] == 12 << 30
    assert [e["precision"] for e in data["estimates"]] == ["fp32", "fp16", "bf16", "int8", "nf4", "fp4", "q8", "q4"]
    for e in data["estimates"]:
        for key in (
            "precision",
            "weights_bytes",
            "kv_cache_bytes",
            "activation_bytes",
            "overhead_bytes",
            "draft_bytes",
            "total_bytes",
            "fits",
        ):
            assert key in e
    assert data["suggestion"]["precision"] == "bf16" and data["suggestion"]["context"] == 4096
    assert data["suggestion"]["text"].startswith("bf16 fits with")


def test_cli_table_and_bad_model(capsys, tmp_path):
    from redline.app.cli import main

    folder = write_config(tmp_path / "m", json.dumps(STARTER_CONFIG))
    assert main(["estimate", str(folder), "--free-gb", "0.5", "--precision", "nf4"]) == 0
    out = capsys.readouterr().out
    assert "134,515,008 parameters" in out and "Nothing fits" in out
    bad = write_config(tmp_path / "bad", "[]")
    assert main(["estimate", str(bad)]) == 2
    assert "does not hold a JSON object" in capsys.readouterr().err


def test_engine_records_predicted_and_measured(tiny_model_dir, tmp_path, monkeypatch):
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.engine import Engine
    from redline.inference.estimate.calibration import history

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    engine = Engine("cpu")
    loaded = engine.load(str(tiny_model_dir), parse_precision("fp32"))
    assert loaded.predicted_bytes and loaded.predicted_bytes > 0
    result = engine.chat(
        [{"role": "user", "content": "Paris"}], SamplingSettings(max_new_tokens=4, temperature=0), DecodeOptions()
    )
    assert result.predicted_memory_bytes and result.measured_memory_bytes
    assert result.memory_error_pct == pytest.approx(
        100 * (result.predicted_memory_bytes - result.measured_memory_bytes) / result.measured_memory_bytes, abs=0.01
    )
    assert engine.memory_check.tokens == result.prompt_tokens + result.new_tokens
    records = history("cpu")
    assert len(records) == 1 and records[0]["measured_bytes"] == result.measured_memory_bytes


def test_shipped_starter_shape_matches_meta_count():
    from redline.inference.estimate.model_shapes import shipped_starter_shape

    shipped = shipped_starter_shape()
    fresh = shape_of(STARTER_CONFIG)
    shipped.name = fresh.name
    assert shipped.to_dict() == fresh.to_dict()


@pytest.mark.starter
def test_starter_folder_config_gives_the_shipped_shape(starter_dir):
    from redline.inference.estimate.model_shapes import shape_for_folder, shipped_starter_shape

    folder = shape_for_folder(starter_dir, "starter")
    shipped = shipped_starter_shape()
    for key in (
        "parameters",
        "layers",
        "heads",
        "kv_heads",
        "head_dim",
        "hidden",
        "intermediate",
        "vocab",
        "max_positions",
        "stored_dtype",
        "linears",
        "default_not_convert",
        "tied_linears",
    ):
        assert getattr(folder, key) == getattr(shipped, key), key


def test_weight_only_q8_q4_bytes(monkeypatch):
    """q8/q4 pack every Linear, a tied head as its own copy. q8's scales: one per row in torch's layout (CUDA,
    CPUs without Redline's kernels), one fp16 per 32 weights in GGUF's blocks (x86-64 CPUs with AVX2)."""
    from types import SimpleNamespace

    from redline.inference import cost

    shape = shape_of(STARTER_CONFIG)
    p, v, h = shape.parameters, 49152, 576
    q = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    rows = 30 * (576 + 192 + 192 + 576 + 1536 + 1536 + 576) + v
    spec = SimpleNamespace(name="q8", compute_dtype="bf16", quantised=False, skip_modules=(), label=lambda: "q8")
    q8 = weights_bytes(shape, spec, "cuda")
    assert q8.quantised == q + v * h and q8.constants == rows * 2 and q8.unquantised == (p - q) * 2
    monkeypatch.setattr(cost, "q8_in_blocks", lambda device: True)
    q8_blocks = weights_bytes(shape, spec, "cpu")
    assert q8_blocks.quantised == q8.quantised
    assert q8_blocks.constants == sum(o * (i // 32) * 2 for _, i, o, _b in shape.linears)
    spec.name = "q4"
    q4 = weights_bytes(shape, spec, "cpu")
    assert q4.quantised == (q + v * h) // 2 and q4.unquantised == (p - q) * 2
    assert q4.constants == sum(o * (i // 32) * 4 for _, i, o, _b in shape.linears)


def test_hub_id_offline_without_cache_says_so(monkeypatch, tmp_path):
    from redline.inference.errors import ModelSourceError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelSourceError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE is set"):
        read_shape("nobody/no-such-model")


def test_gguf_metadata_source(tmp_path, monkeypatch):
    """A .gguf file is estimated from its metadata (gguf.GGUFReader via transformers), never converted."""
    import gguf
    import numpy as np

    monkeypatch.setenv("REDLINE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(100)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shape = read_shape(str(path))
    assert (shape.layers, shape.heads, shape.kv_heads, shape.head_dim, shape.max_positions) == (2, 4, 2, 16, 512)
    assert shape.parameters == llama_formula(64, 128, 2, 4, 2, 100, tied=bool(shape.tied_linears))
    assert shape.stored_dtype == "bfloat16"  # Redline converts a float32 GGUF to bf16 unless asked for fp32
    assert shape.packed == [] and shape.file_types == {"F32": 1}  # nothing quantised to keep
    assert not any((tmp_path / "cache").rglob("*.safetensors"))


def test_the_fast_paths_fused_weights_are_counted_where_they_add_to_a_mapped_checkpoint(tiny_model_dir):
    """The fast path concatenates q/k/v and gate/up once; beside a checkpoint mapped in its own dtype (weights
    that are views of the file) those copies are new memory, and the estimate counts exactly them."""
    from redline.inference.decoding.fastpath import get_decoder
    from redline.inference.engine import Engine
    from redline.inference.estimate.calibration import loaded_shape, predict_loaded
    from redline.inference.estimate.estimator import fast_path_copy_bytes
    from redline.inference.memory.policy import releases_pages

    engine = Engine("cpu")
    loaded = engine.load(str(tiny_model_dir), parse_precision("fp32"))  # the tiny folder is stored in fp32
    shape = loaded_shape(loaded)
    assert shape.stored_dtype == "float32"
    before = predict_loaded(loaded, 64)
    assert before.fast_path_bytes == 0
    get_decoder(loaded, 64)
    layers = loaded.model.model.layers
    fused = sum(
        layer.self_attn.q_proj.weight.untyped_storage().nbytes() + layer.mlp.gate_proj.weight.untyped_storage().nbytes()
        for layer in layers
    )
    wb = weights_bytes(shape, parse_precision("fp32"))
    assert fast_path_copy_bytes(shape, parse_precision("fp32"), "cpu", wb, pages_released=False) == fused
    # Where the fast path gives the mapping's pages back (Linux), the copies replace them: nothing is added.
    released = releases_pages()
    after = predict_loaded(loaded, 64)  # once the fast path has run, whatever it adds stays with the model
    assert after.fast_path_bytes == (0 if released else fused)
    assert after.total_bytes == before.total_bytes + after.fast_path_bytes
    engine.unload()
    # Where the weights are copies already, or not float, or on a GPU, the fusion adds nothing.
    bf16 = parse_precision("bf16")
    assert fast_path_copy_bytes(shape, bf16, "cpu", weights_bytes(shape, bf16), False) == 0  # converted: copies
    assert fast_path_copy_bytes(shape, parse_precision("fp32"), "cuda", wb, False) == 0
    q8 = parse_precision("q8")
    assert fast_path_copy_bytes(shape, q8, "cpu", weights_bytes(shape, q8), False) == 0
    est = estimate(shape, parse_precision("fp32"), 64, strategy="fast")
    assert est.fast_path_bytes == (0 if released else fused)
    assert estimate(shape, parse_precision("fp32"), 64).fast_path_bytes == 0
