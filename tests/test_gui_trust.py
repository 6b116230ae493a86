"""The window asks before running a model's own code, names the files, and remembers the answer;
a multi-megabyte paste is handled without freezing the window."""

import time

import pytest
from custom_model import custom_model  # noqa: F401 - fixture
from gui_helpers import aloop, open_window, profile, send, write_settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("aloop", "profile")


def test_custom_code_needs_confirmation_naming_the_files(qtbot, custom_model, monkeypatch):
    from redline.ui.window import model_controller

    folder, marker = custom_model
    write_settings(model=str(folder), precision="fp32", temperature=0, max_new_tokens=8)
    asked = []
    monkeypatch.setattr(model_controller, "confirm_opt_in", lambda parent, exc: asked.append(exc.files) or False)
    w = open_window(qtbot, wait_loaded=False)
    try:
        qtbot.waitUntil(lambda: bool(asked) and not w.loading, timeout=60_000)
        assert asked == [["configuration_toy.py", "modeling_toy.py"]]
        assert w.loaded is None and not marker.exists()  # declined: nothing ran
        assert "custom Python code" in w.banner.label.text()

        monkeypatch.setattr(model_controller, "confirm_opt_in", lambda parent, exc: asked.append(exc.files) or True)
        with qtbot.waitSignal(w.model_loaded, timeout=60_000):
            w.models.load_model()
        assert marker.exists() and w.loaded is not None
    finally:
        w.shutdown()

    # Remembered: a restart loads it without asking.
    monkeypatch.setattr(model_controller, "confirm_opt_in", lambda parent, exc: pytest.fail("asked again"))
    w2 = open_window(qtbot)
    try:
        assert w2.loaded is not None
    finally:
        w2.shutdown()


@pytest.mark.slow
def test_five_megabyte_paste_is_handled(qtbot, tiny_model_dir):
    from PySide6.QtCore import QMimeData

    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=8)
    w = open_window(qtbot)
    try:
        junk = ("lorem ipsum dolor sit amet \x00\x01\ufffd " * 150_000)[:5_000_000]
        mime = QMimeData()
        mime.setText(junk)
        started = time.perf_counter()
        w.input.insertFromMimeData(mime)
        paste_s = time.perf_counter() - started
        assert paste_s < 1.0, f"pasting took {paste_s:.2f} s on the UI thread"
        assert w.input.message_text() == junk and "pasted text #1" in w.input.toPlainText()
        with qtbot.waitSignal(w.reply_finished, timeout=120_000) as blocker:
            started = time.perf_counter()
            w.send()
            qtbot.wait(0)
            send_s = time.perf_counter() - started
        result = blocker.args[0]
        assert send_s < 1.0, f"sending took {send_s:.2f} s on the UI thread"
        assert result is not None and result.new_tokens > 0
        assert any("left out" in n for n in result.notes)  # what was left out is said
        assert "left out" in w.banner.label.text()  # and shown in the window
        stored = [m.content for m in w.store.messages(w.conversation_id) if m.role == "user"]
        assert stored == [junk.strip()]  # the whole paste is kept
    finally:
        w.shutdown()
