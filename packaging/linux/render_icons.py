"""Render assets/icons/redline.svg into the hicolor PNG sizes desktops expect.

Usage: python render_icons.py OUT_DIR  → OUT_DIR/hicolor/NxN/apps/<app id>.png (+ scalable/apps/*.svg)
"""

import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

APP_ID = "io.github.redline_app.Redline"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def render(out_dir: Path) -> list[Path]:
    from PySide6.QtGui import QGuiApplication

    from redline.assets import asset
    from redline.ui.style import icon_images

    app = QGuiApplication.instance() or QGuiApplication([])  # noqa: F841 - QPainter needs an app
    svg = asset("icons", "redline.svg")
    written = []
    for size, image in zip(SIZES, icon_images(SIZES)):
        target = out_dir / "hicolor" / f"{size}x{size}" / "apps" / f"{APP_ID}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        image.save(str(target))
        written.append(target)
    scalable = out_dir / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg"
    scalable.parent.mkdir(parents=True, exist_ok=True)
    with svg.open("rb") as src, open(scalable, "wb") as dst:
        shutil.copyfileobj(src, dst)
    written.append(scalable)
    return written


if __name__ == "__main__":
    for path in render(Path(sys.argv[1])):
        print(path)
