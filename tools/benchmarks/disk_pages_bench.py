"""Does reading prefix-cache pages from disk beat computing them? (issue 27, item 3: keep it only where it wins.)

For each prompt length, in interleaved rounds on one loaded model, a reply whose prompt is

- **computed**: no page cached, in memory or on disk (what a restart costs without disk pages);
- **from disk, warm**: every full page on disk, none in memory, the files in the OS page cache (a restart soon
  after quitting: the files were just written);
- **from disk, cold**: the same after ``os.posix_fadvise(POSIX_FADV_DONTNEED)`` on each file (a restart after a
  reboot, or once the OS has dropped them): read from the drive itself.

It prints the median time to the first token of each (one new token, greedy), the median time of the page loads
alone (``PagedKV.attach``: read, check, copy into the pool), what writing a page costs the engine's thread (the
copy handed to the writer) and the writer (the file), the bytes per page, and the load average.

    python tools/benchmarks/disk_pages_bench.py [--model starter] [--precision bf16] [--tokens 512,2048] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402


def drop_from_page_cache(folder: Path) -> bool:
    """Ask the OS to forget the files' pages (clean pages only: synced first); False where it cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    os.sync()
    for path in folder.glob("*/*.kvp"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def reply(batcher, ids: list[int]):
    from redline.inference import DecodeOptions, GenerationRequest, SamplingSettings
    from redline.inference.generation.lifecycle import DirectSink

    request = GenerationRequest(input_ids=list(ids), sampling=SamplingSettings(max_new_tokens=1, temperature=0))
    request.options = DecodeOptions("fast", reuse_prefix=True)
    request.record = False
    return batcher.run_one(DirectSink(), request, time.perf_counter())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--tokens", default="512,2048", help="prompt lengths (full pages of 64 are what disk can hold)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    from redline.inference.decoding.disk_pages import DiskPages

    folder = Path(tempfile.mkdtemp(prefix="redline-kv-pages-bench-"))
    load = harness.LoadAverage()
    engine = harness.load(args.model, args.precision)
    target = engine.target
    batcher = target.batcher()
    kv = batcher.dec.kv
    if not kv.paged:
        print(f"This device's KV cache is one page per sequence ({engine.device}): no pages to keep on disk.")
        return 1
    batcher.set_prefix_cache(1 << 40)  # every page of the longest prompt stays (within the KV budget)
    store = DiskPages(folder, batcher.namespace, 1 << 40)
    vocab = target.tokenizer.vocab_size
    g = torch.Generator().manual_seed(0)
    lengths = [int(t) for t in args.tokens.split(",")]
    modes = ("computed", "disk warm", "disk cold")
    ttft: dict[tuple[int, str], list[float]] = {}
    load_ms: dict[tuple[int, str], list[float]] = {}
    copy_ms, write_ms = [], []
    with torch.inference_mode():
        for n in lengths:
            pages = n // kv.page
            ids = torch.randint(100, vocab, (pages * kv.page + 1,), generator=g).tolist()
            reply(batcher, ids)  # a first reply (warms the kernels); its pages are registered
            kv.disk = store
            t0 = time.perf_counter()
            for page in list(kv.idle):
                kv._save(page)
            copy_ms.append((time.perf_counter() - t0) * 1e3 / pages)
            t0 = time.perf_counter()
            store.flush()
            write_ms.append((time.perf_counter() - t0) * 1e3 / pages)
            for r in range(args.rounds):
                order = modes[r % 3 :] + modes[: r % 3]
                for mode in order:
                    kv.forget_cache()  # nothing in memory: a restart
                    kv.disk = None if mode == "computed" else store
                    if mode == "disk cold" and not drop_from_page_cache(folder):
                        continue
                    if mode != "computed":  # the loads alone, then the same again as a whole reply
                        t0 = time.perf_counter()
                        got = kv.attach(-1, ids)
                        load_ms.setdefault((n, mode), []).append((time.perf_counter() - t0) * 1e3)
                        assert got == pages * kv.page, f"{mode}: {got} of {pages * kv.page} positions from disk"
                        kv.release(-1, None)
                        kv.forget_cache()
                        if mode == "disk cold":
                            drop_from_page_cache(folder)
                    result = reply(batcher, ids)
                    expected = 0 if mode == "computed" else pages * kv.page
                    got = result.cached_tokens
                    assert got == expected, f"{mode}: {got} cached, {expected} expected"
                    ttft.setdefault((n, mode), []).append(result.ttft_ms)
                print(f"{n} tokens: round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = statistics.median
    print(
        f"model {args.model}, {args.precision} ({kv.dtype}), device {engine.device}; "
        f"{kv.page_bytes / 1e6:.2f} MB a page of {kv.page} tokens; {args.rounds} interleaved rounds; "
        f"load average {load}"
    )
    print(
        f"writing a page: {med(copy_ms):.2f} ms on the engine's thread (the copy), "
        f"{med(write_ms):.2f} ms on the writer's (the file)"
    )
    print(f"{'prompt':>7} {'mode':<10} {'TTFT ms':>9} {'pages loaded in ms':>19} {'MB/s':>7}")
    for n in lengths:
        pages = n // kv.page
        for mode in modes:
            if (n, mode) not in ttft:
                continue
            loads = load_ms.get((n, mode))
            loaded = f"{med(loads):>19.1f} {pages * kv.page_bytes / 1e3 / med(loads):>7.0f}" if loads else f"{'':>27}"
            print(f"{n:>7} {mode:<10} {med(ttft[(n, mode)]):>9.1f} {loaded}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
