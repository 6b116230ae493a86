"""A first start from a checkout (``make run`` is an editable install, with no prebuilt kernels a wheel carries):
the install step builds Redline's CPU kernels, and a load that must still build them says so instead of reading
"Quantising weights" for about 50 s (issue 49, item 5)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from redline.inference.loading import loader

ROOT = Path(__file__).resolve().parents[1]


def _install_recipe() -> tuple[list[str], str]:
    """The Makefile's ``$(VENV)/.installed`` recipe lines, and the Python its KERNELS_BUILD block runs."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^\$\(VENV\)/\.installed:.*\n((?:\t.*\n)+)", text, re.M)
    block = re.search(r"^define KERNELS_BUILD\n(.*?)^endef", text, re.M | re.S)
    assert recipe, "the Makefile has no $(VENV)/.installed target"
    return recipe.group(1).splitlines(), block.group(1) if block else ""


def test_make_s_install_step_builds_the_kernels_once():
    lines, code = _install_recipe()
    pip = next(i for i, line in enumerate(lines) if "pip install" in line)
    build = next((i for i, line in enumerate(lines) if "KERNELS_BUILD" in line), None)
    assert build is not None and build > pip, lines  # after the install, which makes redline importable
    assert "native.ensure_built()" in code
    # A machine that cannot build them (here: turned off) is not a failed install: it says why and goes on.
    env = {**os.environ, "REDLINE_NATIVE_KERNELS": "0"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("Redline's CPU kernels off: turned off (REDLINE_NATIVE_KERNELS=0)")


def test_a_load_that_must_build_the_kernels_says_so_before_it_builds(tiny_model_dir, monkeypatch):
    """No library shipped and none built on this machine yet: the load says it is building the kernels (once,
    about a minute), builds them, and only then quantises."""
    from redline.inference import parse_precision
    from redline.inference.engine import Engine
    from redline.inference.kernels.cpu import library as native

    said: list[str] = []
    monkeypatch.setattr(native, "status", lambda: {"loaded": False})
    monkeypatch.setattr(native, "will_run", lambda: None)  # they will run here: a compiler is there
    monkeypatch.setattr(native, "shipped_library", lambda variant: None)
    monkeypatch.setattr(native, "cached_library", lambda variant: None)
    monkeypatch.setattr(native, "ensure_built", lambda: said.append("built"))
    engine = Engine("cpu")
    try:
        engine.load(str(tiny_model_dir), parse_precision("q8"), progress=lambda f, phase: said.append(phase))
    finally:
        engine.unload()
    assert loader.BUILDING_KERNELS == "Building Redline's CPU kernels for this machine (once, about a minute)"
    assert said.index(loader.BUILDING_KERNELS) + 1 == said.index("built") < said.index("Quantising weights")
    # Built already (or shipped): nothing said, nothing built.
    monkeypatch.setattr(native, "cached_library", lambda variant: Path("/a/built/library.so"))
    assert not loader.kernels_to_build("cpu") and not loader.kernels_to_build("cuda:0")
