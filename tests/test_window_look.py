"""The window's 2026 look (issue 49, item 10), kept to what it is for: one centred reading column with room between
the lines; a message's actions as icons shown on hover (its place kept, so nothing moves); the gauges collapsible,
collapsed until a model is loaded; the settings a dialog beside the chat instead of a dock squeezing it; an empty
chat offering example prompts; the model picker at the top of the chat. Every figure under a reply stays."""

from __future__ import annotations

import pytest
from gui_helpers import aloop, profile, write_settings  # noqa: F401 - fixtures
from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QEnterEvent, QTextBlockFormat
from PySide6.QtWidgets import QApplication, QToolButton

from redline.ui.style import LINE_HEIGHT, READING_WIDTH

pytestmark = pytest.mark.usefixtures("aloop", "profile")


def slow_window(qtbot, model="fake", **engine):
    from slow_engine import SlowEngine

    from redline.app.gui import build_window

    if model:
        write_settings(model=model, max_new_tokens=12)
    window = build_window(engine_factory=lambda: SlowEngine(interval_s=0.005, tokens=12, **engine))
    qtbot.addWidget(window)
    window.resize(1600, 900)
    window.show()
    if model:
        with qtbot.waitSignal(window.model_loaded, timeout=30_000):
            window.start()
    else:
        window.start()
    return window


def send(qtbot, w, text="What is the capital of France?"):
    w.input.setPlainText(text)
    with qtbot.waitSignal(w.reply_finished, timeout=30_000):
        w.send()
    w.chat_view.render_dirty()
    QApplication.processEvents()


def test_messages_sit_in_one_centred_reading_column_with_room_between_lines(qtbot):
    w = slow_window(qtbot)
    try:
        w.look.set_gauges(False)
        send(qtbot, w)
        view = w.chat_view.viewport()
        assert view.width() > READING_WIDTH + 200  # a wide window: the column does not follow it
        for m in w.chat_view.widgets:
            left = m.mapTo(view, QPoint(0, 0)).x()
            right = view.width() - left - m.width()
            assert m.width() <= READING_WIDTH and abs(left - right) <= 2, (left, m.width(), right)
            block = m.browser.document().begin()
            fmt = block.blockFormat()
            assert fmt.lineHeightType() == QTextBlockFormat.LineHeightTypes.ProportionalHeight.value
            assert fmt.lineHeight() == LINE_HEIGHT
        composer = w.input.parentWidget()
        assert composer.width() <= READING_WIDTH
        # Every figure under the reply stays.
        assert (
            "tokens" in w.chat_view.widgets[-1].stats_label.text()
            and "TTFT" in w.chat_view.widgets[-1].stats_label.text()
        )
    finally:
        w.shutdown()


def test_a_messages_actions_are_icons_shown_on_hover_without_moving_anything(qtbot):
    w = slow_window(qtbot)
    try:
        send(qtbot, w)
        reply = w.chat_view.widgets[-1]
        buttons = [reply.copy_button, reply.action_button]
        assert all(isinstance(b, QToolButton) for b in buttons)
        assert all(not b.icon().isNull() and b.toolButtonStyle() == Qt.ToolButtonIconOnly for b in buttons)
        assert [b.text() for b in buttons] == ["Copy", "Regenerate"]  # what a screen reader says
        assert not reply.actions.isVisible()
        text_at = reply.browser.mapTo(reply, QPoint(0, 0))
        QApplication.sendEvent(reply, QEnterEvent(QPoint(5, 5), QPoint(5, 5), QPoint(5, 5)))
        assert reply.actions.isVisible() and reply.browser.mapTo(reply, QPoint(0, 0)) == text_at
        QApplication.sendEvent(reply, QEvent(QEvent.Leave))
        assert not reply.actions.isVisible() and reply.browser.mapTo(reply, QPoint(0, 0)) == text_at
    finally:
        w.shutdown()


def test_the_gauges_are_collapsed_until_a_model_is_loaded_then_collapsible(qtbot):
    w = slow_window(qtbot, model=None)
    try:
        assert w.models.loaded is None and not w.gauges.isVisible()
        assert not w.gauges_action.isChecked()
        with qtbot.waitSignal(w.model_loaded, timeout=30_000):
            w.models.configure({"model": "fake"})
        assert w.gauges.isVisible() and w.gauges_button.isChecked()
        qtbot.waitUntil(lambda: w.tabs.width() + w.gauges.width() < w.width(), timeout=2_000)
        chat_width = w.tabs.width()
        qtbot.keyClick(w.input, Qt.Key_G, Qt.ControlModifier)  # View → Gauges
        assert not w.gauges.isVisible()
        qtbot.waitUntil(lambda: w.tabs.width() > chat_width, timeout=2_000)  # the chat takes the room
        with qtbot.waitSignal(w.model_loaded, timeout=30_000):
            w.load_model()  # the user's choice holds across a reload
        assert not w.gauges.isVisible()
        w.gauges_button.click()
        assert w.gauges.isVisible() and w.gauges_action.isChecked()
    finally:
        w.shutdown()


def test_the_settings_open_beside_the_chat_without_squeezing_it(qtbot):
    w = slow_window(qtbot)
    try:
        QApplication.processEvents()
        width = w.chat_view.width()
        w.show_settings()
        QApplication.processEvents()
        assert w.settings_dialog.isVisible() and w.settings_dialog.isWindow()
        assert w.chat_view.width() == width
        w.settings_button.click()  # the button at the end of the tab bar: closes them again
        assert not w.settings_dialog.isVisible()
    finally:
        w.shutdown()


def test_an_empty_chat_offers_example_prompts_that_send(qtbot):
    w = slow_window(qtbot)
    try:
        examples = w.chat_view.examples
        assert examples.isVisible() and len(examples.buttons) >= 3 and w.chat_view.placeholder.isVisible()
        prompt = examples.buttons[1].text()
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            examples.buttons[1].click()
        user, reply = w.store.messages(w.conversation_id)
        assert user.content == prompt and reply.content
        assert not examples.isVisible()  # a chat with messages shows them instead
        w.new_chat()
        assert examples.isVisible()
        w.unload_model()
        qtbot.waitUntil(lambda: w.models.loaded is None, timeout=10_000)
        assert not examples.isVisible()  # nothing to send them to: the line says what to do
    finally:
        w.shutdown()


def test_the_model_picker_is_at_the_top_of_the_chat(qtbot):
    w = slow_window(qtbot)
    try:
        picker = w.model_picker
        assert picker.isVisible() and "slow-fake" in picker.text() and picker.text() == w.model_label.text()
        assert picker.menu() is w.model_menu  # the same actions: configure, find, presets, settings, connect…
        chat = w.chat_view.mapTo(w, QPoint(0, 0))
        at = picker.mapTo(w, QPoint(0, 0))
        assert at.y() + picker.height() <= chat.y()  # above the transcript
        middle = at.x() + picker.width() / 2
        assert abs(middle - (chat.x() + w.chat_view.width() / 2)) < 40  # centred over it
        w.unload_model()
        qtbot.waitUntil(lambda: w.models.loaded is None, timeout=10_000)
        assert picker.text() == "Choose a model"
    finally:
        w.shutdown()
