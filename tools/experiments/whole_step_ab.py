"""The fast path with and without the whole-step operator (``redline::decode_step``, decode_step.cpp) for decode
steps and short prompts alike,
interleaved on one engine per precision (A B, then B A, …): decode tokens/s and TTFT of the short chat
prompt, and the median of the per-round ratios (whole step ÷ operator by operator):

    python tools/experiments/whole_step_ab.py [--precisions bf16,q8,q4] [--rounds 5] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precisions", default="bf16,q8,q4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args(argv)

    from redline.inference.decoding.fastpath import get_decoder

    load = harness.LoadAverage()
    for precision in args.precisions.split(","):
        engine = harness.load("starter", precision)
        target = engine.target
        ids = harness.prompt_ids(target.tokenizer, "short")
        n = args.new_tokens
        harness.reply(target, ids, n)  # warm-up: fuses the weights, builds the decoder
        dec = get_decoder(target, len(ids) + n)
        if dec.whole_step_plan is None:
            print(f"{precision}: no whole step here ({dec.whole_step_reason})")
            continue
        prefill_default = dec.whole_prefill
        rows = {True: [], False: []}
        tokens = {}
        for r in range(args.rounds):
            for whole in harness.order((True, False), r):
                dec.whole_step = dec.whole_prefill = whole
                result = harness.reply(target, ids, n)
                rows[whole].append((result.tokens_per_s, result.ttft_ms))
                tokens.setdefault(whole, result.token_ids)
        dec.whole_step, dec.whole_prefill = True, prefill_default
        speed = harness.median_ratio([a[0] for a in rows[True]], [b[0] for b in rows[False]])
        ttft = harness.median_ratio([b[1] for b in rows[False]], [a[1] for a in rows[True]])

        def med(xs, i):
            return statistics.median(x[i] for x in xs)

        print(
            f"{precision}: decode tok/s whole {med(rows[True], 0):.1f} vs per-op {med(rows[False], 0):.1f} "
            f"(median ratio {speed:.2f}x); TTFT ms whole {med(rows[True], 1):.0f} vs per-op "
            f"{med(rows[False], 1):.0f} ({ttft:.2f}x faster); same tokens: {tokens[True] == tokens[False]}"
        )
        engine.unload()
    print(f"prompt {len(ids)} tokens, {args.new_tokens} new; load average {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
