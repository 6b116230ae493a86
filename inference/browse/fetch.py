"""Download one variant from its row, with issue 19's progress, resume, cancel and disk-space check
(``sources.hub``), and say what to load it as: the configuration that was predicted.

A safetensors variant downloads the repository's model files (the same for every precision) and loads as the
hub id at the variant's precision; a GGUF variant downloads its one file and loads as that file's path, as the
file is (``gguf``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import Cancelled
from ..progress import CancelFn, ProgressFn, check_cancel, noop_progress
from ..sources import hub
from ..units import format_bytes
from .errors import check_online
from .predict import VariantPrediction
from .variants import RepoVariants, Variant


@dataclass
class Fetched:
    model: str  # what to pass as --model / LoadRequest.model
    precision: str  # the precision predicted
    strategy: str  # the strategy predicted ("" when none was)
    path: Path  # the snapshot folder or the .gguf file
    bytes: int


def _gguf_file(repo_id: str, commit: str, variant: Variant, progress: ProgressFn, should_cancel) -> Path:
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import HfApi

    # lazy: the hub client loads only when the hub is used
    from huggingface_hub.hf_api import RepoFile

    try:
        entries = [
            f
            for f in HfApi().list_repo_tree(repo_id, recursive=True, revision=commit)
            if isinstance(f, RepoFile) and f.path in variant.files
        ]
    except Exception as exc:
        raise hub._explain(repo_id, exc) from exc
    files = [hub.HubFile(f.path, int(f.size or 0), f.lfs.sha256 if f.lfs is not None else f.blob_id) for f in entries]
    hub.check_disk_space(repo_id, hub.bytes_still_needed(repo_id, files))
    totals = hub._Totals(repo_id, sum(f.size for f in files), progress, should_cancel)
    cls = hub._tqdm_class(totals)
    path: Optional[Path] = None
    for f in files:
        check_cancel(should_cancel)
        totals.file, totals.file_size, totals.file_done = f.path, f.size, 0
        before = totals.done
        try:
            path = hub._fetch(repo_id, f, commit, cls)
        except Cancelled:
            raise
        except Exception as exc:
            raise hub._explain(repo_id, exc) from exc
        totals.done = before + f.size
    progress(1.0, f"Downloaded {variant.files[0]} ({format_bytes(totals.total)})")
    assert path is not None
    return path


def fetch(
    rv: RepoVariants,
    variant: Variant,
    prediction: Optional[VariantPrediction] = None,
    progress: ProgressFn = noop_progress,
    should_cancel: Optional[CancelFn] = None,
) -> Fetched:
    """Download ``variant`` of ``rv`` into the hub cache; what to load, in the predicted configuration."""

    check_online()
    strategy = prediction.strategy if prediction is not None else ""
    if rv.kind == "gguf":
        path = _gguf_file(rv.repo_id, rv.commit, variant, progress, should_cancel)
        return Fetched(str(path), variant.precision, strategy, path, variant.download_bytes)
    folder = hub.download(rv.repo_id, progress, should_cancel)
    return Fetched(rv.repo_id, variant.precision, strategy, folder, variant.download_bytes)
