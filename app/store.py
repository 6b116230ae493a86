"""Conversations and messages in SQLite, under the platform data directory.

Every change is one transaction (``with self._conn``), so a crash leaves either
the old state or the new one. A reply in progress is written as a *partial*
message and updated as it grows; it stays partial if it was stopped or the app
went away mid-reply (even killed with SIGKILL: a committed transaction is in the
WAL file before ``commit`` returns).

``open_store`` never stops the app from starting: a database that is not a
database (or fails its quick check) is moved aside as
``conversations.sqlite3.corrupt-<time>`` (kept, never deleted) and a fresh one is
created; a database another program holds locked is left untouched and this
session uses a temporary in-memory database instead. Either way the caller gets a
message for the user. The database and its folder are private (0600 / 0700).

A message's attachments (documents, images) are rows of their own and files beside the database, one copy per
content, deleted with the last message that uses them: ``app/attachments_store.py``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from . import attachments_store
from .private_files import data_dir, private_dir

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- ids are never reused: a stale id cannot hit a new row
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    tools_on INTEGER NOT NULL DEFAULT 0,  -- the Tools switch of this conversation (the window's ToolsController)
    tools_unticked TEXT NOT NULL DEFAULT '[]'  -- JSON: the tools the user took out of this conversation's offer
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- ids are never reused: a stale id cannot hit a new row
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    partial INTEGER NOT NULL DEFAULT 0,
    stats TEXT,
    created REAL NOT NULL,
    reasoning TEXT NOT NULL DEFAULT ''  -- a reasoning model's thinking, apart from the answer in content
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, position);
-- the conversation list is ordered by last activity: with thousands of conversations, no sort on open
CREATE INDEX IF NOT EXISTS conversations_by_updated ON conversations(updated DESC, id DESC);
"""
# How long to wait for another connection's write lock when opening, and afterwards. Opening is
# short so a locked database cannot hold up the window; later writes (one small transaction each)
# wait a little longer for another Redline instance's transaction to finish.
OPEN_TIMEOUT_S = 0.5
BUSY_TIMEOUT_MS = 2000
IN_MEMORY = ":memory:"


class DatabaseLocked(Exception):
    """Another program holds the database's write lock."""


class DatabaseCorrupt(Exception):
    """The file is not a usable SQLite database."""


def default_db_path() -> Path:
    return data_dir(create=False) / "conversations.sqlite3"


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    created: float
    updated: float
    tools_on: bool = False  # the model may call tools in this conversation (its Tools switch)
    # The tools (as offered: ``server__tool``, ``calculate``) the user unticked here; every other tool is offered, so
    # a tool added to a server later is offered too.
    tools_unticked: list = field(default_factory=list)


@dataclass
class Message:
    id: int
    conversation_id: int
    position: int
    role: str
    content: str
    partial: bool = False
    stats: dict = field(default_factory=dict)
    created: float = 0.0
    reasoning: str = ""  # a reasoning model's thinking before this reply (kept; never sent back to the model)
    attachments: list = field(default_factory=list)  # Documents and Images attached to it, in order


