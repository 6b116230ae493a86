"""Presets on disk, the model checks the wizard's first page makes, and the draft check without weights."""

import json
import os
import stat
from pathlib import Path

import pytest

from redline.app.presets import PresetError, PresetStore
from redline.app.settings import Settings

LLAMA3_8B_CONFIG = Path(__file__).parent / "data" / "llama-3-8b-config.json"


def values(**kw):
    return {**Settings().to_dict(), **kw}


def test_save_list_rename_delete(tmp_path):
    store = PresetStore(tmp_path / "presets")
    p = store.save(
        "Llama 8B · nf4 · 8k",
        values(
            model="meta/llama",
            precision="nf4",
            context_length=8192,
            strategy="speculative",
            draft_model="starter",
            temperature=0.7,
        ),
    )
    assert p.path.name == "llama-8b-nf4-8k.json"
    doc = json.loads(p.path.read_text(encoding="utf-8"))  # readable: a name and the settings, indented
    assert doc["name"] == "Llama 8B · nf4 · 8k" and doc["settings"]["precision"] == "nf4"
    assert doc["settings"]["temperature"] == 0.7 and doc["settings"]["draft_model"] == "starter"
    assert "\n  " in p.path.read_text(encoding="utf-8")
    if os.name == "posix":
        assert stat.S_IMODE(p.path.stat().st_mode) == 0o600
    store.save("Another", values(model="starter"))
    assert [x.name for x in store.presets()] == ["Another", "Llama 8B · nf4 · 8k"]
    # Saving under an existing name replaces it (same file).
    store.save("Another", values(model="starter", precision="fp32"))
    assert len(store.presets()) == 2 and store.get("Another").values["precision"] == "fp32"

    renamed = store.rename("Another", "Starter exact")
    assert renamed.path.name == "starter-exact.json" and not (tmp_path / "presets" / "another.json").exists()
    assert store.get("Starter exact").values["precision"] == "fp32"
    with pytest.raises(PresetError, match="exists already"):
        store.rename("Starter exact", "Llama 8B · nf4 · 8k")
    with pytest.raises(PresetError, match="needs a name"):
        store.save("   ", values())
    store.delete("Starter exact")
    assert [x.name for x in store.presets()] == ["Llama 8B · nf4 · 8k"]
    with pytest.raises(PresetError, match="no preset"):
        store.delete("Starter exact")


def test_bad_files_are_skipped_and_kept(tmp_path):
    folder = tmp_path / "presets"
    store = PresetStore(folder)
    store.save("Good", values(model="starter"))
    (folder / "broken.json").write_text("{ not json", encoding="utf-8")
    (folder / "wrong.json").write_text(
        json.dumps({"name": "Wrong", "settings": {"strategy": "warp"}}), encoding="utf-8"
    )
    assert [p.name for p in store.presets()] == ["Good"]
    assert any("broken.json" in p for p in store.problems) and any("strategy" in p for p in store.problems)
    assert (folder / "broken.json").read_text(encoding="utf-8") == "{ not json"  # never overwritten
    with pytest.raises(ValueError):
        store.save("Bad", values(num_draft_tokens=0))


def test_same_file_name_from_two_names(tmp_path):
    store = PresetStore(tmp_path / "p")
    a = store.save("a/b", values(model="starter"))
    b = store.save("a b", values(model="starter"))
    assert a.path != b.path and {p.name for p in store.presets()} == {"a/b", "a b"}


def test_recent_models(tmp_path):
    store = PresetStore(tmp_path / "presets")
    assert store.recent_models() == []
    for m in ("starter", "/models/a", "starter", "org/model"):
        store.remember_model(m)
    assert store.recent_models() == ["org/model", "starter", "/models/a"]


# -- the wizard's model checks (inference, no Qt) ------------------------------------------------
def test_describe_rejects_with_reason(tmp_path):
    from redline.inference.errors import RedlineError
    from redline.inference.estimate.describe import describe

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RedlineError, match="no config.json"):
        describe(str(empty))
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(
        json.dumps(
            {
                "model_type": "no-such-arch",
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 1,
                "vocab_size": 10,
            }
        ),
        encoding="utf-8",
    )
    with pytest.raises(RedlineError, match="no-such-arch"):
        describe(str(odd))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a gguf file")
    with pytest.raises(RedlineError, match="broken.gguf"):
        describe(str(bad))


def test_describe_config_only_folder(tmp_path):
    from redline.inference.estimate.describe import describe

    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(LLAMA3_8B_CONFIG.read_text(encoding="utf-8"), encoding="utf-8")
    d = describe(str(folder))
    assert d.shape.parameters == 8_030_261_248 and d.kind == "folder" and not d.loadable
    assert "8.03 B parameters" in d.summary() and "no weight files" in d.availability()


def test_describe_tiny_folder(tiny_model_dir):
    from redline.inference.estimate.describe import describe

    d = describe(str(tiny_model_dir))
    assert d.loadable and d.offline and d.size_bytes > 0 and "available offline" in d.availability()


def test_check_pair_from_tokenizers(tiny_model_dir, tiny_draft_dir, tiny_other_tokenizer_dir):
    from redline.inference.decoding.draft_check import check_pair

    shared = check_pair(str(tiny_model_dir), str(tiny_draft_dir))
    assert shared.mode == "shared" and "shares the target's vocabulary" in shared.reason
    universal = check_pair(str(tiny_model_dir), str(tiny_other_tokenizer_dir))
    assert universal.mode == "universal" and "universal assisted decoding" in universal.reason
