"""A conversation's attachments between the store and the engine, without a window (issue 50, item 3): a message sent
with a document and an image is written with them, and the engine is given them in the message's dict, on later
turns too; a reply the engine refuses leaves the message and its attachments in the conversation."""

from __future__ import annotations

import io

import pytest
from gui_helpers import aloop  # noqa: F401 - fixture
from PIL import Image as PILImage
from PySide6.QtCore import QTimer
from slow_engine import SlowEngine

from redline.app.store import Store
from redline.inference import AttachmentError, DecodeOptions, Failed, SamplingSettings, read_attachment_bytes
from redline.ui.bridge import Channel, EngineBridge
from redline.ui.chat_session import ChatSession, ReplyConfig, prompt_messages


def png() -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (32, 16), "blue").save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def bridge(qtbot):
    bridge = EngineBridge(lambda: SlowEngine(interval_s=0.005))
    loaded = bridge.load("fake", "fp32")
    qtbot.waitUntil(lambda: loaded.done, timeout=10_000)
    asked = []
    real = bridge.generate
    bridge.generate = lambda request: asked.append(request) or real(request)  # what the engine was given
    bridge.asked = asked
    yield bridge
    bridge.shutdown(5000)


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "chat.sqlite3")
    yield store
    store.close()


def config() -> ReplyConfig:
    return ReplyConfig("slow-fake", SamplingSettings(max_new_tokens=4), DecodeOptions(strategy="kv"), None, "fp32")


def test_the_engine_is_given_each_user_messages_attachments_in_its_dict(qtbot, bridge, store, tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nThe launch is on Tuesday.", encoding="utf-8")
    doc = read_attachment_bytes(notes.read_bytes(), "notes.md")
    image = read_attachment_bytes(png(), "chart.png")
    conv = store.create_conversation("t", system_prompt="Be brief.")
    session = ChatSession(store, bridge, conv.id)
    shown = []
    session.message_added.connect(shown.append)
    with qtbot.waitSignal(session.reply_finished, timeout=10_000):
        session.send("When is the launch?", config(), attachments=[doc, image], sources=[notes])
    assert shown[0].attachments == [doc, image]  # the window shows them under the message at once
    user = store.messages(conv.id)[0]
    assert user.attachments == [doc, image] and store.attachment_file(user.id, 0).read_bytes() == notes.read_bytes()
    first = bridge.asked[0].messages
    assert first == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "When is the launch?", "attachments": [doc, image]},
    ]
    with qtbot.waitSignal(session.reply_finished, timeout=10_000):
        session.send("And the chart?", config())
    second = bridge.asked[1].messages
    # Earlier turns keep theirs (the prompt builder decides what of them to keep); a message without any has no key.
    assert second[1] == first[1] and second[2]["role"] == "assistant"
    assert second[3] == {"role": "user", "content": "And the chart?"}


def test_a_message_of_attachments_alone_is_a_turn_and_two_user_turns_join_theirs(store):
    doc = read_attachment_bytes(b"alpha", "a.txt")
    image = read_attachment_bytes(png(), "b.png")
    conv = store.create_conversation("t")
    first = store.add_message(conv.id, "user", "")  # sent with no words: its files are the message
    store.add_attachments(first.id, [doc])
    store.add_message(conv.id, "assistant", "")  # a reply that never started
    second = store.add_message(conv.id, "user", "compare")
    store.add_attachments(second.id, [image])
    assert prompt_messages(store, conv.id) == [{"role": "user", "content": "compare", "attachments": [doc, image]}]


class RefusingBridge:
    """The engine's refusal as its channel delivers it (Failed with the prompt builder's AttachmentError), for the
    session's handling of it; the refusal's own wording is the engine's and is tested there."""

    def __init__(self):
        self.asked = []

    def generate(self, request):
        self.asked.append(request)
        channel = Channel(self, -1, "generate")
        refusal = AttachmentError("chart.png is an image, and this model reads text only.", "Load a vision model.")
        QTimer.singleShot(0, lambda: channel._deliver([Failed(refusal)]))
        return channel


def test_a_refused_reply_keeps_the_message_and_its_attachments(qtbot, store):
    image = read_attachment_bytes(png(), "chart.png")
    conv = store.create_conversation("t")
    session = ChatSession(store, RefusingBridge(), conv.id)
    with qtbot.waitSignal(session.reply_finished, timeout=5000) as ended:
        session.send("What does it show?", config(), attachments=[image])
    reply = ended.args[0]
    assert "reads text only" in reply.error
    user, line = store.messages(conv.id)
    assert (user.content, user.attachments) == ("What does it show?", [image])
    assert line.content == "" and line.stats["notes"][0].startswith("No reply: chart.png is an image")
    assert store.attachment_file(user.id, 0).read_bytes() == image.data  # kept to send again after an edit
