"""Which chunk size reads a prompt fastest when nothing streams beside it? (issue 27.4) The batcher reads a
prompt alone in chunks of PREFILL_CHUNK tokens; this times a fresh prompt's first token with the chunk fixed at
each size given, in interleaved rounds (A B C, C B A, ...) on the same loaded model, and prints the median
TTFT per size and the median of the per-round ratios against the first size, with the load average.

    python tools/experiments/prefill_chunk_ab.py [--model starter] [--precisions bf16,q8,q4] [--prompt-tokens 300]
        [--chunks 256,128,64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402


def ttft(target, batcher_cls, chunk: int, ids: list[int]) -> float:
    from redline.inference.events import TokenEvent
    from redline.inference.generation.lifecycle import DirectSink

    b = batcher_cls(target, 1, prefill_chunk=chunk)
    first: list[float] = []

    def on_event(event):
        if isinstance(event, TokenEvent) and not first:
            first.append(time.perf_counter())

    t0 = time.perf_counter()
    b.add(DirectSink(on_event), harness.request(ids, 2), t0)
    while len(b):
        b.step()
    return first[0] - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precisions", default="bf16,q8,q4")
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--chunks", default="256,128,64")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    from redline.inference.generation.batch import Batcher

    chunks = [int(c) for c in args.chunks.split(",")]
    load = harness.LoadAverage()
    out = []
    for precision in args.precisions.split(","):
        engine = harness.load(args.model, precision)
        target = engine.target
        g = torch.Generator().manual_seed(0)
        times: dict[int, list[float]] = {c: [] for c in chunks}
        with torch.inference_mode():
            for c in chunks:  # warm-up: each size's buffers and code paths once
                ttft(target, Batcher, c, harness.random_ids(target.tokenizer, args.prompt_tokens, g))
            for r in range(args.rounds):
                for c in harness.order(chunks, r):
                    ids = harness.random_ids(target.tokenizer, args.prompt_tokens, g)
                    times[c].append(ttft(target, Batcher, c, ids))
                print(f"{precision}: round {r + 1}/{args.rounds} done", file=sys.stderr)
        base = chunks[0]
        for c in chunks:
            ratio = harness.median_ratio(times[base], times[c])
            out.append((precision, c, statistics.median(times[c]), ratio))
        engine.unload()
    print(
        f"model {args.model}; a fresh {args.prompt_tokens}-token prompt read alone; {args.rounds} interleaved rounds; "
        f"load average {load}"
    )
    print(f"{'precision':<10} {'chunk':>6} {'TTFT ms':>9} {'speed-up vs ' + str(chunks[0]):>16}")
    for precision, c, t, ratio in out:
        print(f"{precision:<10} {c:>6} {t * 1000:>9.1f} {ratio:>15.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
