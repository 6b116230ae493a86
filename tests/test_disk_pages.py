"""Prefix-cache pages on disk (inference/decoding/disk_pages.py): a conversation stays warm across restarts, and a
page file that is not exactly the page a prompt needs (corrupt, truncated, another model's, renamed, another
format) is ignored, deleted and recomputed, never trusted."""

from __future__ import annotations

import struct

import pytest
import torch

from redline.inference import DecodeOptions, Engine, EngineService, GenerationRequest, SamplingSettings
from redline.inference.decoding.disk_pages import FORMAT_VERSION, MAGIC, SUFFIX, DiskPages
from redline.inference.decoding.kv_cache import PAGE_TOKENS, PagedKV, chain_keys
from redline.inference.generation.batch import disk_pages_win
from redline.inference.precision import parse_precision

P = PAGE_TOKENS
TIMEOUT = 120
LAYERS, HEADS, DIM = 2, 1, 8


def pool(root, namespace: bytes = b"model-a", cache_pages: int = 8, limit: int = 10**9) -> PagedKV:
    kv = PagedKV(LAYERS, HEADS, DIM, torch.float32, "cpu", tokens=256)
    kv.set_cache(namespace, cache_pages)
    kv.disk = DiskPages(root, namespace, limit)
    return kv


def run_sequence(kv: PagedKV, seq: int, tokens: list[int]) -> int:
    """Takes what the cache holds of ``tokens`` and writes the rest: at each position, in every layer, K = the
    token id and V = minus it, so what a page holds says which tokens computed it."""
    cached = kv.attach(seq, tokens)
    kv.reserve(seq, len(tokens))
    for pos in range(cached, len(tokens)):
        page, off = kv.tables[seq][pos // kv.page], pos % kv.page
        kv.k[:, page, :, off] = tokens[pos]
        kv.v[:, page, :, off] = -tokens[pos]
    kv.release(seq, tokens)
    return cached


def read_back(kv: PagedKV, seq: int, n: int) -> list[int]:
    out = []
    for p in range(n):
        page, off = kv.tables[seq][p // kv.page], p % kv.page
        k, v = kv.k[:, page, :, off], kv.v[:, page, :, off]
        assert torch.all(k == k.flatten()[0]) and torch.all(v == -k)  # every layer, head and dim; V is minus K
        out.append(int(k.flatten()[0]))
    return out


TOKENS = list(range(1, 3 * P + 10))  # three full pages and a partial fourth


def restarted(tmp_path, **kw) -> PagedKV:
    """A pool that served TOKENS and was persisted, then a new pool (a restart) on the same folder."""
    first = pool(tmp_path, **kw)
    run_sequence(first, 1, TOKENS)
    assert first.persist() == 3  # the three full pages; the partial one is never kept
    return pool(tmp_path, **kw)


def page_files(tmp_path, namespace: bytes = b"model-a") -> list:
    keys = chain_keys(namespace, TOKENS, P, 3)
    return [tmp_path / namespace.hex() / f"{k.hex()}{SUFFIX}" for k in keys]


def test_persisted_pages_are_read_back_after_a_restart(tmp_path):
    kv = restarted(tmp_path)
    assert all(f.is_file() for f in page_files(tmp_path))
    assert kv.attach(2, TOKENS) == 3 * P and kv.disk_hits == 3
    assert read_back(kv, 2, 3 * P) == TOKENS[: 3 * P]
    kv.release(2, TOKENS)
    assert kv.attach(3, TOKENS) == 3 * P and kv.disk_hits == 3  # now registered in memory: no second read


def test_pages_are_read_back_into_a_pool_that_grew_during_a_step(tmp_path):
    # A pool that grew inside a step (inference mode) holds inference tensors; the walk that reads pages from disk
    # runs before the request's first step, outside it (a second engine in one process failed here).
    kv = restarted(tmp_path)
    with torch.inference_mode():
        kv.k, kv.v = kv.k.clone(), kv.v.clone()
    assert kv.k.is_inference()
    assert kv.attach(2, TOKENS) == 3 * P and kv.disk_hits == 3
    assert read_back(kv, 2, 3 * P) == TOKENS[: 3 * P]


def test_an_evicted_page_goes_to_disk_and_comes_back(tmp_path):
    kv = pool(tmp_path, cache_pages=3)
    run_sequence(kv, 1, TOKENS)
    other = [5000 + i for i in range(3 * P + 1)]
    run_sequence(kv, 2, other)  # its three pages evict TOKENS' three: each is written as it goes
    kv.disk.flush()
    assert all(f.is_file() for f in page_files(tmp_path)) and not kv.page_of.get(
        chain_keys(b"model-a", TOKENS, P, 1)[0]
    )
    assert kv.attach(3, TOKENS) == 3 * P and kv.disk_hits == 3
    assert read_back(kv, 3, 3 * P) == TOKENS[: 3 * P]


def _corrupt_payload(path):
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-100])


