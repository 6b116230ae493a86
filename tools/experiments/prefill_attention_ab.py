"""A few prompt rows after cached positions: torch's attention (the pages read out into one tensor per layer)
against the native attention operator over the pages in place (``FastDecoder._prefill_native``), on the same
loaded model and the same rows, alternated (A B, B A, ...). For each (cached positions, new rows) it prints the
median time of each and the median of the per-round ratios, with the load average.

    python tools/experiments/prefill_attention_ab.py [--model starter] [--precision q8] [--rounds 5]
        [--shapes 0:33,64:14,1728:14,1728:127,3840:256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="0:33,64:14,1728:14,1728:127,3840:256")
    args = ap.parse_args(argv)
    import torch

    load = harness.LoadAverage()
    engine = harness.load(args.model, args.precision)
    target = engine.target
    target.batcher()
    dec = target.fast_decoder
    if not dec.native:
        print("the native kernels do not run here: nothing to compare")
        return 1
    g = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for n, (cached, new) in enumerate(tuple(map(int, s.split(":"))) for s in args.shapes.split(",")):
            seq = 1000 + n
            if cached:
                dec.prefill(torch.tensor(harness.random_ids(target.tokenizer, cached, g)), 0, seq=seq)
            ids = torch.tensor(harness.random_ids(target.tokenizer, new, g))
            x = dec._embed(ids)
            arms = {
                "torch": lambda ids=ids, cached=cached, seq=seq: _torch_path(dec, ids, cached, seq),
                "native": lambda x=x, cached=cached, seq=seq: dec._prefill_native(x, cached, seq),
            }
            times: dict[str, list[float]] = {a: [] for a in arms}
            for arm in arms:  # warm-up
                arms[arm]()
            for r in range(args.rounds):
                for arm in harness.order(list(arms), r):
                    t0 = time.perf_counter()
                    arms[arm]()
                    times[arm].append(time.perf_counter() - t0)
            dec.kv.release(seq)
            rows.append((cached, new, times))
    print(f"model {args.model} at {args.precision}; KV {dec.kv.form}; {args.rounds} alternated rounds; load {load}")
    print(f"{'cached':>7} {'new':>5} {'torch ms':>9} {'native ms':>10} {'torch ÷ native':>15}")
    for cached, new, t in rows:
        print(
            f"{cached:>7} {new:>5} {statistics.median(t['torch']) * 1000:>9.1f} "
            f"{statistics.median(t['native']) * 1000:>10.1f} {harness.median_ratio(t['torch'], t['native']):>14.2f}×"
        )
    engine.unload()
    return 0


def _torch_path(dec, ids, start: int, seq: int):
    dec.native_prefill = False
    try:
        return dec.prefill(ids, start, seq=seq)
    finally:
        dec.native_prefill = True


if __name__ == "__main__":
    raise SystemExit(main())
