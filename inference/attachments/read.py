"""Read an attached file into a ``Document`` (its text, page by page) or an ``Image`` (its bytes, checked).

What a file is comes from its content first (``%PDF-``, a zip holding ``word/document.xml``, an image's
signature) and only then from its extension, so a PDF named ``.txt`` is still read as a PDF. Anything that
cannot be attached raises ``AttachmentError`` naming the file, what happened, and what to do instead."""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from pathlib import Path

from .types import AttachmentError, Document, Image, Page

MAX_BYTES = 200 * 1024**2  # the largest file Redline attaches

ACCEPTED = "PDF, DOCX, Markdown, plain text, source files, and PNG/JPEG/WebP/GIF/BMP images"

MARKDOWN_EXTENSIONS = frozenset({".md", ".markdown", ".mdown", ".mkd"})
TEXT_EXTENSIONS = frozenset({".txt", ".text", ".log", ".csv", ".tsv", ".rst", ".tex", ".srt", ".vtt"})
CODE_EXTENSIONS = frozenset(
    ".py .pyi .ipynb .js .mjs .cjs .jsx .ts .tsx .c .h .cc .cpp .cxx .hpp .hh .cu .cuh .rs .go .java .kt .kts "
    ".scala .swift .m .mm .cs .fs .vb .rb .php .pl .pm .lua .r .jl .dart .zig .nim .hs .ml .ex .exs .erl .clj "
    ".json .jsonl .yaml .yml .toml .ini .cfg .conf .env .xml .sh .bash .zsh .fish .ps1 .bat .cmd .html .htm "
    ".css .scss .sass .less .vue .svelte .sql .graphql .proto .cmake .mk .gradle .dockerfile .tf .nix".split()
)
CODE_NAMES = frozenset({"makefile", "dockerfile", "cmakelists.txt", "gemfile", "rakefile", "justfile"})

# The image formats a vision model is given, by PIL's format name.
IMAGE_MIMES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}
IMAGE_EXTENSIONS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".gif": "GIF", ".bmp": "BMP"}
# Images people attach that are refused, named so the message can say which format it was.
OTHER_IMAGE_EXTENSIONS = {
    ".tif": "TIFF",
    ".tiff": "TIFF",
    ".heic": "HEIC",
    ".heif": "HEIF",
    ".avif": "AVIF",
    ".svg": "SVG",
    ".ico": "ICO",
    ".psd": "PSD",
    ".jp2": "JPEG 2000",
}

FILE_FILTER = (
    "Documents and images ("
    + " ".join(
        f"*{e}"
        for e in sorted(
            {".pdf", ".docx"} | MARKDOWN_EXTENSIONS | TEXT_EXTENSIONS | CODE_EXTENSIONS | set(IMAGE_EXTENSIONS)
        )
    )
    + ");;All files (*)"
)


def read_attachment(path: str | Path, name: str | None = None) -> Document | Image:
    """The file at ``path`` read as a document or an image; ``name`` is what the user knows it by (its file
    name unless given). The size is checked before a byte is read."""
    path = Path(path)
    name = name or path.name
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise AttachmentError(
            f"{name} does not exist.", "It may have been moved or deleted; attach it again."
        ) from None
    except OSError as e:
        raise AttachmentError(f"{name} could not be opened ({e.strerror or e}).", "Check that you can open it.") from e
    if path.is_dir():
        raise AttachmentError(f"{name} is a folder, not a file.", "Attach the files inside it one by one.")
    _check_size(name, size)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise AttachmentError(f"{name} could not be read ({e.strerror or e}).", "Check that you can open it.") from e
    return read_bytes(data, name)


def read_bytes(data: bytes, name: str, mime: str | None = None) -> Document | Image:
    """``data`` (a file's bytes, or a pasted image's) read as a document or an image. ``mime``, when the bytes
    came with one (a paste, a drop), helps only where neither the content nor ``name`` tells the kind."""
    _check_size(name, len(data))
    if not data:
        raise AttachmentError(f"{name} is empty.", "Attach a file that has something in it.")
    sha = hashlib.sha256(data).hexdigest()
    ext = _extension(name)

    if data.startswith(b"%PDF-") or (ext == ".pdf" and b"%PDF-" in data[:1024]):  # a header may follow junk
        return _read_pdf(data, name, sha)
    if data[:4] == b"PK\x03\x04":
        if _is_docx(data):
            return _read_docx(data, name, sha)
        if ext == ".docx":
            raise _corrupt_docx(name, "it has no word/document.xml")
    if data[:8] == b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1":  # an OLE container: old Office, or encrypted new Office
        if ext in (".docx", ".xlsx", ".pptx"):
            raise AttachmentError(
                f"{name} is password-protected, so Redline cannot read its text.",
                "Open it with the password, save an unprotected copy, and attach that.",
            )
        raise AttachmentError(
            f"{name} is in an older Office format (.doc, .xls or .ppt) that Redline cannot read.",
            "Save it as .docx or PDF and attach that.",
        )
    image_format = _image_signature(data)
    if image_format or ext in IMAGE_EXTENSIONS or ext in OTHER_IMAGE_EXTENSIONS:
        image = _read_image(data, name, sha, image_format, ext)
        if image is not None:
            return image
    if ext == ".pdf":
        raise _corrupt_pdf(name, "it does not start with %PDF-")
    if ext == ".docx":
        raise _corrupt_docx(name, "it is not a zip archive")
    return _read_text(data, name, sha, ext, mime)


