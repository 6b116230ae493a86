"""The main window (``MainWindow``) and the parts it is built from."""

from .main_window import MainWindow

__all__ = ["MainWindow"]
