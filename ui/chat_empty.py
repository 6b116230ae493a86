"""What an empty chat shows under its one line (which model, or why none): a few example prompts to start from.
A click sends the prompt as if typed; they show only while a model is loaded (else the line says what to do)."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QGridLayout, QPushButton, QSizePolicy, QWidget

from .signals import emit

# Short, different in kind (an explanation, code, a plan, a question about Redline's own point), and answerable by
# the starter model in a few hundred tokens.
EXAMPLE_PROMPTS = (
    "Explain how a language model writes a reply",
    "Write a Python function that checks for primes",
    "Plan a relaxed three-day visit to Lisbon",
    "Why run a model on my own computer?",
)


class ExamplePrompts(QWidget):
    chosen = Signal(str)  # the prompt clicked

    def __init__(self, prompts=EXAMPLE_PROMPTS, parent=None):
        super().__init__(parent)
        self.setObjectName("examplePrompts")
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 8, 0, 0)
        grid.setSpacing(8)
        self.buttons: list[QPushButton] = []
        for i, text in enumerate(prompts):
            button = QPushButton(text)
            button.setObjectName("examplePrompt")
            button.setToolTip("Send this message")
            # The grid's two columns share the reading column's width (each prompt fits half of it).
            button.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)
            button.setMinimumWidth(120)
            button.clicked.connect(lambda _checked=False, t=text: emit(self.chosen, t))
            grid.addWidget(button, i // 2, i % 2)
            self.buttons.append(button)
