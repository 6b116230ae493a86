"""Help → About: version, licence, library versions, GPU (read off the UI thread), paths; the window icon."""

import sys
from importlib.metadata import version

import pytest
from gui_helpers import aloop, open_window, profile  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("aloop", "profile")


def test_about_dialog_shows_versions_paths_and_hardware(qtbot, profile):
    from PySide6.QtGui import QGuiApplication

    from redline.app import __version__
    from redline.ui.about import PENDING

    window = open_window(qtbot)
    assert not window.windowIcon().isNull()
    assert "QMainWindow" in window.styleSheet()  # the stylesheet came from assets/style/redline.qss
    window.about_action.trigger()
    qtbot.waitUntil(lambda: window.about_dialog is not None and window.about_dialog.isVisible(), timeout=5000)
    dialog = window.about_dialog
    assert dialog.value("Version") == __version__
    assert dialog.value("Licence") == "Apache-2.0"
    assert dialog.value("torch") == version("torch")
    assert dialog.value("transformers") == version("transformers")
    assert dialog.value("bitsandbytes") == version("bitsandbytes")
    # The paths are this profile's (XDG dirs set by the fixture), handed in by the app.
    assert dialog.value("Conversations").startswith(str(profile / "data"))
    assert dialog.value("Settings").startswith(str(profile / "config"))
    # GPU and CUDA build arrive from a worker thread; until then the rows say so.
    qtbot.waitUntil(lambda: dialog.value("GPU") != PENDING, timeout=60_000)
    import torch

    cuda = dialog.value("CUDA (torch build)")
    assert (torch.version.cuda in cuda) if torch.version.cuda else cuda.startswith("none")
    if not torch.cuda.is_available():
        assert "CPU" in dialog.value("GPU") or "none" in dialog.value("GPU")
    assert not dialog.value("RAM").startswith("unknown")
    dialog.copy_details()
    copied = QGuiApplication.clipboard().text()
    assert f"Version: {__version__}" in copied and "GPU: " in copied
    # A second click raises the same dialog rather than stacking another.
    from redline.ui.about import AboutDialog

    window.about_action.trigger()
    qtbot.wait(100)
    assert window.about_dialog is dialog and len(window.findChildren(AboutDialog)) == 1
    dialog.reject()
    qtbot.waitUntil(lambda: window.about_dialog is None, timeout=5000)
    window.shutdown()


def test_about_shows_why_hardware_is_unknown(qtbot):
    from redline.ui.about import AboutDialog, AboutInfo

    dialog = AboutDialog(AboutInfo("1.2.3", "Apache-2.0", (("Settings", "/x/settings.json"),)))
    qtbot.addWidget(dialog)
    dialog.set_hardware(RuntimeError("NVML said no"))
    assert dialog.value("GPU") == "unknown (RuntimeError: NVML said no)"
    assert dialog.value("Settings") == "/x/settings.json"


def test_smoke_test_option_runs_in_process_free_of_torch(capsys):
    """`redline --smoke-test` in a fresh interpreter: the window starts without importing torch."""
    import json
    import subprocess

    code = "import sys; from redline.app.cli import main; rc = main(['--smoke-test']); sys.exit(rc)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["checks"]["torch_not_imported"] and report["checks"]["window_icon"]
