"""Redline's package data: icons, stylesheet, benchmark prompt sets, desktop metadata.

Installed as the ``redline.assets`` package so that files are found through
``importlib.resources`` in a wheel, an editable install or a frozen bundle alike.
"""

from importlib.resources import files


def asset(*parts: str):
    """A Traversable for a file under assets/, e.g. ``asset("icons", "redline.svg")``."""
    node = files(__name__)
    for part in parts:
        node = node / part
    return node
