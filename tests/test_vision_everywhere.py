"""One image, one question, a vision model in greedy decoding (issue 50's target): the window, ``redline chat
--attach`` and the HTTP server (the official ``openai`` client, an ``image_url`` data URL) give the same answer as the
engine itself, on a tiny random model built from each family's config (tests/vision_models.py)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import openai
import pytest
import vision_models as vm
from gui_helpers import aloop, open_window, profile, write_settings  # noqa: F401 - fixtures
from test_gui_attachments import attach_by_button, wait_chips

from redline.inference import DecodeOptions, Engine, EngineService, GenerationRequest, SamplingSettings
from redline.inference.precision import parse_precision
from tests.test_server import start, stop

QUESTION = "What is in this picture?"
NEW = 6
TIMEOUT = 120


@pytest.fixture(scope="module", params=vm.FAMILIES)
def model(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"everywhere-{request.param}")
    folder = vm.build(request.param, root / f"tiny-{request.param}")
    png = root / "picture.png"
    png.write_bytes(vm.image_bytes(48, 40, seed=3))
    svc = EngineService(lambda: Engine("cpu"))
    try:
        svc.load(str(folder), parse_precision("fp32")).result(TIMEOUT)
        from redline.inference import read_attachment

        req = GenerationRequest(
            messages=[{"role": "user", "content": QUESTION, "attachments": [read_attachment(png)]}],
            sampling=SamplingSettings(max_new_tokens=NEW, temperature=0),
            options=DecodeOptions("auto"),
        )
        engine = svc.submit(req).result(TIMEOUT)
    finally:
        svc.shutdown()
    assert engine.error is None and engine.new_tokens > 0 and engine.text  # an answer, not nothing
    return folder, png, engine.text


def test_the_server_answers_as_the_engine(model):
    folder, png, expected = model
    service, server = start(folder)
    try:
        client = openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=120)
        url = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
        content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]
        reply = client.chat.completions.create(
            model=folder.name, messages=[{"role": "user", "content": content}], max_tokens=NEW, temperature=0
        )
    finally:
        stop(service, server)
    assert reply.choices[0].message.content == expected


@pytest.mark.slow
def test_the_cli_answers_as_the_engine(model):
    folder, png, expected = model
    cmd = [sys.executable, "-m", "redline", "chat", QUESTION, "--attach", str(png), "--model", str(folder)]
    cmd += ["--precision", "fp32", "--temperature", "0", "--max-new-tokens", str(NEW), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["text"] == expected and record["attachments"][0]["kind"] == "image"


@pytest.mark.usefixtures("aloop", "profile")
def test_the_window_answers_as_the_engine(model, qtbot, monkeypatch):
    folder, png, expected = model
    write_settings(model=str(folder), precision="fp32", temperature=0, max_new_tokens=NEW)
    w = open_window(qtbot)
    try:
        qtbot.waitUntil(lambda: w.loaded is not None, timeout=60_000)
        attach_by_button(qtbot, w, monkeypatch, [png])
        wait_chips(qtbot, w, 1)
        w.input.setPlainText(QUESTION)
        with qtbot.waitSignal(w.reply_finished, timeout=60_000):
            w.send()
        reply = [m for m in w.store.messages(w.conversation_id) if m.role == "assistant"][-1]
    finally:
        w.shutdown()
    assert reply.content == expected
