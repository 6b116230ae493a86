"""A reasoning model in the window: its thinking streams into a block above the answer that folds when the answer
begins ("Thought for 1.2 s · 412 tokens"), Copy copies the answer, the thinking is stored apart (a column an old
database gains when it opens) and never sent back to the model, and the settings panel's switch reaches the
template. The real window and engine, on a tiny random model with a Qwen3-style template made to write a scripted
reply (the engine service's submit is wrapped in this process)."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import build_tiny_model
from gui_helpers import aloop, profile, write_settings  # noqa: F401 - fixtures
from reasoning_helpers import Script, thinking_tokenizer

from redline.app.settings import Settings
from redline.app.store import Store
from redline.inference import EngineService, Thinking
from redline.ui.chat_session import prompt_messages
from redline.ui.chat_view import MessageWidget

REPLY = "<think>\nI add 2 and 2.\n</think>\n\nIt is **4**."


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, starter_dir):
    tok = thinking_tokenizer(starter_dir)
    return build_tiny_model(tmp_path_factory.mktemp("gui") / "thinker", tokenizer=tok, layers=1, hidden=32), tok


@pytest.fixture
def scripted(thinker, monkeypatch):
    folder, tok = thinker
    submit = EngineService.submit
    script = {"text": REPLY, "prompts": []}

    def wrapped(self, request):
        if request.messages is not None:
            script["prompts"].append(request)
            ids = tok(script["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            request.logits_processor = Script(ids, request.logits_processor)
        return submit(self, request)

    monkeypatch.setattr(EngineService, "submit", wrapped)
    script["tok"] = tok
    return folder, script


def thinking_window(qtbot, folder, **settings):
    from redline.app.gui import build_window

    write_settings(model=str(folder), precision="fp32", strategy="kv", temperature=0, max_new_tokens=64, **settings)
    window = build_window()
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.model_loaded, timeout=120_000):
        window.start()
    return window


def send(qtbot, window, text):
    window.input.setPlainText(text)
    with qtbot.waitSignal(window.reply_finished, timeout=120_000):
        window.send()


@pytest.mark.usefixtures("aloop", "profile")
def test_thinking_block_above_the_answer_stored_apart_and_not_sent_back(qtbot, scripted):
    folder, script = scripted
    window = thinking_window(qtbot, folder)
    send(qtbot, window, "What is 2 + 2?")
    widget = window.chat_view.widgets[-1]
    block = widget.thinking
    assert block.isVisible() and not block.expanded  # folded once the answer began
    assert block.body.text() == "I add 2 and 2."
    tok = script["tok"]
    thought = len(tok("<think>\nI add 2 and 2.\n</think>", add_special_tokens=False)["input_ids"])
    written = len(tok(REPLY, add_special_tokens=False)["input_ids"]) + 1  # and the end of the turn
    assert block.toggle.text().startswith("Thought for ") and f"{thought} tokens" in block.toggle.text()
    assert widget.browser.toPlainText() == "It is 4."
    assert "think" not in widget.browser.toPlainText()
    widget.copy_text()
    from PySide6.QtGui import QGuiApplication

    assert QGuiApplication.clipboard().text() == "It is **4**."  # the answer, never the thinking
    stored = window.store.messages(window.conversation_id)[-1]
    assert (stored.content, stored.reasoning) == ("It is **4**.", "I add 2 and 2.")
    assert stored.stats["reasoning_tokens"] == thought and stored.stats["new_tokens"] == written
    # the next turn sends the answer alone
    assert prompt_messages(window.store, window.conversation_id)[-1] == {"role": "assistant", "content": "It is **4**."}
    block.toggle.click()
    assert block.expanded and block.body.isVisible()


@pytest.mark.usefixtures("aloop", "profile")
def test_thinking_off_in_the_settings_reaches_the_template(qtbot, scripted):
    folder, script = scripted
    script["text"] = "It is 4."
    window = thinking_window(qtbot, folder, thinking="off")
    send(qtbot, window, "What is 2 + 2?")
    assert script["prompts"][-1].thinking == Thinking(enabled=False)
    assert not window.chat_view.widgets[-1].thinking.isVisible()
    assert window.store.messages(window.conversation_id)[-1].reasoning == ""


def test_block_opens_while_thinking_and_folds_when_the_answer_begins(qtbot):
    widget = MessageWidget(1, "assistant")
    qtbot.addWidget(widget)
    widget.show()
    widget.streaming = True
    widget.thinking.set_text("Let me see")
    widget.render()
    assert widget.thinking.isVisible() and widget.thinking.expanded
    assert widget.thinking.toggle.text().startswith("Thinking… ")
    widget.thinking.set_text("Let me see. Four.")
    widget.text = "Four."
    widget.render()
    assert not widget.thinking.expanded  # folded for the answer
    widget.streaming = False
    widget.set_content("Four.", {"thinking_ms": 1234.0, "reasoning_tokens": 412, "new_tokens": 420})
    widget.render()
    assert widget.thinking.toggle.text() == "Thought for 1.2 s · 412 tokens"


def test_block_left_open_by_the_user_stays_open(qtbot):
    widget = MessageWidget(1, "assistant")
    qtbot.addWidget(widget)
    widget.show()
    widget.streaming = True
    widget.thinking.set_text("Hmm")
    widget.render()
    widget.thinking.toggle.click()  # the user folds it while it thinks…
    widget.thinking.toggle.click()  # …and opens it again: their choice
    widget.text = "Answer"
    widget.render()
    assert widget.thinking.expanded


def test_a_message_without_thinking_shows_no_block(qtbot):
    widget = MessageWidget(1, "assistant", "Hello")
    qtbot.addWidget(widget)
    widget.show()
    assert not widget.thinking.isVisible()


def test_an_old_database_gains_the_column_and_keeps_its_messages(tmp_path):
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, "
        "system_prompt TEXT NOT NULL DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id INTEGER NOT NULL REFERENCES "
        "conversations(id) ON DELETE CASCADE, position INTEGER NOT NULL, role TEXT NOT NULL CHECK (role IN "
        "('user', 'assistant')), content TEXT NOT NULL, partial INTEGER NOT NULL DEFAULT 0, stats TEXT, "
        "created REAL NOT NULL);"
        "INSERT INTO conversations VALUES (1, 'old', '', 0, 0);"
        "INSERT INTO messages VALUES (1, 1, 0, 'user', 'hi', 0, NULL, 0), (2, 1, 1, 'assistant', 'hello', 0, NULL, 0);"
    )
    conn.commit()
    conn.close()
    store = Store(path)
    try:
        old = store.messages(1)
        assert [(m.content, m.reasoning) for m in old] == [("hi", ""), ("hello", "")]
        store.update_message(2, "hello", False, reasoning="a thought")
        assert store.message(2).reasoning == "a thought"
        assert '"reasoning": "a thought"' in store.export_json(1)
    finally:
        store.close()
    reopened = Store(path)  # a second open finds the column there
    try:
        assert reopened.message(2).reasoning == "a thought"
    finally:
        reopened.close()


def test_settings_map_to_the_thinking_setting():
    assert Settings().thinking_setting() is None
    got = Settings(thinking="off", thinking_budget=100).thinking_setting()
    assert got == Thinking(enabled=False, effort=None, budget=100)
    assert Settings(reasoning_effort="high").thinking_setting() == Thinking(effort="high")
    with pytest.raises(ValueError, match="thinking"):
        Settings.from_dict({"thinking": "maybe"})


def test_settings_panel_has_the_toggle_and_the_budget(qtbot):
    from redline.ui.settings_panel import SettingsPanel

    current = Settings(model="starter")
    panel = SettingsPanel(current)
    qtbot.addWidget(panel)
    panel.thinking.setCurrentText("off")
    panel.thinking_budget.setValue(512)
    candidate = panel.candidate()
    assert (candidate.thinking, candidate.thinking_budget) == ("off", 512)
    assert not current.needs_reload(candidate)  # applies to the next reply
    assert panel.apply_button.isEnabled()
