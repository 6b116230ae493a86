"""Staying usable over a long day: unloading frees the model, a killed app keeps the reply so far, a corrupt
or locked database never stops the app, long conversations open a page at a time, streaming touches only the
new reply. (Speed figures live in tools/benchmarks/bench_app.py, not here.)"""

import gc
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
from gui_helpers import aloop, open_window, profile, send, write_settings  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[1]


def _db_path() -> Path:
    from redline.app.store import default_db_path

    return default_db_path()


# -- unloading ------------------------------------------------------------------------------------


def test_engine_unload_frees_model_and_fast_path_caches(tiny_model_dir):
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.engine import Engine
    from redline.inference.precision import parse_precision

    engine = Engine("cpu")
    loaded = engine.load(str(tiny_model_dir), parse_precision("fp32"))
    engine.chat(
        [{"role": "user", "content": "hi"}], SamplingSettings(max_new_tokens=4, temperature=0), DecodeOptions("fast")
    )
    assert loaded.fast_decoder is not None  # the fast path built its fused weights and KV cache
    model, decoder = weakref.ref(loaded.model), weakref.ref(loaded.fast_decoder)
    cache = weakref.ref(loaded.fast_decoder.kv.k)
    engine.unload()
    gc.collect()
    # Freed even though this test still holds the LoadedModel object itself.
    assert engine.target is None and loaded.model is None and loaded.fast_decoder is None
    assert model() is None and decoder() is None and cache() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap is what is measured")
