"""Attachments in the window (issue 50, item 3): the paperclip, a drop on the chat or the box and a paste attach files,
read off the UI thread, each shown as a chip above the message box (its name, pages, preview; its cost while a model
is loaded; an × to remove it); sending takes the chips with the message and the transcript shows a line per
document and a thumbnail per image; a file that cannot be read is said in the banner, the typed text kept."""

from __future__ import annotations

import io
import threading

import pytest
from fpdf import FPDF
from gui_helpers import aloop, open_window, profile, start_slow_window, write_settings  # noqa: F401 - fixtures
from PIL import Image as PILImage
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QGuiApplication, QImage
from PySide6.QtWidgets import QApplication, QFileDialog
from test_theme import BODY, text_contrast

from redline.inference import ATTACHMENT_FILTER
from redline.ui.attachment_widgets import PREVIEW_CHARS, THUMBNAIL_PX
from redline.ui.window import attachments as attach_module
from redline.ui.window.reply_controller import STILL_READING

pytestmark = pytest.mark.usefixtures("aloop", "profile")

LONG_PAGE = "Apples grow on trees in orchards. " * 40  # over PREVIEW_CHARS on its own


def write_pdf(path, pages):
    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    path.write_bytes(bytes(pdf.output()))
    return path


def write_png(path, size=(640, 320), colour="green"):
    out = io.BytesIO()
    PILImage.new("RGB", size, colour).save(out, "PNG")
    path.write_bytes(out.getvalue())
    return path


@pytest.fixture
def files(tmp_path):
    return {
        "pdf": write_pdf(tmp_path / "report.pdf", [LONG_PAGE, "Pears, page two.", "Plums, page three."]),
        "png": write_png(tmp_path / "photo.png"),
        "md": _write(tmp_path / "notes.md", "# Notes\n\nShort."),
        "broken": _write(tmp_path / "broken.pdf", "%PDF-1.4\nthis is not a PDF at all"),
    }


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def slow_window(qtbot):
    return start_slow_window(qtbot, dict(interval_s=0.002, tokens=6), (1280, 800), max_new_tokens=6)


def chips(w):
    return w.attachment_chips.chips()


def read_chips(w):
    return [c for c in chips(w) if not c.reading]


def wait_chips(qtbot, w, n):
    qtbot.waitUntil(lambda: len(read_chips(w)) == n and not w.attachments.reading(), timeout=15_000)
    return read_chips(w)


def attach_by_button(qtbot, w, monkeypatch, paths):
    asked = {}

    def dialog(parent, caption, folder, flt):
        asked["filter"] = flt
        return [str(p) for p in paths], ""

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(dialog))
    w.attach_button.click()
    return asked


def url_mime(paths) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    return mime