def _create_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does (its -wal/-shm files copy the mode)."""
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    try:
        os.chmod(path, 0o600)
    except OSError:
        pass


class Store:
    """``Store(path)`` raises DatabaseLocked / DatabaseCorrupt; the app opens it with ``open_store``."""

    def __init__(self, path: Optional[Path | str] = None):
        self.in_memory = path == IN_MEMORY
        self.path = Path(path) if path and not self.in_memory else (None if self.in_memory else default_db_path())
        if not self.in_memory:
            _create_private(self.path)
        # The originals of attachments: beside the database (a database in memory keeps them in a temporary folder).
        self.files = attachments_store.AttachmentFiles(None if self.in_memory else self.path.parent)
        self._conn = sqlite3.connect(IN_MEMORY if self.in_memory else self.path, timeout=OPEN_TIMEOUT_S)
        try:
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._conn.execute("PRAGMA journal_mode = WAL")
            # Commits go to the WAL without an fsync each (writes happen on the UI thread, every second while a
            # reply grows): a killed app loses nothing committed; only a power cut can lose the last commits.
            self._conn.execute("PRAGMA synchronous = NORMAL")
            with self._conn:
                self._conn.executescript(SCHEMA)
                self._migrate()
            # Can we write? Another program's exclusive transaction shows up here, not on reads in WAL mode.
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("ROLLBACK")
            (check,) = self._conn.execute("PRAGMA quick_check(1)").fetchone()
            if check != "ok":
                raise DatabaseCorrupt(check)
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        except sqlite3.OperationalError as exc:
            self._conn.close()
            self.files.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise DatabaseLocked(str(exc)) from exc
            raise DatabaseCorrupt(str(exc)) from exc
        except sqlite3.DatabaseError as exc:  # "file is not a database", "disk image is malformed"
            self._conn.close()
            self.files.close()
            raise DatabaseCorrupt(str(exc)) from exc
        except DatabaseCorrupt:
            self._conn.close()
            self.files.close()
            raise

    def _migrate(self) -> None:
        """Bring a database an earlier Redline wrote up to this schema: columns added since, with their defaults
        (its messages keep what they had; a reply from before reasoning models has no thinking; a conversation from
        before the Tools switch was kept has tools off, as every conversation started then, and every tool ticked),
        and the attachments' table (its messages have none)."""
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(messages)")}
        if "reasoning" not in columns:
            self._conn.execute("ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT ''")
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(conversations)")}
        if "tools_on" not in columns:
            self._conn.execute("ALTER TABLE conversations ADD COLUMN tools_on INTEGER NOT NULL DEFAULT 0")
        if "tools_unticked" not in columns:
            self._conn.execute("ALTER TABLE conversations ADD COLUMN tools_unticked TEXT NOT NULL DEFAULT '[]'")
        attachments_store.migrate(self._conn)

    def drop_empty_partial_replies(self) -> int:
        """Assistant messages that never got a token because the app was killed first (their placeholder still
        says "interrupted"): an empty bubble marked "partial" helps no one. A reply that ended before its first
        token with a note saying why ("Stopped before it started: …") is the conversation's record and stays.
        Returns how many went."""
        with self._conn:
            cur = self._conn.execute(
                "DELETE FROM messages WHERE role = 'assistant' AND partial = 1 AND content = '' AND ("
                "stats IS NULL OR json_extract(stats, '$.finish_reason') = 'interrupted' "
                "OR json_array_length(COALESCE(json_extract(stats, '$.notes'), '[]')) = 0)"
            )
        return cur.rowcount

    def close(self) -> None:
        self._conn.close()
        self.files.close()

    # -- conversations ----------------------------------------------------------
    def create_conversation(self, title: str = "New chat", system_prompt: str = "") -> Conversation:
        now = time.time()
        with self._conn:
            cur = self._conn.execute(
                "INSERT INTO conversations (title, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
                (title, system_prompt, now, now),
            )
        return Conversation(cur.lastrowid, title, system_prompt, now, now)

    def conversation(self, conversation_id: int) -> Optional[Conversation]:
        row = self._conn.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return self._conversation(row) if row else None

    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; ``search`` matches titles, case-insensitively."""
        pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._conn.execute(
            "SELECT * FROM conversations WHERE title LIKE ? ESCAPE '\\' ORDER BY updated DESC, id DESC", (pattern,)
        ).fetchall()
        return [self._conversation(r) for r in rows]

    @staticmethod
    def _conversation(row) -> Conversation:
        d = dict(row)
        d["tools_on"] = bool(d["tools_on"])
        d["tools_unticked"] = json.loads(d["tools_unticked"] or "[]")
        return Conversation(**d)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        with self._conn:
            self._conn.execute(
                "UPDATE conversations SET title = ?, updated = ? WHERE id = ?",
                (title.strip() or "Untitled", time.time(), conversation_id),
            )

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        with self._conn:
            self._conn.execute(
                "UPDATE conversations SET system_prompt = ? WHERE id = ?", (system_prompt, conversation_id)
            )

    def set_tools_on(self, conversation_id: int, on: bool) -> None:
        """The conversation's Tools switch (not a change of the conversation: its place in the list stays)."""
        with self._conn:
            self._conn.execute("UPDATE conversations SET tools_on = ? WHERE id = ?", (int(on), conversation_id))

    def set_tools_unticked(self, conversation_id: int, names) -> None:
        """The tools not offered in this conversation (the others are), by the names they are offered as."""
        with self._conn:
            self._conn.execute(
                "UPDATE conversations SET tools_unticked = ? WHERE id = ?",
                (json.dumps(sorted(set(names))), conversation_id),
            )

    def delete_conversation(self, conversation_id: int) -> None:
        """The conversation, its messages, their attachments, and each attachment's file no other message uses."""
        with self._conn:
            files = attachments_store.files_of(self._conn, "m.conversation_id = ?", (conversation_id,))
            self._conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        self.files.remove_unreferenced(self._conn, files)

    # -- messages -----------------------------------------------------------------
    def messages(
        self,
        conversation_id: int,
        limit: Optional[int] = None,
        before_position: Optional[int] = None,
        after_position: Optional[int] = None,
    ) -> list[Message]:
        """In order. With ``limit``: the last ``limit`` messages (before ``before_position`` if given), or with
        ``after_position`` the first ``limit`` after it; a long conversation is shown a window at a time."""
        if limit is None and before_position is None and after_position is None:
            rows = self._conn.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY position", (conversation_id,)
            ).fetchall()
            return self._with_attachments([self._message(r) for r in rows])
        n = -1 if limit is None else limit
        if after_position is not None:
            rows = self._conn.execute(
                "SELECT * FROM messages WHERE conversation_id = ? AND position > ? ORDER BY position LIMIT ?",
                (conversation_id, after_position, n),
            ).fetchall()
            return self._with_attachments([self._message(r) for r in rows])
        before = before_position if before_position is not None else 2**62
        rows = self._conn.execute(
            "SELECT * FROM messages WHERE conversation_id = ? AND position < ? ORDER BY position DESC LIMIT ?",
            (conversation_id, before, n),
        ).fetchall()
        return self._with_attachments([self._message(r) for r in reversed(rows)])

    def message_count(self, conversation_id: int, before_position: Optional[int] = None) -> int:
        before = before_position if before_position is not None else 2**62
        (n,) = self._conn.execute(
            "SELECT COUNT(*) FROM messages WHERE conversation_id = ? AND position < ?", (conversation_id, before)
        ).fetchone()
        return int(n)

    def message(self, message_id: int) -> Optional[Message]:
        row = self._conn.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        return self._with_attachments([self._message(row)])[0] if row else None

    def _with_attachments(self, messages: list[Message]) -> list[Message]:
        found = attachments_store.attachments_for(self._conn, self.files, [m.id for m in messages if m.role == "user"])
        for m in messages:
            m.attachments = found.get(m.id, [])
        return messages

    def add_attachments(self, message_id: int, attachments: Sequence, sources: Sequence = ()) -> None:
        """Attach Documents and Images to a message (after any it has). ``sources[i]``: the original of
        ``attachments[i]`` (its path or its bytes), copied once into the data folder; an image's own bytes when
        not given; a document without one keeps its text only."""
        if not attachments:
            return
        with self._conn:
            attachments_store.add(self._conn, self.files, message_id, attachments, sources)

    def attachments(self, message_id: int) -> list:
        """A message's attachments, rebuilt: Documents from their stored pages, Images from their files."""
        return attachments_store.attachments_for(self._conn, self.files, [message_id]).get(message_id, [])

    def attachment_file(self, message_id: int, position: int) -> Optional[Path]:
        """Where the original of a message's attachment is kept, if it is."""
        row = self._conn.execute(
            "SELECT file FROM attachments WHERE message_id = ? AND position = ?", (message_id, position)
        ).fetchone()
        return self.files.path(row[0]) if row and row[0] else None

    def remove_unreferenced_files(self, older_than_s: float = attachments_store.ORPHAN_AGE_S) -> int:
        """Delete the attachment files no message uses (left by a send that never committed); how many went."""
        return self.files.sweep(self._conn, older_than_s)

    @staticmethod
    def _message(row) -> Message:
        d = dict(row)
        d["partial"] = bool(d["partial"])
        d["stats"] = json.loads(d["stats"]) if d["stats"] else {}
        return Message(**d)

    def add_message(
        self, conversation_id: int, role: str, content: str, partial: bool = False, stats: Optional[dict] = None
    ) -> Message:
        now = time.time()
        with self._conn:
            (pos,) = self._conn.execute(
                "SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
            cur = self._conn.execute(
                "INSERT INTO messages (conversation_id, position, role, content, partial, stats, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, pos, role, content, int(partial), json.dumps(stats) if stats else None, now),
            )
            self._conn.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        return Message(cur.lastrowid, conversation_id, pos, role, content, partial, stats or {}, now)

    def update_message(
        self,
        message_id: int,
        content: str,
        partial: bool,
        stats: Optional[dict] = None,
        reasoning: Optional[str] = None,
    ) -> None:
        """``reasoning``: the reply's thinking so far (None leaves what is stored)."""
        with self._conn:
            if reasoning is not None:
                self._conn.execute("UPDATE messages SET reasoning = ? WHERE id = ?", (reasoning, message_id))
            if stats is None:
                self._conn.execute(
                    "UPDATE messages SET content = ?, partial = ? WHERE id = ?", (content, int(partial), message_id)
                )
            else:
                self._conn.execute(
                    "UPDATE messages SET content = ?, partial = ?, stats = ? WHERE id = ?",
                    (content, int(partial), json.dumps(stats), message_id),
                )

    def delete_from(self, message_id: int) -> None:
        """Delete a message and every later one in its conversation (regenerate, edit-and-resend)."""
        with self._conn:
            row = self._conn.execute(
                "SELECT conversation_id, position FROM messages WHERE id = ?", (message_id,)
            ).fetchone()
            if not row:
                return
            where = ("m.conversation_id = ? AND m.position >= ?", (row["conversation_id"], row["position"]))
            files = attachments_store.files_of(self._conn, *where)
            self._conn.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND position >= ?",
                (row["conversation_id"], row["position"]),
            )
        self.files.remove_unreferenced(self._conn, files)

    # -- export -------------------------------------------------------------------
    def export_json(self, conversation_id: int) -> str:
        conv = self.conversation(conversation_id)
        if conv is None:
            raise KeyError(conversation_id)
        data = asdict(conv)
        messages = self.messages(conversation_id)
        rows = attachments_store.rows_for(self._conn, [m.id for m in messages])
        data["messages"] = []
        for m in messages:
            record = {k: v for k, v in asdict(m).items() if k not in ("conversation_id", "attachments")}
            if m.id in rows:
                record["attachments"] = [attachments_store.json_record(r, self.files) for r in rows[m.id]]
            data["messages"].append(record)
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    def export_markdown(self, conversation_id: int) -> str:
        conv = self.conversation(conversation_id)
        if conv is None:
            raise KeyError(conversation_id)
        out = [f"# {conv.title}", ""]
        if conv.system_prompt:
            out += ["**System:**", "", conv.system_prompt, ""]
        messages = self.messages(conversation_id)
        rows = attachments_store.rows_for(self._conn, [m.id for m in messages])
        for m in messages:
            heading = "User" if m.role == "user" else "Assistant"
            if m.partial:
                heading += " (partial)"
            s = m.stats
            notes = [str(n) for n in (s.get("notes") or [])] if m.role == "assistant" and not m.content else []
            out += [f"## {heading}", ""]
            if m.role == "assistant" and s.get("tool_calls"):  # its calls through the tool loop, before its answer
                out += _tool_call_lines(s["tool_calls"])
            # A reply that never got a word: the line saying why stands in its place.
            out += ["*" + " ".join(notes) + "*" if notes else m.content, ""]
            if m.id in rows:  # what was attached to it: a line each (the JSON export holds their text)
                out += attachments_store.markdown_lines(rows[m.id]) + [""]
            if m.role == "assistant" and s.get("new_tokens"):
                bits = [f"{s['new_tokens']} tokens"]
                if s.get("tokens_per_s"):
                    bits.append(f"{s['tokens_per_s']:.1f} tok/s")
                if (s.get("queued_ms") or 0) >= 100:  # its wait behind other work, apart from its TTFT
                    what = f" for {s['waited_for']}" if s.get("waited_for") else ""
                    bits.append(f"waited {s['queued_ms'] / 1000:.1f} s{what}")
                if s.get("ttft_ms") is not None:
                    bits.append(f"TTFT {s['ttft_ms']:.0f} ms")
                bits += [str(s[k]) for k in ("strategy", "precision") if s.get(k)]
                out += ["*" + " · ".join(bits) + "*", ""]
        return "\n".join(out)


