"""A tiny model folder whose architecture is custom code (``auto_map``): for the trust tests."""

import json
import shutil

import pytest

CONFIG_PY = """
from transformers import LlamaConfig

class ToyConfig(LlamaConfig):
    model_type = "redline_toy"
"""
MODELING_PY = """
import os
from transformers import LlamaForCausalLM
from .configuration_toy import ToyConfig

# Proof that this file ran: the test checks for the marker only after opting in.
open(os.environ["REDLINE_TOY_MARKER"], "w").write("ran")

class ToyForCausalLM(LlamaForCausalLM):
    config_class = ToyConfig
"""


@pytest.fixture
def custom_model(tiny_model_dir, tmp_path, monkeypatch):
    # A folder name of its own: transformers caches custom modules by folder name, and the marker must
    # prove that *this* test's code ran.
    folder = tmp_path / f"toy_{tmp_path.name}"
    shutil.copytree(tiny_model_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "redline_toy"
    cfg["architectures"] = ["ToyForCausalLM"]
    cfg["auto_map"] = {
        "AutoConfig": "configuration_toy.ToyConfig",
        "AutoModelForCausalLM": "modeling_toy.ToyForCausalLM",
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "configuration_toy.py").write_text(CONFIG_PY)
    (folder / "modeling_toy.py").write_text(MODELING_PY)
    marker = tmp_path / "marker"
    monkeypatch.setenv("REDLINE_TOY_MARKER", str(marker))
    return folder, marker
