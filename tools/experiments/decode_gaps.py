"""A reply's gaps between tokens as it decodes alone, from a newly loaded model (its KV pool as small as a new
model's): the percentiles and every gap over 2.5x the median, with its token number. A stall that comes back
every so many tokens is ours (a pool growth, a cache), not the machine's.

    python tools/experiments/decode_gaps.py [--model starter] [--precision q8] [--tokens 2000]

For an A/B of two checkouts, run it with each on PYTHONPATH (a folder holding a link named ``redline``), in turns.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--tokens", type=int, default=2000)
    args = ap.parse_args(argv)

    import torch

    from redline.inference.events import TokenEvent
    from redline.inference.generation.batch import Batcher
    from redline.inference.generation.lifecycle import DirectSink

    target = harness.load(args.model, args.precision).target
    prompt = harness.random_ids(target.tokenizer, 40, torch.Generator().manual_seed(0))
    times: list[float] = []
    load = harness.LoadAverage()
    with torch.inference_mode():
        b = Batcher(target, 2)
        sink = DirectSink(lambda e: times.append(time.perf_counter()) if isinstance(e, TokenEvent) else None)
        b.run_one(sink, harness.request(prompt, args.tokens), time.perf_counter())
    gaps = [(t1 - t0) * 1e3 for t0, t1 in zip(times, times[1:])]
    med, p90, p99 = (harness.percentile(gaps, q) for q in (0.5, 0.9, 0.99))
    print(f"model {args.model}, {args.precision}; {len(times)} tokens; load average {load}")
    print(f"gap ms: p50 {med:.2f}, p90 {p90:.2f}, p99 {p99:.2f}, max {max(gaps):.2f}")
    over = [(i + 1, round(x, 1)) for i, x in enumerate(gaps) if x > 2.5 * med]
    print(f"gaps over 2.5x the median (token, ms): {over}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
