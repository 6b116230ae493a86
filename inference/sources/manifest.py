"""The manifest of a folder that keeps quantised weights quantised (``redline_quantization.json``, written by the
GGUF conversion, read by ``loading/packed.py`` and the estimator): which layers are stored in blocks, at what bits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..errors import ModelLoadError

MANIFEST = "redline_quantization.json"


FORMAT = "redline-blocks"


VERSION = 1


def write_manifest(folder: Path, modules: dict[str, dict], source: str) -> None:
    # lazy: block_quant imports torch (torch loads on the engine's thread, never at import)
    from ..kernels.block_quant import BLOCK

    data = {"format": FORMAT, "version": VERSION, "block_size": BLOCK, "source": source, "modules": modules}
    (folder / MANIFEST).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def read_manifest(folder: Path) -> Optional[dict]:
    """The folder's manifest, or None for an ordinary folder; a broken one is an error that names it."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(
            f"{path} cannot be read ({exc}).", "Delete the folder and convert the GGUF again."
        ) from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("modules"), dict):
        raise ModelLoadError(
            f"{path} is not a Redline quantisation manifest.", "Delete the folder and convert the GGUF again."
        )
    if int(data.get("version", 0)) > VERSION or int(data.get("block_size", 0)) != 32:
        raise ModelLoadError(
            f"{path} is format version {data.get('version')} with blocks of {data.get('block_size')}; this Redline "
            f"reads version {VERSION} with blocks of 32.",
            "Upgrade Redline, or delete the folder and convert the GGUF again.",
        )
    return data


def file_bits(manifest: dict) -> str:
    """``q4``, ``q8`` or ``q4/q8``: the bits the folder's layers are stored in."""
    bits = sorted({int(m["bits"]) for m in manifest["modules"].values()})
    return "/".join(f"q{b}" for b in bits) or "none"
