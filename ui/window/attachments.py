"""Attaching files to the next message: the paperclip (a file dialog), files dropped on the chat or the message box,
an image or files pasted into the box. Each file is read on a thread of its own (``redline-attach``; a 40-page PDF
takes a second) while its chip says "reading…"; then the chip shows what it is and, while a model is loaded, what it
costs: the engine's ``attachment_cost_job`` through the bridge, with the conversation so far counted. A file that
cannot be read is said in the banner, and has no chip.

The reply controller takes what is pending when the message is sent (``pending``), clears the chips once the message
is written (``clear``) and, when a sent message is edited, puts its attachments back as chips (``restore``)."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

from PySide6.QtCore import QBuffer, QByteArray, QEvent, QIODevice, QObject, Qt, Signal
from PySide6.QtWidgets import QFileDialog

from ...inference import (
    ATTACHMENT_FILTER,
    Completed,
    Failed,
    attachment_cost_job,
    read_attachment,
    read_attachment_bytes,
)
from ..attachment_widgets import AttachmentChip, AttachmentChips
from ..bridge import user_message
from ..signals import emit
from ..widgets import local_files

PASTED_NAME = "pasted image.png"
HISTORY_LOOKBACK = 8  # messages read to count the conversation so far (the last reply's figures say the rest)
CHARS_PER_TOKEN = 4  # where no reply has said how long its prompt was
COST_LABEL = "an attachment's cost"


@dataclass
class Pending:
    """An attachment read and waiting to go with the next message."""

    attachment: Any  # Document | Image
    source: Any = None  # its original: a path, or bytes; None where the attachment holds it (an image)
    chip: Optional[AttachmentChip] = None
    cost: Any = None  # the engine's AttachmentCost, once it said
    answered: bool = False  # the engine answered (with figures, or a failure: none to show)


def png_bytes(image) -> bytes:
    """A QImage as PNG (a paste's bytes; QImage is safe to use off the UI thread)."""
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.WriteOnly)
    image.save(buffer, "PNG")
    buffer.close()
    return bytes(data.data())


def _together(cost) -> tuple[str, str]:
    return (f"Together: {cost.text}", cost.warning) if cost else ("", "")


