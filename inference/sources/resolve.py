"""What a user can pass as a model, and how each form becomes a local folder.

Accepted forms: ``starter``; a local transformers folder (with config.json);
a ``.gguf`` file (converted once and cached); a Hugging Face hub id
(``owner/name``: the local HF cache first, a download when online).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ModelSourceError
from ..progress import CancelFn, ProgressFn, noop_progress
from .gguf import cache_folder_for, convert_gguf, is_complete
from .hub import download
from .starter import STARTER_NAME, ensure_starter, starter_folder

ACCEPTED_FORMS = (
    "'starter' (the built-in SmolLM2-135M-Instruct), "
    "a local model folder containing config.json, "
    "a .gguf file, "
    "or a Hugging Face hub id such as 'HuggingFaceTB/SmolLM2-360M-Instruct'"
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "starter" | "folder" | "gguf" | "hub"
    spec: str  # what the user typed
    name: str  # short display name
    path: Optional[Path] = None  # folder or gguf file; None for hub/starter until prepared

    def local_folder(self) -> Optional[Path]:
        """The transformers folder if it is already on disk, without fetching anything."""
        if self.kind == "folder":
            return self.path
        if self.kind == "starter":
            return starter_folder() if is_complete(starter_folder()) else None
        if self.kind == "gguf":
            dest = cache_folder_for(self.path)
            return dest if is_complete(dest) else None
        if self.kind == "hub":
            return _hub_cached_folder(self.spec)
        return None

    def prepare(self, progress: ProgressFn = noop_progress, should_cancel: Optional[CancelFn] = None) -> Path:
        """Return a local transformers folder, fetching or converting it if needed."""
        if self.kind == "folder":
            return self.path
        if self.kind == "starter":
            return ensure_starter(progress, should_cancel)
        if self.kind == "gguf":
            return convert_gguf(self.path, cache_folder_for(self.path), progress, should_cancel)
        if self.kind == "hub":
            cached = _hub_cached_folder(self.spec)
            if cached is not None:
                return cached
            return _hub_download(self.spec, progress, should_cancel)
        raise ModelSourceError(f"Unknown model source kind {self.kind!r}.")


def resolve(spec: str) -> ModelSource:
    """Turn a user's model argument into a ModelSource, or explain what is accepted."""
    if not spec or not spec.strip():
        raise ModelSourceError("No model given.", f"Pass one of: {ACCEPTED_FORMS}.")
    spec = spec.strip()
    if spec.lower() == "starter":
        return ModelSource("starter", spec, STARTER_NAME)
    path = Path(os.path.expanduser(spec))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(
                f"The folder {path} has no config.json, so it is not a transformers model folder.",
                f"Point --model at the folder that holds config.json, or pass one of: {ACCEPTED_FORMS}.",
            )
        return ModelSource("folder", spec, path.resolve().name, path.resolve())
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelSourceError(f"GGUF file not found: {path}.", "Check the path.")
        return ModelSource("gguf", spec, path.stem, path.resolve())
    if path.exists():
        raise ModelSourceError(f"{path} is a file but not a .gguf file.", f"Pass one of: {ACCEPTED_FORMS}.")
    looks_like_path = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec
    if _HUB_ID.match(spec) and not looks_like_path:
        return ModelSource("hub", spec, spec.split("/")[-1])
    raise ModelSourceError(f"No model found at {spec!r}.", f"Pass one of: {ACCEPTED_FORMS}.")


def _hub_cached_folder(repo_id: str) -> Optional[Path]:
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:
        return None
    return folder if (folder / "config.json").is_file() else None


def _hub_download(repo_id: str, progress: ProgressFn, should_cancel: Optional[CancelFn] = None) -> Path:

    return download(repo_id, progress, should_cancel)
