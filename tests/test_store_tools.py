"""What the conversation store keeps of a conversation's tools (issue 51, item 4: the user enables tools per
conversation): its Tools switch and the tools unticked in it, kept across a reopen of the database, and a database
from before them opened with every conversation and message it had, tools off and every tool ticked."""

from __future__ import annotations

import json
import sqlite3

import old_store_schema

from redline.app.store import Store

# The schema of the release before the Tools switch was kept (the attachments' table is made by its own migration).
OLD_SCHEMA = (
    old_store_schema.TABLES
    + "INSERT INTO conversations VALUES (1, 'old', 'Be brief.', 10, 20), (2, 'older', '', 5, 6);"
    "INSERT INTO messages VALUES (1, 1, 0, 'user', 'hi', 0, NULL, 10, ''), "
    "(2, 1, 1, 'assistant', 'hello', 0, '{\"new_tokens\": 1}', 11, 'a thought');"
)


def test_the_tools_switch_and_ticks_are_kept_with_the_conversation(tmp_path):
    path = tmp_path / "c.sqlite3"
    store = Store(path)
    try:
        a, b = store.create_conversation("a"), store.create_conversation("b")
        assert not a.tools_on and not store.conversation(a.id).tools_on  # off until turned on
        before = store.conversation(a.id).updated
        store.set_tools_on(a.id, True)
        assert store.conversation(a.id).tools_on and not store.conversation(b.id).tools_on
        assert store.conversation(a.id).updated == before  # a switch is not activity: the list's order stays
        assert {c.id: c.tools_on for c in store.conversations()} == {a.id: True, b.id: False}
        assert json.loads(store.export_json(a.id))["tools_on"] is True
        assert store.conversation(a.id).tools_unticked == []  # every tool offered
        store.set_tools_unticked(a.id, {"echo__hang", "calculate"})
        assert store.conversation(a.id).tools_unticked == ["calculate", "echo__hang"]
        assert store.conversation(b.id).tools_unticked == []
    finally:
        store.close()
    reopened = Store(path)
    try:
        assert reopened.conversation(a.id).tools_on and not reopened.conversation(b.id).tools_on
        assert reopened.conversation(a.id).tools_unticked == ["calculate", "echo__hang"]
        reopened.set_tools_on(a.id, False)
        reopened.set_tools_unticked(a.id, [])
        assert not reopened.conversation(a.id).tools_on and reopened.conversation(a.id).tools_unticked == []
    finally:
        reopened.close()


def test_a_database_from_before_the_switch_opens_with_everything_it_had_and_tools_off(tmp_path):
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA)
    conn.commit()
    conn.close()
    store = Store(path)
    try:
        kept = [(c.title, c.system_prompt, c.created, c.updated) for c in store.conversations()]
        assert kept == [("old", "Be brief.", 10.0, 20.0), ("older", "", 5.0, 6.0)]
        assert [(c.tools_on, c.tools_unticked) for c in store.conversations()] == [(False, []), (False, [])]
        hi, hello = store.messages(1)
        assert (hi.content, hello.content) == ("hi", "hello")
        assert (hello.stats, hello.reasoning) == ({"new_tokens": 1}, "a thought")
        store.set_tools_on(2, True)
        store.set_tools_unticked(2, ["calculate"])
    finally:
        store.close()
    reopened = Store(path)  # the second open finds the column there, with what was written to it
    try:
        assert reopened.conversation(2).tools_on and not reopened.conversation(1).tools_on
        assert reopened.conversation(2).tools_unticked == ["calculate"]
        assert [m.content for m in reopened.messages(1)] == ["hi", "hello"]
    finally:
        reopened.close()
