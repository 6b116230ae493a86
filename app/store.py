"""Conversations and messages in SQLite, under the platform data directory.

Every change is one transaction (``with self._conn``), so a crash leaves either
the old state or the new one. A reply in progress is written as a *partial*
message and updated as it grows; it stays partial if it was stopped or the app
went away mid-reply.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import platformdirs

APP_NAME = "redline"
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- ids are never reused: a stale id cannot hit a new row
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- ids are never reused: a stale id cannot hit a new row
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    partial INTEGER NOT NULL DEFAULT 0,
    stats TEXT,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, position);
"""


def data_dir() -> Path:
    """platformdirs honours XDG_DATA_HOME on Linux."""
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def default_db_path() -> Path:
    return data_dir() / "conversations.sqlite3"


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    created: float
    updated: float


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


class Store:
    def __init__(self, path: Optional[Path] = None):
        self.path = Path(path) if path else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._conn.execute("PRAGMA journal_mode = WAL")
        with self._conn:
            self._conn.executescript(SCHEMA)

    def close(self) -> None:
        self._conn.close()

    # -- conversations ----------------------------------------------------------
    def create_conversation(self, title: str = "New chat", system_prompt: str = "") -> Conversation:
        now = time.time()
        with self._conn:
            cur = self._conn.execute(
                "INSERT INTO conversations (title, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
                (title, system_prompt, now, now))
        return Conversation(cur.lastrowid, title, system_prompt, now, now)

    def conversation(self, conversation_id: int) -> Optional[Conversation]:
        row = self._conn.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return Conversation(**dict(row)) if row else None

    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; ``search`` matches titles, case-insensitively."""
        pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._conn.execute(
            "SELECT * FROM conversations WHERE title LIKE ? ESCAPE '\\' ORDER BY updated DESC, id DESC",
            (pattern,)).fetchall()
        return [Conversation(**dict(r)) for r in rows]

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        with self._conn:
            self._conn.execute("UPDATE conversations SET title = ?, updated = ? WHERE id = ?",
                               (title.strip() or "Untitled", time.time(), conversation_id))

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        with self._conn:
            self._conn.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?",
                               (system_prompt, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self._conn:
            self._conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages -----------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._conn.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY position",
                                  (conversation_id,)).fetchall()
        return [self._message(r) for r in rows]

    def message(self, message_id: int) -> Optional[Message]:
        row = self._conn.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        return self._message(row) if row else None

    @staticmethod
    def _message(row) -> Message:
        d = dict(row)
        d["partial"] = bool(d["partial"])
        d["stats"] = json.loads(d["stats"]) if d["stats"] else {}
        return Message(**d)

    def add_message(self, conversation_id: int, role: str, content: str, partial: bool = False,
                    stats: Optional[dict] = None) -> Message:
        now = time.time()
        with self._conn:
            (pos,) = self._conn.execute("SELECT COALESCE(MAX(position), -1) + 1 FROM messages "
                                        "WHERE conversation_id = ?", (conversation_id,)).fetchone()
            cur = self._conn.execute(
                "INSERT INTO messages (conversation_id, position, role, content, partial, stats, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, pos, role, content, int(partial), json.dumps(stats) if stats else None, now))
            self._conn.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        return Message(cur.lastrowid, conversation_id, pos, role, content, partial, stats or {}, now)

    def update_message(self, message_id: int, content: str, partial: bool, stats: Optional[dict] = None) -> None:
        with self._conn:
            if stats is None:
                self._conn.execute("UPDATE messages SET content = ?, partial = ? WHERE id = ?",
                                   (content, int(partial), message_id))
            else:
                self._conn.execute("UPDATE messages SET content = ?, partial = ?, stats = ? WHERE id = ?",
                                   (content, int(partial), json.dumps(stats), message_id))

    def delete_from(self, message_id: int) -> None:
        """Delete a message and every later one in its conversation (regenerate, edit-and-resend)."""
        with self._conn:
            row = self._conn.execute("SELECT conversation_id, position FROM messages WHERE id = ?",
                                     (message_id,)).fetchone()
            if row:
                self._conn.execute("DELETE FROM messages WHERE conversation_id = ? AND position >= ?",
                                   (row["conversation_id"], row["position"]))

    # -- export -------------------------------------------------------------------
    def export_json(self, conversation_id: int) -> str:
        conv = self.conversation(conversation_id)
        if conv is None:
            raise KeyError(conversation_id)
        data = asdict(conv)
        data["messages"] = [{k: v for k, v in asdict(m).items() if k not in ("conversation_id",)}
                            for m in self.messages(conversation_id)]
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    def export_markdown(self, conversation_id: int) -> str:
        conv = self.conversation(conversation_id)
        if conv is None:
            raise KeyError(conversation_id)
        out = [f"# {conv.title}", ""]
        if conv.system_prompt:
            out += ["**System:**", "", conv.system_prompt, ""]
        for m in self.messages(conversation_id):
            heading = "User" if m.role == "user" else "Assistant"
            if m.partial:
                heading += " (partial)"
            out += [f"## {heading}", "", m.content, ""]
            s = m.stats
            if m.role == "assistant" and s.get("new_tokens"):
                bits = [f"{s['new_tokens']} tokens"]
                if s.get("tokens_per_s"):
                    bits.append(f"{s['tokens_per_s']:.1f} tok/s")
                if s.get("ttft_ms") is not None:
                    bits.append(f"TTFT {s['ttft_ms']:.0f} ms")
                bits += [str(s[k]) for k in ("strategy", "precision") if s.get(k)]
                out += ["*" + " · ".join(bits) + "*", ""]
        return "\n".join(out)
