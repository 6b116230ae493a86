"""The window's stylesheet: light, quiet, with the accent kept for live figures."""

STYLESHEET = """
QMainWindow { background: #f6f7f9; }
QWidget#chatInner { background: #ffffff; }
QFrame#userMessage { background: #eef3fb; border: 1px solid #d9e3f3; border-radius: 8px; }
QFrame#assistantMessage { background: #ffffff; border: 1px solid #e4e6ea; border-radius: 8px; }
QFrame#userMessage QTextBrowser { background: #eef3fb; }
QFrame#assistantMessage QTextBrowser { background: #ffffff; }
QLabel#roleLabel { font-weight: bold; color: #333; }
QLabel#partialBadge { color: #b26a00; font-size: 11px; }
QLabel#statsLabel { color: #6b7280; font-size: 11px; }
QLabel#panelTitle { font-weight: bold; font-size: 13px; color: #222; }
QLabel#ttftValue { font-weight: bold; }
QLabel#chatPlaceholder { color: #6b7280; font-size: 14px; padding: 40px; }
QLabel#reloadNote { color: #b26a00; }
QFrame#gaugesPanel { background: #ffffff; border-left: 1px solid #e4e6ea; }
QPlainTextEdit#messageInput { border: 1px solid #c9ced6; border-radius: 6px; padding: 4px; background: #fff; }
QPushButton#sendButton { min-width: 70px; }
QPushButton#stopButton { min-width: 70px; color: #c0182b; }
"""
