"""The pages of a mapped checkpoint that the fast path copied go back to the system (memory/policy.py, 3.):
released where they lie in a mapping of a file, with their contents kept; anonymous memory is left alone."""

from __future__ import annotations

import sys

import psutil
import pytest
import torch

from redline.inference.memory.policy import release_pages, releases_pages

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and releases_pages()), reason="MADV_PAGEOUT is Linux's"
)
MB = 1 << 20


def test_a_mapped_files_pages_are_given_back_and_read_again_unchanged(tmp_path):
    path = tmp_path / "weights.bin"
    data = torch.arange(16 * MB, dtype=torch.int32)  # 64 MB
    path.write_bytes(data.numpy().tobytes())
    mapped = torch.from_file(str(path), shared=False, size=data.numel(), dtype=torch.int32)
    assert int(mapped.sum()) == int(data.sum())  # every page read: resident
    before = psutil.Process().memory_info().rss
    asked = release_pages([mapped])
    after = psutil.Process().memory_info().rss
    assert asked >= 60 * MB
    assert before - after >= 40 * MB, (before, after)  # given back (the kernel may keep a few)
    assert torch.equal(mapped, data)  # read again from the file: the same values


def test_anonymous_memory_is_left_alone():
    t = torch.ones(8 * MB, dtype=torch.float32)
    assert release_pages([t, None]) == 0
    assert float(t.sum()) == 8 * MB


def test_the_fast_path_releases_the_originals_it_copied(tmp_path):
    """After the fast path's fusion, the q/k/v/gate/up weights' original pages are mostly not mapped any more (a
    few just faulted in may still wait in the kernel's per-CPU batches, which the page-out cannot take)."""
    import os

    from conftest import build_tiny_model

    from redline.inference.decoding.fastpath import get_decoder
    from redline.inference.engine import Engine
    from redline.inference.precision import parse_precision

    folder = build_tiny_model(tmp_path / "wide", layers=1, hidden=512, heads=8, kv_heads=4)  # MLP 2 MB in fp32
    engine = Engine("cpu")
    loaded = engine.load(str(folder), parse_precision("fp32"))  # stored in fp32: views of the mapping
    layer = loaded.model.model.layers[0]
    original = layer.mlp.gate_proj.weight.data
    assert float(original.abs().sum()) > 0  # read: its pages are resident
    storage = original.untyped_storage()
    page = os.sysconf("SC_PAGE_SIZE")
    lo = -(-storage.data_ptr() // page) * page
    hi = (storage.data_ptr() + storage.nbytes()) // page * page
    if hi <= lo:
        pytest.skip("the tiny weight spans no whole page")

    def resident() -> int:
        """Pages of the range mapped in this process (/proc/self/pagemap's bit 63), not merely cached."""
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(lo // page * 8)
            raw = f.read((hi - lo) // page * 8)
        return sum(int.from_bytes(raw[i : i + 8], "little") >> 63 for i in range(0, len(raw), 8))

    pages = (hi - lo) // page
    assert resident() == pages
    get_decoder(loaded, 32)
    assert layer.mlp.gate_proj.weight.untyped_storage().data_ptr() != storage.data_ptr()  # now a fused view
    assert resident() <= pages // 4, (resident(), pages)
    engine.unload()


def test_one_reading_of_the_mappings_serves_every_release_inside_it(tmp_path, monkeypatch):
    """The decoder's build gives pages back after each fusion; inside ``one_reading_of_the_mappings`` the process's
    file mappings are read once for all of them (reading /proc/self/maps each time was most of the first reply's
    wait), and the releases still find the mapped file and still leave anonymous memory alone."""
    from redline.inference.memory import policy

    path = tmp_path / "weights.bin"
    path.write_bytes(torch.arange(4 * MB, dtype=torch.int32).numpy().tobytes())
    mapped = torch.from_file(str(path), shared=False, size=4 * MB, dtype=torch.int32)
    assert int(mapped[::1024].sum()) >= 0
    reads = []
    real = policy._file_mappings
    monkeypatch.setattr(policy, "_file_mappings", lambda: reads.append(1) or real())
    with policy.one_reading_of_the_mappings():
        with policy.one_reading_of_the_mappings():  # nested: still the one reading
            assert release_pages([mapped[: 2 * MB]]) >= 4 * MB
        assert release_pages([torch.ones(MB)]) == 0
        assert release_pages([mapped[2 * MB :]]) >= 4 * MB
    assert len(reads) == 1
    release_pages([mapped])
    assert len(reads) == 2  # outside, each call reads them afresh (a file may have been mapped since)
