"""Redline: a desktop chat app for local LLMs on consumer GPUs, with measured speed and memory.

The repository root is the ``redline`` package (``package-dir = {"redline" = "."}`` in
pyproject.toml): ``redline.app`` is ``app/``, ``redline.ui`` is ``ui/``, ``redline.inference`` is
``inference/`` and ``redline.assets`` is ``assets/``. docs/ARCHITECTURE.md explains the layers.
"""
