"""The prefix cache seen from the window (issue 27, item 7): the reply's footer says how many prompt tokens came
from the cache, the memory gauge shows the KV cache kept for later turns, and Settings has the cache's size
(saved, applied at once and at each load)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from redline.app.settings import Settings, load_settings, save_settings
from redline.inference import DecodeOptions, KvCacheHeld, SamplingSettings, kv_cache_held, prefix_cache_job
from redline.ui.chat_session import stats_from_result
from redline.ui.chat_view import format_stats

TIMEOUT = 120


def test_the_footer_says_what_came_from_the_cache():
    result = SimpleNamespace(prompt_tokens=540, cached_tokens=412, new_tokens=10, notes=[], finish_reason="stop")
    stats = stats_from_result(result, "m", [])
    assert stats["cached_tokens"] == 412
    assert "412 of 540 prompt tokens from the cache" in format_stats(stats)
    assert "cache" not in format_stats({**stats, "cached_tokens": 0})  # a fresh prompt says nothing of it


def test_the_cache_size_is_a_setting_saved_and_checked(tmp_path):
    assert Settings().prefix_cache_bytes == 256_000_000
    path = tmp_path / "settings.json"
    save_settings(dataclasses.replace(Settings(), prefix_cache_bytes=0), path)
    assert load_settings(path)[0].prefix_cache_bytes == 0
    with pytest.raises(ValueError, match="prefix_cache_bytes"):
        Settings.from_dict({"prefix_cache_bytes": -1})
    with pytest.raises(ValueError, match="prefix_cache_bytes"):
        Settings.from_dict({"prefix_cache_bytes": "big"})


def test_the_settings_panel_edits_the_cache_size_without_a_reload(qtbot):
    from redline.ui.settings_panel import SettingsPanel

    panel = SettingsPanel(Settings(model="starter"))
    qtbot.addWidget(panel)
    assert panel.prefix_cache.value() == 256 and panel.values()["prefix_cache_bytes"] == 256_000_000
    panel.prefix_cache.setValue(0)
    assert panel.prefix_cache.text() == "off" and panel.candidate().prefix_cache_bytes == 0
    assert not Settings(model="starter").needs_reload(panel.candidate())
    assert panel.apply_button.isEnabled() and "no reload" in panel.reload_note.text()


def test_the_gauge_shows_the_kv_cache_kept(qtbot):
    from redline.ui.gauges import GaugesPanel

    gauges = GaugesPanel()
    qtbot.addWidget(gauges)
    gauges.set_kv_cache(KvCacheHeld(12_000_000, 384, 256_000_000))
    assert gauges.kv_label.text() == "KV cache kept for later turns: 12.0 MB (384 tokens) of 256 MB"
    assert "least recently used" in gauges.kv_label.toolTip()
    gauges.set_kv_cache(KvCacheHeld(0, 0, 256_000_000))
    assert gauges.kv_label.text() == "KV cache kept for later turns: none yet (up to 256 MB)"
    gauges.set_kv_cache(KvCacheHeld(0, 0, 0))
    assert gauges.kv_label.text().startswith("Prefix cache: off")
    gauges.set_kv_cache(None)
    assert gauges.kv_label.isHidden()


def test_the_engine_reads_out_its_cache_and_takes_a_new_size_at_once_and_at_load(tiny_model_dir, native_kernels):
    from redline.inference import Engine, EngineService, GenerationRequest

    svc = EngineService(lambda: Engine("cpu"))
    try:
        svc.load(str(tiny_model_dir), "fp32").result(TIMEOUT)
        at_load = kv_cache_held(svc.engine)  # the fast path is made at the load (auto runs it here): empty
        assert at_load is not None and at_load.cached_bytes == 0 and at_load.cached_tokens == 0
        request = GenerationRequest(
            messages=[{"role": "user", "content": "Tell me about local models and their speed. " * 8}],
            sampling=SamplingSettings(max_new_tokens=8, temperature=0),
            options=DecodeOptions("fast"),
        )
        svc.submit(request).result(TIMEOUT)
        held = kv_cache_held(svc.engine)
        assert held is not None and held.cached_bytes > 0 and held.cached_tokens > 0
        assert 0 < held.limit_bytes <= 256_000_000  # the setting, or the KV budget where that is smaller
        off = svc.call(prefix_cache_job(0), "test").result(TIMEOUT)
        assert off.cached_bytes == 0 and off.limit_bytes == 0  # let go at once
        assert svc.engine.limits.prefix_cache_bytes == 0
        svc.call(prefix_cache_job(64_000_000), "test").result(TIMEOUT)
        svc.load(str(tiny_model_dir), "fp32").result(TIMEOUT)
        assert svc.engine.target.limits.prefix_cache_bytes == 64_000_000  # what the next load gives the model
    finally:
        svc.shutdown()
    with pytest.raises(ValueError, match="negative"):
        prefix_cache_job(-1)
