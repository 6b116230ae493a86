"""Broken model folders get clear errors that name the file and the fix."""

import shutil

import pytest

from redline.inference.engine import Engine
from redline.inference.errors import ModelLoadError, ModelSourceError, RedlineError, UnsupportedConfiguration
from redline.inference.precision import PrecisionSpec, parse_precision


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


def load(path):
    return Engine(device="cpu").load(str(path), PrecisionSpec("fp32"))


def test_missing_config(tiny_model_dir, tmp_path):
    broken = copy_model(tiny_model_dir, tmp_path / "m")
    (broken / "config.json").unlink()
    with pytest.raises(ModelSourceError, match="config.json"):
        load(broken)


def test_config_not_json(tiny_model_dir, tmp_path):
    broken = copy_model(tiny_model_dir, tmp_path / "m")
    (broken / "config.json").write_text("{ not json")
    with pytest.raises(ModelLoadError, match=r"config.json is not valid JSON \(line 1"):
        load(broken)


def test_unknown_architecture(tiny_model_dir, tmp_path):
    broken = copy_model(tiny_model_dir, tmp_path / "m")
    text = (broken / "config.json").read_text().replace('"llama"', '"no-such-arch"')
    (broken / "config.json").write_text(text)
    with pytest.raises(ModelLoadError, match="no-such-arch"):
        load(broken)


def test_truncated_safetensors(tiny_model_dir, tmp_path):
    broken = copy_model(tiny_model_dir, tmp_path / "m")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        load(broken)


def test_no_weights(tiny_model_dir, tmp_path):
    broken = copy_model(tiny_model_dir, tmp_path / "m")
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weight files"):
        load(broken)


def test_pickle_weights_refused_without_opt_in(tiny_model_dir, tmp_path):
    broken = copy_model(tiny_model_dir, tmp_path / "m")
    (broken / "model.safetensors").unlink()
    (broken / "pytorch_model.bin").write_bytes(b"\x80\x04junk")
    from redline.inference.errors import NeedsOptIn

    with pytest.raises(NeedsOptIn, match="pickle"):
        load(broken)


def test_custom_code_refused(tiny_model_dir, tmp_path):
    import json

    broken = copy_model(tiny_model_dir, tmp_path / "m")
    cfg = json.loads((broken / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedConfiguration, match="trust-remote-code"):
        load(broken)


def test_nonexistent_path():
    with pytest.raises(ModelSourceError, match="No model found"):
        load("/definitely/not/here")


def test_precision_parsing_and_errors():
    p = parse_precision("nf4+keep=lm_head,embed_tokens+compute=fp32+dq=0")
    assert p.name == "nf4" and p.skip_modules == ("lm_head", "embed_tokens")
    assert p.compute_dtype == "fp32" and p.double_quant is False
    with pytest.raises(RedlineError, match="Choose one of"):
        parse_precision("int3")
