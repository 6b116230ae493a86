"""Model output is untrusted: it fetches nothing, raw HTML stays text, links need a click and a look."""

import http.server
import threading

import pytest

from redline.ui import chat_view
from redline.ui.chat_view import MessageWidget


@pytest.fixture
def local_server():
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], hits
    server.shutdown()


def test_hostile_output_makes_no_request_and_shows_as_text(qtbot, local_server):
    port, hits = local_server
    hostile = (
        f"Look: ![x](http://127.0.0.1:{port}/pixel.png)\n\n"
        f'<img src="http://127.0.0.1:{port}/img.png">\n\n'
        f"<script>fetch('http://127.0.0.1:{port}/script')</script>\n\n"
        f'<iframe src="http://127.0.0.1:{port}/frame"></iframe>'
    )
    widget = MessageWidget(1, "assistant", hostile)
    qtbot.addWidget(widget)
    widget.resize(600, 400)
    widget.show()
    qtbot.wait(300)
    shown = widget.browser.toPlainText()
    assert "<img src=" in shown and "<script>" in shown and "<iframe" in shown
    assert f"127.0.0.1:{port}/pixel.png" in widget.browser.toHtml()  # the address is visible as a link
    assert hits == []


def test_link_click_asks_first_and_opens_only_web_links(qtbot, monkeypatch):
    from PySide6.QtCore import QUrl

    asked, opened = [], []
    monkeypatch.setattr(chat_view, "confirm_open_link", lambda parent, addr: asked.append(addr) or False)
    monkeypatch.setattr(chat_view.QDesktopServices, "openUrl", lambda url: opened.append(url.toString()))
    widget = MessageWidget(1, "assistant", "[docs](https://example.org/docs)")
    qtbot.addWidget(widget)
    widget.browser.anchorClicked.emit(QUrl("https://example.org/docs"))
    assert asked == ["https://example.org/docs"] and opened == []  # declined: nothing opens
    monkeypatch.setattr(chat_view, "confirm_open_link", lambda parent, addr: True)
    widget.browser.anchorClicked.emit(QUrl("https://example.org/docs"))
    widget.browser.anchorClicked.emit(QUrl("file:///etc/passwd"))
    assert opened == ["https://example.org/docs"]
