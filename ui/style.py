"""The window's look, from the packaged assets: the Qt stylesheet and the application icon.

Both are read through ``redline.assets.asset()`` (importlib.resources), so they are found the same way in
a source checkout, an installed wheel and a PyInstaller bundle — never through a path relative to this file.
"""

from __future__ import annotations

from functools import lru_cache

from PySide6.QtCore import Qt
from PySide6.QtGui import QIcon, QImage, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

from redline.assets import asset

# The sizes a window manager and a task switcher ask for; drawn from the one SVG source.
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256)


@lru_cache(maxsize=1)
def stylesheet() -> str:
    return asset("style", "redline.qss").read_text(encoding="utf-8")


def app_icon() -> QIcon:
    """The Redline icon, rendered from assets/icons/redline.svg at the usual sizes.

    Rendered here with QSvgRenderer rather than ``QIcon(path)``: that needs the SVG image-format plugin
    and a real file on disk, neither of which a frozen bundle or a zipped install guarantees.
    """
    icon = QIcon()
    for image in icon_images(ICON_SIZES):
        icon.addPixmap(QPixmap.fromImage(image))
    return icon


def icon_images(sizes) -> list[QImage]:
    """The icon drawn at each size from the one SVG source (the window icon and the desktop files' PNGs)."""
    renderer = QSvgRenderer(asset("icons", "redline.svg").read_bytes())
    if not renderer.isValid():
        raise RuntimeError("the packaged icon assets/icons/redline.svg could not be read")
    images = []
    for size in sizes:
        image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        renderer.render(painter)
        painter.end()
        images.append(image)
    return images
