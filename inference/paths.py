"""Where Redline keeps files. platformdirs honours XDG_* on Linux."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "redline"


def cache_dir() -> Path:
    """Converted models and downloads (safe to delete; rebuilt on demand)."""
    override = os.environ.get("REDLINE_CACHE_DIR")
    path = Path(override) if override else Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
