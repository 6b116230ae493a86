"""The fast decode step compiled (Inductor on a CPU): same tokens as eager, kept across processes, and never
a broken reply when the saved compile is bad."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from redline.inference.decoding.fastpath import get_decoder
from redline.inference.engine import Engine
from redline.inference.precision import parse_precision

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [1, 2, 3, 4, 5]


def greedy(dec, n: int = 16) -> list[int]:
    tok, pos, out = int(dec.prefill(torch.tensor(PROMPT)).argmax()), len(PROMPT), []
    for _ in range(n):
        tok = int(dec.step(torch.tensor([tok]), [pos], [0])[0].argmax())
        out.append(tok)
        pos += 1
    return out


@pytest.fixture()
def decoder(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_COMPILED_DIR", str(tmp_path / "compiled"))
    engine = Engine("cpu")
    engine.record_memory = False
    engine.load(str(tiny_model_dir), parse_precision("fp32"))
    return get_decoder(engine.target, 256)


def test_compiled_step_gives_the_eager_tokens(decoder):
    eager = greedy(decoder)
    compiled = decoder.compile_in_background(1)
    assert compiled.wait(600), compiled.status()
    assert greedy(decoder) == eager
    assert compiled.artifact_path.is_file()  # kept for the next start


def test_a_corrupt_saved_compile_is_set_aside_and_compiled_anew(decoder):
    from redline.inference.decoding.compiled import CompiledStep

    step = CompiledStep(decoder, 1)
    step.artifact_path.parent.mkdir(parents=True, exist_ok=True)
    step.artifact_path.write_bytes(b"not a compile at all")
    decoder.compiled = step
    step.start()
    assert step.wait(600), step.status()
    assert "could not be read" in step.note and step.cache_hit is False
    assert list(step.artifact_path.parent.glob("*.corrupt-*"))
    assert greedy(decoder)  # replies still run


def test_a_failing_compiled_step_falls_back_to_eager(decoder, monkeypatch):
    compiled = decoder.compile_in_background(1)
    assert compiled.wait(600)
    eager_tokens = None

    def broken(*args, **kwargs):
        raise RuntimeError("a kernel went wrong")

    compiled._fn = broken
    tokens = greedy(decoder)
    decoder.compiled = None
    eager_tokens = greedy(decoder)
    assert tokens == eager_tokens and compiled.state == "failed" and "eager" in compiled.note


@pytest.mark.slow
def test_a_second_process_reuses_the_saved_compile(tiny_model_dir, tmp_path):
    """Counted by Inductor's own FX-graph cache: the second process, with an empty Inductor cache of its own,
    hits it through the compile Redline saved."""
    probe = (
        "import json, sys, torch\n"
        "from torch._dynamo.utils import counters\n"
        "from redline.inference.engine import Engine\n"
        "from redline.inference.precision import parse_precision\n"
        "from redline.inference.decoding.fastpath import get_decoder\n"
        "e = Engine('cpu'); e.record_memory = False\n"
        "e.load(sys.argv[1], parse_precision('fp32'))\n"
        "d = get_decoder(e.target, 256)\n"
        "c = d.compile_in_background(1); ok = c.wait(600)\n"
        "print(json.dumps({'ok': ok, 'hit': c.cache_hit, 'counters': dict(counters['inductor'])}))\n"
    )
    env = dict(os.environ, REDLINE_COMPILED_DIR=str(tmp_path / "compiled"))
    runs = []
    for n in range(2):
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / f"inductor-{n}")  # nothing shared but Redline's file
        out = subprocess.run(
            [sys.executable, "-c", probe, str(tiny_model_dir)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT.parent,
            timeout=900,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["ok"] and not first["hit"] and first["counters"].get("fxgraph_cache_miss", 0) >= 1
    assert second["ok"] and second["hit"] and second["counters"].get("fxgraph_cache_hit", 0) >= 1
