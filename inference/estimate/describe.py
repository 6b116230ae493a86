"""What the wizard shows about a model before anything is loaded: what it is, whether it is here.

``describe`` validates what the user named (the same forms ``--model`` accepts) and reads its
shape for the estimator from the config alone. It imports torch for a model it has not seen
before (the estimator builds the architecture on the meta device), so the GUI runs it on the
engine thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..sources.resolve import resolve
from .estimator import ModelShape
from .model_shapes import read_shape

STARTER_FETCH_BYTES = 100_000_000  # the starter's download the first time (README: about 100 MB)


@dataclass
class ModelDescription:
    spec: str  # what to pass as the model (settings.model)
    kind: str  # starter | folder | gguf | hub
    name: str
    shape: ModelShape
    local_folder: Optional[str]  # the transformers folder when already on disk
    size_bytes: Optional[int]  # on disk: the folder, the .gguf file, or the hub cache snapshot
    offline: bool  # loads without a network

    def summary(self) -> str:
        s = self.shape
        params = f"{s.parameters / 1e9:.2f} B" if s.parameters >= 1e9 else f"{s.parameters / 1e6:.0f} M"
        text = (
            f"{self.name}: {s.architecture}, {params} parameters, {s.layers} layers, {s.kv_heads} KV heads "
            f"× {s.head_dim}, up to {s.max_positions:,} tokens of context."
        )
        return text

    def availability(self) -> str:
        size = f"{self.size_bytes / 1e6:,.0f} MB on disk" if self.size_bytes else None
        if self.kind == "starter":
            return (
                f"Fetched ({size}); available offline."
                if self.offline
                else f"Not fetched yet: about {STARTER_FETCH_BYTES // 1_000_000} MB to download the first time, "
                "then offline."
            )
        if self.kind == "hub":
            return (
                f"In the local Hugging Face cache ({size}); available offline."
                if self.offline
                else "Not in the local cache: loading downloads it (needs a network)."
            )
        if self.kind == "gguf":
            converted = (
                " (already converted; loads in seconds)"
                if self.local_folder
                else " (converted once into the cache on first load)"
            )
            return f"GGUF file, {size}{converted}; available offline."
        if self.size_bytes:
            return f"Local folder, {size} of weights; available offline."
        return "This folder holds no weight files (*.safetensors): it can be estimated but not loaded."

    @property
    def loadable(self) -> bool:
        return not (self.kind == "folder" and not self.size_bytes)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def describe(spec: str) -> ModelDescription:
    """Validate ``spec`` and read its shape; raises a RedlineError with the reason when it cannot be used."""
    source = resolve(spec)
    shape = read_shape(spec)
    folder = source.local_folder()
    size: Optional[int] = None
    if source.kind == "gguf":
        size = source.path.stat().st_size
    elif source.kind == "folder":
        size = sum(f.stat().st_size for f in source.path.glob("*.safetensors")) or None
        if size is None:
            size = sum(f.stat().st_size for f in source.path.glob("*.bin")) or None
    elif folder is not None:
        size = _size(folder)
    offline = source.kind in ("folder", "gguf") or folder is not None
    return ModelDescription(
        spec=spec.strip(),
        kind=source.kind,
        name=source.name,
        shape=shape,
        local_folder=str(folder) if folder else None,
        size_bytes=size,
        offline=offline,
    )
