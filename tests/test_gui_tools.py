"""Tools in the window (issue 51, items 2 and 4): the Tools switch of a conversation and what the tools cost; a reply
through the tool loop on a worker thread, each call shown in the reply and asked about there (Allow once, Always
allow, Deny), its result folded under it and fed back; Stop at any point; a server that hangs or cannot start never
freezes the window; the calls kept with the conversation (reopened, exported); Settings → Tools and its mcp.json
editor. The MCP server is tests/mcp_servers/echo_server.py, started by the window as a child process and stopped by
each test; the model is a script (tests/slow_engine.py's stand-in, answering as a model on a server does, calls apart
from its text), and once the tiny random model forced to call a tool through the call grammar."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import psutil
import pytest
from gui_helpers import aloop, open_window, profile, write_settings  # noqa: F401 - fixtures
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QFileDialog
from slow_engine import SlowEngine
from test_theme import BODY, text_contrast

from redline.app.cli_tools import approvals_path, default_mcp_path
from redline.app.gui import build_window
from redline.app.settings import Settings, load_settings
from redline.inference import GenerationResult, StatsEvent, TokenEvent

pytestmark = pytest.mark.usefixtures("aloop", "profile")

ECHO = Path(__file__).parent / "mcp_servers" / "echo_server.py"
PY = sys.executable
MISSING = "/nonexistent/redline-test-no-such-mcp-server"
REFUSED = "The user did not allow this call to echo__add; it did not run."


class ToolScript(SlowEngine):
    """A model that calls ``call`` (name, arguments) in a reply's first round when offered tools, as a model on a
    server does (its calls apart from its text), and then answers with what the tool gave it."""

    def __init__(self):
        super().__init__(interval_s=0.002, tokens=40)
        self.requests: list = []
        self.call: tuple | None = ("echo__add", {"a": 2, "b": 3})

    def run(self, request, sink, submitted=None):
        self.requests.append(request)
        messages = request.messages
        if request.tools and messages[-1]["role"] == "user" and self.call is not None:
            name, arguments = self.call
            sink.emit(TokenEvent(0, 1, "Let me check.", 0.001))
            sink.emit(StatsEvent(3, 0.001, 300.0, 1.0))  # the engine's reading of this round: its three tokens
            call = {"id": f"call_{len(self.requests)}", "type": "function"}
            call["function"] = {"name": name, "arguments": json.dumps(arguments)}
            return self._result("Let me check.", "tool_calls", [call])
        last = messages[-1]
        answer = f"The tool said {last['content']}" if last["role"] == "tool" else "A plain answer."
        for i, word in enumerate(answer.split(" ")):
            if sink.cancelled:
                return self._result(answer, "cancelled")
            time.sleep(self.interval_s)
            sink.emit(TokenEvent(i, i + 1, word if i == 0 else " " + word, 0.01 * (i + 1)))
            sink.emit(StatsEvent(i + 1, 0.01 * (i + 1), 100.0, 10.0))
        return self._result(answer, "eos")

    @staticmethod
    def _result(text, finish, calls=()):
        return GenerationResult(
            text=text,
            token_ids=[1] * len(text.split()),
            prompt_tokens=12,
            new_tokens=len(text.split()),
            finish_reason=finish,
            strategy="kv",
            precision="fp32",
            ttft_ms=5.0,
            tool_calls=list(calls),
        )


def write_mcp(servers: dict) -> Path:
    path = default_mcp_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return path


def echo_server(*extra: str) -> dict:
    return {"command": PY, "args": [str(ECHO), *extra]}


def tools_window(qtbot, servers=None, **settings):
    """The window on a scripted model, its mcp.json listing ``servers`` (the echo server by default)."""
    write_mcp({"echo": echo_server()} if servers is None else servers)
    write_settings(model="fake", max_new_tokens=40, **settings)
    engine = ToolScript()
    window = build_window(engine_factory=lambda: engine)
    qtbot.addWidget(window)
    window.resize(1280, 800)
    window.show()
    with qtbot.waitSignal(window.model_loaded, timeout=30_000):
        window.start()
    return window, engine


def server_pids(window) -> list[int]:
    manager = window.tool_service.manager
    return [p for p in (manager.pid(n) for n in manager.names) if p] if manager is not None else []


def close(qtbot, window) -> None:
    """Shut the window down and wait for every server it started to be gone (bounded)."""
    pids = server_pids(window)
    window.shutdown()
    window.tool_service.wait_closed(15)
    for pid in pids:
        qtbot.waitUntil(lambda p=pid: gone(p), timeout=15_000)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def turn_tools_on(qtbot, window) -> None:
    window.tools_button.click()
    assert window.tools_button.isChecked() and window.tools_note.isVisible()
    qtbot.waitUntil(lambda: not window.tool_service.starting and window.tool_service.listed(), timeout=30_000)
    quiet = lambda: not any(w in window.tools_note.text() for w in ("starting", "counting"))  # noqa: E731
    qtbot.waitUntil(quiet, timeout=60_000)


def last_reply(window):
    widgets = window.chat_view.widgets
    return widgets[-1] if widgets else None


def panel_view(window, index=0):
    panel = getattr(last_reply(window), "tool_panel", None)
    return panel.views[index] if panel is not None and len(panel.views) > index else None


def ask(qtbot, window, text="Add 2 and 3.", index=0):
    """Send ``text`` and wait for the reply's call ``index`` to ask (the worker thread waits for the answer)."""
    window.input.setPlainText(text)
    window.send()
    qtbot.waitUntil(lambda: panel_view(window, index) is not None and panel_view(window, index).asking, timeout=30_000)
    return panel_view(window, index)