class AttachmentsController(QObject):
    changed = Signal()  # the pending attachments changed (one read, removed, sent)
    _read = Signal(int, object, object, object)  # ticket, attachment, source, error: from the reading thread

    def __init__(
        self,
        bridge,
        store,
        models,
        chats,
        message_input,
        chips: AttachmentChips,
        button,
        banner,
        drop_on,
        dialog_parent=None,
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self.bridge, self.store, self.models, self.chats = bridge, store, models, chats
        self.input, self.chips, self.button, self.banner = message_input, chips, button, banner
        self.dialog_parent = dialog_parent
        self._pending: list[Pending] = []
        self._reading: dict[int, AttachmentChip] = {}
        self._tickets = itertools.count(1)
        self._asked = 0  # the latest round of cost questions; older answers are dropped
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="redline-attach")
        self._read.connect(self._on_read, Qt.QueuedConnection)
        button.clicked.connect(self.choose_files)
        message_input.files_given.connect(self.add_paths)
        message_input.image_given.connect(self.add_image)
        drop_on.setAcceptDrops(True)
        drop_on.installEventFilter(self)
        models.state_changed.connect(self.refresh_costs)  # a model loaded or gone: the chips' figures follow
        chats.opened.connect(lambda _cid: self.refresh_costs())  # another conversation: another history

    # -- what is pending -----------------------------------------------------------------------------------
    def pending(self) -> list[Pending]:
        return list(self._pending)

    def reading(self) -> list[str]:
        """The names of files still being read."""
        return [chip.name for chip in self._reading.values()]

    def clear(self) -> None:
        """Sent (or the edit it came from was left): no chips; a file still being read is dropped when it ends."""
        self._pending.clear()
        self._reading.clear()
        self.chips.clear()
        emit(self.changed)

    def remove(self, chip: AttachmentChip) -> None:
        self._pending = [p for p in self._pending if p.chip is not chip]
        self.chips.remove(chip)
        self.refresh_costs()
        emit(self.changed)

    def restore(self, message) -> None:
        """Edit a sent message: its attachments come back as chips (their kept originals read now, before the
        message and its files are replaced)."""
        self.clear()
        for i, item in enumerate(getattr(message, "attachments", None) or []):
            source = None
            path = self.store.attachment_file(message.id, i) if hasattr(self.store, "attachment_file") else None
            if path is not None:
                try:
                    source = path.read_bytes()
                except OSError:
                    source = None
            self._add_read(item, source)
        self.refresh_costs()

    # -- attaching -----------------------------------------------------------------------------------------
    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self.dialog_parent, "Attach files", "", ATTACHMENT_FILTER)
        self.add_paths(paths)

    def add_paths(self, paths: list) -> None:
        for path in paths:
            name = str(path).replace("\\", "/").rsplit("/", 1)[-1]
            self._start(name, lambda p=str(path): (read_attachment(p), p))

    def add_image(self, image) -> None:
        """A pasted (or dropped) image: attached as a PNG, "pasted image.png"."""
        if image is None or image.isNull():
            return

        copy = image.copy()  # the clipboard's image may change before the thread reads it

        def work():
            data = png_bytes(copy)
            return read_attachment_bytes(data, PASTED_NAME, "image/png"), None

        self._start(PASTED_NAME, work)

    def _start(self, name: str, work) -> None:
        ticket = next(self._tickets)
        chip = self.chips.add(AttachmentChip(name))
        self._reading[ticket] = chip

        def run():
            try:
                item, source = work()
            except BaseException as exc:  # said on the UI thread, in one sentence
                self._say(ticket, None, None, exc)
                return
            self._say(ticket, item, source, None)

        self._pool.submit(run)

    def _say(self, ticket, item, source, error) -> None:  # the reading thread
        try:
            emit(self._read, ticket, item, source, error)
        except RuntimeError:  # the window went away while the file was read
            pass

    def _on_read(self, ticket: int, item, source, error) -> None:
        chip = self._reading.pop(ticket, None)
        if chip is None:
            return  # cleared meanwhile (sent, or an edit left)
        if error is not None:
            self.chips.remove(chip)
            self.banner.show_message(user_message(error), "error")
            emit(self.changed)
            return
        self._add_read(item, source, chip)
        self.refresh_costs()

    def _add_read(self, item, source, chip: Optional[AttachmentChip] = None) -> None:
        """``item`` read: its chip (the one that said "reading…", in the place it was attached) shows it."""
        chip = chip or self.chips.add(AttachmentChip(item.name))
        chip.set_attachment(item)
        chip.remove_requested.connect(self.remove)
        self._pending.append(Pending(item, source, chip))
        order = self.chips.chips()
        self._pending.sort(key=lambda p: order.index(p.chip))  # in the order attached, whichever was read first
        emit(self.changed)

    # -- what each costs ------------------------------------------------------------------------------------
    def history_tokens(self) -> int:
        """The open conversation's length in tokens, near enough: the last reply's prompt and answer as the engine
        counted them, and what came after it estimated from its characters."""
        cid = self.chats.conversation_id
        if cid is None:
            return 0
        tail = 0
        for m in reversed(self.store.messages(cid, limit=HISTORY_LOOKBACK)):
            stats = m.stats or {}
            if m.role == "assistant" and stats.get("prompt_tokens"):
                return int(stats["prompt_tokens"]) + int(stats.get("new_tokens") or 0) + tail
            tail += len(m.content) // CHARS_PER_TOKEN
        return tail

    def refresh_costs(self) -> None:
        """Ask the engine what each chip costs after the conversation so far, and, for two or more, what they cost
        together (said under them); without a model the chips show what they are and no figures."""
        self._asked += 1
        self.chips.set_summary("")
        if self.models.loaded is None or self.models.unloading:
            for p in self._pending:
                p.cost = None
                p.chip.set_cost("")
            return
        history = self.history_tokens()
        for p in self._pending:
            self._ask([p.attachment], history, lambda cost, p=p: self._show_cost(p, cost))
        if len(self._pending) > 1:
            together = [p.attachment for p in self._pending]
            self._ask(together, history, lambda cost: self.chips.set_summary(*_together(cost)))

    def _ask(self, attachments: list, history: int, then) -> None:
        ask = self.bridge.run(attachment_cost_job(attachments, history), label=COST_LABEL)
        ask.events.connect(lambda events, r=self._asked: self._answered(r, events, then))

    def _answered(self, round_: int, events: list, then) -> None:
        if round_ != self._asked or not isinstance(events[-1], (Completed, Failed)):
            return  # the chips changed since it was asked: a newer round answers
        final = events[-1]
        then(final.value if isinstance(final, Completed) else None)  # a failure (a stand-in engine): no figures

    def _show_cost(self, pending: Pending, cost) -> None:
        if pending in self._pending:
            pending.cost, pending.answered = cost, True
            pending.chip.set_cost(cost.text if cost else "", cost.warning if cost else "")

    # -- dropped on the chat ----------------------------------------------------------------------------------
    def eventFilter(self, obj, event):  # noqa: N802 - Qt override
        kind = event.type()
        if kind in (QEvent.DragEnter, QEvent.DragMove):
            mime = event.mimeData()
            if local_files(mime) or mime.hasImage():
                event.acceptProposedAction()
                return True
        elif kind == QEvent.Drop:
            mime = event.mimeData()
            files = local_files(mime)
            if files or mime.hasImage():
                if files:
                    self.add_paths(files)
                else:
                    image = mime.imageData()
                    self.add_image(image.toImage() if hasattr(image, "toImage") else image)
                event.acceptProposedAction()
                return True
        return False

    def shutdown(self) -> None:
        """The window closes: a file being read is not waited for."""
        self._pool.shutdown(wait=False, cancel_futures=True)
