"""The window's look: one theme definition (light and dark) from which every colour comes — the Qt stylesheet
(assets/style/redline.qss is a template of ``${name}`` slots), the application palette, the gauges' paint, the
banners, code blocks and icons — and the application icon.

``apply_theme(window, choice)`` ("system", "light" or "dark") sets the palette on the application (so dialogs,
menus and tooltips follow) and the stylesheet on the window. "system" reads the desktop's colour scheme
(``QStyleHints.colorScheme()``) and the palette the desktop handed the application (KDE Breeze Dark and GNOME's
dark style hand a dark one): dark if either says so. Widgets that paint by hand read ``current_theme()``.

Assets are read through ``redline.assets.asset()`` (importlib.resources), so they are found the same way in a
source checkout, an installed wheel and a PyInstaller bundle — never through a path relative to this file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from string import Template
from typing import Optional

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import (
    QColor,
    QGuiApplication,
    QIcon,
    QImage,
    QPainter,
    QPalette,
    QPixmap,
    QTextBlockFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QAbstractButton

from ..assets import asset

# The sizes a window manager and a task switcher ask for; drawn from the one SVG source.
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256)
THEME_CHOICES = ("system", "light", "dark")  # the setting's values (app/settings.py keeps the same three)
READING_WIDTH = 760  # the chat's column: messages, the system prompt and the message box, centred
LINE_HEIGHT = 145  # percent of the font's height between lines of a message (code blocks keep their own)


@dataclass(frozen=True)
class Theme:
    """Every colour the window uses, named by what it is for. Text colours are chosen to reach a WCAG contrast of
    at least 4.5 on the backgrounds they sit on (tests/test_theme.py measures it on the rendered window)."""

    name: str
    window: str  # the frame: sidebar, gauges, status bar
    surface: str  # the chat's reading column
    raised: str  # fields and buttons
    user_bubble: str  # the user's messages
    hover: str  # a button or row under the pointer
    border: str
    text: str
    muted: str  # secondary text: a reply's figures, captions
    accent: str  # the "redline": live figures, Send
    on_accent: str  # text on the accent
    accent_soft: str  # the selected conversation
    selection: str  # selected rows and text elsewhere (tables, lists, fields)
    on_selection: str
    link: str
    code_bg: str
    track: str  # an empty gauge: the dial's arc, a bar's background
    axis: str  # chart axes and the bars' outline
    draft: str  # tokens a draft model (or prompt lookup) wrote
    info_bg: str
    info_fg: str
    warning_bg: str
    warning_fg: str
    error_bg: str
    error_fg: str
    other: str  # memory of other processes
    torch: str  # torch's allocated memory
    torch_reserved: str
    pygments: str  # the code highlighting style

    @property
    def dark(self) -> bool:
        return self.name == "dark"

    def color(self, role: str) -> QColor:
        return QColor(getattr(self, role))

    def banner(self, kind: str) -> tuple[str, str]:
        """(background, text) of a banner of ``kind`` (info, warning, error)."""
        kind = kind if kind in ("info", "warning", "error") else "info"
        return getattr(self, f"{kind}_bg"), getattr(self, f"{kind}_fg")

    def palette(self) -> QPalette:
        """The application palette: what native widgets (fields, lists, menus, dialogs, tooltips) draw with."""
        p = QPalette()
        c = self.color
        roles = {
            QPalette.Window: c("window"),
            QPalette.WindowText: c("text"),
            QPalette.Base: c("raised"),
            QPalette.AlternateBase: c("window"),
            QPalette.Text: c("text"),
            QPalette.Button: c("raised"),
            QPalette.ButtonText: c("text"),
            QPalette.BrightText: c("on_accent"),
            QPalette.ToolTipBase: c("raised"),
            QPalette.ToolTipText: c("text"),
            QPalette.PlaceholderText: c("muted"),
            QPalette.Highlight: c("selection"),
            QPalette.HighlightedText: c("on_selection"),
            QPalette.Link: c("link"),
            QPalette.LinkVisited: c("link"),
            QPalette.Light: c("raised").lighter(120),
            QPalette.Midlight: c("hover"),
            QPalette.Mid: c("border"),
            QPalette.Dark: c("axis"),
            QPalette.Shadow: QColor(0, 0, 0),
        }
        for role, colour in roles.items():
            p.setColor(role, colour)
        for role in (QPalette.WindowText, QPalette.Text, QPalette.ButtonText):
            p.setColor(QPalette.Disabled, role, c("muted"))
        p.setColor(QPalette.Disabled, QPalette.Highlight, c("border"))
        return p


LIGHT = Theme(
    name="light",
    window="#f4f5f7",
    surface="#ffffff",
    raised="#ffffff",
    user_bubble="#eef1f6",
    hover="#e8ebf0",
    border="#dfe2e7",
    text="#1d2025",
    muted="#5b626c",
    accent="#c41e3a",
    on_accent="#ffffff",
    accent_soft="#f9e3e6",
    selection="#2563c9",
    on_selection="#ffffff",
    link="#1f5fc4",
    code_bg="#f4f5f7",
    track="#e4e6ea",
    axis="#b9bec6",
    draft="#c8f0c8",
    info_bg="#eaf1ff",
    info_fg="#1d4fb8",
    warning_bg="#fff4e0",
    warning_fg="#8a5300",
    error_bg="#fdecee",
    error_fg="#b0172a",
    other="#f0a03c",
    torch="#466ec8",
    torch_reserved="#a0b4e6",
    pygments="friendly",
)

DARK = Theme(
    name="dark",
    window="#16171a",
    surface="#1d1f23",
    raised="#25282d",
    user_bubble="#2a2e35",
    hover="#30343b",
    border="#363a41",
    text="#e8e9ec",
    muted="#a4aab3",
    accent="#ff5a67",
    on_accent="#16171a",
    accent_soft="#3a2226",
    selection="#2f5fb3",
    on_selection="#ffffff",
    link="#8ab4ff",
    code_bg="#16171a",
    track="#34373d",
    axis="#5a5f68",
    draft="#1f4a2a",
    info_bg="#1c2740",
    info_fg="#8fb4ff",
    warning_bg="#2e2414",
    warning_fg="#f3b35b",
    error_bg="#3a1f23",
    error_fg="#ff8a95",
    other="#e0902c",
    torch="#6f94e8",
    torch_reserved="#3d4f7a",
    pygments="github-dark",
)

THEMES = {"light": LIGHT, "dark": DARK}

_current: Theme = LIGHT
_applied: Optional[QPalette] = None  # the palette apply_theme last set on the application
_system: Optional[QPalette] = None  # the palette the desktop handed the application


def current_theme() -> Theme:
    """The theme in use (light until a window applies one)."""
    return _current


def luminance(colour: QColor) -> float:
    """WCAG relative luminance of an sRGB colour."""

    def channel(v: float) -> float:
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(colour.redF()) + 0.7152 * channel(colour.greenF()) + 0.0722 * channel(colour.blueF())


def contrast(a: QColor, b: QColor) -> float:
    """WCAG contrast ratio of two colours, 1 to 21 (body text needs 4.5)."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def system_is_dark(palette: Optional[QPalette] = None) -> bool:
    """Does the desktop ask for dark? Its colour scheme where the platform says one, and the palette it handed the
    application (a dark window colour): dark if either says so."""
    app = QGuiApplication.instance()
    scheme = app.styleHints().colorScheme() if app is not None else Qt.ColorScheme.Unknown
    if scheme == Qt.ColorScheme.Dark:
        return True
    palette = palette if palette is not None else (_system or (app.palette() if app is not None else QPalette()))
    window, text = palette.color(QPalette.Window), palette.color(QPalette.WindowText)
    return luminance(window) < luminance(text)


