"""The model browser's engine side against the stand-in hub on 127.0.0.1: search and its filter, every variant of
a safetensors and of a GGUF repository, header-only GGUF reads (bytes counted), gated and offline, a
download loaded in the configuration predicted, the local library and Delete."""

from __future__ import annotations

import json
import time

import pytest
from gguf_helpers import write_llama_gguf
from hub_server import FakeHub, Repo

from redline.inference.browse import gguf_header, library, predict, search, variants
from redline.inference.browse.fetch import fetch
from redline.inference.errors import ModelSourceError
from redline.inference.estimate.fit import Target
from redline.inference.speed.arithmetic import Machine
from redline.inference.speed.model import SpeedModel
from redline.inference.units import GB

TEXT_GEN = {"pipeline_tag": "text-generation"}


def _model_files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """A tiny Llama folder and two GGUFs of it (Q8_0 and Q4_0 linear layers)."""
    from conftest import build_tiny_model

    root = tmp_path_factory.mktemp("browse-models")
    folder = build_tiny_model(root / "tiny", layers=2, hidden=64)
    q8 = write_llama_gguf(folder, root / "tiny-chat.Q8_0.gguf", {"attn": "Q8_0", "ffn": "Q8_0"})
    q4 = write_llama_gguf(folder, root / "tiny-chat.Q4_0.gguf", {"attn": "Q4_0", "ffn": "Q4_0"})
    big = build_tiny_model(root / "wide", layers=4, hidden=256)
    wide = write_llama_gguf(big, root / "wide-F32.gguf", {"attn": "F32", "ffn": "F32"})
    f16 = write_llama_gguf(folder, root / "tiny-chat.F16.gguf", {"attn": "F16", "ffn": "F16"})
    return folder, q8, q4, wide, f16


