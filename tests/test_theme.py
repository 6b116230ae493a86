"""A dark desktop must not make the window unreadable (issue 49, item 3). The real window (on the slow stand-in
engine) is rendered offscreen under the palette KDE's Breeze Dark hands a Qt application, and the contrast of text
on its background is measured in the grabbed pixels — the messages, the buttons, the gauges' labels, the status
bar — against WCAG's 4.5 for body text; then with the theme chosen light and dark by hand, and switched while the
window is open. Every colour comes from one theme definition (ui/style.py): the stylesheet holds none."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from gui_helpers import aloop, profile, start_slow_window  # noqa: F401 - fixtures
from PySide6.QtCore import QRect
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QLabel

from redline.ui import style
from redline.ui.style import DARK, LIGHT, contrast

pytestmark = pytest.mark.usefixtures("aloop", "profile")

BODY = 4.5  # WCAG AA for body text

# What KDE Plasma's Breeze Dark colour scheme hands a Qt application.
BREEZE_DARK = {
    QPalette.Window: "#202326",
    QPalette.WindowText: "#fcfcfc",
    QPalette.Base: "#141618",
    QPalette.AlternateBase: "#1d1f22",
    QPalette.Text: "#fcfcfc",
    QPalette.Button: "#292c30",
    QPalette.ButtonText: "#fcfcfc",
    QPalette.Highlight: "#3daee9",
    QPalette.HighlightedText: "#fcfcfc",
    QPalette.ToolTipBase: "#292c30",
    QPalette.ToolTipText: "#fcfcfc",
    QPalette.PlaceholderText: "#a1a9b1",
    QPalette.Link: "#1d99f3",
}


def desktop_palette(colours: dict) -> QPalette:
    p = QPalette()
    for role, colour in colours.items():
        p.setColor(role, QColor(colour))
    return p


@pytest.fixture
def desktop(qapp):
    """Set the desktop's palette on the application (as the platform theme would); restored afterwards."""
    saved = QPalette(qapp.palette())

    def use(colours: dict) -> None:
        style.restore_system_palette()
        qapp.setPalette(desktop_palette(colours))

    yield use
    style.restore_system_palette()
    qapp.setPalette(saved)


def text_contrast(widget, rect: QRect = None) -> float:
    """The contrast of the text drawn in ``widget``, in the window's grabbed pixels (what is on the screen, whatever
    shows through a transparent widget): the background is the commonest colour, the text the colour farthest from
    it that covers a few pixels (glyph cores; antialiased edges lie between)."""
    rect = rect if rect is not None else widget.rect()
    top = widget.window()
    image = top.grab(QRect(widget.mapTo(top, rect.topLeft()), rect.size())).toImage()
    counts = Counter(image.pixel(x, y) for y in range(image.height()) for x in range(image.width()))
    background = QColor.fromRgb(counts.most_common(1)[0][0])
    inks = [QColor.fromRgb(rgb) for rgb, n in counts.items() if n >= 3]
    return max(contrast(background, ink) for ink in inks)


def slow_window(qtbot, **settings):
    return start_slow_window(qtbot, dict(interval_s=0.005, tokens=12), (1280, 800), max_new_tokens=12, **settings)


def with_a_reply(qtbot, window):
    window.input.setPlainText("What is the capital of France?")
    with qtbot.waitSignal(window.reply_finished, timeout=30_000):
        window.send()
    window.chat_view.render_dirty()
    window.status.set_note("auto: kv · fp32 — the fastest that fits")
    QApplication.processEvents()


def unreadable(window) -> list[str]:
    """Every text the test looks at whose contrast is under BODY, with the ratio measured."""
    checks = {}
    for i, m in enumerate(window.chat_view.widgets):
        checks[f"message {i} ({m.role}) text"] = m.browser
        checks[f"message {i} role label"] = m.role_label
        if m.stats_label.isVisible():
            checks[f"message {i} figures"] = m.stats_label
    checks["Send"] = window.send_button
    checks["New chat"] = window.conversations.new_button
    checks["Rename"] = window.conversations.rename_button
    checks["model picker"] = window.model_picker
    for label in window.gauges.findChildren(QLabel):
        if label.isVisible() and label.text().strip():
            checks[f"gauges: {label.text()[:30]!r}"] = label
    checks["status bar: model"] = window.model_label
    checks["status bar: the note about auto"] = window.status.note_label
    out = [f"{name}: {text_contrast(w):.2f}" for name, w in checks.items() if text_contrast(w) < BODY]
    window.statusBar().showMessage("Copied the last reply.")  # a passing message, where the note was
    QApplication.processEvents()
    bar = window.statusBar()  # its message, left of the permanent widgets
    ratio = text_contrast(bar, QRect(0, 0, window.model_label.x() - 4, bar.height()))
    if ratio < BODY:
        out.append(f"status bar: message: {ratio:.2f}")
    return out


def is_dark(window) -> bool:
    return window.palette().color(QPalette.Window).lightness() < 100


def test_a_dark_desktop_gets_a_readable_dark_window(qtbot, desktop):
    desktop(BREEZE_DARK)
    w = slow_window(qtbot)  # theme: follow the system (the default)
    try:
        with_a_reply(qtbot, w)
        assert w.look.theme is DARK and is_dark(w)
        assert unreadable(w) == []
        assert text_contrast(w.chat_view.widgets[-1].browser) >= 7  # the reply itself: AAA
    finally:
        w.shutdown()


def test_light_and_dark_chosen_by_hand_are_readable_on_any_desktop_and_switch_at_once(qtbot, desktop):
    desktop(BREEZE_DARK)
    w = slow_window(qtbot, theme="light")
    try:
        with_a_reply(qtbot, w)
        assert w.look.theme is LIGHT and not is_dark(w)
        assert unreadable(w) == []
        w.theme_actions["dark"].trigger()  # View → Theme → Dark: no reload, saved
        w.chat_view.render_dirty()
        QApplication.processEvents()
        assert w.look.theme is DARK and is_dark(w) and w.settings.theme == "dark"
        assert unreadable(w) == []
        w.settings_panel.theme.setCurrentIndex(w.settings_panel.theme.findData("system"))
        w.settings_panel.theme.activated.emit(w.settings_panel.theme.currentIndex())  # Settings → Theme
        assert w.settings.theme == "system" and w.look.theme is DARK  # the desktop is dark
    finally:
        w.shutdown()


def test_the_stylesheet_holds_no_colour_of_its_own_and_every_theme_reads(qapp):
    from redline.assets import asset

    qss = asset("style", "redline.qss").read_text(encoding="utf-8")
    code = re.sub(r"/\*.*?\*/", "", qss, flags=re.S)
    assert not re.findall(r"#[0-9a-fA-F]{3,8}\b|rgba?\(|\b(?:white|black|gray|grey)\b", code)
    for theme in (LIGHT, DARK):
        sheet = style.stylesheet(theme.name)  # every ${slot} is a theme field, or this raises
        assert theme.surface in sheet and "QMainWindow" in sheet
        c = theme.color
        for fg, bg in (
            ("text", "surface"),
            ("text", "window"),
            ("text", "user_bubble"),
            ("text", "raised"),
            ("muted", "surface"),
            ("muted", "window"),
            ("muted", "user_bubble"),
            ("on_accent", "accent"),
            ("on_selection", "selection"),
            ("link", "surface"),
            ("info_fg", "info_bg"),
            ("warning_fg", "warning_bg"),
            ("error_fg", "error_bg"),
        ):
            assert contrast(c(fg), c(bg)) >= BODY, (theme.name, fg, bg)