def stored_reply(window):
    return [m for m in window.store.messages(window.conversation_id) if m.role == "assistant"][-1]


# -- the switch and what it costs ---------------------------------------------------------------------------------
def test_tools_are_off_in_each_chat_until_switched_on_there(qtbot):
    w, engine = tools_window(qtbot)
    try:
        assert not w.tools_button.isChecked() and w.tools_note.isHidden()
        assert w.tool_service.status("echo")[1] == "not started"  # nothing starts until a chat needs it
        w.input.setPlainText("Hello")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        assert engine.requests[-1].tools is None and server_pids(w) == []
        first = w.conversation_id
        turn_tools_on(qtbot, w)
        # calculate and echo's six; a model on a server counts their tokens itself
        assert w.tools_note.text() == "tools: 7"
        assert w.tool_service.status("echo")[1] == "6 tools"
        w.new_chat()
        assert not w.tools_button.isChecked() and w.tools_note.isHidden()
        w.tools_button.click()  # on in a new chat: it stays on once its first message makes it a conversation
        engine.call = None
        w.input.setPlainText("Hi there")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        assert w.conversation_id != first and w.tools_button.isChecked()
        assert [t["function"]["name"] for t in engine.requests[-1].tools][:2] == ["calculate", "echo__add"]
        w.open_conversation(first)
        assert w.tools_button.isChecked()
    finally:
        close(qtbot, w)


def test_the_switch_is_kept_with_each_conversation_when_redline_starts_again(qtbot):
    w, engine = tools_window(qtbot)
    try:
        engine.call = None
        w.tools_button.click()  # on in a new chat, kept once its first message makes it a conversation
        w.input.setPlainText("With tools")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        with_tools = w.conversation_id
        w.new_chat()
        w.input.setPlainText("Without")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        without = w.conversation_id
        w.open_conversation(with_tools)
        turned_off = w.store.create_conversation("on, then off")
        w.open_conversation(turned_off.id)
        w.tools_button.click()
        w.tools_button.click()
    finally:
        close(qtbot, w)
    # A new window on the same database: Redline started again.
    again, engine = tools_window(qtbot)
    try:
        engine.call = None
        again.open_conversation(without)
        assert not again.tools_button.isChecked() and again.tools_note.isHidden()
        again.open_conversation(turned_off.id)
        assert not again.tools_button.isChecked()
        again.open_conversation(with_tools)
        assert again.tools_button.isChecked() and again.tools_note.isVisible()
        again.input.setPlainText("Still with tools?")
        with qtbot.waitSignal(again.reply_finished, timeout=30_000):
            again.send()
        assert "calculate" in [t["function"]["name"] for t in engine.requests[-1].tools]
    finally:
        close(qtbot, again)


def sized_count(definitions):
    """Stands in for the engine's count of the definitions' tokens (the scripted model has no tokenizer here): a
    figure of exactly the definitions it is given, so what is shown can be checked against what is offered."""
    return lambda engine, report: sum(len(json.dumps(d)) for d in definitions)


