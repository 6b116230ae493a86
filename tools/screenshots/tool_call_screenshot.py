"""Save docs/screenshots/tool-call.png: the window showing replies that are tool calls (docs/chat.md).

The window is connected, as a user would connect it, to a stand-in OpenAI-compatible server on 127.0.0.1 that
answers the first message with text and a Hermes ``<tool_call>`` block in its content (what a local Qwen-style
model writes) and the second with streamed ``tool_calls`` and no text (what an OpenAI-compatible server sends).
No model runs. A throwaway profile; offscreen unless DISPLAY is set.

Run: .venv/bin/python tools/screenshots/tool_call_screenshot.py
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for gui_session (not a package)
from gui_session import OUT, ROOT, qt_app, settle, throwaway_profile, wait_until  # noqa: E402

FIRST = (
    "I'll look up the current weather in Paris for you.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
)
SECOND_ARGS = {
    "title": "Picnic in the Jardin du Luxembourg",
    "start": "2026-12-05T12:00:00+01:00",
    "duration_minutes": 120,
    "attendees": ["ana@example.org", "li@example.org"],
    "reminder": {"minutes_before": 30, "method": "notification"},
}


def stand_in_app():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    turns = []

    def event(delta: dict, finish=None) -> str:
        return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"

    async def stream(turn: int):
        if turn == 0:
            for i in range(0, len(FIRST), 12):
                yield event({"content": FIRST[i : i + 12]})
                await asyncio.sleep(0.03)  # a model's pace, so the figures under the reply look like one
            yield event({}, "stop")
        else:
            args = json.dumps(SECOND_ARGS)
            first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "create_event"}}
            yield event({"tool_calls": [{**first, "function": {"name": "create_event", "arguments": ""}}]})
            for i in range(0, len(args), 24):
                yield event({"tool_calls": [{"index": 0, "function": {"arguments": args[i : i + 24]}}]})
                await asyncio.sleep(0.03)
            yield event({}, "tool_calls")
        yield "data: [DONE]\n\n"

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "assistant-with-tools"}]})

    async def completions(request):
        await request.json()
        turns.append(1)
        return StreamingResponse(stream(len(turns) - 1), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", completions, methods=["POST"])])


def main() -> int:
    throwaway_profile("redline-tool-call-")
    import uvicorn

    from redline.app.gui import build_window
    from redline.app.settings import Settings, save_settings

    app = qt_app()  # noqa: F841 - the application must stay alive
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(stand_in_app(), log_level="critical", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"

    save_settings(Settings(model=base + "#assistant-with-tools", temperature=0, max_new_tokens=200))
    window = build_window()
    window.resize(1100, 760)
    window.show()
    loaded, finished = [], []
    window.model_loaded.connect(loaded.append)
    window.reply_finished.connect(finished.append)
    window.start()
    wait_until(lambda: loaded or (window.banner.isVisible() and window.banner.kind == "error"), 120)
    if not loaded:
        print(f"the stand-in server did not connect: {window.banner.label.text()}", file=sys.stderr)
        return 1
    for n, text in enumerate(("What's the weather in Paris?", "Put a picnic in my calendar for Saturday noon."), 1):
        window.input.setPlainText(text)
        window.send()
        wait_until(lambda n=n: len(finished) == n, 60)
    settle(0.5)
    window.chat_view.render_dirty()
    window.chat_view.verticalScrollBar().setValue(window.chat_view.verticalScrollBar().maximum())
    settle(0.3)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "tool-call.png"
    window.grab().save(str(path))
    print(f"saved {path.relative_to(ROOT)}")
    window.shutdown()
    server.should_exit = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
