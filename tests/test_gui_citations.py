"""A reply given excerpts of a document too long for the context (issue 50, item 3): the window shows the excerpts it
could cite under it, a button each, and a click shows the excerpt's text; kept with the conversation."""

from __future__ import annotations

import pytest
from gui_helpers import aloop, open_window, profile, write_settings  # noqa: F401 - fixtures
from test_attachments_engine import FACT, QUESTION, flat, write_pdf
from test_gui_attachments import attach_by_button, wait_chips

pytestmark = pytest.mark.usefixtures("aloop", "profile")


def test_a_long_documents_excerpts_are_shown_under_the_reply_and_open_on_a_click(qtbot, monkeypatch, tmp_path):
    from conftest import build_tiny_model

    folder = build_tiny_model(tmp_path / "tiny-long", max_positions=4096)
    pdf = write_pdf(tmp_path / "annals.pdf", pages=40, fact_page=23)
    write_settings(model=str(folder), precision="fp32", temperature=0, max_new_tokens=8, context_length=1024)
    w = open_window(qtbot)
    try:
        qtbot.waitUntil(lambda: w.loaded is not None, timeout=60_000)
        attach_by_button(qtbot, w, monkeypatch, [pdf])
        (chip,) = wait_chips(qtbot, w, 1)
        w.input.setPlainText(QUESTION)
        with qtbot.waitSignal(w.reply_finished, timeout=60_000):
            w.send()
        reply = [m for m in w.store.messages(w.conversation_id) if m.role == "assistant"][-1]
        cited = reply.stats["citations"]
        assert 23 in [c["page"] for c in cited] and all(c["name"] == "annals.pdf" for c in cited)
        shown = w.chat_view.widget_for(reply.id).citations
        assert shown is not None and [b.text() for b in shown.buttons][0] == f"[1] annals.pdf, p. {cited[0]['page']}"
        assert shown.excerpt.isHidden()
        which = [c["page"] for c in cited].index(23)
        shown.buttons[which].click()
        assert not shown.excerpt.isHidden()
        assert FACT in flat(shown.excerpt.text()) and shown.excerpt.text().startswith(f"[{which + 1}] annals.pdf")
        shown.buttons[which].click()
        assert shown.excerpt.isHidden()
        w.new_chat()  # reopened from the store: the same sources
        w.open_conversation(reply.conversation_id)
        again = w.chat_view.widget_for(reply.id).citations
        assert again is not None and len(again.buttons) == len(cited)
    finally:
        w.shutdown()
