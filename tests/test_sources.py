"""Model arguments: each accepted form resolves, anything else says what is accepted."""

import pytest

from redline.inference.errors import ModelSourceError
from redline.inference.sources.resolve import resolve


def test_starter_and_hub_id_forms():
    assert resolve("starter").kind == "starter"
    assert resolve("STARTER").kind == "starter"
    src = resolve("HuggingFaceTB/SmolLM2-360M-Instruct")
    assert src.kind == "hub" and src.name == "SmolLM2-360M-Instruct"


def test_folder_and_gguf_forms(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert resolve(str(tmp_path / "m")).kind == "folder"
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve(str(gguf)).kind == "gguf"


@pytest.mark.parametrize("spec", ["", "./does/not/exist", "/no/such/model/dir", "not a model!"])
def test_unknown_forms_list_what_is_accepted(spec):
    with pytest.raises(ModelSourceError) as err:
        resolve(spec)
    assert "starter" in str(err.value) and "gguf" in str(err.value)


def test_folder_without_config_is_explained(tmp_path):
    with pytest.raises(ModelSourceError, match="no config.json"):
        resolve(str(tmp_path))


def test_plain_file_that_is_not_gguf(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelSourceError, match="not a .gguf"):
        resolve(str(f))


def test_hub_id_offline_and_uncached_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = resolve("nobody-here/not-a-cached-model")
    assert src.local_folder() is None
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE"):
        src.prepare()
