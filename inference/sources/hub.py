"""Downloading a model from the Hugging Face hub: per-file and total progress, resume, cancel, disk space.

The files are listed first (``HfApi.repo_info`` for the commit, ``list_repo_tree`` for their sizes), the
space they need is checked against the free space of the hub cache, and each file is fetched with
huggingface_hub's own ``http_get`` and a tqdm class of our own, so its byte counts reach Redline's
``ProgressFn`` (file, bytes, speed, time left).

Resuming: ``http_get`` resumes a dropped connection itself (a range request for the rest). huggingface_hub
2.x deletes its partial file when a download stops for any other reason (a cancel, a crash), so Redline
keeps its own: each file is written to ``blobs/<etag>.redline-partial`` in the hub cache and continued with
a range request next time; when complete it becomes the cache's blob and ``hf_hub_download`` adds the
snapshot's pointer to it without downloading anything.

Errors that mean "log in" (gated or private repositories, 401/403) say how to log in, never a traceback.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tqdm.auto import tqdm as base_tqdm

from ..errors import Cancelled, ModelSourceError
from ..progress import CancelFn, ProgressFn, check_cancel, noop_progress
from ..units import MB, format_bytes

MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model"]
DISK_MARGIN_BYTES = 50 * MB  # kept free beyond the files themselves
PARTIAL = ".redline-partial"  # a file part-downloaded by Redline, continued next time
LOGIN = "log in with `hf auth login` (formerly `huggingface-cli login`) or set HF_TOKEN to an access token"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


@dataclass
class HubFile:
    path: str
    size: int
    blob: str  # the cache's blob name: the LFS sha256, else the git blob id


def _explain(repo_id: str, exc: BaseException) -> ModelSourceError:
    """A hub error as one sentence a user can act on."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, GatedRepoError):
        return ModelSourceError(
            f"{repo_id} is a gated model: its authors ask you to accept their terms before downloading it.",
            f"Accept them on the model's page on the Hugging Face hub, then {LOGIN}.",
        )
    if isinstance(exc, RepositoryNotFoundError):
        return ModelSourceError(
            f"{repo_id} was not found on the Hugging Face hub, or it is private.",
            f"Check the id; for a private model, {LOGIN}.",
        )
    if isinstance(exc, RevisionNotFoundError):
        return ModelSourceError(f"{repo_id} has no such revision on the hub.", "Check the id.")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, HfHubHTTPError) and status in (401, 403):
        return ModelSourceError(
            f"The Hugging Face hub refused access to {repo_id} (HTTP {status}).",
            f"If the model is private or gated, {LOGIN}.",
        )
    if isinstance(exc, LocalEntryNotFoundError) or isinstance(exc, (OSError, ConnectionError)):
        return ModelSourceError(
            f"Could not reach the Hugging Face hub to download {repo_id} ({type(exc).__name__}: {exc}).",
            "Check your connection, or pass a local model folder or .gguf file.",
        )
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return ModelSourceError(
        f"Could not download {repo_id} from the Hugging Face hub ({text}).",
        "Check the id and your connection, or pass a local model folder or .gguf file.",
    )


