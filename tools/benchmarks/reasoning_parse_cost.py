"""What splitting a reasoning model's reply costs the decode: the same greedy reply on the fast path with the split on
and off (``ReplySplit.for_reply`` made to return None), interleaved in the same run, the median of the per-round
ratios of decode tokens/s; and the parser alone per token, and the format's detection per reply (all a model that
does not reason pays: it is never split).

    python tools/benchmarks/reasoning_parse_cost.py --rounds 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "accuracy"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per reply (default 48)")
    args = ap.parse_args(argv)

    from make_thinking_model import ensure_thinking_model

    from redline.inference import DecodeOptions, GenerationRequest, SamplingSettings
    from redline.inference.engine import Engine
    from redline.inference.generation import lifecycle
    from redline.inference.generation.lifecycle import DirectSink
    from redline.inference.precision import PrecisionSpec
    from redline.inference.reasoning import ReasoningStream, detect
    from redline.inference.reasoning.formats import by_name
    from redline.inference.reasoning.split import ReplySplit

    engine = Engine(device="cpu")
    engine.load(str(ensure_thinking_model()), PrecisionSpec("fp32"))
    question = [{"role": "user", "content": "What is 12 + 30?"}]
    real = ReplySplit.for_reply

    def reply(split: bool):
        lifecycle.ReplySplit.for_reply = real if split else (lambda *a, **k: None)
        try:
            request = GenerationRequest(
                messages=question,
                sampling=SamplingSettings(max_new_tokens=args.tokens, min_new_tokens=args.tokens, temperature=0),
                options=DecodeOptions("fast"),
            )
            return engine.run(request, DirectSink())
        finally:
            lifecycle.ReplySplit.for_reply = real

    reply(True), reply(False)  # warm up both
    ratios, on_rates, off_rates = [], [], []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        got = {split: reply(split) for split in order}
        assert got[True].token_ids == got[False].token_ids
        on_rates.append(got[True].tokens_per_s)
        off_rates.append(got[False].tokens_per_s)
        ratios.append(got[True].tokens_per_s / got[False].tokens_per_s)
    print(f"reply: {args.tokens} tokens, split result: {reply(True).reasoning_tokens} thinking")
    print(f"decode tok/s split on:  median {statistics.median(on_rates):.1f} ({min(on_rates):.1f}-{max(on_rates):.1f})")
    print(
        f"decode tok/s split off: median {statistics.median(off_rates):.1f} ({min(off_rates):.1f}-{max(off_rates):.1f})"
    )
    print(f"on/off per round: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")

    # The parser alone, one token's delta at a time, and the detection every reply runs.
    tok = engine.target.tokenizer
    text = "<think>\n" + "The user asks for 12 plus 30, so I add them. " * 200 + "\n</think>\n\n42."
    pieces = [tok.decode([i]) for i in tok(text, add_special_tokens=False)["input_ids"]]
    stream = ReasoningStream(by_name("think"))
    t = time.perf_counter()
    for p in pieces:
        stream.feed(p)
    stream.finish()
    per_token_us = (time.perf_counter() - t) / len(pieces) * 1e6
    t = time.perf_counter()
    for _ in range(1000):
        detect(tok)
    detect_us = (time.perf_counter() - t) / 1000 * 1e6
    print(
        f"parser: {per_token_us:.2f} µs a token over {len(pieces)} tokens; detect (cached): {detect_us:.2f} µs a reply"
    )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
