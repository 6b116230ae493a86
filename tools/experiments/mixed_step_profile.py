"""Where the time of a mixed pass goes: one streaming reply's decode step with T rows of a long prompt read in
the same pass (the batcher's ``_mixed``), at a prompt position of about 1,500, with the whole-step operator's stage
profile (``redline::step_profile``). What a long prompt costs a reply streaming beside it, row by row (issue 27.5).

    python tools/experiments/mixed_step_profile.py [--model starter] [--precision q8] [--rows 1,2,4,8,64] [--passes 6]

For an A/B of two checkouts, run it with each on PYTHONPATH (a folder holding a link named ``redline``), in turns.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402

STAGES = ["norm", "qkv", "rotary+cache", "attention", "quantise", "o", "norm", "gate_up", "silu·up", "down", "head"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--rows", default="1,2,4,8,64")
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--position", type=int, default=1500)
    args = ap.parse_args(argv)

    import torch

    from redline.inference.generation.batch import Batcher
    from redline.inference.generation.lifecycle import DirectSink

    target = harness.load(args.model, args.precision).target
    g = torch.Generator().manual_seed(0)
    short = harness.random_ids(target.tokenizer, 40, g)
    long = harness.random_ids(target.tokenizer, args.position + 200 * len(args.rows.split(",")), g)

    profile = torch.ops.redline.step_profile
    load = harness.LoadAverage()
    print(f"model {args.model}, {args.precision}")
    print("| prompt rows | pass ms | " + " | ".join(STAGES) + " |")
    print("|---" * (len(STAGES) + 2) + "|")
    with torch.inference_mode():
        b = Batcher(target, 2)
        b.add(DirectSink(), harness.request(short, 6000), time.perf_counter())
        for _ in range(20):
            b.step()
        b.add(DirectSink(), harness.request(long, 4), time.perf_counter())
        b.pace.fixed = 256  # to the position quickly, then mixed passes of exactly T rows
        while b.active[1].seq.prefilled < args.position:
            b.step()
        b.pace.fixed = None
        for rows in (int(r) for r in args.rows.split(",")):
            b.pace.next_chunk = lambda *a, rows=rows, **k: rows
            b.step()  # the first pass of this size (warm)
            profile(True)
            profile(False)  # cleared
            profile(True)
            t0 = time.perf_counter()
            for _ in range(args.passes):
                b.step()
            ms = (time.perf_counter() - t0) * 1e3 / args.passes
            stages = (profile(False)[: len(STAGES)] * 1e3 / args.passes).tolist()
            print(f"| {rows} | {ms:.2f} | " + " | ".join(f"{s:.2f}" for s in stages) + " |", flush=True)
        b.cancel_all("profile over")
        while len(b):
            b.step()
    print(f"load average {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
