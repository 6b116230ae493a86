"""Issue 29 item 4: in the window, a reply that is a tool call (local or remote) is shown as a call — "Tool call:
NAME" with a toggle and its arguments as JSON beneath — not as raw JSON text; a malformed call stays text; Copy
copies the call as JSON; reopening the conversation shows the call again. Driven like a user: the real window on a
scripted stand-in engine (no torch) for local replies, and on a stand-in OpenAI-compatible server on 127.0.0.1 that
answers with streamed ``tool_calls`` for remote ones."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from gui_helpers import aloop, profile, send, write_settings  # noqa: F401 - fixtures
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from slow_engine import SlowEngine

from redline.inference.events import GenerationResult, TokenEvent

pytestmark = pytest.mark.usefixtures("aloop", "profile")

WEATHER = {"city": "Paris", "unit": "celsius"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'


class ScriptedEngine(SlowEngine):
    """Streams the next scripted reply in 7-character pieces, as a local model's tokens would come."""

    def __init__(self, replies: list[str]):
        super().__init__(interval_s=0.0)
        self.replies = replies

    def chat(self, messages, sampling, options, on_event=None, context=None, should_cancel=None):
        text = self.replies.pop(0)
        pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
        start = time.perf_counter()
        for i, piece in enumerate(pieces):
            if on_event:
                on_event(TokenEvent(i, i, piece, time.perf_counter() - start))
        return GenerationResult(
            text=text,
            token_ids=list(range(len(pieces))),
            prompt_tokens=3,
            new_tokens=len(pieces),
            finish_reason="eos",
            strategy=options.strategy,
            precision="fp32",
            device="cpu",
            total_s=time.perf_counter() - start,
        )


def scripted_window(qtbot, *replies: str):
    from redline.app.gui import build_window

    write_settings(model="fake", temperature=0, max_new_tokens=200)
    queue = list(replies)
    window = build_window(engine_factory=lambda: ScriptedEngine(queue))
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.model_loaded, timeout=30_000):
        window.start()
    return window


def last_reply(qtbot, window):
    """The newest message's widget, once on screen (the view shows a new message widget in the next turn)."""
    widget = window.chat_view.widgets[-1]
    qtbot.waitUntil(widget.isVisible, timeout=5_000)
    return widget


def reopened(qtbot, window):
    """The conversation closed (a new chat) and opened again: every widget rebuilt from the store."""
    cid = window.conversation_id
    window.new_chat()
    assert not window.chat_view.widgets
    window.open_conversation(cid)
    return last_reply(qtbot, window)


def shows_the_weather_call(widget) -> None:
    [block] = widget.call_blocks
    assert block.toggle.text() == "Tool call: get_weather" and block.toggle.isVisible()
    assert block.expanded and block.arguments.isVisible()
    assert json.loads(block.arguments.toPlainText()) == WEATHER
    assert '"city": "Paris"' in block.arguments.toPlainText()  # pretty-printed, one key a line
    assert "<tool_call>" not in widget.browser.toPlainText()


def test_a_local_reply_that_is_a_call_shows_as_a_call_folds_copies_as_json_and_reopens(qtbot):
    w = scripted_window(qtbot, "Let me check the weather.\n" + CALL)
    try:
        send(qtbot, w, "Weather in Paris?")
        widget = last_reply(qtbot, w)
        shows_the_weather_call(widget)
        assert widget.browser.toPlainText() == "Let me check the weather." and widget.browser.isVisible()
        block = widget.call_blocks[0]
        qtbot.mouseClick(block.toggle, Qt.LeftButton)
        assert not block.expanded and not block.arguments.isVisible()
        assert block.toggle.arrowType() == Qt.RightArrow
        qtbot.mouseClick(block.toggle, Qt.LeftButton)
        assert block.expanded and block.arguments.isVisible()
        qtbot.mouseClick(widget.copy_button, Qt.LeftButton)
        text, copied = QGuiApplication.clipboard().text().split("\n\n", 1)
        assert text == "Let me check the weather."
        assert json.loads(copied) == {"name": "get_weather", "arguments": WEATHER}
        [_, stored] = w.store.messages(w.conversation_id)
        assert stored.content == "Let me check the weather.\n" + CALL  # the model's own text, kept as it came
        shows_the_weather_call(reopened(qtbot, w))
    finally:
        w.shutdown()


