"""Every page of the window fits the most common laptop screen, 1366×768 (issue 28, item 13): the chat (with a
banner and a notice up), the settings, the speed lab and the configuration wizard. Laid out at 1366×768 less
a title bar and a task bar, each page's minimum size fits, and no widget on it is squeezed below its own minimum
size (which is what clips a widget: its text or rows cut off, or drawn over a neighbour)."""

from __future__ import annotations

import pytest
from gui_helpers import aloop, profile, write_settings  # noqa: F401 - fixtures
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QWidget

pytestmark = pytest.mark.usefixtures("aloop", "profile")

SCREEN = (1366, 768)
USABLE = (1366, 768 - 30 - 40)  # a window's title bar and a task bar take about this much


def inside_scroll_area(w: QWidget) -> bool:
    p = w.parentWidget()
    while p is not None:
        if isinstance(p, QAbstractScrollArea):
            return True
        p = p.parentWidget()
    return False


def clipped(root: QWidget) -> list[str]:
    """Visible widgets smaller than their minimum size (outside a scroll area, where being larger than the view is
    what scrolling is for)."""
    out = []
    for w in [root, *root.findChildren(QWidget)]:
        if not w.isVisible() or w.isWindow() and w is not root or inside_scroll_area(w):
            continue
        hint = w.minimumSize().expandedTo(w.minimumSizeHint())
        if not hint.isValid():
            continue
        short_w, short_h = hint.width() - w.width(), hint.height() - w.height()
        if short_w > 1 or short_h > 1:
            name = w.objectName() or type(w).__name__
            out.append(f"{name} {w.width()}×{w.height()} < {hint.width()}×{hint.height()}")
    return out


def fits(window, page: str) -> None:
    window.resize(*USABLE)
    for _ in range(3):
        QApplication.processEvents()
    need = window.minimumSizeHint().expandedTo(window.minimumSize())
    assert need.width() <= USABLE[0] and need.height() <= USABLE[1], f"{page}: needs {need.toTuple()}"
    assert window.size().toTuple() == USABLE, f"{page}: the window grew to {window.size().toTuple()}"
    assert clipped(window) == [], page


def test_every_page_fits_a_1366x768_screen(qtbot):
    from slow_engine import SlowEngine

    from redline.app.gui import build_window

    write_settings(model="fake")
    w = build_window(engine_factory=lambda: SlowEngine())
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.model_loaded, timeout=30_000):
        w.start()
    try:
        fits(w, "chat")
        w.notices.add("The settings file was unusable; defaults are in use. It was kept as settings.json.corrupt.")
        w.banner.show_message(
            "The model could not be loaded: the file is not a GGUF model (its first bytes are not 'GGUF'). "
            "Choose another file in Settings, or use the starter model.",
            "error",
            [("Open settings", w.show_settings), ("Use the starter model", lambda: None)],
        )
        fits(w, "chat with a notice and a banner")
        w.show_settings()  # a dialog beside the window now: the chat keeps its width
        fits(w, "settings open")
        dialog = w.settings_dialog
        need = dialog.minimumSizeHint().expandedTo(dialog.minimumSize())
        assert need.width() <= USABLE[0] and need.height() <= USABLE[1], f"settings need {need.toTuple()}"
        assert dialog.height() <= USABLE[1] and clipped(dialog) == []
        dialog.close()
        titles = [w.tabs.tabText(i) for i in range(w.tabs.count())]
        w.tabs.setCurrentIndex(titles.index("Speed lab"))
        fits(w, "speed lab")
        lab = w.tabs.currentWidget().inner
        lab.configs_editor.show_text_form(True)
        lab.configs_editor.use_set("ladder")  # seven rows
        fits(w, "speed lab, the ladder and the text form")
        lab.configs_editor.show_text_form(False)
        assert not lab.configs_edit.isVisible()
        w.tabs.setCurrentIndex(0)
        wizard = w.open_wizard()
        for _ in range(3):
            QApplication.processEvents()
        need = wizard.minimumSizeHint().expandedTo(wizard.minimumSize())
        assert need.width() <= USABLE[0] and need.height() <= USABLE[1], f"wizard needs {need.toTuple()}"
        wizard.close()
    finally:
        w.shutdown()
