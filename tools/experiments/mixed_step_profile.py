"""Where the time of a mixed pass goes: one streaming reply's decode step with T rows of a long prompt read in
the same pass (the batcher's ``_mixed``), at a prompt position of about 1,500, with the whole-step operator's stage
profile (``redline::step_profile``). What a long prompt costs a reply streaming beside it, row by row (issue 27.5).

    python tools/mixed_step_profile.py [--model starter] [--precision q8] [--rows 1,2,4,8,64] [--passes 6]

For an A/B of two checkouts, run it with each on PYTHONPATH (a folder holding a link named ``redline``), in turns.
"""

from __future__ import annotations

import argparse
import os
import time

STAGES = ["norm", "qkv", "rotary+cache", "attention", "quantise", "o", "norm", "gate_up", "silu·up", "down", "head"]


def load_target(model: str, precision: str):
    """The model loaded as the app loads it, without recording its memory (a benchmark's loads are not the user's)."""
    from redline.inference import Engine, resolve_precision

    engine = Engine()
    engine.record_memory = False
    engine.load(model, resolve_precision(precision, engine.device))
    return engine.target


def request(ids, new: int):
    """A greedy request on the fast path of exactly ``new`` tokens, sharing no prefix with earlier ones."""
    from redline.inference import DecodeOptions, GenerationRequest, SamplingSettings

    return GenerationRequest(
        input_ids=ids,
        sampling=SamplingSettings(max_new_tokens=new, temperature=0, min_new_tokens=new),
        options=DecodeOptions(strategy="fast", reuse_prefix=False),
        record=False,
    )


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

    target = load_target(args.model, args.precision)
    g = torch.Generator().manual_seed(0)
    vocab = target.tokenizer.vocab_size
    short = torch.randint(100, vocab, (40,), generator=g).tolist()
    long = torch.randint(100, vocab, (args.position + 200 * len(args.rows.split(",")),), generator=g).tolist()

    profile = torch.ops.redline.step_profile
    print(f"model {args.model}, {args.precision}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| prompt rows | pass ms | " + " | ".join(STAGES) + " |")
    print("|---" * (len(STAGES) + 2) + "|")
    with torch.inference_mode():
        b = Batcher(target, 2)
        b.add(DirectSink(), request(short, 6000), time.perf_counter())
        for _ in range(20):
            b.step()
        b.add(DirectSink(), request(long, 4), time.perf_counter())
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