def drop(widget, mime: QMimeData) -> bool:
    point = QPointF(widget.rect().center())
    enter = QDragEnterEvent(point.toPoint(), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(widget, enter)
    event = QDropEvent(point, Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(widget, event)
    return enter.isAccepted() and event.isAccepted()


def test_the_paperclip_reads_each_file_off_the_ui_thread_and_shows_its_chip(qtbot, monkeypatch, files):
    threads = []
    real = attach_module.read_attachment
    monkeypatch.setattr(
        attach_module, "read_attachment", lambda p: threads.append(threading.current_thread().name) or real(p)
    )
    w = slow_window(qtbot)
    try:
        assert w.attach_button.accessibleName() == "Attach files" and w.attach_button.toolTip()
        asked = attach_by_button(qtbot, w, monkeypatch, [files["pdf"], files["png"]])
        assert asked["filter"] == ATTACHMENT_FILTER
        pdf, png = wait_chips(qtbot, w, 2)
        assert all(name.startswith("redline-attach") for name in threads) and len(threads) == 2
        assert (pdf.name_label.text(), pdf.detail_label.text()) == ("report.pdf", "3 pages")
        assert (png.name_label.text(), png.detail_label.text()) == ("photo.png", "640×320")
        tip = pdf.toolTip()
        assert tip.startswith("report.pdf\n\nApples grow on trees") and tip.endswith("…")
        assert len(tip) <= len("report.pdf\n\n") + PREVIEW_CHARS + 1
        assert pdf.accessibleName().startswith("Attachment report.pdf, 3 pages")
        assert pdf.remove_button.accessibleName() == "Remove report.pdf"
        assert not pdf.icon_label.pixmap().isNull()
        assert w.input.toPlainText() == ""  # nothing typed into the box
    finally:
        w.shutdown()


@pytest.mark.filterwarnings("ignore:Function.*QDragEnterEvent:DeprecationWarning")  # Qt 6's one constructor
def test_files_dropped_on_the_box_or_the_chat_and_a_pasted_image_become_chips(qtbot, files):
    w = slow_window(qtbot)
    try:
        assert drop(w.input.viewport(), url_mime([files["md"]]))
        wait_chips(qtbot, w, 1)
        assert drop(w.tabs.widget(0), url_mime([files["png"]]))  # anywhere on the chat page
        wait_chips(qtbot, w, 2)
        QGuiApplication.clipboard().setImage(QImage(120, 80, QImage.Format.Format_RGB32))  # a screenshot
        w.input.setFocus()
        w.input.paste()  # Ctrl+V
        md, png, pasted = wait_chips(qtbot, w, 3)
        assert (md.name, png.name, pasted.name) == ("notes.md", "photo.png", "pasted image.png")
        assert pasted.item.mime == "image/png" and (pasted.item.width, pasted.item.height) == (120, 80)
        QGuiApplication.clipboard().setMimeData(url_mime([files["pdf"]]))  # a file manager's Copy
        w.input.paste()
        assert wait_chips(qtbot, w, 4)[-1].name == "report.pdf"
        assert w.input.toPlainText() == ""  # no addresses typed in
        QGuiApplication.clipboard().setText("plain words")  # text is still typed
        w.input.paste()
        assert w.input.toPlainText() == "plain words"
    finally:
        w.shutdown()


def test_removing_a_chip_leaves_it_out_of_the_message(qtbot, monkeypatch, files):
    w = slow_window(qtbot)
    try:
        attach_by_button(qtbot, w, monkeypatch, [files["md"], files["png"]])
        md, png = wait_chips(qtbot, w, 2)
        md.remove_button.click()
        assert [c.name for c in chips(w)] == ["photo.png"]
        assert [p.attachment.name for p in w.attachments.pending()] == ["photo.png"]
        png.remove_button.click()
        assert chips(w) == [] and not w.attachment_chips.isVisible() and w.attachments.pending() == []
        w.input.setPlainText("no files")
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            w.send()
        assert w.store.messages(w.conversation_id)[0].attachments == []
    finally:
        w.shutdown()


def test_sending_takes_the_chips_and_the_transcript_shows_a_line_and_a_thumbnail(qtbot, monkeypatch, files):
    w = slow_window(qtbot)
    try:
        attach_by_button(qtbot, w, monkeypatch, [files["pdf"], files["png"]])
        wait_chips(qtbot, w, 2)
        w.input.setPlainText("What do these say?")
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            w.send()
        assert chips(w) == [] and not w.attachment_chips.isVisible() and w.input.toPlainText() == ""
        user = w.store.messages(w.conversation_id)[0]
        assert [a.name for a in user.attachments] == ["report.pdf", "photo.png"]

        def shown():
            widget = w.chat_view.widget_for(user.id)
            return widget.attached

        check_shown(shown())
        w.new_chat()  # reopened from the store: the same
        w.open_conversation(user.conversation_id)
        check_shown(shown())
    finally:
        w.shutdown()


def check_shown(attached):
    QApplication.processEvents()  # a widget built into a shown layout shows on the next turn
    assert attached is not None and attached.isVisible()
    (thumb,) = attached.thumbnails
    pixmap = thumb.pixmap()
    assert max(pixmap.width(), pixmap.height()) == THUMBNAIL_PX and pixmap.width() == 2 * pixmap.height()
    assert thumb.accessibleName() == "Image photo.png, 640×320"
    assert [line.text() for line in attached.lines] == ["report.pdf · 3 pages"]


def test_a_file_that_cannot_be_read_is_said_in_the_banner_and_the_text_stays(qtbot, monkeypatch, files):
    w = slow_window(qtbot)
    try:
        w.input.setPlainText("Summarise this")
        attach_by_button(qtbot, w, monkeypatch, [files["broken"]])
        qtbot.waitUntil(lambda: w.banner.isVisible() and "broken.pdf" in w.banner.label.text(), timeout=15_000)
        assert w.banner.kind == "error"
        assert chips(w) == [] and w.attachments.pending() == [] and w.attachments.reading() == []
        assert w.input.toPlainText() == "Summarise this"
    finally:
        w.shutdown()


def test_a_message_waits_for_a_file_still_being_read(qtbot, monkeypatch, files):
    release = threading.Event()
    real = attach_module.read_attachment
    monkeypatch.setattr(attach_module, "read_attachment", lambda p: release.wait(10) and real(p))
    w = slow_window(qtbot)
    try:
        attach_by_button(qtbot, w, monkeypatch, [files["pdf"]])
        assert [c.name for c in chips(w)] == ["report.pdf"] and chips(w)[0].reading  # "reading…"
        w.input.setPlainText("Summarise it")
        w.send()
        qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=5000)
        assert w.banner.label.text() == STILL_READING.format(names="report.pdf")
        assert w.input.toPlainText() == "Summarise it" and w.conversation_id is None  # nothing was sent
        release.set()
        wait_chips(qtbot, w, 1)
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            w.send()
        assert not w.banner.isVisible()  # the notice that held it back went with it
        assert [a.name for a in w.store.messages(w.conversation_id)[0].attachments] == ["report.pdf"]
    finally:
        w.shutdown()


def test_editing_a_sent_message_puts_its_attachments_back_as_chips(qtbot, monkeypatch, files):
    w = slow_window(qtbot)
    try:
        attach_by_button(qtbot, w, monkeypatch, [files["pdf"], files["png"]])
        wait_chips(qtbot, w, 2)
        w.input.setPlainText("first try")
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            w.send()
        user = w.store.messages(w.conversation_id)[0]
        kept = w.store.attachment_file(user.id, 0)
        w.chat_view.widget_for(user.id).action_button.click()  # Edit
        assert [c.name for c in wait_chips(qtbot, w, 2)] == ["report.pdf", "photo.png"]
        read_chips(w)[1].remove_button.click()  # the image is left out this time
        w.input.setPlainText("second try")
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            w.send()
        (again, _reply) = w.store.messages(w.conversation_id)
        assert again.content == "second try" and [a.name for a in again.attachments] == ["report.pdf"]
        assert w.store.attachment_file(again.id, 0) == kept and kept.is_file()  # the original kept through the edit
        assert not any(p.suffix == ".png" for p in kept.parent.iterdir())  # the image went with the old message
    finally:
        w.shutdown()


def test_without_a_model_a_chip_shows_name_and_pages_and_asks_the_engine_nothing(qtbot, monkeypatch, files):
    w = open_window(qtbot, wait_loaded=False)
    try:
        assert w.models.loaded is None
        jobs = []
        real = w.engine.run
        monkeypatch.setattr(w.engine, "run", lambda fn, label="", **k: jobs.append(label) or real(fn, label, **k))
        attach_by_button(qtbot, w, monkeypatch, [files["pdf"]])
        (chip,) = wait_chips(qtbot, w, 1)
        assert (chip.name, chip.detail_label.text(), chip.cost_text()) == ("report.pdf", "3 pages", "")
        assert not chip.cost_label.isVisible() and attach_module.COST_LABEL not in jobs
        w.input.setPlainText("hello")
        w.send()
        assert w.input.toPlainText() == "hello" and len(chips(w)) == 1  # refused for want of a model: all kept
    finally:
        w.shutdown()


def test_chips_show_the_engines_cost_and_its_warning_readably_in_both_themes(qtbot, monkeypatch, files, tiny_model_dir):
    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=8, theme="light")
    w = open_window(qtbot)
    try:
        attach_by_button(qtbot, w, monkeypatch, [files["md"], files["pdf"]])
        md, pdf = wait_chips(qtbot, w, 2)
        qtbot.waitUntil(lambda: bool(md.cost_text() and pdf.cost_text()), timeout=30_000)
        assert md.cost_text().split(" · ")[0].endswith(" tokens")
        pending = w.attachments.pending()
        assert md.cost_text() == pending[0].cost.text and pdf.cost_text() == pending[1].cost.text
        assert pending[1].cost.tokens > pending[0].cost.tokens  # three pages cost more than a line
        for chip, p in ((md, pending[0]), (pdf, pending[1])):
            assert chip.warning == p.cost.warning and chip.property("warning") == bool(p.cost.warning)
            assert chip.warning_label.isVisible() == bool(p.cost.warning)
        qtbot.waitUntil(lambda: w.attachment_chips.summary.isVisible(), timeout=30_000)
        assert w.attachment_chips.summary.text().startswith("Together: ")
        for theme in ("light", "dark"):
            w.theme_actions[theme].trigger()
            QApplication.processEvents()
            for chip in (md, pdf):
                assert text_contrast(chip.name_label) >= BODY, (theme, chip.name)
                assert text_contrast(chip.cost_label) >= BODY, (theme, chip.name)
    finally:
        w.shutdown()


