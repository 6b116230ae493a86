"""What in a model folder could run code, and a fingerprint of it.

Model folders come from strangers. Custom architecture code (``auto_map`` in
config.json → .py files) runs on load, and pickle-based weights (.bin/.pt) can
run code when unpickled. Redline refuses both unless the user opts in for that
model; the fingerprint lets the app remember the opt-in and ask again when a
file changes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt")


def remote_code_files(folder: Path) -> list[str]:
    """The Python files a custom architecture would run (those auto_map names, plus any *.py present)."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    named = set()
    for ref in (cfg.get("auto_map") or {}).values():
        refs = ref if isinstance(ref, list) else [ref]
        for r in refs:
            if isinstance(r, str) and "." in r and "--" not in r:
                named.add(r.split(".")[0] + ".py")
            elif isinstance(r, str) and "--" in r:
                named.add(r)  # code from another hub repo: named as is
    present = {p.name for p in folder.glob("*.py")}
    return sorted(named | present)


def pickle_files(folder: Path) -> list[str]:
    return sorted({p.name for pattern in PICKLE_PATTERNS for p in folder.glob(pattern)})


def fingerprint(folder: Path, kind: str) -> str:
    """sha256 over what the opt-in covers. Code files are hashed whole; large weight files by
    name, size and modification time (hashing gigabytes on every start would be slow)."""
    h = hashlib.sha256(kind.encode())
    if kind == "remote_code":
        for name in remote_code_files(folder) + ["config.json"]:
            path = folder / name
            h.update(name.encode())
            h.update(path.read_bytes() if path.is_file() else b"<missing>")
    else:
        for name in pickle_files(folder):
            st = (folder / name).stat()
            h.update(f"{name}|{st.st_size}|{int(st.st_mtime)}".encode())
    return h.hexdigest()