def _tool_call_lines(calls: list) -> list[str]:
    """A reply's tool calls in the Markdown export: each its tool, what became of it (the user's answer, its time),
    its arguments and its result (as the reply keeps it: the first 2,000 characters)."""
    out: list[str] = []
    for c in calls:
        tool = c.get("tool") or c.get("name", "?")
        name = f"{c['server']} · {tool}" if c.get("server") else c.get("name", "?")
        what = c.get("approval") or c.get("state") or ""
        took = f", {c['ms']:,.0f} ms" if c.get("ms") else ""
        out += [f"**Tool call** `{name}`" + (f" — {what}{took}" if what else ""), ""]
        out += _fenced(json.dumps(c.get("arguments"), indent=2, ensure_ascii=False), "json")
        if c.get("result"):
            out += ["Error:" if c.get("is_error") else "Result:", ""] + _fenced(str(c["result"]), "text")
    return out


def _fenced(text: str, language: str) -> list[str]:
    fence = "```"
    while fence in text:  # a fence longer than any run of backticks in the text
        fence += "`"
    return [fence + language, text, fence, ""]


def _move_aside(path: Path) -> Path:
    """Rename a bad database (and its WAL/shared-memory files) out of the way; return the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.replace(path, backup)
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            os.replace(extra, backup.with_name(backup.name + suffix))
    return backup


def open_store(path: Optional[Path] = None) -> tuple[Store, Optional[str]]:
    """Open the conversation database for the app: (store, message for the user or None). Never raises for
    a corrupt or locked database: the user's data is kept and the app still starts."""
    path = Path(path) if path else default_db_path()
    try:
        store = Store(path)
        store.drop_empty_partial_replies()  # left by a kill before a reply's first token
        store.remove_unreferenced_files()  # an attachment copied for a send that never committed
        return store, None
    except DatabaseLocked:
        return Store(IN_MEMORY), (
            f"The conversation database {path} is locked by another program (another Redline window?). "
            "It was left untouched; this session's chats are kept in memory only and are lost when you quit. "
            "Close the other program and restart Redline to use your saved conversations."
        )
    except DatabaseCorrupt as exc:
        try:
            backup = _move_aside(path)
        except OSError as move_exc:
            return Store(IN_MEMORY), (
                f"The conversation database {path} is unreadable ({exc}) and could not be moved aside "
                f"({move_exc}); this session's chats are kept in memory only."
            )
        try:
            store = Store(path)
        except (DatabaseLocked, DatabaseCorrupt) as again:
            return Store(IN_MEMORY), (
                f"The conversation database {path} was unreadable ({exc}) and was kept as "
                f"{backup}; a new one could not be created ({again}), so this session's "
                "chats are kept in memory only."
            )
        return store, (
            f"The conversation database was unreadable ({exc}). It was kept as {backup} and a new, "
            "empty one was started."
        )