def shaped_config(layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, vocab: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def repos(tiny_files) -> dict[str, Repo]:
    folder, q8, q4, wide, f16 = tiny_files
    st_info = {
        **TEXT_GEN,
        "downloads": 900,
        "likes": 5,
        "trendingScore": 3,
        "tags": ["transformers", "safetensors", "llama", "license:apache-2.0"],
        "cardData": {"license": "apache-2.0"},
        "config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
        "safetensors": {"parameters": {"F32": 60000}, "total": 60000},
    }
    gguf_info = {
        **TEXT_GEN,
        "downloads": 400,
        "likes": 50,
        "trendingScore": 40,
        "tags": ["gguf", "llama", "license:mit"],
        "gguf": {"total": 60000, "architecture": "llama", "context_length": 512},
    }
    files = _model_files(folder)
    out = {
        "me/tiny-chat": Repo(files=files, lfs={"model.safetensors"}, info=st_info),
        "me/tiny-chat-GGUF": Repo(
            files={q8.name: q8.read_bytes(), q4.name: q4.read_bytes(), "README.md": b"# tiny"},
            lfs={q8.name, q4.name},
            sha="1111111111111111111111111111111111111111",
            info=gguf_info,
        ),
        "me/half-GGUF": Repo(files={f16.name: f16.read_bytes()}, lfs={f16.name}, info={**gguf_info, "downloads": 2}),
        "me/wide-GGUF": Repo(files={wide.name: wide.read_bytes()}, lfs={wide.name}, info={**gguf_info, "downloads": 1}),
        "me/tiny-chat-gated": Repo(
            files=files, lfs={"model.safetensors"}, gated=True, gated_files_only=True, info={**st_info, "downloads": 10}
        ),
        # Left out by the search: not text generation, an architecture transformers does not build, pickles only.
        "me/tiny-chat-bert": Repo(files={"config.json": b"{}"}, info={"pipeline_tag": "fill-mask", "downloads": 10**6}),
        "me/tiny-chat-foo": Repo(
            files={"config.json": b"{}"},
            info={**TEXT_GEN, "downloads": 10**6, "tags": ["safetensors"], "config": {"architectures": ["FooLM"]}},
        ),
        "me/tiny-chat-pickles": Repo(
            files={"config.json": b"{}"},
            info={**TEXT_GEN, "downloads": 10**6, "tags": ["pytorch"], "config": {"model_type": "llama"}},
        ),
    }
    return out


@pytest.fixture
def hub(monkeypatch, tmp_path, tiny_files):
    """The stand-in hub with the repositories above; huggingface_hub and Redline's caches pointed at temp dirs."""
    from huggingface_hub import constants

    with FakeHub(repos(tiny_files)) as server:
        cache = tmp_path / "hf-cache"
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        monkeypatch.setenv("REDLINE_CACHE_DIR", str(tmp_path / "redline-cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        monkeypatch.setattr(
            constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}"
        )
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
        server.cache = cache
        yield server


def target(gb: float) -> Target:
    return Target("cpu", int(gb * GB), "test RAM", None)


SPEED = SpeedModel(Machine("cpu", 20e9, 200e9, "a test CPU", None))


# --------------------------------------------------------------------------- search
def test_search_keeps_text_generation_models_redline_can_run(hub):
    rows = search.search("tiny-chat")
    ids = [r.repo_id for r in rows]
    assert ids == ["me/tiny-chat", "me/tiny-chat-GGUF", "me/tiny-chat-gated"]  # most downloaded first
    st, gg, gated = rows
    assert (st.kind, st.parameters, st.license, st.gated) == ("safetensors", 60000, "apache-2.0", False)
    assert (gg.kind, gg.architecture, gg.license) == ("gguf", "llama", "mit")
    assert gated.gated
    assert [r.repo_id for r in search.search("tiny-chat", sort="trending")][:2] == ["me/tiny-chat-GGUF", "me/tiny-chat"]
    assert [r.repo_id for r in search.search("tiny", kind="gguf")] == ["me/tiny-chat-GGUF"]
    assert search.search("nothing-like-this") == []
    query = next(p for m, p, _ in hub.requests if p == "/api/models")
    assert query  # one request to the search endpoint per search


def test_offline_and_unreachable_say_one_sentence(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError) as err:
        search.search("tiny")
    assert "HF_HUB_OFFLINE" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE"):
        variants.repo_variants("me/tiny-chat")
    assert not hub.requests
    monkeypatch.delenv("HF_HUB_OFFLINE")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    started = time.monotonic()
    with pytest.raises(ModelSourceError) as err:
        search.search("tiny")
    # At once, not after huggingface_hub's five retries (their waits alone add up to 23 s).
    assert time.monotonic() - started < 10
    text = str(err.value)
    assert text.startswith("Could not reach the Hugging Face hub while searching the hub") and "\n" not in text


# --------------------------------------------------------------------------- variants
def test_safetensors_repository_variants_read_only_the_config(hub):
    rv = variants.repo_variants("me/tiny-chat")
    assert rv.kind == "safetensors" and rv.commit == Repo(files={}).sha
    names = [v.name for v in rv.variants]
    assert names[:2] == ["fp32", "bf16"] and "q8" in names and "q4" in names
    assert "int8" not in names  # bitsandbytes runs on CUDA only
    assert "fp16" not in names  # on a CPU: bf16's memory at an eighth of its speed (no fp16 kernel)
    import fnmatch

    from redline.inference.sources.hub import MODEL_FILES

    files = hub.repos["me/tiny-chat"].files
    size = sum(len(b) for n, b in files.items() if any(fnmatch.fnmatch(n, p) for p in MODEL_FILES))
    assert all(v.download_bytes == size for v in rv.variants)
    fetched = {p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p}
    assert fetched == {"/me/tiny-chat/resolve/" + rv.commit + "/config.json"}, fetched  # no weights
    preds = predict.predict_repo(rv, 256, "quality", target(64), SPEED)
    assert all(p.fit == predict.FITS and p.tokens_per_s > 0 and p.ttft_ms > 0 for p in preds)
    best = [p for p in preds if p.recommended]
    assert [p.name for p in best] == ["fp32"]  # the highest quality that fits
    assert [p.name for p in preds if p.recommended] == ["fp32"]
    again = variants.repo_variants("me/tiny-chat")
    assert again.from_cache and [v.name for v in again.variants] == names  # the same commit: from the cache
    on_gpu = variants.repo_variants("me/tiny-chat", "cuda:0")  # the device kind is part of the cache's key
    assert not on_gpu.from_cache and [v.name for v in on_gpu.variants][:3] == ["fp32", "fp16", "bf16"]
    assert variants.repo_variants("me/tiny-chat", "cuda").from_cache


def test_a_float16_gguf_loads_as_bf16_on_a_cpu_and_as_fp16_on_a_gpu(hub):
    (v,) = variants.repo_variants("me/half-GGUF").variants
    assert v.name == "F16" and v.model_shape().stored_dtype == "float16" and not v.model_shape().packed
    assert v.precision == "bf16"  # no CPU kernel multiplies fp16 weights: they are cast once, at load
    (gpu,) = variants.repo_variants("me/half-GGUF", "cuda").variants
    assert gpu.precision == "fp16"
    assert variants.repo_variants("me/half-GGUF").variants[0].precision == "bf16"  # each from its cache
    assert variants.float_gguf_precision("float32", "cpu") == "fp32"
    assert variants.float_gguf_precision("bfloat16", "cuda") == "bf16"


def test_gguf_repository_variants_by_quant_type_from_their_headers(hub):
    rv = variants.repo_variants("me/tiny-chat-GGUF")
    assert rv.kind == "gguf"
    assert [v.name for v in rv.variants] == ["Q4_0", "Q8_0"]
    q4, q8 = rv.variants
    assert not q4.problem and q4.model_shape().layers == 2 and q4.model_shape().packed
    assert q8.quality_bits > q4.quality_bits
    for v in rv.variants:
        assert v.download_bytes == len(hub.repos["me/tiny-chat-GGUF"].files[v.files[0]])
        assert hub.sent[v.files[0]] == v.header_bytes_read
    preds = predict.predict_repo(rv, 256, "speed", target(64), SPEED)
    assert [p.name for p in preds if p.recommended] == ["Q4_0"]  # speed first: fewer bytes a step
    preds = predict.predict_repo(rv, 256, "balanced", target(64), SPEED)
    assert [p.name for p in preds if p.recommended] == ["Q8_0"]  # 8-bit weights kept
    before = dict(hub.sent)
    assert variants.repo_variants("me/tiny-chat-GGUF").from_cache and hub.sent == before


def test_header_only_reads_count_their_bytes(hub, monkeypatch):
    import gguf

    monkeypatch.setattr(gguf_header, "FIRST_READ", 4096)  # the header is longer: a second read is needed
    rv = variants.repo_variants("me/wide-GGUF")
    (v,) = rv.variants
    name = v.files[0]
    data = hub.repos["me/wide-GGUF"].files[name]
    assert len(data) > gguf_header.MAX_HEADER_BYTES  # a file larger than what may be read of it
    sent = hub.sent[name]
    assert sent == v.header_bytes_read and sent <= gguf_header.MAX_HEADER_BYTES
    assert sent < len(data) / 5
    ranges = [r for m, p, r in hub.requests if m == "GET" and p.endswith(name)]
    assert len(ranges) >= 2 and all(r.startswith("bytes=") for r in ranges)
    # The walk ends where the reader's tensor data starts (less the alignment padding).
    path = hub.cache.parent / name
    path.write_bytes(data)
    reader = gguf.GGUFReader(str(path))
    length = gguf_header.header_length(data)
    assert 0 <= reader.data_offset - length < reader.alignment
    assert v.model_shape().layers == 4 and v.model_shape().hidden == 256
    assert v.precision == "bf16"  # a float file keeps nothing quantised: it loads at a float precision, not gguf


def test_a_header_larger_than_the_limit_is_refused_in_one_sentence(hub, monkeypatch, tmp_path):
    rv_sha = hub.repos["me/wide-GGUF"].sha
    name = next(iter(hub.repos["me/wide-GGUF"].files))
    with pytest.raises(ModelSourceError) as err:
        gguf_header.read_header("me/wide-GGUF", name, rv_sha, 10**8, tmp_path / "x.gguf", limit=1000)
    assert "larger than 1.00 kB" in str(err.value) or "larger than" in str(err.value)
    assert hub.sent[name] <= 1000


def test_gated_repository_lists_but_its_files_say_how_to_log_in(hub):
    rv_rows = search.search("tiny-chat-gated")
    assert rv_rows[0].gated
    with pytest.raises(ModelSourceError) as err:
        variants.repo_variants("me/tiny-chat-gated")
    text = str(err.value)
    assert "gated" in text and "hf auth login" in text and "\n" not in text


def test_generated_7b_8b_14b_configs_predict_memory_without_weights(hub, tmp_path):
    shapes = {
        "shapes/llama-7b": shaped_config(32, 4096, 11008, 32, 32, 32000),
        "shapes/llama3-8b": shaped_config(32, 4096, 14336, 32, 8, 128256),
        "shapes/qwen-14b": shaped_config(48, 5120, 13824, 40, 8, 152064),
    }
    params = {"shapes/llama-7b": 6_738_415_616, "shapes/llama3-8b": 8_030_261_248, "shapes/qwen-14b": 14_770_033_664}
    for rid, cfg in shapes.items():
        files = {"config.json": json.dumps(cfg).encode(), "model.safetensors": b"\0" * 8}
        hub.repos[rid] = Repo(files=files, sizes={"model.safetensors": 2 * params[rid]})  # bf16, never downloaded
    got = {}
    for rid in shapes:
        rv = variants.repo_variants(rid)
        preds = {p.name: p for p in predict.predict_repo(rv, 4096, "balanced", target(24), SPEED)}
        got[rid] = preds
        assert all(p.total_bytes and p.tokens_per_s for p in preds.values())  # predicted even where none fits
        assert preds["bf16"].download_bytes == 2 * params[rid] + len(files["config.json"])
        print(rid, {n: round(p.total_bytes / 1e9, 2) for n, p in preds.items()})
    # bf16 weights alone: 2 bytes a parameter
    assert 13.4e9 < got["shapes/llama-7b"]["bf16"].total_bytes < 17e9
    assert got["shapes/llama-7b"]["bf16"].fit == predict.FITS
    assert got["shapes/qwen-14b"]["bf16"].fit == predict.NO_FIT
    assert not any("/resolve/" in p and "safetensors" in p for _, p, _ in hub.requests)


# --------------------------------------------------------------------------- fetch, load, library, delete
def test_download_then_load_in_the_predicted_configuration(hub):
    from redline.inference.engine import Engine, LoadRequest

    rv = variants.repo_variants("me/tiny-chat-GGUF")
    preds = predict.predict_repo(rv, 256, "balanced", target(64), SPEED)
    pick = next(p for p in preds if p.recommended)
    variant = next(v for v in rv.variants if v.name == pick.name)
    seen = []
    got = fetch(rv, variant, pick, lambda f, p: seen.append((f, p)))
    assert got.path.is_file() and got.path.stat().st_size == variant.download_bytes
    assert seen[-1][0] == 1.0 and got.precision == "gguf"
    engine = Engine("cpu")
    try:
        report = engine.load_all(LoadRequest(got.model, got.precision), lambda event: None)
        assert report.precision.startswith("gguf"), report
        assert report.predicted_bytes and report.measured_bytes
        from redline.inference.estimate.estimator import accuracy_margin

        assert abs(report.predicted_bytes - report.measured_bytes) <= accuracy_margin(report.measured_bytes)
    finally:
        engine.unload()
    # The safetensors repository loads as its hub id at the precision predicted.
    rv = variants.repo_variants("me/tiny-chat")
    q8 = next(v for v in rv.variants if v.name == "q8")
    got = fetch(rv, q8)
    assert (got.model, got.precision) == ("me/tiny-chat", "q8") and (got.path / "model.safetensors").is_file()


def test_library_lists_models_and_reclaimables_and_delete_frees_what_it_said(hub, tmp_path):
    from redline.inference.paths import models_dir

    rv = variants.repo_variants("me/tiny-chat-GGUF")
    fetch(rv, rv.variants[0])
    fetch(variants.repo_variants("me/tiny-chat"), variants.repo_variants("me/tiny-chat").variants[0])
    blobs = next(hub.cache.glob("models--me--tiny-chat/blobs"))
    (blobs / ("f" * 64 + ".redline-partial")).write_bytes(b"x" * 100_000)
    orphan = models_dir() / "gguf" / "gone-0123456789ab"
    orphan.mkdir(parents=True)
    (orphan / "config.json").write_text("{}")
    (orphan / ".redline-complete").write_text("converted from gone.gguf\n")
    (orphan / "model.safetensors").write_bytes(b"\0" * 50_000)
    rows = library.local_library()
    kinds = {r.name: r.kind for r in rows}
    assert kinds["me/tiny-chat"] == "hub" and kinds["me/tiny-chat-GGUF/tiny-chat.Q4_0.gguf"] == "gguf"
    assert kinds["me/tiny-chat (partial download)"] == "partial" and kinds["gone-0123456789ab"] == "orphaned"
    assert library.reclaimable_bytes(rows) >= 150_000
    deleted = 0
    while rows:  # one at a time, as a user would, the list read again after each
        row = rows[0]
        said = row.size_bytes
        text = library.delete_text(row)
        assert library.format_bytes(said) in text
        before = library.disk_bytes(hub.cache) + library.disk_bytes(models_dir())
        freed = library.delete(row)
        after = library.disk_bytes(hub.cache) + library.disk_bytes(models_dir())
        assert freed == said == before - after, (row, said, freed, before - after)
        deleted += 1
        rows = library.local_library()
    assert deleted >= 3


def test_a_given_cpu_baseline_moves_the_prediction_by_its_difference(hub):
    from redline.inference.estimate.estimator import CPU_BASELINE_BYTES

    rv = variants.repo_variants("me/tiny-chat")
    plain = predict.predict_repo(rv, 256, "balanced", target(64), SPEED)
    heavy = predict.predict_repo(rv, 256, "balanced", target(64), SPEED, baseline_bytes=CPU_BASELINE_BYTES + 10**9)
    assert [h.total_bytes - p.total_bytes for p, h in zip(plain, heavy)] == [10**9] * len(plain)
    window = CPU_BASELINE_BYTES + 16 * 10**8
    tight = predict.predict_repo(rv, 256, "balanced", target(2.0), SPEED, baseline_bytes=window)
    assert {p.fit for p in tight} <= {predict.TIGHT, predict.NO_FIT}  # a window that holds 2 GB leaves no room