def test_the_tools_ticked_in_a_chat_are_the_ones_offered_counted_and_kept(qtbot, monkeypatch):
    monkeypatch.setattr("redline.ui.window.tools_controller.tool_tokens_job", sized_count)
    w, engine = tools_window(qtbot)
    try:
        engine.call = None
        turn_tools_on(qtbot, w)
        every = w.tool_service.registry().names  # calculate and echo's six
        definitions = w.tool_service.registry().definitions()

        def size(names):
            return sum(len(json.dumps(d)) for d in definitions if d["function"]["name"] in names)

        assert w.tools_note.text() == f"tools: 7 · {size(every):,} tokens"
        menu = w.tools.menu
        assert w.tools_button.menu() is menu
        menu.popup(w.tools_button.mapToGlobal(w.tools_button.rect().topLeft()))  # as the button's arrow opens it
        qtbot.waitUntil(menu.isVisible, timeout=5_000)
        actions = menu.tool_actions()
        assert list(actions) == every and all(a.isChecked() for a in actions.values())
        assert (actions["echo__add"].text(), actions["calculate"].text()) == ("echo · add", "calculate (built-in)")
        qtbot.mouseClick(menu, Qt.LeftButton, pos=menu.actionGeometry(actions["echo__add"]).center())
        assert menu.isVisible() and not actions["echo__add"].isChecked()  # open for the next tick
        actions["echo__hang"].trigger()
        menu.close()
        kept = [n for n in every if n not in ("echo__add", "echo__hang")]
        qtbot.waitUntil(lambda: w.tools_note.text() == f"tools: 5 of 7 · {size(kept):,} tokens", timeout=10_000)
        # The new chat's ticks become the conversation's with its first message; only the ticked are offered.
        w.input.setPlainText("Which tools?")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        cid = w.conversation_id
        assert sorted(w.store.conversation(cid).tools_unticked) == ["echo__add", "echo__hang"]
        assert [t["function"]["name"] for t in engine.requests[-1].tools] == kept
        tools = stored_reply(w).stats["tools"]
        assert (tools["offered"], tools["tokens"]) == (kept, size(kept))
        # Another chat offers every tool until it is told otherwise.
        w.new_chat()
        turn_tools_on(qtbot, w)
        qtbot.waitUntil(lambda: w.tools_note.text() == f"tools: 7 · {size(every):,} tokens", timeout=10_000)
        w.open_conversation(cid)
        qtbot.waitUntil(lambda: w.tools_note.text().startswith("tools: 5 of 7 · "), timeout=10_000)
        menu.refresh()
        assert [n for n, a in menu.tool_actions().items() if not a.isChecked()] == ["echo__add", "echo__hang"]
        next(a for a in menu.actions() if a.text() == "Offer all").trigger()
        qtbot.waitUntil(lambda: w.tools_note.text() == f"tools: 7 · {size(every):,} tokens", timeout=10_000)
        assert w.store.conversation(cid).tools_unticked == []
        menu.refresh()
        menu.tool_actions()["calculate"].trigger()
        every_but = [n for n in every if n != "calculate"]
        qtbot.waitUntil(lambda: w.tools_note.text() == f"tools: 6 of 7 · {size(every_but):,} tokens", timeout=10_000)
        for n in every:  # none ticked: said so, and no tool is offered
            w.tools.set_ticked(n, False)
        assert w.tools_note.text().startswith("tools: none ticked in this chat")
        w.input.setPlainText("No tools now.")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        assert not engine.requests[-1].tools
        w.tools.set_ticked("calculate", True)
    finally:
        close(qtbot, w)
    again, engine = tools_window(qtbot)  # Redline started again: the chat's ticks as they were left
    try:
        again.open_conversation(cid)
        assert again.tools_button.isChecked()  # its servers start again, listed on a thread
        shown = f"tools: 1 of 7 · {size(['calculate']):,} tokens"
        qtbot.waitUntil(lambda: again.tools_note.text() == shown, timeout=30_000)
    finally:
        close(qtbot, again)


