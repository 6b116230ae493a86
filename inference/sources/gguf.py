"""Convert a GGUF file into a normal transformers folder, once.

transformers can read GGUF (through the ``gguf`` package) but de-quantising on
every load takes tens of seconds. We convert once into safetensors and load the
folder afterwards in about a second. The GGUF's quantised values are
de-quantised to float32, so the folder holds exactly what the GGUF holds.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from redline.inference.errors import ModelLoadError
from redline.inference.paths import models_dir
from redline.inference.progress import CancelFn, ProgressFn, check_cancel, noop_progress, transformers_progress

COMPLETE_MARKER = ".redline-complete"


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).exists() and (folder / "config.json").exists()


def cache_folder_for(gguf_path: Path) -> Path:
    """A stable cache folder per GGUF file (name + size + mtime), so edits reconvert."""
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:12]
    return models_dir() / "gguf" / f"{gguf_path.stem}-{key}"


def convert_gguf(
    gguf_path: Path, dest: Path, progress: ProgressFn = noop_progress, should_cancel: Optional[CancelFn] = None
) -> Path:
    """Convert ``gguf_path`` into ``dest`` atomically (temp folder, then rename)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    if is_complete(dest):
        return dest
    if not gguf_path.is_file():
        raise ModelLoadError(f"GGUF file not found: {gguf_path}.", "Check the path.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=dest.parent))
    try:
        progress(0.0, "Reading GGUF tokenizer")
        try:
            tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            check_cancel(should_cancel)
            with transformers_progress(progress, 0.05, 0.85, "Converting GGUF", should_cancel):
                model = AutoModelForCausalLM.from_pretrained(
                    str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
                )
        except (ValueError, KeyError, OSError, RuntimeError) as exc:
            raise ModelLoadError(
                f"Could not read GGUF file {gguf_path.name}: {exc}",
                "The file may be truncated or use an architecture transformers cannot convert; "
                "try the model's Hugging Face folder instead.",
            ) from exc
        check_cancel(should_cancel)
        progress(0.88, "Writing safetensors")
        # transformers marks a GGUF-loaded model as quantised and refuses to save
        # it; after de-quantisation the weights are plain float32, so drop the mark.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / COMPLETE_MARKER).write_text(f"converted from {gguf_path.name}\n")
        del model
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
        progress(1.0, "Converted")
        return dest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
