"""`redline` with no subcommand: the window opens, or the user is told exactly why not, and the terminal chat
takes over only when what is missing is the window's own (Qt)."""

import shlex
import sys

import pytest

from redline.app import cli, launch

PIP = f"{shlex.quote(sys.executable)} -m pip install"


@pytest.fixture
def chats(monkeypatch):
    """The terminal chat the launcher may fall back to, recorded instead of run; the terminal is interactive."""
    started = []
    monkeypatch.setattr(cli.cli_chat, "run_interactive_default", lambda model: started.append(model) or 0)
    monkeypatch.setattr(launch, "_interactive", lambda: True)
    return started


def test_missing_qt_says_so_and_offers_the_terminal_chat(monkeypatch, capsys, chats):
    monkeypatch.setitem(sys.modules, "PySide6.QtWidgets", None)  # as if PySide6 were not installed
    assert cli.main(["--model", "starter"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(
        f"The desktop window needs PySide6, which is not installed. Install it with: {PIP} PySide6-Essentials\n"
    )
    assert "here is the terminal chat (redline chat --model starter)" in err
    assert chats == ["starter"]


def test_missing_qt_without_a_terminal_exits_with_the_reason(monkeypatch, capsys, chats):
    monkeypatch.setitem(sys.modules, "PySide6.QtWidgets", None)
    monkeypatch.setattr(launch, "_interactive", lambda: False)
    assert cli.main([]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: The desktop window needs PySide6, which is not installed.")
    assert "chat in a terminal with: redline chat --model starter" in err and chats == []


def test_qt_that_does_not_load_names_the_error(monkeypatch, capsys, chats):
    def import_module(name):
        raise ImportError("libEGL.so.1: cannot open shared object file: No such file or directory", name=name)

    monkeypatch.setattr(launch.importlib, "import_module", import_module)
    assert launch.gui_problem() == (
        "The desktop window needs PySide6, which is installed but failed to load (PySide6.QtWidgets: libEGL.so.1: "
        "cannot open shared object file: No such file or directory). If that names a system library, install it "
        f"with your system's package manager; otherwise reinstall the package with: {PIP} --force-reinstall "
        "PySide6-Essentials"
    )


def test_an_import_error_inside_redline_is_a_bug_not_a_reason_to_switch(monkeypatch, capsys, chats):
    monkeypatch.setitem(sys.modules, "redline.app.gui", None)  # Redline's own module fails to import
    assert cli.main([]) == 1
    err = capsys.readouterr().err
    assert "error: Redline could not start its window: importing redline.app.gui failed" in err
    assert "This is a bug in Redline, not in your setup: please report it with the traceback above." in err
    assert "Traceback" in err and chats == []


def test_a_missing_dependency_is_named_with_its_install_command(monkeypatch, capsys, chats):
    import redline.app.gui

    def run_gui(model=None):
        raise ModuleNotFoundError("No module named 'pynvml'", name="pynvml")

    monkeypatch.setattr(redline.app.gui, "run_gui", run_gui)
    assert cli.main([]) == 1
    assert capsys.readouterr().err == (
        f"error: Redline needs pynvml, which is not installed. Install it with: {PIP} nvidia-ml-py\n"
    )
    assert chats == []
