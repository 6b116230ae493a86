"""A message's attachments in the conversation store (issue 50, item 2): a document and an image kept with a message
and listed back equal, one copy of a file however many messages use it, the copies deleted with the last message
that uses them, a database from before attachments opened as it was, and the exports listing them."""

from __future__ import annotations

import base64
import io
import json
import os
import sqlite3
import stat
import time

import old_store_schema
import pytest
from fpdf import FPDF
from PIL import Image as PILImage

from redline.app.store import IN_MEMORY, Store, open_store
from redline.inference import Document, Image, read_attachment, read_attachment_bytes


def write_pdf(path, pages: list[str]):
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 8, text)
    path.write_bytes(bytes(pdf.output()))
    return path


def png(width=40, height=20, colour="red") -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (width, height), colour).save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "data" / "chat.sqlite3")
    yield store
    store.close()


@pytest.fixture
def report(tmp_path):
    path = write_pdf(tmp_path / "report.pdf", ["The first page is about apples.", "The second is about pears."])
    return path, read_attachment(path)


def kept(store) -> list[str]:
    folder = store.path.parent / "attachments"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def test_a_document_and_an_image_come_back_equal_and_the_file_is_kept_once(store, report):
    path, doc = report
    image = read_attachment_bytes(png(), "red.png")
    assert isinstance(doc, Document) and doc.page_count == 2 and isinstance(image, Image)
    conv = store.create_conversation("t")
    first = store.add_message(conv.id, "user", "What is in these?")
    store.add_attachments(first.id, [doc, image], [path])
    second = store.add_message(conv.id, "user", "And again?")
    store.add_attachments(second.id, [doc], [path])

    assert store.attachments(first.id) == [doc, image]  # the document's pages from the row, the image from its file
    assert store.message(second.id).attachments == [doc]
    listed = store.messages(conv.id)
    assert [m.attachments for m in listed] == [[doc, image], [doc]]
    # One copy of the PDF for two messages, named by its content; the image's bytes beside it.
    assert kept(store) == sorted([f"{doc.sha256}.pdf", f"{image.sha256}.png"])
    copy = store.attachment_file(first.id, 0)
    assert copy.read_bytes() == path.read_bytes()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert stat.S_IMODE(copy.parent.stat().st_mode) == 0o700
    # A later turn never reads the PDF again: the original gone, the document is still whole.
    path.unlink()
    assert store.attachments(second.id) == [doc]


def test_files_go_with_the_last_message_that_uses_them(store, report):
    path, doc = report
    image = read_attachment_bytes(png(), "red.png")
    a = store.create_conversation("a")
    b = store.create_conversation("b")
    in_a = store.add_message(a.id, "user", "one")
    store.add_attachments(in_a.id, [doc, image], [path])
    in_b = store.add_message(b.id, "user", "two")
    store.add_attachments(in_b.id, [doc], [path])

    store.delete_conversation(a.id)  # the image was a's alone; the PDF is b's too
    assert kept(store) == [f"{doc.sha256}.pdf"]
    assert store._conn.execute("SELECT COUNT(*) FROM attachments").fetchone()[0] == 1  # b's row alone
    later = store.add_message(b.id, "user", "three")
    store.add_attachments(later.id, [image])  # an image's own bytes are its original
    assert kept(store) == sorted([f"{doc.sha256}.pdf", f"{image.sha256}.png"])
    store.delete_from(later.id)  # regenerate or edit: the messages from there on, and their files
    assert kept(store) == [f"{doc.sha256}.pdf"]
    assert store.attachments(later.id) == []
    store.delete_conversation(b.id)
    assert kept(store) == []


def test_a_document_without_its_original_keeps_its_text_and_a_moved_file_is_no_failure(store, tmp_path):
    doc = read_attachment_bytes(b"# Notes\n\nSome words.", "notes.md")
    conv = store.create_conversation("t")
    m = store.add_message(conv.id, "user", "read this")
    store.add_attachments(m.id, [doc], [tmp_path / "moved-away.md"])  # gone between attaching and sending
    assert store.attachments(m.id) == [doc]
    assert store.attachment_file(m.id, 0) is None and kept(store) == []