def list_files(repo_id: str, patterns: list[str] = MODEL_FILES) -> tuple[str, list[HubFile]]:
    """The commit and the files (with sizes) a download of ``repo_id`` would fetch."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import HfApi

    # lazy: the hub client loads only when the hub is used
    from huggingface_hub.hf_api import RepoFile

    api = HfApi()
    try:
        commit = api.repo_info(repo_id).sha
        files = [
            HubFile(f.path, int(f.size or 0), f.lfs.sha256 if f.lfs is not None else f.blob_id)
            for f in api.list_repo_tree(repo_id, recursive=True, revision=commit)
            if isinstance(f, RepoFile) and any(fnmatch.fnmatch(f.path, p) for p in patterns)
        ]
    except Exception as exc:
        raise _explain(repo_id, exc) from exc
    if not any(f.path == "config.json" for f in files):
        raise ModelSourceError(
            f"{repo_id} has no config.json, so it is not a transformers model.",
            "Pass the id of a transformers model repository, or a .gguf file you downloaded.",
        )
    return commit, files


def _storage(repo_id: str) -> Path:
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))


def bytes_still_needed(repo_id: str, files: list[HubFile]) -> int:
    """What the download still has to write: files not in the cache, less what partial downloads hold."""
    blobs = _storage(repo_id) / "blobs"
    needed = 0
    for f in files:
        if (blobs / f.blob).is_file():
            continue
        partial = blobs / f"{f.blob}{PARTIAL}"
        needed += max(0, f.size - (partial.stat().st_size if partial.is_file() else 0))
    return needed


def check_disk_space(repo_id: str, needed: int) -> None:
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import constants

    where = Path(constants.HF_HUB_CACHE)
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(str(probe)).free
    if needed + DISK_MARGIN_BYTES > free:
        raise ModelSourceError(
            f"Not enough disk space to download {repo_id}: it needs {format_bytes(needed)} more in {where}, "
            f"and that disk has {format_bytes(free)} free.",
            "Free some space, or set HF_HUB_CACHE to a folder on a disk with more room.",
        )


class _Totals:
    """Bytes across all files, for the total progress, speed and time left."""

    def __init__(self, repo_id: str, total: int, progress: ProgressFn, should_cancel: Optional[CancelFn]):
        self.repo_id, self.total, self.progress, self.should_cancel = repo_id, max(1, total), progress, should_cancel
        self.done = 0
        self.started = time.monotonic()
        self.last = 0.0
        self.file = ""
        self.file_size = 0
        self.file_done = 0
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        check_cancel(self.should_cancel)
        with self.lock:
            self.done += n
            self.file_done += n
            now = time.monotonic()
            if now - self.last < 0.1 and self.file_done < self.file_size:
                return
            self.last = now
            elapsed = max(now - self.started, 1e-6)
            speed = self.done / elapsed
            left = (self.total - self.done) / speed if speed > 0 else 0
            self.progress(
                min(1.0, self.done / self.total),
                f"Downloading {self.repo_id}: {self.file} {format_bytes(self.file_done)} of "
                f"{format_bytes(self.file_size)}; {format_bytes(self.done)} of {format_bytes(self.total)} at "
                f"{format_bytes(speed)}/s, about {left:.0f} s left",
            )


def _tqdm_class(totals: _Totals):

    class Reporting(base_tqdm):
        """huggingface_hub's byte bar for one file, reported into ``totals`` instead of the terminal."""

        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            initial = int(kwargs.get("initial") or 0)  # bytes a resumed download already has
            if initial:
                totals.add(initial)

        def update(self, n=1):
            totals.add(int(n or 0))
            return True

    return Reporting


def _fetch(repo_id: str, f: HubFile, commit: str, cls) -> Path:
    """One file into the cache, continuing a partial download left by an earlier attempt."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    # lazy: the hub client loads only when the hub is used
    from huggingface_hub.file_download import http_get

    # lazy: the hub client loads only when the hub is used
    from huggingface_hub.utils import build_hf_headers

    try:
        return Path(hf_hub_download(repo_id, f.path, revision=commit, local_files_only=True))
    except Exception:
        pass  # not in the cache yet
    headers = build_hf_headers()
    meta = get_hf_file_metadata(hf_hub_url(repo_id, f.path, revision=commit), headers=headers)
    blobs = _storage(repo_id) / "blobs"
    blob = blobs / meta.etag
    if not blob.is_file():
        blobs.mkdir(parents=True, exist_ok=True)
        partial = blobs / f"{meta.etag}{PARTIAL}"
        with open(partial, "ab") as out:
            done = out.tell()
            if meta.size is not None and done > meta.size:  # not this file after all: start again
                out.truncate(0)
                out.seek(0)
                done = 0
            http_get(meta.location, out, resume_size=done, headers=headers, expected_size=meta.size, tqdm_class=cls)
        os.replace(partial, blob)
    # The blob is in place: hf_hub_download only adds the snapshot's pointer to it.
    return Path(hf_hub_download(repo_id, f.path, revision=commit, etag_timeout=10))


def download(repo_id: str, progress: ProgressFn = noop_progress, should_cancel: Optional[CancelFn] = None) -> Path:
    """Download ``repo_id``'s model files into the hub cache and return the snapshot folder."""
    if offline():
        raise ModelSourceError(
            f"{repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set.",
            "Unset HF_HUB_OFFLINE to download it, or pass a local folder.",
        )
    progress(0.0, f"Listing the files of {repo_id}")
    commit, files = list_files(repo_id)
    check_disk_space(repo_id, bytes_still_needed(repo_id, files))
    totals = _Totals(repo_id, sum(f.size for f in files), progress, should_cancel)
    cls = _tqdm_class(totals)
    folder: Optional[Path] = None
    for f in sorted(files, key=lambda f: f.size):
        check_cancel(should_cancel)
        totals.file, totals.file_size, totals.file_done = f.path, f.size, 0
        before = totals.done
        try:
            path = _fetch(repo_id, f, commit, cls)
        except Cancelled:
            raise
        except Exception as exc:
            raise _explain(repo_id, exc) from exc
        totals.done = before + f.size  # a file already in the cache reports nothing
        folder = path.parents[len(Path(f.path).parts) - 1]
    progress(1.0, f"Downloaded {repo_id} ({format_bytes(totals.total)})")
    assert folder is not None
    return folder
