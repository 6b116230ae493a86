"""`redline` with no subcommand: open the desktop window, or say exactly why it cannot open.

What the window needs beyond the terminal chat is Qt (PySide6) and qasync. When one of them is missing or
does not load, the user is told which, the error, and the command that installs it; in an interactive
terminal Redline then offers its terminal chat instead, since that needs neither. Any other import
failure is not a reason to switch: a missing dependency of Redline itself is named with its install
command, and an import error inside Redline's own modules is a bug, reported as one.
"""

from __future__ import annotations

import importlib
import shlex
import sys
import traceback
from typing import Callable, Optional

# The modules the window needs and the terminal chat does not, with the package that provides each
# (pyproject.toml's dependencies). PySide6.QtWidgets rather than PySide6: it is the part that loads Qt's
# libraries, so it is what fails when a system library is missing.
GUI_MODULES = {"PySide6.QtWidgets": "PySide6-Essentials", "qasync": "qasync"}
# Where an importable module's name differs from the package to install.
DISTRIBUTIONS = {"PySide6": "PySide6-Essentials", "pynvml": "nvidia-ml-py"}


def pip_install(distribution: str, reinstall: bool = False) -> str:
    """The command that installs ``distribution`` into the Python running Redline."""
    flag = " --force-reinstall" if reinstall else ""
    return f"{shlex.quote(sys.executable)} -m pip install{flag} {distribution}"


def _root(module: Optional[str]) -> str:
    return (module or "").split(".")[0]


def explain_missing(module: str, distribution: str, exc: ImportError, needed_by: str) -> str:
    """One sentence: which module, the error, and the command that fixes it."""
    if isinstance(exc, ModuleNotFoundError) and _root(exc.name) == _root(module):
        return (
            f"{needed_by} needs {_root(module)}, which is not installed. Install it with: {pip_install(distribution)}"
        )
    return (
        f"{needed_by} needs {_root(module)}, which is installed but failed to load ({module}: {exc}). "
        "If that names a system library, install it with your system's package manager; otherwise "
        f"reinstall the package with: {pip_install(distribution, reinstall=True)}"
    )


def gui_problem() -> Optional[str]:
    """Why the window cannot open here (a GUI package missing or not loading), or None."""
    for module, distribution in GUI_MODULES.items():
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return explain_missing(module, distribution, exc, "The desktop window")
    return None


def _is_redline(exc: ImportError) -> bool:
    return _root(exc.name) == "redline"


def explain_import_error(exc: ImportError) -> str:
    """What an import failure while starting the window means: a bug in Redline, or a package to install."""
    if _is_redline(exc):
        return (
            f"Redline could not start its window: importing {exc.name} failed ({exc}). This is a bug in "
            "Redline, not in your setup: please report it with the traceback above."
        )
    if not exc.name:
        return (
            f"Redline could not start its window: {exc} (traceback above). If that names a package, install "
            "it; otherwise please report it as a bug in Redline."
        )
    return explain_missing(exc.name, DISTRIBUTIONS.get(_root(exc.name), _root(exc.name)), exc, "Redline")


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def open_gui(model: Optional[str], terminal_chat: Callable[[str], int]) -> int:
    """Open the window with ``model`` loading; ``terminal_chat(model)`` is the fallback when Qt is missing."""
    problem = gui_problem()
    if problem is not None:
        chat = f"redline chat --model {model or 'starter'}"
        if not _interactive():
            print(f"error: {problem}\nMeanwhile you can chat in a terminal with: {chat}", file=sys.stderr)
            return 1
        print(f"{problem}\nUntil then, here is the terminal chat ({chat}).", file=sys.stderr)
        return terminal_chat(model or "starter")
    try:
        # lazy: it may be missing or fail to load here, which the handler below says
        from .gui import run_gui

        return run_gui(model=model)
    except ImportError as exc:
        if _is_redline(exc) or not exc.name:
            traceback.print_exc()
        print(f"error: {explain_import_error(exc)}", file=sys.stderr)
        return 1
