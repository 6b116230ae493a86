"""Where Redline keeps files. platformdirs honours XDG_* on Linux."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "redline"


def cache_dir(create: bool = True) -> Path:
    """Converted models and downloads (safe to delete; rebuilt on demand)."""
    override = os.environ.get("REDLINE_CACHE_DIR")
    path = Path(override) if override else Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir(create: bool = True) -> Path:
    """``create=False`` only names the folder (the About dialog shows it without touching the disk).
    ``REDLINE_MODELS_DIR`` moves it alone (models on another disk; a benchmark's converted files in its own folder)."""
    override = os.environ.get("REDLINE_MODELS_DIR")
    path = Path(override) if override else cache_dir(create) / "models"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def kv_pages_dir() -> Path:
    """Prefix-cache pages kept across restarts (``decoding/disk_pages.py``; safe to delete: pages are recomputed).
    ``REDLINE_KV_PAGES_DIR`` moves them (the tests' own folder, never the user's)."""
    override = os.environ.get("REDLINE_KV_PAGES_DIR")
    return Path(override) if override else cache_dir(create=False) / "kv-pages"
