"""The fast path with and without the whole-step operator (``redline::decode_step``, decode_step.cpp) for decode
steps and short prompts alike,
interleaved on one engine per precision (A B, then B A, …): decode tokens/s and TTFT of the short chat
prompt, and the median of the per-round ratios (whole step ÷ operator by operator):

    python tools/whole_step_ab.py [--precisions bf16,q8,q4] [--rounds 5] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precisions", default="bf16,q8,q4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args(argv)

    from redline.inference import Engine, SamplingSettings, load_prompt_set, resolve_precision
    from redline.inference.decoding.fastpath import get_decoder
    from redline.inference.decoding.options import DecodeOptions
    from redline.inference.decoding.prompt import build_prompt
    from redline.inference.generation.run import generate

    before = os.getloadavg()
    for precision in args.precisions.split(","):
        engine = Engine()
        engine.record_memory = False
        engine.load("starter", resolve_precision(precision, engine.device))
        target = engine.target
        ids = build_prompt(target.tokenizer, load_prompt_set("short").prompts[0].messages, 4096, 64).input_ids
        n = args.new_tokens
        sampling = SamplingSettings(max_new_tokens=n, temperature=0, min_new_tokens=n)
        fast = DecodeOptions(strategy="fast")
        generate(target, ids, sampling, fast)  # warm-up: fuses the weights, builds the decoder
        dec = get_decoder(target, len(ids) + n)
        if dec.whole_step_plan is None:
            print(f"{precision}: no whole step here ({dec.whole_step_reason})")
            continue
        prefill_default = dec.whole_prefill
        rows = {True: [], False: []}
        tokens = {}
        for r in range(args.rounds):
            for whole in (True, False) if r % 2 == 0 else (False, True):
                dec.whole_step = dec.whole_prefill = whole
                result = generate(target, ids, sampling, fast)
                rows[whole].append((result.tokens_per_s, result.ttft_ms))
                tokens.setdefault(whole, result.token_ids)
        dec.whole_step, dec.whole_prefill = True, prefill_default
        speed = statistics.median(a[0] / b[0] for a, b in zip(rows[True], rows[False]))
        ttft = statistics.median(b[1] / a[1] for a, b in zip(rows[True], rows[False]))

        def med(xs, i):
            return statistics.median(x[i] for x in xs)

        print(
            f"{precision}: decode tok/s whole {med(rows[True], 0):.1f} vs per-op {med(rows[False], 0):.1f} "
            f"(median ratio {speed:.2f}x); TTFT ms whole {med(rows[True], 1):.0f} vs per-op "
            f"{med(rows[False], 1):.0f} ({ttft:.2f}x faster); same tokens: {tokens[True] == tokens[False]}"
        )
        engine.unload()
    print(f"prompt {len(ids)} tokens, {args.new_tokens} new; load average {before[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
