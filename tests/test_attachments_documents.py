"""Documents and images attached to a message (issue 50): reading them (and refusing what cannot be read, with a
message that names the file and what to do), cutting them into chunks, finding the chunk that answers a question,
and placing them before the question in the prompt. The files are written here: PDFs with fpdf2, DOCX with
python-docx, images with Pillow."""

from __future__ import annotations

import hashlib
import io
import random
import zipfile

import docx
import pytest
from fpdf import FPDF
from PIL import Image as PILImage

from redline.inference.attachments import read as read_module
from redline.inference.attachments.chunks import Chunk, estimate_tokens, split
from redline.inference.attachments.compose import document_block, place
from redline.inference.attachments.read import ACCEPTED, FILE_FILTER, MAX_BYTES, read_attachment, read_bytes
from redline.inference.attachments.retrieval import Index, fts_query
from redline.inference.attachments.types import AttachmentError, Document, Image, Page

FACT = "The bridge at Calvera was rebuilt in 1874 by the engineer Ottilie Marsh."
QUESTION = "Who rebuilt the bridge at Calvera?"
FACT_PAGE = 23
WORDS = (
    "amber basalt cedar delta ember fjord granite harvest indigo juniper kestrel lagoon meadow nickel orchard "
    "pewter quarry saffron tundra umber velvet walnut yarrow zephyr copper lantern marble thistle willow cobalt "
    "falcon glacier heron island jasper kettle linen mosaic nectar oyster pigeon quartz raven silver tulip"
).split()


def filler_pages(n: int, seed: int = 7) -> list[str]:
    """``n`` pages of distinct sentences from a seeded word list; none holds a word of FACT or QUESTION."""
    rng = random.Random(seed)
    pages = []
    for _ in range(n):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 14))).capitalize() + "."
            for _ in range(rng.randint(7, 9))
        ]
        pages.append(" ".join(sentences[:4]) + "\n\n" + " ".join(sentences[4:]))
    return pages


def make_pdf(pages: list[str], user_password: str | None = None) -> bytes:
    pdf = FPDF()
    if user_password is not None:
        pdf.set_encryption(owner_password="owner-secret", user_password=user_password)
    pdf.set_font("Helvetica", size=10)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 5, text)
    return bytes(pdf.output())


def long_pdf() -> bytes:
    pages = filler_pages(40)
    pages[FACT_PAGE - 1] = pages[FACT_PAGE - 1].replace("\n\n", f" {FACT}\n\n", 1)
    return make_pdf(pages)


def png_bytes(size=(31, 17), fmt="PNG") -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", size, (200, 30, 40)).save(out, format=fmt)
    return out.getvalue()


def flat(text: str) -> str:
    return " ".join(text.split())  # a PDF's text breaks lines where the page did


def refused(path_or_bytes, name: str) -> str:
    with pytest.raises(AttachmentError) as info:
        if isinstance(path_or_bytes, bytes):
            read_bytes(path_or_bytes, name)
        else:
            read_attachment(path_or_bytes)
    message = str(info.value)
    assert name in info.value.message and info.value.hint, message  # names the file, and says what to do
    return message


# ---- Reading --------------------------------------------------------------------------------------------------


def test_a_pdf_is_read_page_by_page_with_1_based_numbers_and_the_sha256_of_its_bytes(tmp_path):
    data = make_pdf(["Alpha page text.", "Beta page text.", "Gamma page text."])
    path = tmp_path / "three.pdf"
    path.write_bytes(data)
    doc = read_attachment(path)
    assert isinstance(doc, Document) and doc.kind == "pdf" and doc.name == "three.pdf"
    assert [p.number for p in doc.pages] == [1, 2, 3]
    assert [p.text for p in doc.pages] == ["Alpha page text.", "Beta page text.", "Gamma page text."]
    assert doc.sha256 == hashlib.sha256(data).hexdigest()
    assert read_attachment(path, name="shown.pdf").name == "shown.pdf"


def test_a_pdf_is_known_by_its_content_whatever_its_extension():
    doc = read_bytes(make_pdf(["Content decides."]), "misnamed.txt")
    assert doc.kind == "pdf" and doc.pages[0].text == "Content decides."


def test_a_pdf_locked_only_for_its_owner_opens_with_the_empty_password():
    doc = read_bytes(make_pdf(["Readable without a password."], user_password=""), "restricted.pdf")
    assert doc.pages[0].text == "Readable without a password."


def test_a_password_protected_pdf_is_refused_with_a_hint_to_save_an_unprotected_copy():
    message = refused(make_pdf(["Hidden."], user_password="secret"), "locked.pdf")
    assert "password-protected" in message and "unprotected copy" in message