def test_the_gauges_move_during_a_reply_with_tools_as_in_a_plain_one(qtbot, monkeypatch):
    w, engine = tools_window(qtbot)
    try:
        readings, gaps = [], []
        live, add_latencies = w.gauges.live, w.gauges.add_latencies
        monkeypatch.setattr(w.gauges, "live", lambda *a, **k: (readings.append(a[:3]), live(*a, **k)))
        monkeypatch.setattr(w.gauges, "add_latencies", lambda ms: (gaps.extend(ms), add_latencies(ms)))
        w.input.setPlainText("Hello")  # tools off: the engine's readings reach the gauges
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        assert readings and readings[-1] == (100.0, 10.0, 3)  # "A plain answer.": three words
        readings.clear()
        gaps.clear()
        w.tool_service.set_trust("echo", "always")
        turn_tools_on(qtbot, w)
        w.input.setPlainText("Add 2 and 3.")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        assert stored_reply(w).content == "Let me check.\n\nThe tool said 5"
        # Both rounds' readings, as one reply: the call round's three tokens, then the answer's four counted on from
        # them (never back to 1), and the reply's TTFT, its first round's, throughout.
        assert readings[0] == (300.0, 1.0, 3) and readings[-1] == (100.0, 1.0, 7)
        tokens = [n for _rate, _ttft, n in readings]
        assert tokens == sorted(tokens) and {ttft for _r, ttft, _n in readings} == {1.0}
        assert len(gaps) == 3 and all(abs(ms - 10.0) < 0.5 for ms in gaps)  # the answer's gaps; none across the call
        assert w.gauges.tokens_label.text() == str(stored_reply(w).stats["new_tokens"])  # the last round's, as stored
    finally:
        close(qtbot, w)


# -- asking -----------------------------------------------------------------------------------------------------------
def test_allow_once_runs_the_call_shows_its_result_and_feeds_it_back(qtbot):
    w, engine = tools_window(qtbot)
    try:
        turn_tools_on(qtbot, w)
        view = ask(qtbot, w)
        assert view.question.text() == "Allow echo · add?" and view.toggle.text() == "Tool call: echo · add"
        assert json.loads(view.arguments_text) == {"a": 2, "b": 3}
        assert not w.send_button.isEnabled() and w.stop_button.isEnabled()
        assert last_reply(w).badge.text() == "waiting for your answer"
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            view.allow_once.click()
        tool_message = engine.requests[-1].messages[-1]
        assert tool_message["role"] == "tool" and tool_message["content"] == "5"
        m = stored_reply(w)
        assert m.content == "Let me check.\n\nThe tool said 5" and not m.partial
        (call,) = m.stats["tool_calls"]
        assert (call["server"], call["tool"], call["approval"], call["state"], call["result"]) == (
            "echo",
            "add",
            "allowed once",
            "done",
            "5",
        )
        assert m.stats["tools"]["offered"][:2] == ["calculate", "echo__add"]
        view = panel_view(w)
        assert not view.asking and view.status.text().startswith("allowed once · ")
        assert view.result_toggle.text() == "Result: 5" and view.result.isHidden()  # folded
        view.result_toggle.click()
        assert view.result.isVisible() and view.result.text() == "5"
        # Asked again next time (once is once).
        view = ask(qtbot, w, "And again.")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            view.deny.click()
    finally:
        close(qtbot, w)


def test_deny_tells_the_model_it_did_not_run(qtbot):
    w, engine = tools_window(qtbot)
    try:
        turn_tools_on(qtbot, w)
        view = ask(qtbot, w)
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            view.deny.click()
        assert engine.requests[-1].messages[-1] == {
            "role": "tool",
            "tool_call_id": "call_1",
            "name": "echo__add",
            "content": REFUSED,
        }
        assert server_pids(w) and stored_reply(w).stats["tool_calls"][0]["state"] == "denied"
        assert panel_view(w).status.text() == "denied — the model was told so"
        assert stored_reply(w).content.endswith(REFUSED)
    finally:
        close(qtbot, w)


def test_always_allow_is_saved_and_the_next_call_runs_without_asking(qtbot):
    w, engine = tools_window(qtbot)
    try:
        turn_tools_on(qtbot, w)
        view = ask(qtbot, w)
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            view.allow_always.click()
        saved = json.loads(approvals_path().read_text())
        assert saved["tools"] == {"echo__add": "always"}
        assert stat.S_IMODE(os.stat(approvals_path()).st_mode) == 0o600
        engine.call = ("echo__add", {"a": 40, "b": 2})
        w.input.setPlainText("Add 40 and 2.")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()  # no question this time
        (call,) = stored_reply(w).stats["tool_calls"]
        assert (call["approval"], call["result"]) == ("allowed by your rules", "42")
        w.show_tools_settings()
        assert "Always allowed: echo__add." in w.tools_settings.approvals_label.text()
        w.tools_settings.forget_button.click()
        assert json.loads(approvals_path().read_text())["tools"] == {}
    finally:
        close(qtbot, w)


