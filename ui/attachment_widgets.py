"""Attachments as the window shows them: the chips above the message box (what goes with the next message) and,
under a sent message in the transcript, a line per document (its name and pages) and a thumbnail per image.

A chip says what the attachment is (an icon by kind, its name, its pages or its size in pixels) and, while a model
is loaded, what it costs (``set_cost``: the engine's figures, "6,120 tokens · 138 MB KV · ≈ 3.4 s to first
token"); a warning (it will not fit, or it pushes earlier turns out) turns the chip to the warning colours and is
said under it. Its tooltip is the start of the document's text. Its × removes it. The colours are the theme's
(assets/style/redline.qss)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

from PySide6.QtCore import QBuffer, QByteArray, QEvent, QIODevice, QSize, Qt, Signal
from PySide6.QtGui import QImage, QImageReader, QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from ..inference import Image
from .signals import emit
from .style import icon

PREVIEW_CHARS = 600  # of a document's text in its tooltip
THUMBNAIL_PX = 160  # the longer side of an image's thumbnail in the transcript
CHIP_ICON_PX = 16
_THUMBNAILS: "OrderedDict[tuple[str, int], QPixmap]" = OrderedDict()  # (sha256, size) -> its pixmap, newest last
_THUMBNAILS_KEPT = 64


def is_image(item) -> bool:
    return isinstance(item, Image)


def detail(item) -> str:
    """ "12 pages", "1 page", "1024×768": what a chip and the transcript say after the name."""
    if is_image(item):
        return f"{item.width}×{item.height}"
    n = item.page_count
    return f"{n} page{'' if n == 1 else 's'}"


def preview(item) -> str:
    """A document's first ``PREVIEW_CHARS`` characters (its tooltip); an image's size and type."""
    if is_image(item):
        return f"{item.name}\n{item.width}×{item.height} {item.mime.removeprefix('image/').upper()} image"
    text = item.text.strip()
    if not text:
        return f"{item.name}\n(no text)"
    cut = text[:PREVIEW_CHARS]
    return f"{item.name}\n\n{cut}{'…' if len(text) > PREVIEW_CHARS else ''}"


def thumbnail(item, size: int = THUMBNAIL_PX) -> QPixmap:
    """An image scaled to fit ``size`` pixels (decoded at that size: a photo's full frame is never decoded to show a
    thumbnail), kept for the next time its message is built."""
    key = (item.sha256, size)
    cached = _THUMBNAILS.get(key)
    if cached is not None:
        _THUMBNAILS.move_to_end(key)
        return cached
    buffer = QBuffer()
    buffer.setData(QByteArray(item.data))
    buffer.open(QIODevice.ReadOnly)
    reader = QImageReader(buffer)
    reader.setAutoTransform(True)
    full = reader.size()
    if full.isValid() and (full.width() > size or full.height() > size):
        reader.setScaledSize(full.scaled(QSize(size, size), Qt.KeepAspectRatio))
    image = reader.read()
    if image.isNull():
        image = QImage(size, size // 2, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
    pixmap = QPixmap.fromImage(image)
    if pixmap.width() > size or pixmap.height() > size:
        pixmap = pixmap.scaled(size, size, Qt.KeepAspectRatio, Qt.SmoothTransformation)
    _THUMBNAILS[key] = pixmap
    while len(_THUMBNAILS) > _THUMBNAILS_KEPT:
        _THUMBNAILS.popitem(last=False)
    return pixmap


def kind_icon(label: QLabel, kind: str) -> None:
    """A label's icon for a document or an image, in the theme's muted colour (``follow_theme`` draws it again)."""
    label.setProperty("kindIcon", kind)
    label.setPixmap(icon(kind, "muted").pixmap(CHIP_ICON_PX, CHIP_ICON_PX))


def follow_theme(widget: QWidget, event) -> None:
    """The theme changed (the application's palette): the kind icons under ``widget`` in its colours."""
    if event.type() == QEvent.PaletteChange:
        for label in widget.findChildren(QLabel):
            if label.property("kindIcon"):
                kind_icon(label, label.property("kindIcon"))


WARNING_PX = 420  # the width a chip's warning wraps at


class AttachmentChip(QFrame):
    """One pending attachment, or one being read (``reading``: its name and "reading…", no ×)."""

    remove_requested = Signal(object)  # this chip

    def __init__(self, name: str, parent=None):
        super().__init__(parent)
        self.setObjectName("attachmentChip")
        self.setProperty("warning", False)
        self.setProperty("reading", True)
        self.item = None
        self.name = name
        self.warning = ""
        box = QVBoxLayout(self)
        box.setContentsMargins(8, 3, 3, 3)
        box.setSpacing(1)
        row = QHBoxLayout()
        row.setSpacing(6)
        self.icon_label = QLabel()
        self.icon_label.setObjectName("attachmentIcon")
        self.name_label = QLabel(name)
        self.name_label.setObjectName("attachmentName")
        self.detail_label = QLabel("reading…")
        self.detail_label.setObjectName("attachmentDetail")
        self.cost_label = QLabel()
        self.cost_label.setObjectName("attachmentCost")
        self.cost_label.hide()
        self.remove_button = QToolButton()
        self.remove_button.setObjectName("attachmentRemove")
        self.remove_button.setText("✕")
        self.remove_button.setAutoRaise(True)
        self.remove_button.setToolTip(f"Remove {name}; it is not sent")
        self.remove_button.setAccessibleName(f"Remove {name}")
        self.remove_button.clicked.connect(lambda: emit(self.remove_requested, self))
        self.remove_button.hide()
        for w in (self.icon_label, self.name_label, self.detail_label, self.cost_label):
            row.addWidget(w)
        row.addStretch(1)  # a chip wider than its row (a warning under it): the row stays at the left
        row.addWidget(self.remove_button)
        box.addLayout(row)
        self.warning_label = QLabel()
        self.warning_label.setObjectName("attachmentWarning")
        self.warning_label.setWordWrap(True)
        self.warning_label.hide()
        box.addWidget(self.warning_label)
        self.setSizePolicy(QSizePolicy.Maximum, QSizePolicy.Fixed)
        self.setAccessibleName(f"Attachment {name}, being read")
        self.setToolTip(f"Reading {name}…")

    @property
    def reading(self) -> bool:
        return self.item is None

    def set_attachment(self, item) -> None:
        """Read: show what it is (name, pages or size) with its preview; the × appears."""
        self.item = item
        self.name = item.name
        self.name_label.setText(item.name)
        kind_icon(self.icon_label, "image" if is_image(item) else "document")
        self.detail_label.setText(detail(item))
        self.setToolTip(preview(item))
        self.remove_button.show()
        self._restyle("reading", False)
        self._say()

    def set_cost(self, text: str, warning: str = "") -> None:
        """The engine's figures for it ("" while unknown: no model loaded), and its warning, if any."""
        self.cost_label.setText(text)
        self.cost_label.setVisible(bool(text))
        self.warning = warning
        self.warning_label.setText(warning)
        # A wrapped label does not lend its height to a chip of fixed height: given a width, it gets the height its
        # lines take (else a long warning overlapped the chip's name row).
        self.warning_label.setMinimumWidth(WARNING_PX if warning else 0)
        self.warning_label.setMinimumHeight(self.warning_label.heightForWidth(WARNING_PX) if warning else 0)
        self.warning_label.setVisible(bool(warning))
        self._restyle("warning", bool(warning))
        self._say()

    def cost_text(self) -> str:
        return self.cost_label.text()

    def _restyle(self, prop: str, value: bool) -> None:
        if self.property(prop) != value:
            self.setProperty(prop, value)
            self.style().unpolish(self)  # the stylesheet's [warning="true"] rule follows the property
            self.style().polish(self)

    def changeEvent(self, event):  # noqa: N802 - Qt override
        super().changeEvent(event)
        follow_theme(self, event)

    def _say(self) -> None:
        """What a screen reader says: the chip's whole line, its warning too."""
        bits = [self.name, self.detail_label.text()] + ([self.cost_label.text()] if self.cost_label.text() else [])
        self.setAccessibleName("Attachment " + ", ".join(bits))
        self.setAccessibleDescription(self.warning)


class AttachmentChips(QWidget):
    """The chips above the message box, one under another; hidden while there are none."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("attachmentChips")
        self.setAccessibleName("Attachments to send")
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(4)
        self._chips: list[AttachmentChip] = []
        self.summary = QLabel()  # two or more: what they cost together, and its warning
        self.summary.setObjectName("attachmentSummary")
        self.summary.setWordWrap(True)
        self.summary.setProperty("warning", False)
        self.summary.hide()
        self._layout.addWidget(self.summary)
        self.hide()

    def set_summary(self, text: str, warning: str = "") -> None:
        self.summary.setText("\n".join(t for t in (text, warning) if t))
        self.summary.setVisible(bool(text) and len(self._chips) > 1)
        if self.summary.property("warning") != bool(warning):
            self.summary.setProperty("warning", bool(warning))
            self.summary.style().unpolish(self.summary)
            self.summary.style().polish(self.summary)

    def add(self, chip: AttachmentChip) -> AttachmentChip:
        self._layout.insertWidget(self._layout.count() - 1, chip, 0, Qt.AlignLeft)  # above the summary
        self._chips.append(chip)
        self.show()
        return chip

    def remove(self, chip: AttachmentChip) -> None:
        if chip in self._chips:
            self._chips.remove(chip)
            chip.hide()
            chip.setParent(None)
            chip.deleteLater()
        if len(self._chips) < 2:
            self.summary.hide()
        self.setVisible(bool(self._chips))

    def clear(self) -> None:
        for chip in list(self._chips):
            self.remove(chip)

    def chips(self) -> list[AttachmentChip]:
        return list(self._chips)


class AttachedFiles(QWidget):
    """Under a sent message: its images as thumbnails (in a row) and its documents, a line each."""

    def __init__(self, items: Sequence, parent=None):
        super().__init__(parent)
        self.setObjectName("attachedFiles")
        self.items = list(items)
        box = QVBoxLayout(self)
        box.setContentsMargins(0, 2, 0, 2)
        box.setSpacing(4)
        self.thumbnails: list[QLabel] = []
        self.lines: list[QLabel] = []
        images = [i for i in self.items if is_image(i)]
        if images:
            row = QHBoxLayout()
            row.setSpacing(6)
            for item in images:
                label = QLabel()
                label.setObjectName("attachedImage")
                label.setPixmap(thumbnail(item))
                label.setToolTip(preview(item))
                label.setAccessibleName(f"Image {item.name}, {detail(item)}")
                row.addWidget(label)
                self.thumbnails.append(label)
            row.addStretch(1)
            box.addLayout(row)
        for item in self.items:
            if is_image(item):
                continue
            line = QFrame()
            line.setObjectName("attachedDocument")
            h = QHBoxLayout(line)
            h.setContentsMargins(6, 2, 8, 2)
            h.setSpacing(6)
            mark = QLabel()
            kind_icon(mark, "document")
            text = QLabel(f"{item.name} · {detail(item)}")
            text.setObjectName("attachedDocumentName")
            h.addWidget(mark)
            h.addWidget(text)
            line.setToolTip(preview(item))
            line.setAccessibleName(f"Document {item.name}, {detail(item)}")
            line.setSizePolicy(QSizePolicy.Maximum, QSizePolicy.Fixed)
            box.addWidget(line, 0, Qt.AlignLeft)
            self.lines.append(text)

    def changeEvent(self, event):  # noqa: N802 - Qt override
        super().changeEvent(event)
        follow_theme(self, event)

    @classmethod
    def attach(cls, message, items: Optional[Sequence]) -> Optional["AttachedFiles"]:
        """Put the files of a message widget's message under its header (above its text); None without any."""
        if not items:
            return None
        shown = cls(items, message)
        layout = message.layout()
        layout.insertWidget(layout.indexOf(message.browser), shown)
        message.attached = shown
        return shown
