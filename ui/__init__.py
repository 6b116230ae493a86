"""Redline Qt widgets. Handed the objects it needs; never imports app."""