def _check_size(name: str, size: int) -> None:
    if size > MAX_BYTES:
        raise AttachmentError(
            f"{name} is {_size(size)}; Redline attaches files up to {_size(MAX_BYTES)}.",
            "Split it, or attach only the pages you need.",
        )


def _size(n: int) -> str:
    for unit, scale in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def _extension(name: str) -> str:
    return Path(name).suffix.lower()


# ---- PDF --------------------------------------------------------------------------------------------------


def _read_pdf(data: bytes, name: str, sha: str) -> Document:
    # lazy: pypdf only when a PDF is attached
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not _decrypt_with_empty_password(reader):
            raise AttachmentError(
                f"{name} is password-protected, so Redline cannot read its text.",
                "Open it with the password, save an unprotected copy (Print to PDF works), and attach that.",
            )
        texts = [page.extract_text() or "" for page in reader.pages]
    except AttachmentError:
        raise
    except DependencyError as e:  # AES-encrypted without the `cryptography` package
        raise AttachmentError(
            f"{name} is encrypted in a way this installation cannot open ({e}).",
            "Save an unprotected copy of it and attach that.",
        ) from e
    except FileNotDecryptedError:
        raise AttachmentError(
            f"{name} is password-protected, so Redline cannot read its text.",
            "Open it with the password, save an unprotected copy, and attach that.",
        ) from None
    except Exception as e:  # pypdf raises PdfReadError and many other kinds on a broken file
        raise _corrupt_pdf(name, _short(e)) from e
    pages = tuple(Page(number=i, text=_tidy(t)) for i, t in enumerate(texts, 1))
    if not pages:
        raise _corrupt_pdf(name, "it has no pages")
    _check_has_text(name, "pdf", pages)
    return Document(name=name, kind="pdf", sha256=sha, pages=pages)


def _decrypt_with_empty_password(reader) -> bool:
    """Many "encrypted" PDFs only restrict printing or copying and open with the empty password."""
    # lazy: pypdf only when a PDF is attached
    from pypdf import PasswordType

    return reader.decrypt("") != PasswordType.NOT_DECRYPTED


def _corrupt_pdf(name: str, why: str) -> AttachmentError:
    return AttachmentError(
        f"{name} could not be read as a PDF: {why}.",
        "It may be damaged or incomplete; open it in a PDF viewer, save a copy, and attach that.",
    )


