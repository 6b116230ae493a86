"""Redline application layer: entry points, settings, storage, wiring."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("redline")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"
