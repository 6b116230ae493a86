"""Code from a model folder never runs without an opt-in; opt-ins are remembered per content."""

import os
import shutil
import stat
import subprocess
import sys

import pytest
from custom_model import MODELING_PY, custom_model  # noqa: F401 - fixture

from redline.app.trust_store import TrustStore, opt_in_from
from redline.inference.engine import Engine
from redline.inference.errors import NeedsOptIn
from redline.inference.precision import PrecisionSpec


def load_with_trust(engine, model, precision, *, store, trust_remote_code=False, allow_pickle=False, confirm=None):
    """A load as the CLI and the window make it: the engine asks ``opt_in_from``'s question before running code."""
    return engine.load(model, precision, opt_in=opt_in_from(store, trust_remote_code, allow_pickle, confirm))


def test_custom_code_refused_then_loaded_after_opt_in_and_remembered(custom_model, tmp_path):
    folder, marker = custom_model
    store = TrustStore(tmp_path / "trust.json")
    engine = Engine(device="cpu")
    with pytest.raises(NeedsOptIn) as err:
        load_with_trust(engine, str(folder), PrecisionSpec("fp32"), store=store)
    assert err.value.kind == "remote_code"
    assert err.value.files == ["configuration_toy.py", "modeling_toy.py"]
    assert "trust-remote-code" in str(err.value)
    assert not marker.exists()  # nothing ran

    loaded = load_with_trust(engine, str(folder), PrecisionSpec("fp32"), store=store, trust_remote_code=True)
    assert type(loaded.model).__name__ == "ToyForCausalLM" and marker.exists()
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600

    # remembered: loads without the flag
    again = load_with_trust(Engine(device="cpu"), str(folder), PrecisionSpec("fp32"), store=TrustStore(store.path))
    assert type(again.model).__name__ == "ToyForCausalLM"

    # a changed file asks again
    (folder / "modeling_toy.py").write_text(MODELING_PY + "\n# changed\n")
    with pytest.raises(NeedsOptIn):
        load_with_trust(Engine(device="cpu"), str(folder), PrecisionSpec("fp32"), store=TrustStore(store.path))


def test_confirm_callback_is_asked_with_the_files(custom_model, tmp_path):
    folder, _ = custom_model
    asked = []
    store = TrustStore(tmp_path / "trust.json")
    with pytest.raises(NeedsOptIn):
        load_with_trust(
            Engine(device="cpu"),
            str(folder),
            PrecisionSpec("fp32"),
            store=store,
            confirm=lambda exc: asked.append(exc.files) or False,
        )
    assert asked == [["configuration_toy.py", "modeling_toy.py"]]


def test_pickle_weights_need_opt_in_and_load_weights_only(tiny_model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    folder = tmp_path / "pickled"
    shutil.copytree(tiny_model_dir, folder)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    store = TrustStore(tmp_path / "trust.json")
    with pytest.raises(NeedsOptIn) as err:
        load_with_trust(Engine(device="cpu"), str(folder), PrecisionSpec("fp32"), store=store)
    assert err.value.kind == "pickle" and err.value.files == ["pytorch_model.bin"]
    loaded = load_with_trust(Engine(device="cpu"), str(folder), PrecisionSpec("fp32"), store=store, allow_pickle=True)
    assert loaded.model is not None


def test_cli_refuses_custom_code_with_a_clear_message(custom_model):
    folder, marker = custom_model
    proc = subprocess.run(
        [sys.executable, "-m", "redline", "chat", "hi", "--model", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "modeling_toy.py" in proc.stderr and "--trust-remote-code" in proc.stderr
    assert "Traceback" not in proc.stderr and not marker.exists()


def test_untrusted_custom_code_is_refused_for_that_before_the_estimate(custom_model):
    """A custom config may lack a field the estimate for ``auto`` reads (here num_hidden_layers): the reason given is
    still the code it needs and how to opt in, not that the memory cannot be estimated."""
    import json

    folder, marker = custom_model
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (folder / "config.json").write_text(json.dumps(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "redline", "chat", "hi", "--model", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "modeling_toy.py" in proc.stderr and "--trust-remote-code" in proc.stderr
    assert "cannot be estimated" not in proc.stderr
    assert "Traceback" not in proc.stderr and not marker.exists()


def test_code_opt_in_reads_the_folder_alone(custom_model, tiny_model_dir):
    from redline.inference import code_opt_in

    folder, marker = custom_model
    needs = code_opt_in(str(folder))
    assert needs is not None and needs.kind == "remote_code"
    assert needs.files == ["configuration_toy.py", "modeling_toy.py"] and not marker.exists()
    assert code_opt_in(str(tiny_model_dir)) is None
    assert code_opt_in(str(folder / "no-such-folder")) is None