def _short(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    text = text.rstrip(".")
    return text if len(text) <= 160 else text[:157] + "..."


# ---- DOCX -------------------------------------------------------------------------------------------------


def _is_docx(data: bytes) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return "word/document.xml" in z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def _read_docx(data: bytes, name: str, sha: str) -> Document:
    # lazy: python-docx only when a DOCX is attached
    import docx
    from docx.table import Table

    try:
        document = docx.Document(io.BytesIO(data))
        blocks = []
        for block in document.iter_inner_content():  # paragraphs and tables in the order they appear
            if isinstance(block, Table):
                blocks.append(_table_text(block))
            else:
                blocks.append(block.text)
    except Exception as e:  # python-docx and lxml raise many kinds on a broken file
        raise _corrupt_docx(name, _short(e)) from e
    text = "\n\n".join(b.strip() for b in blocks if b.strip())
    pages = (Page(number=1, text=_tidy(text)),)
    _check_has_text(name, "docx", pages)
    return Document(name=name, kind="docx", sha256=sha, pages=pages)


def _table_text(table) -> str:
    """One line a row, its cells between " | "; a merged cell (the same cell in several columns) once."""
    lines = []
    for row in table.rows:
        cells, seen = [], set()
        for cell in row.cells:
            if id(cell._tc) in seen:
                continue
            seen.add(id(cell._tc))
            cells.append(" ".join(cell.text.split()))
        if any(cells):
            lines.append(" | ".join(cells))
    return "\n".join(lines)


def _corrupt_docx(name: str, why: str) -> AttachmentError:
    return AttachmentError(
        f"{name} could not be read as a Word document: {why}.",
        "It may be damaged; open it in Word or LibreOffice, save a copy as .docx, and attach that.",
    )


# ---- Images -----------------------------------------------------------------------------------------------


def _image_signature(data: bytes) -> str | None:
    """PIL's name of the image format the bytes start with, for the formats told apart here (accepted or not)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[:2] == b"BM" and len(data) > 26 and data[14] in (12, 40, 52, 56, 64, 108, 124):  # a DIB header's size
        return "BMP"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if data[4:8] == b"ftyp" and data[8:12] in (b"heic", b"heix", b"mif1", b"msf1", b"hevc"):
        return "HEIC"
    if data[4:8] == b"ftyp" and data[8:12] in (b"avif", b"avis"):
        return "AVIF"
    return None


def _read_image(data: bytes, name: str, sha: str, sniffed: str | None, ext: str) -> Image | None:
    """The image, checked by decoding it; None for bytes that only looked like a BMP (read as text next)."""
    # lazy: Pillow only when an image is attached
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    claimed = sniffed or IMAGE_EXTENSIONS.get(ext) or OTHER_IMAGE_EXTENSIONS.get(ext)
    if claimed and claimed not in IMAGE_MIMES:
        raise _unsupported_image(name, claimed)
    try:
        with PILImage.open(io.BytesIO(data)) as im:
            fmt = im.format
            im.verify()  # checksums and structure, without decoding every pixel
        if fmt not in IMAGE_MIMES:
            raise _unsupported_image(name, fmt)
        with PILImage.open(io.BytesIO(data)) as im:
            im.load()  # decodes the (first) frame: a truncated file fails here, not in the vision model
            width, height = im.size
    except AttachmentError:
        raise
    except PILImage.DecompressionBombError:
        raise AttachmentError(
            f"{name} has too many pixels for Redline to open safely.",
            "Scale it down (under 90 megapixels) and attach that.",
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as e:
        if sniffed == "BMP" and ext != ".bmp":  # "BM" and one byte is a weak signature: read it as text
            return None
        # Pillow's "cannot identify image file <_io.BytesIO object at 0x...>" says nothing a user can use.
        why = "its content is no image Redline knows" if isinstance(e, UnidentifiedImageError) else _short(e)
        raise AttachmentError(
            f"{name} could not be read as a {claimed} image: {why}.",
            "It may be damaged or not really an image; open it in an image viewer, save a copy as PNG or JPEG, "
            "and attach that.",
        ) from e
    return Image(name=name, mime=IMAGE_MIMES[fmt], sha256=sha, data=data, width=width, height=height)


def _unsupported_image(name: str, fmt: str | None) -> AttachmentError:
    what = f"a {fmt} image" if fmt else "an image in a format"
    return AttachmentError(
        f"{name} is {what}, which Redline does not accept.",
        "Save it as PNG or JPEG and attach that; Redline accepts PNG, JPEG, WebP, GIF and BMP images.",
    )


# ---- Text, Markdown and source files ----------------------------------------------------------------------


def _read_text(data: bytes, name: str, sha: str, ext: str, mime: str | None) -> Document:
    kind = _text_kind(name, ext, mime)
    text = _decode(data, known_text=kind != "text" or ext in TEXT_EXTENSIONS or (mime or "").startswith("text/"))
    if text is None:
        raise AttachmentError(
            f"{name} is not a document Redline can read (it is binary, not text).",
            f"Redline attaches {ACCEPTED}.",
        )
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise AttachmentError(f"{name} has no text, only blank space.", "Attach a file with some text in it.")
    if kind != "code":
        text = _tidy(text)
    return Document(name=name, kind=kind, sha256=sha, pages=(Page(number=1, text=text),))


def _text_kind(name: str, ext: str, mime: str | None) -> str:
    if ext in MARKDOWN_EXTENSIONS or mime == "text/markdown":
        return "markdown"
    if ext in CODE_EXTENSIONS or Path(name).name.lower() in CODE_NAMES:
        return "code"
    return "text"


def _decode(data: bytes, known_text: bool) -> str | None:
    """The text of ``data``: UTF-8 (with or without a BOM), UTF-16 with a BOM, and for a file whose name says
    it is text, Windows-1252 as a last try. None for binary data (NUL bytes, or no encoding fits)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            return None
    if b"\x00" in data:
        return None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        if not known_text:
            return None
        try:
            text = data.decode("cp1252")
        except UnicodeDecodeError:
            return None
    controls = sum(1 for c in text[:65536] if ord(c) < 32 and c not in "\t\n\r\f\v\x1b")
    return None if controls > max(8, len(text[:65536]) // 100) else text


_TRAILING_SPACE = re.compile(r"[ \t]+\n")
_BLANK_RUNS = re.compile(r"\n{3,}")


def _tidy(text: str) -> str:
    """Trailing spaces and runs of blank lines gone; the text otherwise as read."""
    return _BLANK_RUNS.sub("\n\n", _TRAILING_SPACE.sub("\n", text)).strip()


def _check_has_text(name: str, kind: str, pages: tuple[Page, ...]) -> None:
    if any(p.text.strip() for p in pages):
        return
    if kind == "pdf":
        raise AttachmentError(
            f"{name} has no text layer; it looks like a scan or only pictures.",
            "Redline has no OCR yet: run OCR on it first (for example with ocrmypdf), or attach its text.",
        )
    raise AttachmentError(
        f"{name} has no text (it may hold only pictures).",
        "Redline has no OCR yet: attach the text itself, or a copy with its text.",
    )
