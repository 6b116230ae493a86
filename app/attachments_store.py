"""A message's attachments in the conversation database, and their files beside it.

Each attachment is a row of ``attachments`` (its message, its place among the message's attachments, what it is,
its name, its format, its content's SHA-256, the extracted pages of a document as JSON so that a later turn never
reads the PDF again, an image's size) and, where the original was at hand, one file in the data folder named by its
content: ``<data folder>/attachments/<sha256><ext>``, private (0600) like the database. Two messages with the same
file share one copy. The rows go with their message (``ON DELETE CASCADE``: deleting a conversation, or the
messages from one on, deletes them) and the store then deletes every file no row names any more.

An image is rebuilt from its file (its bytes are what the model sees); a document from its row alone (the file is
kept for the user: to open it again, to export it). A database written before attachments existed gains the empty
table when it is opened (``migrate``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from ..inference import Document, Image, Page, format_bytes
from .private_files import private_dir, write_private

SCHEMA = """
CREATE TABLE IF NOT EXISTS attachments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,  -- its place among its message's attachments
    kind TEXT NOT NULL CHECK (kind IN ('document', 'image')),
    name TEXT NOT NULL,  -- the file's name as the user knows it
    format TEXT NOT NULL,  -- a document's kind (pdf, docx, markdown, text, code) or an image's MIME type
    sha256 TEXT NOT NULL,  -- of the original's bytes
    file TEXT,  -- the original's copy, relative to the data folder (attachments/<sha256><ext>); NULL: not kept
    pages TEXT,  -- a document's pages, JSON [{"number": 1, "text": "..."}]; NULL for an image
    width INTEGER,
    height INTEGER,
    bytes INTEGER NOT NULL DEFAULT 0,  -- the original's size
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS attachments_by_message ON attachments(message_id, position);
CREATE INDEX IF NOT EXISTS attachments_by_file ON attachments(file);
"""
FOLDER = "attachments"
IMAGE_EXTENSIONS = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/webp": ".webp",
    "image/gif": ".gif",
    "image/bmp": ".bmp",
}
DOCUMENT_KINDS = {"pdf": "PDF", "docx": "Word", "markdown": "Markdown", "text": "text", "code": "source code"}
ORPHAN_AGE_S = 3600.0  # a file no row names is swept at start only once this old (another Redline may be adding it)
_IDS_PER_QUERY = 500  # SQLite's bound on a statement's parameters is 999 in older builds

Attachment = Union[Document, Image]
Source = Union[str, os.PathLike, bytes, None]  # the original file (its path or its bytes); None: not at hand


def migrate(conn) -> None:
    """Create the table in a database an earlier Redline wrote (its messages have no attachments)."""
    conn.executescript(SCHEMA)


class AttachmentFiles:
    """The folder the originals are kept in: ``root`` is the data folder (the database's), or, for a database in
    memory, a temporary folder removed at ``close`` (never the real data folder, whose files another database
    names)."""

    def __init__(self, root: Optional[Path]):
        self.temporary = root is None
        self._root = None if root is None else Path(root)

    @property
    def root(self) -> Path:
        if self._root is None:  # a database in memory: its folder is made when its first file is kept
            self._root = Path(tempfile.mkdtemp(prefix="redline-attachments-"))
        return self._root

    def path(self, relative: str) -> Path:
        return self.root / relative

    def keep(self, source: Source, name: str, kind: str, mime: str = "") -> tuple[Optional[str], int]:
        """Copy the original into the folder unless a copy is there: (its path relative to the root, its size).
        A source that cannot be read (the file moved since it was attached) is not kept: (None, 0)."""
        if source is None:
            return None, 0
        try:
            data = source if isinstance(source, bytes) else Path(source).read_bytes()
        except OSError:
            return None, 0
        relative = f"{FOLDER}/{hashlib.sha256(data).hexdigest()}{extension(name, kind, mime)}"
        target = self.path(relative)
        try:
            if not (target.is_file() and target.stat().st_size == len(data)):
                private_dir(target.parent)
                write_private(target, data)
        except OSError:
            return None, len(data)
        return relative, len(data)

    def read(self, relative: Optional[str]) -> Optional[bytes]:
        if not relative:
            return None
        try:
            return self.path(relative).read_bytes()
        except OSError:
            return None

    def remove_unreferenced(self, conn, candidates: Iterable[str]) -> int:
        """Delete each of ``candidates`` (relative paths) that no row names any more; how many went."""
        gone = 0
        for relative in set(c for c in candidates if c):
            if conn.execute("SELECT 1 FROM attachments WHERE file = ? LIMIT 1", (relative,)).fetchone():
                continue
            try:
                self.path(relative).unlink()
                gone += 1
            except FileNotFoundError:
                pass
            except OSError:
                pass  # kept; the sweep at the next start tries again
        return gone

    def sweep(self, conn, older_than_s: float = ORPHAN_AGE_S) -> int:
        """Delete every file of the folder no row names (a send that failed after its copy, an app killed
        between the two), once it is ``older_than_s`` old; how many went."""
        folder = self.path(FOLDER)
        if not folder.is_dir():
            return 0
        named = {row[0] for row in conn.execute("SELECT DISTINCT file FROM attachments WHERE file IS NOT NULL")}
        now, gone = time.time(), 0
        for entry in folder.iterdir():
            relative = f"{FOLDER}/{entry.name}"
            try:
                if relative in named or not entry.is_file() or now - entry.stat().st_mtime < older_than_s:
                    continue
                entry.unlink()
                gone += 1
            except OSError:
                pass
        return gone

    def close(self) -> None:
        if self.temporary and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


def extension(name: str, kind: str, mime: str = "") -> str:
    """The copy's extension: an image's from its type, a document's from its name (letters and digits only)."""
    if kind == "image" and mime in IMAGE_EXTENSIONS:
        return IMAGE_EXTENSIONS[mime]
    suffix = Path(name).suffix.lower()
    return suffix if re.fullmatch(r"\.[a-z0-9]{1,10}", suffix) else ""


def add(conn, files: AttachmentFiles, message_id: int, attachments: Sequence[Attachment], sources=()) -> None:
    """Store ``attachments`` on a message, in order after any it has; ``sources[i]`` is the original of
    ``attachments[i]`` (a path or bytes; an image's own bytes when not given). Copies first, then the rows, in one
    transaction (the caller's)."""
    sources = list(sources) + [None] * (len(attachments) - len(sources))
    (start,) = conn.execute(
        "SELECT COALESCE(MAX(position), -1) + 1 FROM attachments WHERE message_id = ?", (message_id,)
    ).fetchone()
    now = time.time()
    for i, (item, source) in enumerate(zip(attachments, sources)):
        if isinstance(item, Image):
            relative, size = files.keep(source if source is not None else item.data, item.name, "image", item.mime)
            row = ("image", item.name, item.mime, item.sha256, relative, None, item.width, item.height)
            size = size or len(item.data)
        elif isinstance(item, Document):
            relative, size = files.keep(source, item.name, "document")
            pages = json.dumps([{"number": p.number, "text": p.text} for p in item.pages], ensure_ascii=False)
            row = ("document", item.name, item.kind, item.sha256, relative, pages, None, None)
            size = size or len(item.text.encode("utf-8"))
        else:
            raise TypeError(f"not an attachment: {type(item).__name__}")
        conn.execute(
            "INSERT INTO attachments (message_id, position, kind, name, format, sha256, file, pages, width, height, "
            "bytes, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (message_id, start + i, *row, size, now),
        )


def rows_for(conn, message_ids: Sequence[int]) -> dict[int, list]:
    """The attachment rows of these messages, by message, each message's in order."""
    out: dict[int, list] = {}
    ids = list(dict.fromkeys(message_ids))
    for at in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[at : at + _IDS_PER_QUERY]
        marks = ",".join("?" * len(chunk))
        for row in conn.execute(
            f"SELECT * FROM attachments WHERE message_id IN ({marks}) ORDER BY message_id, position", chunk
        ):
            out.setdefault(row["message_id"], []).append(row)
    return out


def rebuild(row, files: AttachmentFiles) -> Optional[Attachment]:
    """The Document or Image a row stands for; None for an image whose file is gone (deleted by hand)."""
    if row["kind"] == "document":
        pages = tuple(Page(int(p["number"]), str(p["text"])) for p in json.loads(row["pages"] or "[]"))
        return Document(row["name"], row["format"], row["sha256"], pages)
    data = files.read(row["file"])
    if data is None:
        return None
    return Image(row["name"], row["format"], row["sha256"], data, int(row["width"] or 0), int(row["height"] or 0))


def attachments_for(conn, files: AttachmentFiles, message_ids: Sequence[int]) -> dict[int, list]:
    """Each message's attachments, rebuilt (only messages that have some)."""
    out = {}
    for message_id, rows in rows_for(conn, message_ids).items():
        items = [a for a in (rebuild(r, files) for r in rows) if a is not None]
        if items:
            out[message_id] = items
    return out


def files_of(conn, where: str, params: tuple) -> set[str]:
    """The files named by the attachments of the messages ``where`` selects (before they are deleted)."""
    rows = conn.execute(
        "SELECT DISTINCT a.file FROM attachments a JOIN messages m ON a.message_id = m.id "
        f"WHERE a.file IS NOT NULL AND {where}",
        params,
    )
    return {r[0] for r in rows}


# -- export ------------------------------------------------------------------------------------------------
def describe(row) -> str:
    """One line about an attachment, as the Markdown export lists it: "report.pdf (PDF document, 12 pages,
    340 KB)"."""
    if row["kind"] == "document":
        pages = len(json.loads(row["pages"] or "[]"))
        what = [f"{DOCUMENT_KINDS.get(row['format'], row['format'])} document"]
        what.append(f"{pages} page{'s' if pages != 1 else ''}")
    else:
        what = [f"{row['format'].removeprefix('image/').upper()} image", f"{row['width']}×{row['height']}"]
    if row["bytes"]:
        what.append(format_bytes(row["bytes"]))
    return f"{row['name']} ({', '.join(what)})"


def markdown_lines(rows: Sequence) -> list[str]:
    return [f"- Attached: {describe(r)}" for r in rows]


def json_record(row, files: AttachmentFiles) -> dict:
    """An attachment as the JSON export writes it: what a reader (or a later import) needs without the data
    folder. A document: its pages' text. An image: its bytes as base64 (``data``), empty if its file is gone."""
    record = {
        "kind": row["kind"],
        "name": row["name"],
        "format": row["format"],
        "sha256": row["sha256"],
        "bytes": row["bytes"],
        "file": row["file"],
    }
    if row["kind"] == "document":
        record["pages"] = json.loads(row["pages"] or "[]")
    else:
        data = files.read(row["file"])
        record.update(width=row["width"], height=row["height"])
        record["data"] = base64.b64encode(data).decode("ascii") if data is not None else ""
    return record
