"""Settings file (corrupt-file backup) and the SQLite conversation store."""

import json

import pytest

from redline.app.settings import Settings, load_settings, save_settings, settings_path
from redline.app.store import Store, default_db_path


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def test_settings_roundtrip_in_config_dir(dirs):
    assert settings_path().is_relative_to(dirs / "config")
    s = Settings(model="starter", precision="nf4", temperature=0.0, seed=7)
    save_settings(s)
    loaded, warning = load_settings()
    assert warning is None and loaded == s


def test_corrupt_settings_kept_aside_and_defaults_used(dirs):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json", encoding="utf-8")
    settings, warning = load_settings()
    assert settings == Settings()
    assert "defaults" in warning and "corrupt" in warning
    backups = list(path.parent.glob("settings.json.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_text() == "{not json"
    assert not path.exists()


def test_wrong_types_count_as_corrupt(dirs):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"max_new_tokens": "lots"}), encoding="utf-8")
    settings, warning = load_settings()
    assert settings == Settings() and "max_new_tokens" in warning


def test_needs_reload():
    base = Settings(model="starter")
    assert not base.needs_reload(Settings(model="starter", temperature=0.5, max_new_tokens=9))
    assert base.needs_reload(Settings(model="starter", precision="int8"))
    assert base.needs_reload(Settings(model="starter", strategy="speculative"))
    assert not base.needs_reload(Settings(model="starter", strategy="prompt-lookup"))
    # precision auto is chosen by the priority when the model loads; a pinned precision does not care
    assert base.precision == "auto" and base.needs_reload(Settings(model="starter", priority="speed"))
    pinned = Settings(model="starter", precision="q8")
    assert not pinned.needs_reload(Settings(model="starter", precision="q8", priority="speed"))


def test_store_persists_in_data_dir(dirs):
    assert default_db_path().is_relative_to(dirs / "data")
    store = Store()
    conv = store.create_conversation("Capitals", "Answer briefly.")
    store.add_message(conv.id, "user", "What is the capital of France?")
    reply = store.add_message(conv.id, "assistant", "", partial=True)
    store.update_message(reply.id, "Paris", partial=True, stats={"finish_reason": "cancelled", "new_tokens": 2})
    store.close()

    again = Store()
    [c] = again.conversations()
    assert (c.title, c.system_prompt) == ("Capitals", "Answer briefly.")
    user, assistant = again.messages(c.id)
    assert (user.role, user.content, user.partial) == ("user", "What is the capital of France?", False)
    assert (assistant.content, assistant.partial, assistant.stats["new_tokens"]) == ("Paris", True, 2)
    again.close()


def test_store_search_rename_delete_and_truncate(dirs):
    store = Store()
    a = store.create_conversation("Python tips")
    b = store.create_conversation("Cooking 100%")
    assert [c.title for c in store.conversations("python")] == ["Python tips"]
    assert [c.title for c in store.conversations("100%")] == ["Cooking 100%"]
    assert store.conversations("_") == []  # LIKE wildcards are literal
    store.rename_conversation(a.id, "Rust tips")
    assert store.conversation(a.id).title == "Rust tips"
    m1 = store.add_message(a.id, "user", "one")
    store.add_message(a.id, "assistant", "two")
    store.add_message(a.id, "user", "three")
    store.delete_from(m1.id + 1)
    assert [m.content for m in store.messages(a.id)] == ["one"]
    store.delete_conversation(b.id)
    assert [c.id for c in store.conversations()] == [a.id]
    store.delete_conversation(a.id)
    assert store.messages(a.id) == []  # cascade


def test_export_markdown_and_json(dirs):
    store = Store()
    c = store.create_conversation("Export me", "Be kind.")
    store.add_message(c.id, "user", "Hi")
    store.add_message(
        c.id,
        "assistant",
        "Hello **there**",
        partial=True,
        stats={"new_tokens": 3, "tokens_per_s": 12.5, "ttft_ms": 80.0, "strategy": "kv", "precision": "bf16"},
    )
    md = store.export_markdown(c.id)
    assert "# Export me" in md and "Be kind." in md and "## Assistant (partial)" in md
    assert "12.5 tok/s" in md and "Hello **there**" in md
    data = json.loads(store.export_json(c.id))
    assert data["title"] == "Export me"
    assert [m["content"] for m in data["messages"]] == ["Hi", "Hello **there**"]
    assert data["messages"][1]["partial"] is True


def test_settings_accept_every_engine_strategy_and_name_them_when_one_is_unknown():
    from redline.inference import STRATEGIES

    for strategy in ("auto", *STRATEGIES):
        Settings(strategy=strategy).validate()
    with pytest.raises(ValueError, match="strategy must be auto or one of naive, kv, .*, not 'turbo'"):
        Settings.from_dict({"strategy": "turbo"})
    with pytest.raises(ValueError, match="priority must be one of quality, balanced, speed, not 'cheap'"):
        Settings.from_dict({"priority": "cheap"})
    assert Settings().strategy == "auto" and Settings().priority == "balanced"


def test_settings_panel_offers_every_engine_strategy_and_precision(qtbot):
    from redline.inference import PRECISIONS, STRATEGIES
    from redline.ui.settings_panel import SettingsPanel

    panel = SettingsPanel(Settings())
    qtbot.addWidget(panel)
    offered = {box: [box.itemText(i) for i in range(box.count())] for box in (panel.precision, panel.strategy)}
    assert offered[panel.strategy][:3] == ["auto", "kv", "fast"]
    assert sorted(offered[panel.strategy][1:]) == sorted(STRATEGIES)
    priorities = [panel.priority.itemData(i) for i in range(panel.priority.count())]
    assert priorities == ["quality", "balanced", "speed"] and panel.priority.currentData() == "balanced"
    assert offered[panel.precision] == ["auto", *PRECISIONS, "nf4+keep=lm_head"]