# -- stopping, and servers that hang or fail ------------------------------------------------------------------------
def test_stop_while_a_call_waits_for_an_answer_denies_it_and_ends_the_reply(qtbot):
    w, engine = tools_window(qtbot)
    try:
        turn_tools_on(qtbot, w)
        ask(qtbot, w)
        with qtbot.waitSignal(w.reply_finished, timeout=5_000):
            w.escape()  # Esc, as the Stop button
        assert len(engine.requests) == 1  # the model was not asked again
        m = stored_reply(w)
        assert m.partial and m.stats["tool_calls"][0]["state"] == "stopped"
        assert m.stats["tools_stopped"] == "cancelled"
        assert panel_view(w).status.text() == "stopped" and not panel_view(w).asking
        engine.call = None
        w.input.setPlainText("Go on.")  # the chat goes on
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        assert stored_reply(w).content == "A plain answer."
    finally:
        close(qtbot, w)


def test_a_server_that_hangs_never_freezes_the_window_and_stop_ends_the_reply(qtbot):
    servers = {"echo": echo_server(), "gone": {"command": MISSING}}
    w, engine = tools_window(qtbot, servers)
    ticks: list[float] = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    try:
        w.tool_service.set_trust("echo", "always")  # Settings → Tools: this server's calls run without asking
        engine.call = ("echo__hang", {})
        turn_tools_on(qtbot, w)
        assert "1 server could not start (Settings → Tools)" in w.tools_note.text()
        state, sentence = w.tool_service.status("gone")
        assert state == "failed" and sentence.startswith("The MCP server 'gone' could not start")
        w.input.setPlainText("Wait for it.")
        w.send()
        running = lambda: panel_view(w) is not None and panel_view(w).call.get("state") == "running"  # noqa: E731
        qtbot.waitUntil(running, timeout=20_000)
        assert last_reply(w).badge.text() == "running a tool…"
        timer.start(20)
        qtbot.wait(1_500)  # the call hangs on its server; the window goes on
        gaps = [b - a for a, b in zip(ticks, ticks[1:])]
        assert len(ticks) >= 40 and max(gaps) < 0.5, (len(ticks), max(gaps, default=None))
        assert w.replies.busy_in(w.conversation_id)
        started = time.monotonic()
        with qtbot.waitSignal(w.reply_finished, timeout=5_000):
            w.stop_button.click()
        assert time.monotonic() - started < 2.0  # at once, not after the call's timeout
        (call,) = stored_reply(w).stats["tool_calls"]
        assert call["state"] == "stopped" and call["name"] == "echo__hang"
        assert panel_view(w).status.text() == "stopped"
        # The failed server's sentence in Settings → Tools; the chat goes on.
        w.show_tools_settings()
        row = w.tools_settings.rows["gone"]
        assert row.status.text() == sentence and row.status.objectName() == "toolError"
        assert w.tools_settings.rows["echo"].status.text() == "6 tools"
        assert w.tools_settings.rows["echo"].trust.currentData() == "always"
        engine.call = ("echo__add", {"a": 1, "b": 1})
        w.input.setPlainText("Now add.")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        assert stored_reply(w).content.endswith("The tool said 2")
    finally:
        timer.stop()
        close(qtbot, w)


def test_a_call_that_hangs_times_out_with_its_sentence_and_the_reply_goes_on(qtbot):
    w, engine = tools_window(qtbot)
    try:
        w.tool_service.call_timeout_s = 1.5  # Redline's is 60 s
        w.tool_service.load_config()
        w.tool_service.set_trust("echo", "always")
        engine.call = ("echo__hang", {})
        turn_tools_on(qtbot, w)
        w.input.setPlainText("Wait for it.")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        sentence = "The MCP server 'echo' did not answer the call to hang within 1.5 s; the call was stopped."
        (call,) = stored_reply(w).stats["tool_calls"]
        assert (call["state"], call["is_error"], call["result"]) == ("error", True, sentence)
        assert stored_reply(w).content.endswith("The tool said " + sentence)  # the model was told, and answered
        assert panel_view(w).result_toggle.text().startswith("Error: The MCP server 'echo' did not answer")
    finally:
        close(qtbot, w)


