"""Remembered opt-ins to run a model's own code or unpickle its weights.

Keyed by the model folder and the kind of opt-in; the stored fingerprint must
match the folder's current one (``inference.sources.trust.fingerprint``), so a changed
file asks again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional

from ..inference import NeedsOptIn
from .private_files import config_dir, write_private


class TrustStore:
    def __init__(self, path: Optional[Path] = None):
        self.path = path or (config_dir() / "trust.json")
        self._data = self._read()

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # no file yet, or unreadable: trust nothing

    @staticmethod
    def _key(folder, kind: str) -> str:
        return f"{kind}:{Path(folder).resolve()}"

    def is_trusted(self, folder, kind: str, fingerprint: str) -> bool:
        entry = self._data.get(self._key(folder, kind))
        return bool(entry) and entry.get("fingerprint") == fingerprint

    def remember(self, folder, kind: str, fingerprint: str, files: list[str]) -> None:
        self._data[self._key(folder, kind)] = {
            "fingerprint": fingerprint,
            "files": files,
            "granted_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        write_private(self.path, json.dumps(self._data, indent=2))

    def forget(self, folder, kind: str) -> None:
        if self._data.pop(self._key(folder, kind), None) is not None:
            write_private(self.path, json.dumps(self._data, indent=2))


def opt_in_from(
    store: TrustStore,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    confirm: Optional[Callable[[NeedsOptIn], bool]] = None,
) -> Callable[[NeedsOptIn], bool]:
    """The engine's ``opt_in`` question answered from remembered opt-ins and the user's explicit ones (a CLI flag,
    or ``confirm`` returning True after asking); an explicit one is remembered for this folder."""

    def opt_in(exc: NeedsOptIn) -> bool:
        if store.is_trusted(exc.folder, exc.kind, exc.fingerprint):
            return True
        explicit = trust_remote_code if exc.kind == "remote_code" else allow_pickle
        if explicit or (confirm is not None and confirm(exc)):
            store.remember(exc.folder, exc.kind, exc.fingerprint, exc.files)
            return True
        return False

    return opt_in