def test_a_warning_turns_the_chip_to_the_warning_colours(qtbot, monkeypatch, files):
    """The chip's look for a warning (the engine's sentence, stood in here: the stand-in engine has no tokenizer)."""
    w = slow_window(qtbot)
    try:
        attach_by_button(qtbot, w, monkeypatch, [files["md"]])
        (chip,) = wait_chips(qtbot, w, 1)
        # the stand-in engine's answer (a failure: no figures) first, so it cannot clear the look set below
        qtbot.waitUntil(lambda: w.attachments.pending()[0].answered, timeout=15_000)
        chip.set_cost("9,000 tokens · 1.1 GB KV", "With the conversation so far this fills the context.")
        QApplication.processEvents()
        assert chip.warning_label.isVisible() and chip.property("warning") is True
        assert "fills the context" in chip.accessibleDescription()
        for theme in ("light", "dark"):
            w.theme_actions[theme].trigger()
            QApplication.processEvents()
            assert text_contrast(chip.warning_label) >= BODY, theme
            background = chip.grab().toImage().pixelColor(QPoint(chip.width() // 2, 2))
            assert background != QColor(w.look.theme.user_bubble)  # not the plain chip's colour
    finally:
        w.shutdown()


def test_an_image_a_text_only_model_refuses_is_kept_to_send_again(qtbot, monkeypatch, files, tiny_model_dir):
    """The engine's own refusal (the tiny model reads text only): the message and its image stay in the
    conversation, and Edit brings them back as chips to send again without the image."""
    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=4)
    w = open_window(qtbot)
    try:
        attach_by_button(qtbot, w, monkeypatch, [files["png"], files["md"]])
        wait_chips(qtbot, w, 2)
        w.input.setPlainText("What is this?")
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            w.send()
        assert w.banner.kind == "error" and "cannot see images" in w.banner.label.text()
        user, line = w.store.messages(w.conversation_id)
        assert [a.name for a in user.attachments] == ["photo.png", "notes.md"] and line.content == ""
        w.chat_view.widget_for(user.id).action_button.click()  # Edit
        image, _notes = wait_chips(qtbot, w, 2)
        image.remove_button.click()
        with qtbot.waitSignal(w.reply_finished, timeout=30_000) as ended:
            w.send()
        assert ended.args[0] is not None and ended.args[0].finish_reason != "error"
        again, reply = w.store.messages(w.conversation_id)
        assert [a.name for a in again.attachments] == ["notes.md"] and again.content == "What is this?"
    finally:
        w.shutdown()
