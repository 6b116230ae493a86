"""Save PNGs of the main window with the starter model, each in the light theme and (NAME-dark.png) the dark one:
the empty chat, mid-reply, finished, draft tokens tinted with the settings open, and the speed lab driven by its
configuration table (mid-run with the gauges following, and finished).

Run with `make screenshots`. Uses a throwaway profile (conversations and settings go to a
temporary folder) and the Qt offscreen platform unless DISPLAY is set (e.g. under xvfb-run).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for gui_session (not a package)
from gui_session import OUT, ROOT, qt_app, settle, throwaway_profile, wait_until  # noqa: E402
from PySide6.QtGui import QPainter  # noqa: E402


def main() -> int:
    throwaway_profile("redline-shots-")
    from redline.app.gui import build_window
    from redline.app.settings import Settings, save_settings

    app = qt_app()  # noqa: F841 - the application must stay alive

    def grab(window, name, dialog=None):
        OUT.mkdir(parents=True, exist_ok=True)
        window.chat_view.render_dirty()
        settle(0.3)
        image = window.grab()
        if dialog is not None:  # a dialog is a window of its own: drawn where it floats, over the window's right
            painter = QPainter(image)
            painter.drawPixmap(image.width() - dialog.width() - 24, 56, dialog.grab())
            painter.end()
        path = OUT / name
        image.save(str(path))
        print(f"saved {path.relative_to(ROOT)}")

    def shot(window, name, dialog=None):
        """The same moment in both themes: NAME.png (light) and NAME-dark.png."""
        for theme in ("light", "dark"):
            window.look.set_theme(theme)
            grab(window, name if theme == "light" else name.replace(".png", "-dark.png"), dialog)
        window.look.set_theme("light")

    save_settings(Settings(model="starter", temperature=0, max_new_tokens=200))
    window = build_window()
    window.resize(1280, 800)
    window.show()
    loaded = []
    window.model_loaded.connect(loaded.append)
    finished = []
    window.reply_finished.connect(finished.append)
    window.start()
    wait_until(lambda: loaded or (window.banner.isVisible() and window.banner.kind == "error"))
    if not loaded:
        print(f"the starter did not load: {window.banner.label.text()}", file=sys.stderr)
        return 1
    settle(0.5)
    shot(window, "chat-empty.png")

    window.input.setPlainText("What is the capital of France?")
    window.send()
    wait_until(lambda: finished)
    window.input.setPlainText("Write a Python function that checks whether a number is prime.")
    window.send()
    wait_until(lambda: window.generation is not None and len(window.generation.text) > 260)
    settle(0.6)
    shot(window, "chat-mid-reply.png")
    wait_until(lambda: len(finished) == 2)
    settle(1.0)
    shot(window, "chat-finished.png")

    # Prompt lookup copies tokens from the conversation: those are tinted like draft tokens.
    import dataclasses

    window.new_chat()
    window.apply_settings(dataclasses.replace(window.settings, strategy="prompt-lookup", max_new_tokens=120))
    window.input.setPlainText(
        "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river bank at dawn."
    )
    window.send()
    wait_until(lambda: len(finished) == 3)
    window.show_settings()
    settle(1.0)
    shot(window, "chat-prompt-lookup-settings.png", window.settings_dialog)
    window.settings_dialog.close()

    # The speed lab, filled by clicking: a ready-made set trimmed to four rows, predicted then measured.
    tabs = window.tabs
    titles = [tabs.tabText(i) for i in range(tabs.count())]
    tabs.setCurrentIndex(titles.index("Speed lab"))
    lab = tabs.widget(titles.index("Speed lab")).ensure_built()
    window.resize(1500, 1000)
    ed = lab.configs_editor
    ed.use_set("ladder")
    keep = {"kv:fp32", "kv:bf16", "fast:q8", "fast:q4"}
    ed.set_configs([c for c in ed.configs() if c.label in keep])
    lab.new_tokens_spin.setValue(48)
    lab.warmup_spin.setValue(0)
    lab.samples_spin.setValue(1)
    wait_until(lambda: all(ed.prediction(r) is not None for r in range(len(ed.configs()))), what="predictions")
    done = []
    lab.run_finished.connect(done.append)
    lab.start()
    wait_until(lambda: lab.outputs.column(2) is not None and lab.outputs.column(2).live_tokens_per_s, what="row 3")
    settle(1.5)
    OUT.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(OUT / "speedlab-running.png"))
    print(f"saved {(OUT / 'speedlab-running.png').relative_to(ROOT)}")
    wait_until(lambda: done, what="the lab run")
    settle(1.0)
    lab.grab().save(str(OUT / "speedlab-configs.png"))
    print(f"saved {(OUT / 'speedlab-configs.png').relative_to(ROOT)}")
    window.look.set_theme("dark")
    settle(0.5)
    window.grab().save(str(OUT / "speedlab-dark.png"))
    print(f"saved {(OUT / 'speedlab-dark.png').relative_to(ROOT)}")
    window.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