@pytest.mark.parametrize("cut", ["truncated", "garbage"])
def test_a_corrupt_pdf_is_refused_with_the_reason(cut):
    data = make_pdf(["Some text.", "More text."])
    data = data[: len(data) // 2] if cut == "truncated" else b"%PDF-1.4\n" + bytes(range(256)) * 8
    message = refused(data, "broken.pdf")
    assert "could not be read as a PDF:" in message and "PDF viewer" in message


def test_a_file_named_pdf_that_is_not_one_is_refused_as_a_pdf():
    assert "does not start with %PDF-" in refused(b"just words", "fake.pdf")


def test_a_pdf_with_no_text_layer_is_called_a_scan_and_ocr_is_suggested():
    pdf = FPDF()
    pdf.add_page()
    pdf.rect(20, 20, 80, 50, style="F")
    message = refused(bytes(pdf.output()), "scan.pdf")
    assert "no text layer" in message and "scan" in message and "OCR" in message


def test_a_docx_keeps_paragraphs_and_table_cells_in_order_as_page_1():
    document = docx.Document()
    document.add_paragraph("Before the table.")
    table = document.add_table(rows=2, cols=2)
    for (r, c), text in {(0, 0): "Name", (0, 1): "Year", (1, 0): "Calvera", (1, 1): "1874"}.items():
        table.cell(r, c).text = text
    document.add_paragraph("After the table.")
    out = io.BytesIO()
    document.save(out)
    doc = read_bytes(out.getvalue(), "notes.docx")
    assert doc.kind == "docx" and [p.number for p in doc.pages] == [1]
    assert doc.pages[0].text == "Before the table.\n\nName | Year\nCalvera | 1874\n\nAfter the table."


def test_a_broken_docx_and_an_empty_one_are_refused():
    assert "Word document" in refused(b"PK\x03\x04" + b"\x00" * 40, "broken.docx")
    empty = io.BytesIO()
    docx.Document().save(empty)
    assert "has no text" in refused(empty.getvalue(), "blank.docx")
    other_zip = io.BytesIO()
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("xl/workbook.xml", "<workbook/>")
    assert "no word/document.xml" in refused(other_zip.getvalue(), "sheet.docx")


def test_text_markdown_and_code_by_extension_and_encoding():
    assert read_bytes(b"# Title\n\nBody.\n", "readme.md").kind == "markdown"
    code = read_bytes(b"def f():\n    return 1   \n", "tool.py")
    assert code.kind == "code" and code.pages[0].text == "def f():\n    return 1   \n"  # code kept as is
    assert read_bytes(b"plain words", "notes.txt").kind == "text"
    assert read_bytes(b"no extension at all", "LICENSE").kind == "text"
    assert read_bytes("\ufeffcaf\u00e9 with a BOM".encode(), "bom.txt").pages[0].text == "caf\u00e9 with a BOM"
    assert read_bytes("utf-16 text \u00e9".encode("utf-16"), "wide.txt").pages[0].text == "utf-16 text \u00e9"
    assert read_bytes("Windows caf\u00e9".encode("cp1252"), "old.txt").pages[0].text == "Windows caf\u00e9"


def test_a_binary_file_is_refused_with_the_accepted_kinds():
    message = refused(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "program.bin")
    assert "not a document Redline can read" in message and ACCEPTED in message
    ole = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 504
    assert "older Office format" in refused(ole, "old.doc")
    assert "password-protected" in refused(ole, "locked.docx")  # an encrypted .docx is an OLE container


def test_images_are_checked_and_measured():
    data = png_bytes((31, 17))
    image = read_bytes(data, "red.png")
    assert isinstance(image, Image) and (image.mime, image.width, image.height) == ("image/png", 31, 17)
    assert image.sha256 == hashlib.sha256(data).hexdigest() and image.data == data
    jpeg = read_bytes(png_bytes((8, 9), "JPEG"), "photo.jpg")
    assert (jpeg.mime, jpeg.width, jpeg.height) == ("image/jpeg", 8, 9)
    assert read_bytes(png_bytes((5, 5), "GIF"), "anim.gif").mime == "image/gif"
    assert read_bytes(png_bytes((5, 5), "WEBP"), "pic.webp").mime == "image/webp"
    assert read_bytes(png_bytes((5, 5), "BMP"), "old.bmp").mime == "image/bmp"
    assert read_bytes(data, "pasted", mime="image/png").mime == "image/png"  # a paste has no extension


def test_an_image_in_another_format_is_refused_with_the_accepted_ones():
    message = refused(png_bytes((4, 4), "TIFF"), "scan.tiff")
    assert "TIFF" in message and "PNG, JPEG, WebP, GIF and BMP" in message
    assert "SVG" in refused(b"<svg xmlns='http://www.w3.org/2000/svg'/>", "logo.svg")


def test_garbage_named_png_and_a_truncated_png_are_refused_as_images():
    message = refused(b"this is not an image at all", "fake.png")
    assert "could not be read as a PNG image: its content is no image" in message and "BytesIO" not in message
    data = png_bytes((200, 200))
    assert "could not be read as a PNG image" in refused(data[: len(data) // 2], "cut.png")


def test_a_missing_an_empty_and_a_too_large_file_are_refused(tmp_path, monkeypatch):
    assert "does not exist" in refused(tmp_path / "gone.pdf", "gone.pdf")
    (tmp_path / "empty.txt").write_bytes(b"")
    assert "is empty" in refused(tmp_path / "empty.txt", "empty.txt")
    huge = tmp_path / "report.pdf"
    with huge.open("wb") as f:  # a sparse file: 512 MB by its size, nothing written; refused before reading
        f.truncate(512 * 1024**2)
    message = refused(huge, "report.pdf")
    assert "report.pdf is 512 MB; Redline attaches files up to 200 MB." in message and "Split" in message
    assert MAX_BYTES == 200 * 1024**2
    monkeypatch.setattr(read_module, "MAX_BYTES", 1024)
    assert "up to 1 KB" in refused(b"x" * 3000, "small.txt")


def test_the_file_filter_lists_documents_and_images():
    first, rest = FILE_FILTER.split(";;")
    assert first.startswith("Documents and images (") and rest == "All files (*)"
    for pattern in ("*.pdf", "*.docx", "*.md", "*.txt", "*.py", "*.png", "*.jpg", "*.webp"):
        assert pattern in first.removesuffix(")").split()


# ---- Chunks and retrieval -------------------------------------------------------------------------------------


def test_chunks_stay_within_the_target_keep_their_pages_and_overlap():
    doc = read_bytes(long_pdf(), "long.pdf")
    chunks = split(doc, target_tokens=120)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert max(estimate_tokens(c.text) for c in chunks) <= 130  # the pieces' counts sum to within a few
    assert all(c.text in doc.pages[c.page - 1].text for c in chunks)  # each a run of its own page's text
    assert {c.page for c in chunks} == set(range(1, 41))
    fact = [c for c in chunks if FACT in flat(c.text)]
    assert fact and {c.page for c in fact} == {FACT_PAGE}
    same_page = [(a, b) for a, b in zip(chunks, chunks[1:]) if a.page == b.page]
    overlapping = [(a, b) for a, b in same_page if a.text.rsplit(". ", 1)[-1] in b.text]
    assert len(overlapping) >= len(same_page) // 2  # most neighbours share their boundary sentence


def test_a_huge_paragraph_is_cut_by_words_and_a_huge_word_by_characters():
    doc = Document("blob.txt", "text", "0", (Page(1, "word " * 2000), Page(2, "x" * 9000)))
    chunks = split(doc, target_tokens=100)
    assert all(estimate_tokens(c.text) <= 101 for c in chunks)
    assert "".join(c.text for c in chunks if c.page == 2) == "x" * 9000
    assert sum(c.text.count("word") for c in chunks if c.page == 1) >= 2000


def test_the_index_finds_the_chunk_holding_a_fact_and_does_not_duplicate_a_document():
    doc = read_bytes(long_pdf(), "long.pdf")
    chunks = split(doc, target_tokens=150)
    index = Index()
    index.add("long", chunks)
    index.add("long", chunks)  # again: replaced, not doubled
    hits = index.search(QUESTION, limit=3)
    assert hits[0].page == FACT_PAGE and FACT in flat(hits[0].text)
    assert hits[0].score > 0 and hits == sorted(hits, key=lambda h: -h.score)
    assert len({(h.doc_key, h.chunk_index) for h in index.search("Calvera", limit=50)}) == len(
        index.search("Calvera", limit=50)
    )
    assert index.search(QUESTION, doc_keys=["other"]) == []
    first = index.search("what is the of?", limit=2)  # nothing usable: the first chunks
    assert [h.chunk_index for h in first] == [0, 1]


def test_a_question_becomes_a_safe_fts5_query():
    assert (
        fts_query('What is "the" NEAR(bridge) AND col:x* of Calvera?')
        == '"near" OR "bridge" OR "col" OR "x" OR "calvera"'
    )
    assert fts_query("what is the") == ""
    index = Index()
    index.add("d", [Chunk(0, 1, 'Odd "quotes" AND (brackets) * here.')])
    assert index.search('"quotes" AND (brackets) OR * -', limit=1)[0].chunk_index == 0  # no syntax error


# ---- Placing documents in the prompt --------------------------------------------------------------------------


def test_documents_that_fit_go_in_whole_before_the_question_with_a_stable_prefix():
    doc = read_bytes(make_pdf(["First page words.", "Second page words."]), "short.pdf")
    a = place("What is on page two?", [doc], budget_tokens=2000, count=estimate_tokens)
    b = place("Summarise it.", [doc], budget_tokens=2000, count=estimate_tokens)
    block = (
        '<document name="short.pdf" pages="2">\n[page 1]\nFirst page words.\n[page 2]\nSecond page words.\n</document>'
    )
    assert document_block(doc) == block
    asked = "\n\nQuestion about the document above: What is on page two?"
    assert a.whole and a.text == block + asked and a.cited == [] and a.notes == []
    assert b.text.startswith(block + "\n\n") and b.text.endswith("Summarise it.")
    note = read_bytes(b"A note.", "note.md")
    both = place("Q?", [doc, note], budget_tokens=2000, count=estimate_tokens)
    note = '\n\n<document name="note.md">\nA note.\n</document>'
    assert both.text == block + note + "\n\nQuestion about the documents above: Q?"


def test_a_document_too_long_for_the_budget_sends_the_excerpts_that_answer_the_question():
    doc = read_bytes(long_pdf(), "long.pdf")
    whole_tokens = estimate_tokens(document_block(doc))
    budget = whole_tokens // 5
    placed = place(QUESTION, [doc], budget_tokens=budget, count=estimate_tokens)
    assert not placed.whole and estimate_tokens(placed.text) <= budget
    assert placed.text.startswith('<excerpts from="long.pdf">\n[1] (page ')
    assert placed.text.endswith("Answer from the excerpts above and cite them by number, like [1].\n\n" + QUESTION)
    holding = [c for c in placed.cited if FACT in flat(c.text)]
    assert holding and holding[0].page == FACT_PAGE and holding[0].name == "long.pdf"
    n = placed.cited.index(holding[0]) + 1
    assert f"[{n}] (page {FACT_PAGE}) " in placed.text
    assert [(c.page, c.chunk_index) for c in placed.cited] == sorted((c.page, c.chunk_index) for c in placed.cited)
    assert len(placed.cited) >= 2  # the budget is used, not just the one best chunk
    (note,) = placed.notes
    assert note.startswith(f"long.pdf ({whole_tokens:,} tokens) does not fit the context; ")
    assert f"{len(placed.cited)} excerpts chosen for this question were sent" in note and str(FACT_PAGE) in note


def test_a_tiny_budget_still_sends_the_one_excerpt_that_answers():
    doc = read_bytes(long_pdf(), "long.pdf")
    placed = place(QUESTION, [doc], budget_tokens=60, count=estimate_tokens)
    assert len(placed.cited) == 1 and estimate_tokens(placed.text) <= 60
    assert placed.cited[0].page == FACT_PAGE and FACT in flat(placed.cited[0].text)
    cramped = place(QUESTION * 20, [doc], budget_tokens=60, count=estimate_tokens)
    assert len(cramped.cited) == 1 and "shorten it" in cramped.notes[-1]


def test_several_documents_share_the_budget_numbered_in_order_with_one_note():
    def words(text: str) -> int:
        return len(text.split())

    doc = read_bytes(long_pdf(), "long.pdf")
    town = read_bytes(b"Calvera is a hill town.\n\nIts old bridge crosses the river.", "town.md")
    placed = place(QUESTION, [doc, town], budget_tokens=600, count=words)
    assert not placed.whole and words(placed.text) <= 600
    assert placed.text.index('<excerpts from="long.pdf">') < placed.text.index('<excerpts from="town.md">')
    names = [c.name for c in placed.cited]
    assert names == sorted(names, key=["long.pdf", "town.md"].index) and "town.md" in names
    town_n = names.index("town.md") + 1
    assert f"[{town_n}] Calvera is a hill town." in placed.text  # not a PDF: no page
    assert any(FACT in flat(c.text) and c.page == FACT_PAGE for c in placed.cited)
    (note,) = placed.notes
    assert note.startswith("long.pdf (") and "and town.md (" in note and "do not fit the context together" in note


def test_the_attachment_modules_import_neither_torch_nor_qt_nor_transformers():
    import subprocess
    import sys

    code = (
        "import sys; import redline.inference.attachments.read, redline.inference.attachments.compose; "
        "print(sorted(m for m in ('torch', 'PySide6', 'transformers', 'pypdf', 'docx', 'PIL') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
