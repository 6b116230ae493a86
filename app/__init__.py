"""Redline application layer: entry points, settings, storage, wiring."""

from importlib.metadata import PackageNotFoundError, metadata, version

try:
    __version__ = version("redline")
    __license__ = metadata("redline").get("License-Expression") or metadata("redline").get("License") or "Apache-2.0"
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"
    __license__ = "Apache-2.0"