@pytest.mark.slow
def test_unloading_the_starter_returns_its_memory(starter_dir):
    """The real thing, in a fresh process: bf16 weights (about 270 MB) loaded, used by both decode paths and
    unloaded; resident memory must come back within 10 % of where it was (the long-day budget). Measured:
    +28-32 MB on a 441 MB baseline; without inference.memory.policy, +79-106 MB (the worker thread's heap
    kept the freed weights)."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.unload_probe", str(starter_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    before, loaded = figures["before"], figures["loaded"]
    assert loaded - before > 200 * 2**20  # the model really was resident
    for after in figures["after"]:
        assert after <= before * 1.10, f"{(after - before) / 2**20:.0f} MB stayed after unloading"


def test_memory_policy_windows_nest_and_restore(monkeypatch):
    from redline.inference.memory import policy as mp

    calls = []

    class FakeLibc:
        def mallopt(self, option, value):
            calls.append((option, value))

    monkeypatch.setattr(mp, "_libc", FakeLibc())
    wide = [(mp.M_MMAP_THRESHOLD, mp.DECODE_MMAP_BYTES), (mp.M_TRIM_THRESHOLD, mp.DECODE_TRIM_BYTES)]
    with mp.weights_in_own_mappings():
        assert calls[-2:] == [(mp.M_MMAP_THRESHOLD, mp.OWN_MAPPING_BYTES), (mp.M_TRIM_THRESHOLD, mp.DECODE_TRIM_BYTES)]
        with mp.returning_freed_memory():  # e.g. a failed load frees what it made
            assert calls[-2:] == [
                (mp.M_MMAP_THRESHOLD, mp.OWN_MAPPING_BYTES),
                (mp.M_TRIM_THRESHOLD, mp.OWN_MAPPING_BYTES),
            ]
            with mp.returning_freed_memory():
                pass
            assert calls[-1] == (mp.M_TRIM_THRESHOLD, mp.OWN_MAPPING_BYTES)  # the outer window still holds
        assert calls[-1] == (mp.M_TRIM_THRESHOLD, mp.DECODE_TRIM_BYTES)
    assert calls[-2:] == wide  # decoding runs with the wide thresholds
    try:
        with mp.returning_freed_memory():
            raise RuntimeError("out of memory")
    except RuntimeError:
        pass
    assert calls[-2:] == wide and mp._depth == {"weights": 0, "release": 0}


def test_engine_bounds_kernel_caches_unless_the_user_chose(monkeypatch):
    from redline.inference.engine import Engine
    from redline.inference.memory.policy import KERNEL_CACHE_ENTRIES

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "256")
    Engine("cpu")
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(KERNEL_CACHE_ENTRIES)
    assert os.environ["LRU_CACHE_CAPACITY"] == "256"


@pytest.mark.usefixtures("aloop", "profile")
def test_window_unload_then_reload(qtbot, tiny_model_dir):
    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=6)
    w = open_window(qtbot)
    try:
        send(qtbot, w, "hello")
        model = weakref.ref(w.engine.engine.target.model)
        with qtbot.waitSignal(w.model_unloaded, timeout=30_000):
            w.unload_model()
        gc.collect()
        assert w.loaded is None and w.engine.engine.target is None
        # Nothing in the window (last result, widgets, tasks) keeps the weights alive. A queued signal or the
        # engine thread's last frame can hold them for a moment after model_unloaded (seen once in a full run,
        # not alone): give them a bounded moment, and name the holders if they stay.
        deadline = time.monotonic() + 5
        while model() is not None and time.monotonic() < deadline:
            qtbot.wait(50)
            gc.collect()
        assert model() is None, [type(r).__name__ for r in gc.get_referrers(model())]
        assert "No model loaded" in w.model_label.text()
        assert w.last_result is not None  # the figures of the last reply are kept, the tensors are not
        with qtbot.waitSignal(w.model_loaded, timeout=60_000):
            w.load_model()
        assert send(qtbot, w, "again").new_tokens > 0
    finally:
        w.shutdown()


# -- SIGKILL mid-reply ------------------------------------------------------------------------------


@pytest.mark.usefixtures("profile")
@pytest.mark.slow
def test_sigkill_mid_reply_keeps_partial_text(tmp_path):
    from slow_engine import word

    from redline.app.store import open_store

    write_settings(model="fake", temperature=0, max_new_tokens=2000)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        QT_QPA_PLATFORM="offscreen",
    )
    child = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "app_child.py"), "Tell me everything."],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        saved = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
            if not _db_path().exists():
                continue
            try:
                con = sqlite3.connect(f"file:{_db_path()}?mode=ro", uri=True, timeout=1)
                row = con.execute("SELECT content FROM messages WHERE role = 'assistant'").fetchone()
                con.close()
            except sqlite3.OperationalError:
                continue
            # Two saves in: the reply has grown in the database at least once after it started.
            if row and len(row[0].split()) >= 20:
                saved = row[0]
                break
        assert saved, "the child never saved a growing reply: " + child.stdout.read1().decode(errors="replace")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    store, warning = open_store()
    assert warning is None
    [conv] = store.conversations()
    user, reply = store.messages(conv.id)
    assert (user.role, user.content) == ("user", "Tell me everything.")
    assert reply.role == "assistant" and reply.partial
    assert reply.stats["finish_reason"] == "interrupted"
    n = len(reply.content.split())
    assert n >= 20 and reply.content == "".join(word(i) for i in range(n))  # the text up to the last save
    store.close()


# -- corrupt and locked databases -------------------------------------------------------------------


@pytest.mark.usefixtures("aloop", "profile")
def test_corrupt_database_is_kept_aside_and_app_starts(qtbot):
    db = _db_path()
    db.parent.mkdir(parents=True, exist_ok=True)
    garbage = b"this is not a database, just bytes\x00\xff" * 100
    db.write_bytes(garbage)
    w = open_window(qtbot)
    try:
        [notice] = w.notices.texts()
        assert w.notices.isVisible() and "unreadable" in notice
        [backup] = list(db.parent.glob("conversations.sqlite3.corrupt-*"))
        assert backup.read_bytes() == garbage and str(backup) in notice
        # The fresh database works.
        conv = w.store.create_conversation("after the crash")
        assert [c.title for c in w.store.conversations()] == ["after the crash"]
        assert not w.store.in_memory and w.store.path == db and conv.id
    finally:
        w.shutdown()
        w.store.close()


@pytest.mark.usefixtures("aloop", "profile")
def test_locked_database_is_reported_and_app_starts(qtbot):
    from redline.app.store import Store

    s = Store()
    c = s.create_conversation("saved before")
    s.close()
    db = _db_path()
    before = db.read_bytes()
    locker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout.readline().strip() == "locked"
        w = open_window(qtbot)
        try:
            [notice] = w.notices.texts()
            assert w.notices.isVisible() and "locked" in notice and "memory only" in notice
            assert w.store.in_memory
            w.store.create_conversation("this session")  # usable, in memory
            assert [x.title for x in w.store.conversations()] == ["this session"]
        finally:
            w.shutdown()
            w.store.close()
    finally:
        os.kill(locker.pid, signal.SIGKILL)
        locker.wait(timeout=30)
    assert not list(db.parent.glob("*.corrupt-*"))  # a locked database is not "corrupt": left where it was
    again = Store()
    assert [x.id for x in again.conversations()] == [c.id]
    again.close()
    assert before  # the original file was never replaced


def test_database_and_settings_files_are_private(profile):
    from redline.app.settings import Settings, save_settings, settings_path
    from redline.app.store import Store

    s = Store()
    s.create_conversation("private")
    save_settings(Settings(model="starter"))
    for path in (_db_path(), settings_path()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700, path.parent
    wal = _db_path().with_name(_db_path().name + "-wal")
    if wal.exists():
        assert stat.S_IMODE(wal.stat().st_mode) == 0o600
    s.close()


# -- large histories ----------------------------------------------------------------------------------


def test_store_pages_messages(profile):
    from redline.app.store import Store

    s = Store()
    c = s.create_conversation("long")
    for i in range(30):
        s.add_message(c.id, "user" if i % 2 == 0 else "assistant", f"m{i}")
    last = s.messages(c.id, limit=10)
    assert [m.content for m in last] == [f"m{i}" for i in range(20, 30)]
    older = s.messages(c.id, limit=10, before_position=last[0].position)
    assert [m.content for m in older] == [f"m{i}" for i in range(10, 20)]
    assert s.message_count(c.id) == 30 and s.message_count(c.id, last[0].position) == 20
    assert [m.content for m in s.messages(c.id)] == [f"m{i}" for i in range(30)]
    plan = " ".join(
        r[-1] for r in s._conn.execute("EXPLAIN QUERY PLAN SELECT * FROM conversations ORDER BY updated DESC, id DESC")
    )
    assert "conversations_by_updated" in plan  # the list never sorts the whole table
    s.close()


@pytest.mark.usefixtures("aloop", "profile")
def test_long_conversation_opens_one_page_and_loads_older_on_demand(qtbot, tiny_model_dir):
    from redline.app.store import Store
    from redline.ui.chat_view import MAX_BUILT, PAGE

    s = Store()
    c = s.create_conversation("long one")
    for i in range(100):
        s.add_message(c.id, "user" if i % 2 == 0 else "assistant", f"message number {i}")
    s.close()
    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=6)
    w = open_window(qtbot)
    try:
        view = w.chat_view
        assert w.conversation_id == c.id
        assert [x.text for x in view.widgets] == [f"message number {i}" for i in range(100 - PAGE, 100)]
        assert view.earlier_button.isVisible() and f"({100 - PAGE})" in view.earlier_button.text()
        view.earlier_button.click()
        assert len(view.widgets) == 2 * PAGE
        assert view.widgets[0].text == f"message number {100 - 2 * PAGE}"
        # Scrolling up builds older messages; never more than MAX_BUILT widgets exist at once.
        bar = view.verticalScrollBar()
        qtbot.waitUntil(lambda: (bar.setValue(0), view._earlier == 0 and bar.value() == 0)[1], timeout=30_000)
        assert view.widgets[0].text == "message number 0" and len(view.widgets) <= MAX_BUILT
        assert view._later == 100 - len(view.widgets) and view.later_button.isVisible()
        # ... and scrolling back down builds the newer ones again, dropping the oldest.
        qtbot.waitUntil(lambda: (bar.setValue(bar.maximum()), view._later == 0)[1], timeout=30_000)
        assert view.widgets[-1].text == "message number 99" and len(view.widgets) <= MAX_BUILT
        assert [w.position for w in view.widgets] == list(range(100 - len(view.widgets), 100))

        # Streaming a reply renders the new reply only, never the messages above it.
        counts = [x.render_count for x in view.widgets]
        result = send(qtbot, w, "and one more")
        assert result.new_tokens > 0
        assert [x.render_count for x in view.widgets[: len(counts)]] == counts
        assert [x.role for x in view.widgets[-2:]] == ["user", "assistant"]
        assert view.widgets[-1].text == result.text and not view.widgets[-1].streaming
        assert w.store.message_count(c.id) == 102
    finally:
        w.shutdown()