def resolve_theme(choice: str, palette: Optional[QPalette] = None) -> Theme:
    """The theme for a setting: "light", "dark", or "system" (anything else is read as "system")."""
    if choice in THEMES:
        return THEMES[choice]
    return DARK if system_is_dark(palette) else LIGHT


def apply_theme(window, choice: str) -> Theme:
    """Use the theme ``choice`` resolves to: on the application's palette and the window's stylesheet; icons set
    with ``set_icon`` are drawn again in its colours."""
    global _current, _applied, _system
    app = QGuiApplication.instance()
    if app is not None and (_applied is None or app.palette() != _applied):
        _system = QPalette(app.palette())  # not ours: what the desktop (or whoever set it) wants
    theme = resolve_theme(choice, _system)
    _current = theme
    if app is not None:
        _applied = theme.palette()
        app.setPalette(_applied)
    window.setStyleSheet(stylesheet(theme.name))
    for button in window.findChildren(QAbstractButton):
        name = button.property("themeIcon")
        if name:
            button.setIcon(icon(*name.split(":")))
    return theme


def restore_system_palette() -> None:
    """Hand the application back the palette it had before a theme was applied (tests, between windows)."""
    global _applied, _current
    app = QGuiApplication.instance()
    if app is not None and _system is not None:
        app.setPalette(_system)
    _applied, _current = None, LIGHT


@lru_cache(maxsize=4)
def stylesheet(theme: str = "light") -> str:
    """The window's stylesheet in a theme's colours (every ``${name}`` in the template is a Theme field)."""
    template = Template(asset("style", "redline.qss").read_text(encoding="utf-8"))
    return template.substitute(asdict(THEMES[theme]))


@lru_cache(maxsize=64)
def _icon(name: str, colour: str, disabled: str) -> QIcon:
    svg = asset("style", "icons", f"{name}.svg").read_text(encoding="utf-8")
    result = QIcon()
    for mode, fill in ((QIcon.Normal, colour), (QIcon.Disabled, disabled)):
        renderer = QSvgRenderer(QByteArray(svg.replace("currentColor", fill).encode()))
        for size in (16, 20, 24, 32, 48):
            image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
            image.fill(Qt.GlobalColor.transparent)
            painter = QPainter(image)
            renderer.render(painter)
            painter.end()
            result.addPixmap(QPixmap.fromImage(image), mode)
    return result


def icon(name: str, role: str = "text") -> QIcon:
    """One of assets/style/icons/NAME.svg (drawn in ``currentColor``) in the theme's ``role`` colour."""
    t = current_theme()
    return _icon(name, getattr(t, role), t.axis)


def set_icon(button, name: str, role: str = "text") -> None:
    """Give a button an icon in the theme's ``role`` colour that follows the theme (``apply_theme`` draws it
    again)."""
    button.setProperty("themeIcon", f"{name}:{role}")
    button.setIcon(icon(name, role))


def space_lines(doc: QTextDocument) -> None:
    """Comfortable reading: ``LINE_HEIGHT`` percent between the lines of a message's paragraphs and lists (code
    blocks stay tight, as an editor shows them)."""
    cursor = QTextCursor(doc)
    block = doc.begin()
    while block.isValid():
        fmt = block.blockFormat()
        code = fmt.hasProperty(QTextFormat.BlockCodeFence) or fmt.hasProperty(QTextFormat.BlockCodeLanguage)
        if not code and fmt.lineHeight() != LINE_HEIGHT:
            fmt.setLineHeight(LINE_HEIGHT, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value)
            cursor.setPosition(block.position())
            cursor.setBlockFormat(fmt)
        block = block.next()


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