def test_the_round_limit_from_settings_ends_a_loop_of_calls(qtbot):
    w, engine = tools_window(qtbot, tools_max_rounds=1)
    try:
        turn_tools_on(qtbot, w)
        w.tool_service.set_trust("echo", "always")
        w.input.setPlainText("Add.")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        m = stored_reply(w)
        assert len(engine.requests) == 1 and m.stats["tool_calls"][0]["state"] == "not run"
        assert any("most tool calls per reply" in n for n in m.stats["notes"])
    finally:
        close(qtbot, w)


# -- kept with the conversation -------------------------------------------------------------------------------------
def test_the_calls_are_kept_reopened_and_exported(qtbot):
    w, engine = tools_window(qtbot)
    try:
        turn_tools_on(qtbot, w)
        view = ask(qtbot, w)
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            view.allow_once.click()
        cid, reply = w.conversation_id, stored_reply(w)
        w.new_chat()
        w.open_conversation(cid)
        again = w.chat_view.widget_for(reply.id).tool_panel
        (shown,) = again.views
        assert shown.toggle.text() == "Tool call: echo · add" and shown.result_toggle.text() == "Result: 5"
        assert not shown.asking and shown.status.text().startswith("allowed once")
        markdown = w.store.export_markdown(cid)
        assert "**Tool call** `echo · add` — allowed once" in markdown
        assert '"a": 2' in markdown and "Result:\n\n```text\n5\n```" in markdown
        assert markdown.index("**Tool call**") < markdown.index("The tool said 5")
        exported = json.loads(w.store.export_json(cid))
        (call,) = exported["messages"][-1]["stats"]["tool_calls"]
        assert (call["arguments"], call["result"], call["approval"]) == ({"a": 2, "b": 3}, "5", "allowed once")
        # The next turn with tools shows the model its earlier call and result.
        engine.call = None
        w.input.setPlainText("Thanks.")
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            w.send()
        roles = [m["role"] for m in engine.requests[-1].messages]
        assert roles == ["user", "assistant", "tool", "assistant", "user"]
    finally:
        close(qtbot, w)


# -- Settings → Tools -----------------------------------------------------------------------------------------------
def test_settings_list_the_servers_and_the_editor_refuses_what_cannot_be_used(qtbot, monkeypatch):
    w, engine = tools_window(qtbot, {"gone": {"command": MISSING}})
    try:
        w.show_tools_settings()
        page = w.tools_settings
        assert list(page.rows) == ["gone"] and page.rows["gone"].status.text() == "not started"
        assert page.rows["gone"].trust.currentData() == "ask"
        page.start_button.click()
        qtbot.waitUntil(lambda: page.rows["gone"].status.objectName() == "toolError", timeout=20_000)
        assert "could not start" in page.rows["gone"].status.text()
        path = w.tool_service.mcp_path
        before = path.read_text()
        editor = page.edit()
        editor.editor.setPlainText('{"mcpServers": {"a": {"command": "x",}}}')
        assert editor.save() is False
        assert editor.error.text().startswith(f"{path} is not valid JSON:") and editor.isVisible()
        assert path.read_text() == before  # not written
        editor.editor.setPlainText('{"mcpServers": {"a": {"comand": "x"}}}')
        assert editor.save() is False and 'unknown key "comand"' in editor.error.text()
        editor.editor.setPlainText(json.dumps({"mcpServers": {"echo": echo_server()}}))
        assert editor.save() is True and not editor.isVisible()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert list(page.rows) == ["echo"]
        qtbot.waitUntil(lambda: page.rows["echo"].status.text() == "6 tools", timeout=30_000)
        page.calculator.setChecked(False)
        assert w.settings.tools_calculator is False
        page.max_rounds.setValue(3)
        assert w.settings.tools_max_rounds == 3
        saved, warning = load_settings()
        assert warning is None and (saved.tools_calculator, saved.tools_max_rounds) == (False, 3)
        # read_file, for the files the user picks.
        notes = Path(w.tool_service.mcp_path).parent / "notes.md"
        notes.write_text("# Notes\n\nBuy milk.", encoding="utf-8")
        monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(notes), "")))
        page.add_file.click()
        assert w.settings.tools_read_paths == (str(notes),) and page.read_paths.item(0).text() == str(notes)
        registry = w.tool_service.registry()
        assert registry.names[0] == "read_file" and "calculate" not in registry.names
        assert "Buy milk." in registry.call("read_file", {"path": str(notes)}).text
        page.remove_path.click()
        assert w.settings.tools_read_paths == () and "read_file" not in w.tool_service.registry().names
        page.rows["echo"].trust.setCurrentIndex(2)
        page.rows["echo"].trust.activated.emit(2)
        assert w.tool_service.policy.server_trust("echo") == "never"
    finally:
        close(qtbot, w)


