"""A reply's gaps between tokens as it decodes alone, from a newly loaded model (its KV pool as small as a new
model's): the percentiles and every gap over 2.5x the median, with its token number. A stall that comes back
every so many tokens is ours (a pool growth, a cache), not the machine's.

    python tools/decode_gaps.py [--model starter] [--precision q8] [--tokens 2000]

For an A/B of two checkouts, run it with each on PYTHONPATH (a folder holding a link named ``redline``), in turns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--tokens", type=int, default=2000)
    args = ap.parse_args(argv)

    import torch
    from mixed_step_profile import load_target, request

    from redline.inference.events import TokenEvent
    from redline.inference.generation.batch import Batcher
    from redline.inference.generation.lifecycle import DirectSink

    target = load_target(args.model, args.precision)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, target.tokenizer.vocab_size, (40,), generator=g).tolist()
    times: list[float] = []
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with torch.inference_mode():
        b = Batcher(target, 2)
        sink = DirectSink(lambda e: times.append(time.perf_counter()) if isinstance(e, TokenEvent) else None)
        b.run_one(sink, request(prompt, args.tokens), time.perf_counter())
    gaps = [(t1 - t0) * 1e3 for t0, t1 in zip(times, times[1:])]
    s = sorted(gaps)
    med = statistics.median(gaps)
    print(f"model {args.model}, {args.precision}; {len(times)} tokens; load average {load}")
    print(f"gap ms: p50 {med:.2f}, p90 {s[int(0.9 * len(s))]:.2f}, p99 {s[int(0.99 * len(s))]:.2f}, max {s[-1]:.2f}")
    over = [(i + 1, round(x, 1)) for i, x in enumerate(gaps) if x > 2.5 * med]
    print(f"gaps over 2.5x the median (token, ms): {over}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
