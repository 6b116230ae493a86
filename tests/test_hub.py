"""Hub downloads against a stand-in hub on 127.0.0.1: progress, interruption and resume, cancel, disk space,
gated and private repositories, offline."""

from __future__ import annotations

import collections
import json
import os

import pytest
from hub_server import FakeHub, Repo

from redline.inference.errors import Cancelled, ModelSourceError
from redline.inference.sources.resolve import resolve

BIG = bytes(range(256)) * 4096 * 3  # 3 MiB of weights


def model_repo(**kw) -> Repo:
    files = {
        "config.json": json.dumps({"model_type": "llama"}).encode(),
        "tokenizer.json": b"{}",
        "model.safetensors": BIG,
        "README.md": b"not downloaded",  # outside the model patterns
    }
    return Repo(files=files, lfs={"model.safetensors"}, **kw)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A fake hub with three repositories, and huggingface_hub pointed at it (HF_ENDPOINT) with its own cache."""
    from huggingface_hub import constants

    repos = {"me/tiny": model_repo(), "me/gated": model_repo(gated=True), "me/private": model_repo(private=True)}
    with FakeHub(repos) as server:
        cache = tmp_path / "hf-cache"
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        # huggingface_hub read these when it was imported; point the running process at the fake hub too.
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        monkeypatch.setattr(
            constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}"
        )
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
        # huggingface_hub writes what it received in chunks of 10 MB; smaller ones let a 3 MB file be cut part-way.
        monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 128 * 1024)
        server.cache = cache
        yield server


def blobs(cache):
    return list(cache.rglob("blobs/*"))


def test_download_reports_per_file_and_total_bytes(hub):
    seen = []
    folder = resolve("me/tiny").prepare(lambda f, p: seen.append((f, p)))
    assert (folder / "model.safetensors").read_bytes() == BIG
    assert (folder / "config.json").is_file() and not (folder / "README.md").exists()
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    per_file = [p for _, p in seen if "model.safetensors" in p]
    assert any("of 3.15 MB" in p for p in per_file), per_file[:3]  # the file's own size
    total = len(BIG) + len(b"{}") + len(json.dumps({"model_type": "llama"}))
    assert any(f"of {total / 1e6:.2f} MB at" in p and "/s" in p and "left" in p for p in per_file), per_file[-1]
    # A second call finds everything in the cache: nothing is fetched again.
    gets = sum(1 for m, path, _ in hub.requests if m == "GET" and "/resolve/" in path)
    assert resolve("me/tiny").prepare() == folder
    assert sum(1 for m, path, _ in hub.requests if m == "GET" and "/resolve/" in path) == gets


def test_dropped_connection_resumes_with_a_range_request(hub):
    hub.drop_after["model.safetensors"] = 1_000_000
    folder = resolve("me/tiny").prepare()
    assert (folder / "model.safetensors").read_bytes() == BIG
    ranges = [r for m, path, r in hub.requests if m == "GET" and path.endswith("model.safetensors") and r]
    # Resumed from the last chunk huggingface_hub had written (128 KiB chunks here), not from the start.
    assert ranges and int(ranges[0].split("=")[1].rstrip("-")) >= 1_000_000 - 128 * 1024, hub.requests


def test_cancel_keeps_the_partial_file_and_the_next_download_resumes(hub):
    hub.chunk_delay = 0.02
    state = {"bytes": 0}

    def progress(fraction, phase):
        if "model.safetensors" in phase:
            state["bytes"] = fraction

    with pytest.raises(Cancelled):
        resolve("me/tiny").prepare(progress, should_cancel=lambda: state["bytes"] > 0.2)
    partial = [b for b in blobs(hub.cache) if b.name.endswith(".redline-partial")]
    assert partial and 0 < partial[0].stat().st_size < len(BIG)
    size = partial[0].stat().st_size
    hub.chunk_delay = 0.0
    folder = resolve("me/tiny").prepare()
    assert (folder / "model.safetensors").read_bytes() == BIG
    ranges = [r for m, path, r in hub.requests if m == "GET" and path.endswith("model.safetensors") and r]
    assert ranges == [f"bytes={size}-"], "the second download asks for the rest of the file only"
    assert not [b for b in blobs(hub.cache) if b.name.endswith(".redline-partial")]


def test_not_enough_disk_space_is_refused_before_downloading(hub, monkeypatch):
    import shutil

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1_000_000, 1_000_000))
    with pytest.raises(ModelSourceError, match=r"Not enough disk space to download me/tiny: it needs 3\.15 MB"):
        resolve("me/tiny").prepare()
    assert not any("/resolve/" in path for _, path, _ in hub.requests)
    assert not blobs(hub.cache)


@pytest.mark.parametrize(
    "repo, words",
    [("me/gated", "gated model"), ("me/private", "not found on the Hugging Face hub, or it is private")],
)
def test_gated_and_private_repos_say_how_to_log_in(hub, repo, words):
    with pytest.raises(ModelSourceError) as err:
        resolve(repo).prepare()
    text = str(err.value)
    assert words in text and "hf auth login" in text and "HF_TOKEN" in text
    assert "Traceback" not in text and "\n" not in text


def test_cli_prints_the_login_message_without_a_traceback(hub, tmp_path):
    import subprocess
    import sys

    env = dict(os.environ, REDLINE_CACHE_DIR=str(tmp_path / "rl"))
    proc = subprocess.run(
        [sys.executable, "-m", "redline", "models", "pull", "me/gated"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2
    assert "gated model" in proc.stderr and "HF_TOKEN" in proc.stderr and "Traceback" not in proc.stderr


def test_offline_with_nothing_cached_says_so(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE is set"):
        resolve("me/tiny").prepare()
    assert not hub.requests