def test_an_old_settings_file_loads_with_the_tools_defaults():
    old = Settings.from_dict({"model": "starter", "theme": "dark"})
    assert (old.tools_calculator, old.tools_read_paths, old.tools_max_rounds) == (True, (), 8)
    made = Settings(tools_read_paths=("/a", "/b"), tools_max_rounds=3)
    assert Settings.from_dict(json.loads(json.dumps(made.to_dict()))) == made
    with pytest.raises(ValueError):
        Settings.from_dict({"tools_max_rounds": 0})


# -- readable in both themes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_question_the_result_and_an_error_are_readable(qtbot, theme):
    w, engine = tools_window(qtbot, {"echo": echo_server(), "gone": {"command": MISSING}}, theme=theme)
    try:
        engine.call = ("echo__fail", {})
        turn_tools_on(qtbot, w)
        view = ask(qtbot, w, "Try it.")
        QApplication.processEvents()
        assert text_contrast(view.question) >= BODY
        with qtbot.waitSignal(w.reply_finished, timeout=20_000):
            view.allow_once.click()
        view = panel_view(w)
        assert view.result_toggle.objectName() == "toolResultHeaderError"
        assert view.result_toggle.text() == "Error executing tool fail"
        assert view.arguments_text == "{}"
        view.result_toggle.click()
        w.chat_view.ensureWidgetVisible(view.result)
        QApplication.processEvents()
        assert view.result.text() == "Error executing tool fail"  # the server's own words
        assert text_contrast(view.result) >= BODY and text_contrast(view.status) >= BODY
        w.show_tools_settings()
        QApplication.processEvents()
        error = w.tools_settings.rows["gone"].status
        assert text_contrast(error) >= BODY, theme
    finally:
        close(qtbot, w)


# -- the tiny model, forced to call a tool through the call grammar ---------------------------------------------------
@pytest.mark.slow
def test_a_model_here_forced_to_call_add_asks_runs_and_answers(qtbot, tmp_path):
    from conftest import build_tiny_model

    # Room for the seven definitions (about 1,900 tokens of the byte-level tokenizer), a call and its result.
    folder = build_tiny_model(tmp_path / "tiny-tools", max_positions=4096)
    write_mcp({"echo": echo_server()})
    write_settings(
        model=str(folder), precision="fp32", strategy="kv", temperature=0, max_new_tokens=120, tools_max_rounds=2
    )
    w = open_window(qtbot)
    try:
        w.tool_service.tool_choice = "echo__add"
        turn_tools_on(qtbot, w)
        assert w.tools_note.text().endswith(" tokens")
        n, tokens = w.tools_note.text().removeprefix("tools: ").split(" · ")[:2]
        assert n == "7" and int(tokens.removesuffix(" tokens").replace(",", "")) > 100
        view = ask(qtbot, w, "Add two numbers.")
        assert view.toggle.text() == "Tool call: echo · add"
        a, b = view.call["arguments"]["a"], view.call["arguments"]["b"]
        with qtbot.waitSignal(w.reply_finished, timeout=60_000):
            view.allow_once.click()
            # A second call the random model may make in its last round is not run (the limit is 2 rounds).
        m = stored_reply(w)
        first = m.stats["tool_calls"][0]
        assert (first["state"], first["result"], first["approval"]) == ("done", str(a + b), "allowed once")
        assert m.stats["tool_messages"][1]["content"] == str(a + b)  # fed back to the model
        assert m.stats["tools"]["tokens"] == int(tokens.removesuffix(" tokens").replace(",", ""))
        assert m.stats["finish_reason"] in ("eos", "length") and not m.partial
    finally:
        close(qtbot, w)
