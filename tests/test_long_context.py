"""Contexts as long as the model allows (issue 48, item 3): the model's own limit with its rope scaling as
transformers reads it, what each length costs (``redline estimate``), and sliding-window layers that keep only
their window. Tiny configs, no weights, no network."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from transformers import LlamaConfig, Qwen2Config

from redline.inference.cost import kv_cache_bytes
from redline.inference.estimate.estimator import context_limit, kv_geometry
from redline.inference.speed.arithmetic import Machine

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize(
    "config, limit",
    [
        (LlamaConfig(**TINY, max_position_embeddings=4096), 4096),
        # Qwen2.5's documented yarn: factor 4 over its 32,768 positions
        (
            Qwen2Config(
                **TINY,
                max_position_embeddings=32768,
                rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            ),
            131072,
        ),
        # yarn without the original length: transformers takes max_position_embeddings
        (LlamaConfig(**TINY, max_position_embeddings=4096, rope_scaling={"rope_type": "yarn", "factor": 2.0}), 8192),
        (LlamaConfig(**TINY, max_position_embeddings=2048, rope_scaling={"type": "linear", "factor": 4.0}), 8192),
        (LlamaConfig(**TINY, max_position_embeddings=2048, rope_scaling={"rope_type": "dynamic", "factor": 2.0}), 4096),
        # Llama 3.1: llama3 ×8 over 8,192, and 131,072 set already: the larger
        (
            LlamaConfig(
                **TINY,
                max_position_embeddings=131072,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "original_max_position_embeddings": 8192,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                },
            ),
            131072,
        ),
    ],
)
def test_the_context_limit_counts_the_rope_scaling(config, limit):
    assert context_limit(config) == limit


def test_a_rope_per_layer_type_and_a_plain_config_are_read_too():
    nested = SimpleNamespace(
        max_position_embeddings=8192,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0},
            "sliding_attention": {"rope_type": "default"},
        },
    )
    assert context_limit(nested) == 32768
    assert context_limit(SimpleNamespace(n_positions=1024)) == 1024
    assert context_limit(SimpleNamespace()) == 4096


def test_the_loaded_model_refuses_prompts_at_the_same_limit():
    from redline.inference.backends.local import LoadedModel

    cfg = Qwen2Config(**TINY, max_position_embeddings=1024, rope_scaling={"type": "yarn", "factor": 4.0})
    assert LoadedModel.context_limit.fget(SimpleNamespace(model=SimpleNamespace(config=cfg))) == 4096


def test_sliding_layers_keep_their_window_and_full_ones_every_token():
    cfg = SimpleNamespace(
        num_hidden_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=512,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )
    g = kv_geometry(cfg)
    assert g["layer_windows"] == [512, None, 512, None]
    row = 2 * 2 * 16 * 2  # K and V × KV heads × head dim × bf16
    at = lambda n, form="bf16": kv_cache_bytes(4, 2, 16, n, 1, 2, g["layer_windows"], form)  # noqa: E731
    assert at(8192) == row * (2 * 512 + 2 * 8192)
    assert at(256) == row * 4 * 256
    assert at(8192, "q8") == 2 * 2 * (16 + 2) * (2 * 512 + 2 * 8192)


def test_estimate_says_what_each_length_costs_up_to_the_models_limit(capsys, tmp_path, monkeypatch):
    from redline.app import cli_estimate
    from redline.app.cli import main

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    cpu = Machine("cpu", 20e9, 100e9, "a test CPU", "cpu")
    monkeypatch.setattr(cli_estimate, "cached_machine", lambda *a, **kw: cpu)
    # The kernels run, whatever this machine has.
    monkeypatch.setattr("redline.inference.cost.will_run", lambda: None)
    assert main(["estimate", "starter", "--free-gb", "16", "--kv", "q8", "--context", "3000", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    lengths = report["lengths"]
    assert report["kv"] == "q8" and report["max_positions"] == 8192
    assert lengths["kv_bytes_per_token"] == {"bf16": 2 * 30 * 3 * 64 * 2, "q8": 2 * 30 * 3 * 66}
    assert [r["context"] for r in lengths["rows"]] == [2048, 3000, 4096, 8192]
    last = lengths["rows"][-1]
    assert last["kv_q8_bytes"] == 2 * 30 * 3 * 66 * 8192 and last["kv_bf16_bytes"] == 2 * 30 * 3 * 128 * 8192
    q8 = next(e for e in report["estimates"] if e["precision"] == "q8")
    assert q8["kv_cache_bytes"] == 2 * 30 * 3 * 66 * 3000  # the table counts --kv q8 where the fast path runs
    rows = {(r["precision"], r["strategy"]): r for r in report["speed"]["predictions"]}
    assert rows[("q8", "fast")]["kv"] == "q8" and rows[("q8", "kv")]["kv"] == "bf16"
    assert main(["estimate", "starter", "--free-gb", "16", "--precision", "q8"]) == 0
    out = capsys.readouterr().out
    assert "KV cache per token: 23,040 bytes in 16 bits, 11,880 in 8 bits (--kv q8)" in out
    assert "up to the model's 8,192 tokens" in out


def test_the_fast_and_compiled_steps_read_the_same_limit():
    """The rotary tables and the compiled step's width stop at the rope-scaled limit, not at
    ``max_position_embeddings`` (a yarn x4 model over 1,024 positions allows 4,096)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from redline.inference.decoding.compiled import MIN_CONTEXT, step_context
    from redline.inference.decoding.fastpath import FastDecoder

    cfg = LlamaConfig(**TINY, max_position_embeddings=1024, rope_scaling={"rope_type": "linear", "factor": 4.0})
    dec = SimpleNamespace(model=SimpleNamespace(config=cfg), max_context=0, device="cpu")
    dec.rotary = LlamaRotaryEmbedding(cfg)
    FastDecoder.ensure_context(dec, 1500)  # beyond 1,024: the tables grow to the next power of two, 2,048
    assert dec.max_context == 2048 and tuple(dec.cos.shape) == (2048, 16)
    assert step_context(dec) == 4096  # the compiled step covers up to the limit (MIN_CONTEXT is 8,192)
    dec.model.config = LlamaConfig(**TINY, max_position_embeddings=1024)
    assert step_context(dec) == 1024 < MIN_CONTEXT