def test_a_malformed_call_stays_text_and_long_arguments_start_folded(qtbot):
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    long_args = {f"field_{i}": i for i in range(20)}
    long_call = "<tool_call>\n" + json.dumps({"name": "save_form", "arguments": long_args}) + "\n</tool_call>"
    w = scripted_window(qtbot, broken, long_call)
    try:
        send(qtbot, w, "Weather?")
        widget = last_reply(qtbot, w)
        assert widget.call_blocks == [] and widget.browser.isVisible()
        assert "<tool_call>" in widget.browser.toPlainText() and '"city": }' in widget.browser.toPlainText()
        qtbot.mouseClick(widget.copy_button, Qt.LeftButton)
        assert QGuiApplication.clipboard().text() == broken  # the text as it came, as for any reply
        send(qtbot, w, "Save the form.")
        [block] = last_reply(qtbot, w).call_blocks
        assert block.toggle.text() == "Tool call: save_form"
        assert not block.expanded and not block.arguments.isVisible()  # 22 lines: folded until asked for
        assert not w.chat_view.widgets[-1].browser.isVisible()  # a reply that is only a call: no empty text
        qtbot.mouseClick(block.toggle, Qt.LeftButton)
        assert block.arguments.isVisible() and json.loads(block.arguments.toPlainText()) == long_args
    finally:
        w.shutdown()


# -- a remote engine ---------------------------------------------------------------------------------------
def _tool_server_app(bodies: list):
    """A server that answers every chat with one streamed call to get_weather (no text), as OpenAI streams it."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "caller"}]})

    async def stream():
        first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
        for piece in (
            first,
            {"index": 0, "function": {"arguments": '{"city": "Paris", '}},
            {"index": 0, "function": {"arguments": '"unit": "celsius"}'}},
        ):
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [piece]}}]}) + "\n\n"
        yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}) + "\n\n"
        yield "data: [DONE]\n\n"

    async def completions(request):
        bodies.append(await request.json())
        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", completions, methods=["POST"])])


@pytest.fixture
def tool_server():
    import uvicorn

    bodies: list = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_tool_server_app(bodies), log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", bodies
    server.should_exit = True
    thread.join(10)
    sock.close()


def test_a_remote_reply_with_tool_calls_shows_as_a_call_is_stored_and_reopens(qtbot, tool_server):
    from redline.app.gui import build_window

    base, bodies = tool_server
    write_settings(model=base + "#caller", temperature=0, max_new_tokens=50)
    w = build_window()
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.model_loaded, timeout=60_000):
        w.start()
    try:
        result = send(qtbot, w, "Weather in Paris?")
        assert result.text == "" and result.tool_calls[0]["function"]["name"] == "get_weather"
        widget = last_reply(qtbot, w)
        shows_the_weather_call(widget)
        assert not widget.browser.isVisible()  # no text came, only the call
        qtbot.mouseClick(widget.copy_button, Qt.LeftButton)
        assert json.loads(QGuiApplication.clipboard().text()) == {"name": "get_weather", "arguments": WEATHER}
        [_, stored] = w.store.messages(w.conversation_id)
        assert stored.content == CALL  # the canonical form: a Hermes block
        shows_the_weather_call(reopened(qtbot, w))
        send(qtbot, w, "And tomorrow?")  # the next turn shows the server the call, as text
        assert bodies[-1]["messages"][-2] == {"role": "assistant", "content": CALL}
    finally:
        w.shutdown()