def _wrong_version(path):
    data = bytearray(path.read_bytes())
    struct.pack_into("<8sI", data, 0, MAGIC, FORMAT_VERSION + 1)
    path.write_bytes(bytes(data))


def _renamed(path):
    """The file of another page (the first) under this page's name: its key and token ids are another's."""
    first = sorted(path.parent.iterdir())
    source = next(f for f in first if f != path)
    path.write_bytes(source.read_bytes())


BREAKAGES = {
    "corrupt payload": _corrupt_payload,
    "truncated file": _truncate,
    "wrong format version": _wrong_version,
    "wrong token ids (renamed file)": _renamed,
}


@pytest.mark.parametrize("how", list(BREAKAGES))
def test_a_bad_page_file_is_ignored_deleted_and_recomputed(tmp_path, how):
    kv = restarted(tmp_path)
    files = page_files(tmp_path)
    BREAKAGES[how](files[1])  # the second page: the first is still read, the walk stops at the second
    assert kv.attach(2, TOKENS) == P
    assert kv.disk.rejected == 1 and not files[1].exists() and files[2].exists()
    assert read_back(kv, 2, P) == TOKENS[:P]
    kv.release(2, None)


def test_another_models_page_under_this_models_key_is_ignored(tmp_path):
    """A page file copied into another namespace's folder under the name that namespace's walk asks for."""
    restarted(tmp_path)
    mine, theirs = page_files(tmp_path), page_files(tmp_path, b"model-b")
    theirs[0].parent.mkdir(parents=True)
    theirs[0].write_bytes(mine[0].read_bytes())
    kv = pool(tmp_path, namespace=b"model-b")
    assert kv.attach(2, TOKENS) == 0 and kv.disk.rejected == 1 and not theirs[0].exists()
    assert "namespace" in kv.disk.last_error


def test_a_page_of_another_dtype_or_shape_is_ignored(tmp_path):
    restarted(tmp_path)
    kv = PagedKV(LAYERS + 1, HEADS, DIM, torch.float32, "cpu", tokens=256)  # same name, other shape
    kv.set_cache(b"model-a", 8)
    kv.disk = DiskPages(tmp_path, b"model-a")
    assert kv.attach(2, TOKENS) == 0 and kv.disk.rejected == 1


def test_the_store_keeps_within_its_size_least_recently_used_out_first(tmp_path):
    kv = restarted(tmp_path)
    size = page_files(tmp_path)[0].stat().st_size
    limit = 4 * (size + 192)  # four pages (a header grows by 64-byte steps with its token ids' digits)
    small = pool(tmp_path, namespace=b"model-b", limit=limit)  # one limit for the whole folder
    run_sequence(small, 1, [7000 + i for i in range(2 * P + 1)])
    small.persist()
    left = sorted(tmp_path.glob(f"*/*{SUFFIX}"))
    assert len(left) == 4 and small.disk.total_bytes() <= limit
    # The oldest went first, and of a sequence's pages its last: a chain that lost its first page would lose
    # every page after it (each is found through the one before).
    assert not page_files(tmp_path)[2].exists() and page_files(tmp_path)[0].exists()
    assert kv.attach(2, TOKENS) == 2 * P  # the first two pages from disk; the third is computed again


def test_a_write_that_died_leaves_no_page(tmp_path):
    import os
    import time

    kv = restarted(tmp_path)
    stale = page_files(tmp_path)[0].parent / ".dead.1.2.tmp"
    stale.write_bytes(b"half a page")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    DiskPages(tmp_path, b"model-a")
    assert not stale.exists()
    assert kv.attach(2, TOKENS) == 3 * P