def test_a_file_left_by_a_send_that_never_committed_is_swept_at_the_next_start(tmp_path):
    path = tmp_path / "data" / "chat.sqlite3"
    store = Store(path)
    conv = store.create_conversation("t")
    m = store.add_message(conv.id, "user", "x")
    image = read_attachment_bytes(png(), "red.png")
    store.add_attachments(m.id, [image])
    store.close()
    orphan = path.parent / "attachments" / ("0" * 64 + ".png")
    orphan.write_bytes(b"left over")
    fresh = path.parent / "attachments" / ("1" * 64 + ".png")
    fresh.write_bytes(b"being added by another Redline right now")
    old = time.time() - 2 * 3600
    os.utime(orphan, (old, old))
    reopened, warning = open_store(path)
    try:
        assert warning is None
        assert not orphan.exists() and fresh.exists()  # a young file may be another window's send in progress
        assert reopened.attachments(m.id) == [image]
    finally:
        reopened.close()


def test_a_database_from_before_attachments_opens_with_its_messages(tmp_path, report):
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(
        old_store_schema.TABLES + "INSERT INTO conversations VALUES (1, 'old', '', 0, 0);"
        "INSERT INTO messages VALUES (1, 1, 0, 'user', 'hi', 0, NULL, 0, ''), "
        "(2, 1, 1, 'assistant', 'hello', 0, NULL, 0, '');"
    )
    conn.commit()
    conn.close()
    store = Store(path)
    try:
        assert [(m.content, m.attachments) for m in store.messages(1)] == [("hi", []), ("hello", [])]
        pdf, doc = report
        m = store.add_message(1, "user", "now with a file")
        store.add_attachments(m.id, [doc], [pdf])
        assert "Attached: report.pdf" in store.export_markdown(1)
    finally:
        store.close()
    reopened = Store(path)  # the second open finds the table there, with its row
    try:
        assert reopened.message(m.id).attachments == [doc]
        columns = {r[1] for r in reopened._conn.execute("PRAGMA table_info(attachments)")}
        assert {"message_id", "position", "kind", "name", "format", "sha256", "file", "pages", "width"} <= columns
    finally:
        reopened.close()


def test_the_exports_list_the_attachments(store, report):
    path, doc = report
    image = read_attachment_bytes(png(30, 10), "shot.png")
    conv = store.create_conversation("t")
    m = store.add_message(conv.id, "user", "Compare these")
    store.add_attachments(m.id, [doc, image], [path])
    store.add_message(conv.id, "assistant", "They differ.")

    md = store.export_markdown(conv.id)
    assert "- Attached: report.pdf (PDF document, 2 pages," in md
    assert "- Attached: shot.png (PNG image, 30×10," in md
    assert md.index("Compare these") < md.index("Attached: report.pdf") < md.index("## Assistant")

    data = json.loads(store.export_json(conv.id))
    user, answer = data["messages"]
    assert "attachments" not in answer
    pdf, picture = user["attachments"]
    assert pdf["kind"] == "document" and pdf["name"] == "report.pdf" and pdf["sha256"] == doc.sha256
    assert [p["text"] for p in pdf["pages"]] == [p.text for p in doc.pages]
    assert picture["kind"] == "image" and (picture["width"], picture["height"]) == (30, 10)
    assert base64.b64decode(picture["data"]) == image.data  # readable without the data folder


def test_a_store_in_memory_keeps_its_files_apart_and_removes_them_when_closed(tmp_path):
    store = Store(IN_MEMORY)
    conv = store.create_conversation("t")
    m = store.add_message(conv.id, "user", "x")
    image = read_attachment_bytes(png(), "red.png")
    store.add_attachments(m.id, [image])
    folder = store.files.root
    assert store.attachments(m.id) == [image] and (folder / "attachments").is_dir()
    store.close()
    assert not folder.exists()
