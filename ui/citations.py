"""Under a reply that was given excerpts of a document too long for the context: the excerpts it could cite, a
button each ("[2] annals.pdf, p. 31"); a click shows the excerpt's text as it was sent, a second hides it. The
engine numbers them in the prompt (``GenerationResult.citations``) and the reply's stats keep them."""

from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

EXCERPT_CHARS = 1500  # of an excerpt, shown when its button is clicked (the stats keep it whole)


def label(citation: dict) -> str:
    page = f", p. {citation['page']}" if citation.get("page") else ""
    return f"[{citation.get('number', '?')}] {citation.get('name', 'document')}{page}"


class Citations(QWidget):
    def __init__(self, citations: list[dict], parent=None):
        super().__init__(parent)
        self.setObjectName("citations")
        self.citations = list(citations)
        box = QVBoxLayout(self)
        box.setContentsMargins(0, 2, 0, 2)
        box.setSpacing(2)
        row = QHBoxLayout()
        row.setSpacing(4)
        title = QLabel("Sources:")
        title.setObjectName("citationsTitle")
        row.addWidget(title)
        self.buttons: list[QPushButton] = []
        for c in self.citations:
            b = QPushButton(label(c))
            b.setObjectName("citationButton")
            b.setFlat(True)
            b.setCheckable(True)
            b.setToolTip("Show the excerpt the reply was given")
            b.setAccessibleName(f"Source {label(c)}")
            b.toggled.connect(lambda on, c=c, b=b: self._show(c if on else None, b))
            row.addWidget(b)
            self.buttons.append(b)
        row.addStretch(1)
        box.addLayout(row)
        self.excerpt = QLabel()
        self.excerpt.setObjectName("citationExcerpt")
        self.excerpt.setWordWrap(True)
        self.excerpt.setFrameShape(QFrame.StyledPanel)
        self.excerpt.hide()
        box.addWidget(self.excerpt)

    def _show(self, citation: Optional[dict], button: QPushButton) -> None:
        if citation is None:
            if not any(b.isChecked() for b in self.buttons):
                self.excerpt.hide()
            return
        for b in self.buttons:  # one excerpt at a time
            if b is not button and b.isChecked():
                b.blockSignals(True)
                b.setChecked(False)
                b.blockSignals(False)
        text = " ".join(str(citation.get("text", "")).split())
        if len(text) > EXCERPT_CHARS:
            text = text[:EXCERPT_CHARS] + " …"
        self.excerpt.setText(f"{label(citation)}: {text}")
        self.excerpt.show()

    @classmethod
    def show_under(cls, message, stats: dict) -> Optional["Citations"]:
        """Under a reply's stats line, once: the excerpts its stats say it was given (None without any)."""
        cited = stats.get("citations") if stats else None
        if not cited or getattr(message, "citations", None) is not None:
            return getattr(message, "citations", None)
        shown = cls(cited, message)
        layout = message.layout()
        layout.insertWidget(layout.indexOf(message.stats_label) + 1, shown)
        message.citations = shown
        return shown
