"""A load that runs out of memory says so, with the estimator's figure and what fits instead; a truncated
file is still reported as truncated."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    import psutil, torch, transformers  # the runtime first: the limit is set on top of it
    from redline.inference.engine import Engine
    from redline.inference.errors import RedlineError
    from redline.inference.precision import PrecisionSpec

    folder, headroom = sys.argv[1], int(sys.argv[2])
    engine = Engine(device="cpu")
    vms = psutil.Process().memory_info().vms
    resource.setrlimit(resource.RLIMIT_AS, (vms + headroom, resource.RLIM_INFINITY))
    try:
        engine.load(folder, PrecisionSpec("fp32"))
        print(json.dumps({"loaded": True}))
    except RedlineError as exc:
        print(json.dumps({"kind": type(exc).__name__, "text": str(exc)}))
    """
)


@pytest.fixture(scope="module")
def big_model_dir(tmp_path_factory):
    """A 2-layer Llama whose fp32 weights (about 290 MB) do not fit in the headroom the child allows."""
    from conftest import build_tiny_model, build_tokenizer

    tok = build_tokenizer(400)
    return build_tiny_model(
        tmp_path_factory.mktemp("big") / "big-llama",
        hidden=2048,
        layers=2,
        heads=16,
        kv_heads=4,
        tokenizer=tok,
        max_positions=2048,
    )


@pytest.mark.slow
def test_out_of_memory_under_an_address_space_limit(big_model_dir):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(big_model_dir), str(120 * 1000**2)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result.get("kind") == "OutOfMemory", result
    text = result["text"]
    assert text.startswith("Ran out of memory while loading big-llama in fp32 on cpu")
    assert "The estimator puts loading it at about" in text and "address-space limit (ulimit -v)" in text
    assert "truncated" not in text and "Traceback" not in text


def test_truncated_weights_are_still_reported_as_truncated(tiny_model_dir, tmp_path):
    import shutil

    from redline.inference.engine import Engine
    from redline.inference.errors import ModelLoadError
    from redline.inference.precision import PrecisionSpec

    broken = shutil.copytree(tiny_model_dir, tmp_path / "m")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        Engine(device="cpu").load(str(broken), PrecisionSpec("bf16"))


@pytest.mark.parametrize(
    "exc, oom",
    [
        (
            RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory: you tried"),
            True,
        ),
        (MemoryError(), True),
        (RuntimeError("std::bad_alloc"), True),
        (OSError(12, "Cannot allocate memory"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (
            Exception("unable to mmap 538090408 bytes from file <m.safetensors>: Cannot allocate memory (os error 12)"),
            True,
        ),
        (Exception("Error while deserializing header: incomplete metadata, file not fully covered"), False),
        (ValueError("invalid load key, 'x'."), False),
    ],
)
def test_allocation_failures_are_recognised(exc, oom):
    from redline.inference.memory.oom import is_oom

    assert is_oom(exc) is oom
    wrapped = RuntimeError("loading failed")
    wrapped.__cause__ = exc
    assert is_oom(wrapped) is oom


# `redline chat` in a child whose address space is limited (ulimit -v) at a point the test chooses: before torch
# is imported (its libraries cannot be mapped) or just after (no room left for torch's threads and a load). Either
# way the child must end with one sentence of Redline's (exit 2), never a traceback or libgomp's "Thread creation
# failed" abort.
LIMITED_CHAT = textwrap.dedent(
    """
    import resource, sys
    import psutil
    from redline.app.cli import main

    folder, when, headroom = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if when == "after-torch":
        import torch, transformers  # noqa: F401
    vms = psutil.Process().memory_info().vms
    resource.setrlimit(resource.RLIMIT_AS, (vms + headroom, resource.RLIM_INFINITY))
    sys.exit(main(["chat", "hi", "--model", folder, "--max-new-tokens", "2"]))
    """
)


def _limited_chat(folder, when: str, headroom: int):
    return subprocess.run(
        [sys.executable, "-c", LIMITED_CHAT, str(folder), when, str(headroom)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_an_address_space_too_small_for_torch_is_one_sentence(tiny_model_dir):
    proc = _limited_chat(tiny_model_dir, "before-torch", 64 * 1000**2)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("error: torch could not be loaded within this process's address-space limit (ulimit -v "), err
    assert "ulimit -v unlimited" in err
    assert "Traceback" not in proc.stderr and "libgomp" not in proc.stderr


@pytest.mark.slow
def test_an_address_space_without_room_for_threads_and_a_load_is_one_sentence(tiny_model_dir):
    proc = _limited_chat(tiny_model_dir, "after-torch", 100 * 1000**2)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("error: This process's address-space limit (ulimit -v "), err
    assert "once torch is loaded" in err and "threads and loading tiny-llama in " in err and "mid-start" in err
    assert "or at least ulimit -v " in err
    assert "Traceback" not in proc.stderr and "libgomp" not in proc.stderr


def test_no_address_space_limit_means_no_check(monkeypatch):
    from redline.inference.loading import loader

    monkeypatch.setattr(loader, "address_space_limit", lambda: None)
    loader.check_address_space("no-such-model", "auto")  # returns without reading anything
