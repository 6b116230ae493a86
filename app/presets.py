"""Named presets: a model with its precision, context, strategy, draft and sampling — one JSON file each.

Files live in ``<config dir>/presets/`` (0600, written atomically), named after the preset
so a user can read, copy or delete them by hand. A file that cannot be read is skipped and
reported, never overwritten. The store also remembers the models loaded recently (for the
wizard's "recent model" choice) in ``recent-models.json``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

from .private_files import config_dir, write_private
from .settings import Settings

# The settings a preset carries (everything but nothing: all of Settings' fields are part of a configuration).
PRESET_FIELDS = tuple(f.name for f in fields(Settings))
MAX_RECENT = 10
MAX_NAME = 80


class PresetError(ValueError):
    """A preset name or file that cannot be used; the message says why."""


@dataclass(frozen=True)
class Preset:
    name: str
    values: dict  # Settings fields
    path: Path
    created: str = ""

    def describe(self) -> str:
        v = self.values
        parts = [str(v.get("model")), str(v.get("precision"))]
        if v.get("context_length"):
            parts.append(f"{v['context_length']} tokens")
        parts.append(str(v.get("strategy")))
        if v.get("strategy") == "speculative" and v.get("draft_model"):
            parts.append(f"draft {v['draft_model']}")
        return " · ".join(parts)


def file_stem(name: str) -> str:
    """A file name for a preset: its name with anything but letters, digits, '-', '_' and '.' as '-'."""
    stem = re.sub(r"[^\w.-]+", "-", name.strip(), flags=re.UNICODE).strip("-.")
    return stem.lower() or "preset"


def check_name(name: str) -> str:
    name = name.strip()
    if not name:
        raise PresetError("A preset needs a name.")
    if len(name) > MAX_NAME:
        raise PresetError(f"A preset name can have at most {MAX_NAME} characters.")
    return name


class PresetStore:
    def __init__(self, folder: Optional[Path] = None):
        self.folder = folder or (config_dir() / "presets")
        self.problems: list[str] = []  # files skipped by the last list(), with the reason

    # -- presets --------------------------------------------------------------
    def _read(self, path: Path) -> Preset:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise PresetError(f"{path.name}: not readable JSON ({exc})") from exc
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("name"), str)
            or not isinstance(data.get("settings"), dict)
        ):
            raise PresetError(f"{path.name}: needs a 'name' and a 'settings' object")
        try:
            settings = Settings.from_dict(data["settings"])
        except (ValueError, TypeError) as exc:
            raise PresetError(f"{path.name}: {exc}") from exc
        values = {k: getattr(settings, k) for k in PRESET_FIELDS}
        return Preset(data["name"], values, path, str(data.get("created", "")))

    def presets(self) -> list[Preset]:
        """Every readable preset, by name; unreadable files are listed in ``problems``."""
        self.problems = []
        found = []
        if self.folder.is_dir():
            for path in sorted(self.folder.glob("*.json")):
                try:
                    found.append(self._read(path))
                except PresetError as exc:
                    self.problems.append(str(exc))
        return sorted(found, key=lambda p: p.name.lower())

    def get(self, name: str) -> Optional[Preset]:
        return next((p for p in self.presets() if p.name == name), None)

    def _path_for(self, name: str, keep: Optional[Path] = None) -> Path:
        """The file for ``name``: the existing preset's file, else a free one."""
        existing = self.get(name)
        if existing is not None:
            return existing.path
        stem = file_stem(name)
        path = self.folder / f"{stem}.json"
        n = 2
        while path.exists() and path != keep:
            path = self.folder / f"{stem}-{n}.json"
            n += 1
        return path

    def _write(self, path: Path, name: str, values: dict, created: str) -> Preset:
        settings = Settings.from_dict(values)  # validates; unknown keys dropped
        clean = {k: getattr(settings, k) for k in PRESET_FIELDS}
        doc = {"name": name, "created": created, "settings": clean}
        write_private(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return Preset(name, clean, path, created)

    def save(self, name: str, values: dict) -> Preset:
        """Create a preset, or replace the one of that name."""
        name = check_name(name)
        existing = self.get(name)
        created = existing.created if existing else time.strftime("%Y-%m-%dT%H:%M:%S")
        return self._write(self._path_for(name), name, values, created)

    def rename(self, old: str, new: str) -> Preset:
        new = check_name(new)
        preset = self.get(old)
        if preset is None:
            raise PresetError(f"There is no preset named {old!r}.")
        if new != old and self.get(new) is not None:
            raise PresetError(f"A preset named {new!r} exists already; choose another name or delete it first.")
        path = self._path_for(new, keep=preset.path) if file_stem(new) != file_stem(old) else preset.path
        renamed = self._write(path, new, preset.values, preset.created)
        if path != preset.path:
            preset.path.unlink(missing_ok=True)
        return renamed

    def delete(self, name: str) -> None:
        preset = self.get(name)
        if preset is None:
            raise PresetError(f"There is no preset named {name!r}.")
        preset.path.unlink(missing_ok=True)

    # -- recent models --------------------------------------------------------
    @property
    def _recent_path(self) -> Path:
        return self.folder.parent / "recent-models.json"

    def recent_models(self) -> list[str]:
        try:
            data = json.loads(self._recent_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        return [m for m in data if isinstance(m, str)][:MAX_RECENT] if isinstance(data, list) else []

    def remember_model(self, model: Optional[str]) -> None:
        if not model:
            return
        recent = [model] + [m for m in self.recent_models() if m != model]
        try:
            write_private(self._recent_path, json.dumps(recent[:MAX_RECENT], indent=2) + "\n")
        except OSError:
            pass  # a list of recent models that cannot be written costs nothing but convenience
