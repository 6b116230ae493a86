"""`redline models` against the stand-in hub: search, show (every variant predicted here), pull a variant, the
local library with its reclaimable leftovers, and delete saying the space it frees before deleting."""

from __future__ import annotations

import pytest
from test_model_browser import hub, tiny_files  # noqa: F401 - the fixtures

from redline.app.cli import main


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("REDLINE_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path


def test_search_lists_what_redline_runs(hub, home, capsys):  # noqa: F811
    assert main(["models", "search", "tiny-chat"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("me/")]
    assert [line.split()[0] for line in lines] == ["me/tiny-chat", "me/tiny-chat-GGUF", "me/tiny-chat-gated"]
    assert "apache-2.0" in lines[0] and lines[2].endswith("yes") and "gguf" in lines[1]
    assert "bert" not in out and "pickles" not in out


def test_search_offline_is_one_sentence(hub, home, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["models", "search", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_HUB_OFFLINE" in err and "Traceback" not in err
    assert main(["models", "--no-predict"]) == 0  # the local library still lists


def test_show_pull_list_and_delete(hub, home, capsys):  # noqa: F811
    assert main(["models", "show", "me/tiny-chat-GGUF", "--context", "256", "--priority", "balanced"]) == 0
    out = capsys.readouterr().out
    assert "Q4_0" in out and "Q8_0" in out and "recommended here" in out and "fits" in out
    assert main(["models", "pull", "me/tiny-chat-GGUF", "Q4_0"]) == 0
    out = capsys.readouterr().out
    assert "--precision gguf" in out
    assert main(["models", "pull", "me/tiny-chat-GGUF", "Q9"]) == 2
    assert "has no variant 'Q9'; it has: Q4_0, Q8_0." in capsys.readouterr().err
    blobs = next(hub.cache.glob("models--me--tiny-chat-GGUF/blobs"))
    (blobs / ("e" * 64 + ".redline-partial")).write_bytes(b"x" * 70_000)
    assert main(["models", "--no-predict"]) == 0
    out = capsys.readouterr().out
    assert "me/tiny-chat-GGUF/tiny-chat.Q4_0.gguf" in out and "Reclaimable (70.0 KB" in out
    assert main(["models", "delete", "--reclaimable"]) == 2  # not a terminal: asks for --yes
    assert "pass --yes" in capsys.readouterr().err
    assert main(["models", "delete", "--reclaimable", "--yes"]) == 0
    out = capsys.readouterr().out
    said, done = out.splitlines()[0], out.splitlines()[-1]
    assert said.startswith("Deleting me/tiny-chat-GGUF (partial download) frees 70.0 KB")
    assert done == "Deleted; 70.0 KB freed."
    assert main(["models", "delete", "nothing-such"]) == 2
