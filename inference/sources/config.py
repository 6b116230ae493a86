"""A model folder's config and tokenizer, read with errors that name the file and what to do, and the opt-in that
a model's own code needs before it runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..errors import ModelLoadError, NeedsOptIn, RedlineError
from .resolve import resolve
from .trust import fingerprint, remote_code_files


def read_config(folder: Path) -> dict:
    """Read config.json with errors that name the file and the problem."""
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing.", "A transformers model folder needs config.json.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}).",
            "Restore the file from the model's original download.",
        ) from exc
    except UnicodeDecodeError as exc:
        raise ModelLoadError(f"{path} is not a text file.", "Restore it from the original download.") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object.", "Restore it from the original download.")
    if "model_type" not in data:
        raise ModelLoadError(
            f"{path} has no 'model_type' field, so the architecture is unknown.",
            "Restore the file from the model's original download.",
        )
    return data


def _remote_code_opt_in(folder: Path) -> NeedsOptIn:
    files = remote_code_files(folder)
    return NeedsOptIn(
        f"{folder.name} needs custom Python code shipped with the model ({', '.join(files) or 'auto_map'}), "
        "which Redline does not run unless you opt in.",
        "If you trust its author, opt in for this model with --trust-remote-code.",
        "remote_code",
        folder,
        files,
        fingerprint(folder, "remote_code"),
    )


def code_opt_in(spec: str) -> Optional[NeedsOptIn]:
    """The opt-in that loading ``spec`` (a ``--model`` value) would ask for because its folder ships custom code,
    read from its config.json on disk alone (nothing fetched, nothing run); None when it asks none or the folder
    is not here yet. Asked before anything reads the model's shape, so an untrusted model is refused for that
    reason, not for a field its custom config leaves out."""

    try:
        folder = resolve(spec).local_folder()
        data = json.loads((folder / "config.json").read_text(encoding="utf-8")) if folder is not None else None
    except (RedlineError, OSError, ValueError):
        return None  # the load itself says what is wrong with the folder
    if not isinstance(data, dict) or "auto_map" not in data:
        return None
    return _remote_code_opt_in(folder)


def load_config(folder: Path, trust_remote_code: bool = False):
    # lazy: transformers loads on the engine's thread, never at import
    from transformers import AutoConfig

    data = read_config(folder)
    if "auto_map" in data and not trust_remote_code:
        raise _remote_code_opt_in(folder)
    try:
        return AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except (ValueError, KeyError) as exc:
        raise ModelLoadError(
            f"{folder / 'config.json'}: model_type {data.get('model_type')!r} is not an architecture this "
            f"version of transformers knows ({exc}).",
            "Upgrade transformers, or choose a model of a supported architecture.",
        ) from exc


def load_tokenizer(folder: Path, trust_remote_code: bool = False):
    # lazy: transformers loads on the engine's thread, never at import
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(
            f"Could not load the tokenizer in {folder} ({type(exc).__name__}: {exc}).",
            "The folder needs tokenizer.json or tokenizer.model and tokenizer_config.json.",
        ) from exc
    return tok
