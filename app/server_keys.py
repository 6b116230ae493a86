"""API keys for remote servers, one per server address, in a private file (0600 in a 0700 folder, written
atomically: ``private_files``). A key is never logged, printed or put in settings or presets; the settings
keep only the server's address."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..inference import parse_server_spec
from .private_files import config_dir, write_private


def _key_for(url: str) -> str:
    base, _model = parse_server_spec(url)
    return base


class ServerKeys:
    def __init__(self, path: Optional[Path] = None):
        self.path = path or config_dir(create=False) / "server-keys.json"

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, url: str) -> Optional[str]:
        key = self._read().get(_key_for(url))
        return key if isinstance(key, str) and key else None

    def set(self, url: str, key: Optional[str]) -> None:
        """Remember ``key`` for the server at ``url`` (None or empty forgets it)."""
        data = self._read()
        if key:
            data[_key_for(url)] = key
        else:
            data.pop(_key_for(url), None)
        write_private(self.path, json.dumps(data, indent=2) + "\n")

    # -- the key of Redline's own server (the window's Server switch) ------------------------------------
    OWN = "redline-server"

    def own_key(self) -> Optional[str]:
        key = self._read().get(self.OWN)
        return key if isinstance(key, str) and key else None

    def set_own_key(self, key: Optional[str]) -> None:
        data = self._read()
        if key:
            data[self.OWN] = key
        else:
            data.pop(self.OWN, None)
        write_private(self.path, json.dumps(data, indent=2) + "\n")

    def __repr__(self) -> str:
        return f"ServerKeys({self.path})"  # never the keys