def test_disk_pages_are_off_where_reading_would_not_win():
    assert disk_pages_win(True, "cpu") is None
    assert "GPU" in disk_pages_win(True, "cuda:0")
    assert "one page per sequence" in disk_pages_win(False, "cpu")


def test_a_store_without_a_size_is_refused_in_one_sentence(tmp_path):
    with pytest.raises(ValueError, match="size limit"):
        DiskPages(tmp_path, b"ns", 0)


# -- a restart, through the engine service -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    from conftest import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("disk") / "tiny-2k", max_positions=2048)


MESSAGES = [
    {"role": "system", "content": "Answer about local models and their speed. " * 12},
    {"role": "user", "content": "Question: how fast is int8 on a consumer GPU? " * 6},
]


def ask(svc, reuse=True):
    request = GenerationRequest(
        messages=list(MESSAGES),
        sampling=SamplingSettings(max_new_tokens=16, temperature=0),
        options=DecodeOptions("fast", reuse_prefix=reuse),
    )
    return svc.submit(request).result(TIMEOUT)


def start(folder):
    svc = EngineService(lambda: Engine("cpu"))
    svc.load(str(folder), parse_precision("fp32")).result(TIMEOUT)
    return svc


def kv_pages(tmp_path):
    return sorted(tmp_path.glob(f"*/*{SUFFIX}"))


@pytest.fixture
def pages_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_KV_PAGES_DIR", str(tmp_path))
    return tmp_path


def test_a_conversation_stays_warm_across_a_restart(pages_dir, model_folder, native_kernels):
    svc = start(model_folder)
    try:
        cold = ask(svc, reuse=False)
        first = ask(svc)
    finally:
        svc.shutdown()  # quitting with the model loaded: its pages are written
    assert first.cached_tokens == 0 and len(kv_pages(pages_dir)) >= first.prompt_tokens // P > 0
    svc = start(model_folder)
    try:
        again = ask(svc)
        svc.unload().result(TIMEOUT)  # the unload writes too (nothing new here: the pages are on disk already)
    finally:
        svc.shutdown()
    assert again.cached_tokens == (first.prompt_tokens - 1) // P * P > 0  # the whole prompt but its last page
    assert again.token_ids == cold.token_ids == first.token_ids  # greedy fp32: token for token


@pytest.mark.parametrize("how", list(BREAKAGES))
def test_after_a_restart_a_bad_page_file_is_recomputed_with_the_same_answer(
    pages_dir, model_folder, native_kernels, how
):
    svc = start(model_folder)
    try:
        cold = ask(svc, reuse=False)
        ask(svc)
    finally:
        svc.shutdown()
    files = kv_pages(pages_dir)
    assert len(files) >= 2
    if BREAKAGES[how] is _renamed:  # each file holds the next one's page (a snapshot: none gets its own back)
        pages = [f.read_bytes() for f in files]
        for i, f in enumerate(files):
            f.write_bytes(pages[(i + 1) % len(files)])
    else:
        for f in files:
            BREAKAGES[how](f)
    svc = start(model_folder)
    try:
        again = ask(svc)
    finally:
        svc.shutdown()
    assert again.cached_tokens == 0 and again.token_ids == cold.token_ids


def test_after_a_restart_another_models_pages_are_never_used(pages_dir, model_folder, tmp_path_factory, native_kernels):
    """Another model's files at the same path (a re-download: other bytes, other times) start another namespace."""
    import shutil

    svc = start(model_folder)
    try:
        ask(svc)
    finally:
        svc.shutdown()
    assert kv_pages(pages_dir)
    from conftest import build_tiny_model

    other = build_tiny_model(tmp_path_factory.mktemp("disk-other") / "tiny-2k", max_positions=2048, seed=5)
    moved = model_folder.parent / "moved-away"
    model_folder.rename(moved)
    shutil.copytree(other, model_folder)
    try:
        svc = start(model_folder)
        try:
            cold = ask(svc, reuse=False)
            again = ask(svc)
        finally:
            svc.shutdown()
    finally:
        shutil.rmtree(model_folder)
        moved.rename(model_folder)
    assert again.cached_tokens == 0 and again.token_ids == cold.token_ids
