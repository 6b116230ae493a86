"""The window's server (Server → Serve the model) and remote engines (Model → Connect to a server…).

Servers listen on 127.0.0.1, on free ports, and are stopped by the test; every wait is bounded."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import threading

import openai
import pytest
from gui_helpers import aloop, open_window, profile, send, write_settings  # noqa: F401 - fixtures

from redline.inference import ApiServer, EngineService, ServerConfig, parse_precision
from redline.inference.engine import Engine

pytestmark = pytest.mark.usefixtures("aloop", "profile")
KEY = "gui-test-server-key"


@pytest.fixture
def tiny_window(qtbot, tiny_model_dir):
    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=24, server_port=0)
    window = open_window(qtbot)
    yield window
    window.shutdown()


def serve(qtbot, window):
    qtbot.waitUntil(lambda: not window.server.busy, timeout=5000)
    window.set_serving(True)
    qtbot.waitUntil(lambda: window.server.running and not window.server.busy, timeout=30_000)
    return window.server.server.address


def test_the_window_serves_its_model_and_chat_and_api_share_the_engine(qtbot, tiny_window):
    w = tiny_window
    address = serve(qtbot, w)
    assert address.startswith("http://127.0.0.1:")
    assert w.serve_action.isChecked() and w.server_button.isChecked()
    assert address in w.server_button.text()
    replies = []

    def api_call():
        client = openai.OpenAI(base_url=address, api_key="unused", max_retries=0, timeout=60)
        replies.append(
            client.chat.completions.create(
                model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=16, temperature=0
            )
        )

    caller = threading.Thread(target=api_call)
    caller.start()
    result = send(qtbot, w, "hello from the window")  # the chat replies while the API request runs
    qtbot.waitUntil(lambda: not caller.is_alive(), timeout=60_000)
    assert result.finish_reason in ("eos", "length") and replies and replies[0].usage.completion_tokens > 0
    qtbot.waitUntil(lambda: "0 active" in w.server_button.text(), timeout=5000)
    w.set_serving(False)
    qtbot.waitUntil(lambda: not w.server.running and not w.server.busy, timeout=30_000)
    assert w.server_button.text() == "Server: off" and not w.serve_action.isChecked()


def test_an_address_beyond_loopback_needs_a_key_and_the_window_says_it_is_reachable(qtbot, tiny_window, monkeypatch):
    w = tiny_window
    # Refused before anything binds: 192.0.2.1 (TEST-NET-1) stands for any address beyond loopback.
    w.settings_holder.set(dataclasses.replace(w.settings, server_host="192.0.2.1"))
    w.set_serving(True)
    qtbot.waitUntil(lambda: "needs an API key" in w.banner.label.text(), timeout=10_000)
    qtbot.waitUntil(lambda: not w.server.busy, timeout=10_000)
    assert not w.server.running and w.server_button.text() == "Server: off"
    # With a key it would be reachable from the network; tests stay on loopback, so only the flag is forced.
    w.settings_holder.set(dataclasses.replace(w.settings, server_host="127.0.0.1"))
    w.server_keys.set_own_key(KEY)
    monkeypatch.setattr(ServerConfig, "exposed", property(lambda self: True))
    serve(qtbot, w)
    qtbot.waitUntil(lambda: "reachable from the network" in w.server_button.text(), timeout=5000)
    assert any("reachable from the network" in text for text in w.notices.texts())
    wrong = openai.OpenAI(base_url=w.server.server.address, api_key="nope", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    settings_text = open(os.path.join(os.environ["XDG_CONFIG_HOME"], "redline", "settings.json")).read()
    assert KEY not in settings_text


@pytest.fixture
def remote_server(tiny_model_dir):
    service = EngineService(lambda: Engine("cpu"))
    service.load(str(tiny_model_dir), parse_precision("fp32")).result(120)
    server = ApiServer(service, ServerConfig(port=0, api_key=KEY))
    server.start()
    yield server
    server.stop(10)
    service.shutdown(30)


def test_connect_to_a_server_chats_measures_and_keeps_the_key_private(qtbot, remote_server):
    window = open_window(qtbot)
    try:
        dialog = window.models.connect_dialog()
        dialog.url_edit.setText(remote_server.address)
        dialog.key_edit.setText(KEY)
        dialog.list_models()
        qtbot.waitUntil(lambda: dialog.models_list.count() == 1, timeout=30_000)
        assert dialog.models_list.item(0).model_id == "tiny-llama"
        with qtbot.waitSignal(window.model_loaded, timeout=60_000) as loaded:
            dialog.connect()
        info = loaded.args[0]
        assert not info.measured_here and info.name == f"tiny-llama @ 127.0.0.1:{remote_server.port}"
        assert "on the server" in window.model_label.text()
        assert window.settings.model == remote_server.address + "#tiny-llama"
        result = send(qtbot, window, "hello over the network")
        assert result.finish_reason in ("eos", "length") and result.ttft_ms > 0
        [reply] = [m for m in window.store.messages(window.conversation_id) if m.role == "assistant"]
        assert reply.content == result.text and reply.stats["server_timings"]["completion_tokens"] == result.new_tokens
        assert reply.stats["device"] == "remote"
        qtbot.waitUntil(lambda: window.gauges.last_snapshot is not None, timeout=5000)
        assert "memory is the server's" in window.gauges.mem_label.text()
        assert "hello over the network" in window.store.export_markdown(window.conversation_id)
        keys_file = os.path.join(os.environ["XDG_CONFIG_HOME"], "redline", "server-keys.json")
        assert stat.S_IMODE(os.stat(keys_file).st_mode) == 0o600
        assert json.load(open(keys_file))[remote_server.address] == KEY
        settings_text = open(os.path.join(os.environ["XDG_CONFIG_HOME"], "redline", "settings.json")).read()
        assert KEY not in settings_text
        remote_server.stop(10)  # the server goes away: one clear sentence, the conversation kept
        send(qtbot, window, "are you there?")
        assert "Could not reach the server" in window.banner.label.text()
    finally:
        window.shutdown()
