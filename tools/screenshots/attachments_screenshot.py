"""Save PNGs of attachments in the window with the starter model, in the light theme and (NAME-dark.png) the dark
one: a PDF and an image as chips with their cost before sending (attachments-chips.png), and the PDF's question
answered, its line in the transcript (attachments-answered.png).

    python tools/screenshots/attachments_screenshot.py

Uses a throwaway profile and the Qt offscreen platform unless DISPLAY is set (e.g. under Xvfb)."""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for gui_session (not a package)
from gui_session import OUT, ROOT, qt_app, settle, throwaway_profile, wait_until  # noqa: E402

sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from test_attachments_engine import QUESTION, write_pdf  # noqa: E402 - the tests' own PDF


def main() -> int:
    throwaway_profile("redline-attach-shots-")
    from PIL import Image as PILImage

    from redline.app.gui import build_window
    from redline.app.settings import Settings, save_settings

    app = qt_app()  # noqa: F841 - the application must stay alive
    tmp = Path(tempfile.mkdtemp(prefix="redline-attach-files-"))
    pdf = write_pdf(tmp / "calvera-notes.pdf", pages=6, fact_page=3, sentences=10)
    png = tmp / "harbour.png"
    out = io.BytesIO()
    PILImage.new("RGB", (640, 360), (70, 130, 180)).save(out, "PNG")
    png.write_bytes(out.getvalue())

    save_settings(Settings(model="starter", temperature=0, max_new_tokens=40))
    window = build_window()
    window.resize(1280, 800)
    window.show()
    loaded, finished = [], []
    window.model_loaded.connect(loaded.append)
    window.reply_finished.connect(finished.append)
    window.start()
    wait_until(lambda: loaded or (window.banner.isVisible() and window.banner.kind == "error"))
    if not loaded:
        print(f"the starter did not load: {window.banner.label.text()}", file=sys.stderr)
        return 1

    def shot(name):
        for theme in ("light", "dark"):
            window.look.set_theme(theme)
            window.chat_view.render_dirty()
            settle(0.4)
            path = OUT / (name if theme == "light" else name.replace(".png", "-dark.png"))
            window.grab().save(str(path))
            print(f"saved {path.relative_to(ROOT)}")
        window.look.set_theme("light")

    window.attachments.add_paths([pdf, png])
    wait_until(
        lambda: all(p.cost is not None for p in window.attachments.pending()) and not window.attachments.reading()
    )
    window.input.setPlainText(QUESTION)
    shot("attachments-chips.png")
    for chip in list(window.attachment_chips.chips()):  # the starter cannot see: the image is left out
        if chip.name == png.name:
            window.attachments.remove(chip)
    settle(0.3)
    window.send()
    wait_until(lambda: finished)
    shot("attachments-answered.png")
    window.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
