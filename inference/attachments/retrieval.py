"""Full-text search over documents' chunks: SQLite's FTS5 (in the standard library's sqlite3), ranked by BM25.

A user's question is free text, not an FTS5 query: its words are quoted one by one (so no word is read as
an operator), the commonest English words are dropped, and the rest are OR-ed, so a chunk that holds more
of the question's rarer words ranks higher."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .chunks import Chunk
from .types import AttachmentError


@dataclass(frozen=True)
class Hit:
    doc_key: str
    chunk_index: int
    page: int
    text: str
    score: float  # BM25, higher is better (SQLite's bm25() negated); 0.0 for a query with no usable words


STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below between
    both but by can could did do does doing down during each few for from further had has have having he her here
    hers herself him himself his how i if in into is it its itself just me more most my myself no nor not now of
    off on once only or other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up very was we were what
    when where which while who whom why will with would you your yours yourself yourselves tell say says said
    please document documents file""".split()
)

_WORD = re.compile(r"\w+")


def fts_query(text: str) -> str:
    """``text`` as an FTS5 query: its words quoted and OR-ed, stopwords and punctuation dropped; "" when no
    word is left."""
    terms: list[str] = []
    for word in _WORD.findall(text.lower()):
        word = word.strip("_")
        if word and word not in STOPWORDS and word not in terms:
            terms.append(word)
    return " OR ".join(f'"{t}"' for t in terms)


class Index:
    """Chunks of documents, each document under a key of the caller's choosing, searchable by free text.
    ``path`` is ":memory:" (the default) or a database file. Safe to call from several threads."""

    def __init__(self, path: str = ":memory:"):
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False)
        try:
            self._db.execute(
                "CREATE VIRTUAL TABLE IF NOT EXISTS chunks USING fts5("
                "text, doc_key UNINDEXED, chunk_index UNINDEXED, page UNINDEXED, tokenize='porter unicode61')"
            )
        except sqlite3.OperationalError as e:
            self._db.close()
            if "fts5" in str(e).lower():
                raise AttachmentError(
                    "Searching long documents needs SQLite's FTS5, which this Python's sqlite3 was built without.",
                    "Use a Python whose SQLite has FTS5 (python.org's builds and most Linux distributions' do), "
                    "or attach shorter documents that fit the context whole.",
                ) from e
            raise

    def add(self, doc_key: str, chunks: Iterable[Chunk]) -> None:
        """Index ``chunks`` under ``doc_key``, replacing what that key held (adding twice does not duplicate)."""
        rows = [(c.text, doc_key, c.index, c.page) for c in chunks]
        with self._lock, self._db:
            self._db.execute("DELETE FROM chunks WHERE doc_key = ?", (doc_key,))
            self._db.executemany("INSERT INTO chunks (text, doc_key, chunk_index, page) VALUES (?, ?, ?, ?)", rows)

    def remove(self, doc_key: str) -> None:
        with self._lock, self._db:
            self._db.execute("DELETE FROM chunks WHERE doc_key = ?", (doc_key,))

    def search(self, query: str, limit: int = 5, doc_keys: Sequence[str] | None = None) -> list[Hit]:
        """The ``limit`` chunks that best match ``query``, best first (only those of ``doc_keys`` when given).
        A query with no usable words (only stopwords or punctuation) gives the first chunks in order."""
        where, params = "", []
        if doc_keys is not None:
            if not doc_keys:
                return []
            where = f" AND doc_key IN ({', '.join('?' * len(doc_keys))})"
            params = list(doc_keys)
        match = fts_query(query)
        with self._lock:
            if match:
                rows = self._db.execute(
                    "SELECT doc_key, chunk_index, page, text, -bm25(chunks) FROM chunks "
                    f"WHERE chunks MATCH ?{where} ORDER BY bm25(chunks), rowid LIMIT ?",
                    [match, *params, limit],
                ).fetchall()
            else:
                rows = self._db.execute(
                    f"SELECT doc_key, chunk_index, page, text, 0.0 FROM chunks WHERE 1{where} ORDER BY rowid LIMIT ?",
                    [*params, limit],
                ).fetchall()
        return [Hit(k, int(i), int(p), t, float(s)) for k, i, p, t, s in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
