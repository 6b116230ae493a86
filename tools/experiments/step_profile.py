"""Where a decode step's time goes: the whole-step operator's own stage profile (``redline::step_profile``,
wall time between its barriers on thread 0), per precision, for a real reply on the starter, and the time
per token outside the step (sampling, streaming, Python):

    python tools/experiments/step_profile.py [--precisions bf16,q8,q4] [--new-tokens 64] [--prompt short|long]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402

STAGES = ["norm", "qkv", "rotary+cache", "attention", "quantise", "o", "norm", "gate_up", "silu·up", "down", "head"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precisions", default="bf16,q8,q4")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt", default="short")
    ap.add_argument("--model", default="starter", help="a name, folder or GGUF file")
    args = ap.parse_args(argv)

    import torch

    from redline.inference.decoding.fastpath import get_decoder

    load = harness.LoadAverage()
    print("| precision | step ms | " + " | ".join(STAGES) + " | outside the step ms |")
    print("|---" * (len(STAGES) + 3) + "|")
    for precision in args.precisions.split(","):
        engine = harness.load(args.model, precision)
        target = engine.target
        ids = harness.prompt_ids(target.tokenizer, args.prompt)
        n = args.new_tokens
        harness.reply(target, ids, n)  # warm-up
        dec = get_decoder(target, len(ids) + n)
        if not dec.whole_step:
            print(f"| {precision} | no whole step here: {dec.whole_step_reason} |")
            continue
        # The reply's decode steps alone: a reply of n tokens less one of a single token (its prefill).
        profiles, result = [], None
        for tokens in (n, 1):
            torch.ops.redline.step_profile(True)
            run = harness.reply(target, ids, tokens)
            profiles.append(torch.ops.redline.step_profile(False).tolist())
            result = run if tokens == n else result
        seconds = [a - b for a, b in zip(*profiles)]
        steps = int(seconds[-1])
        stage_ms = [s * 1e3 / max(1, steps) for s in seconds[:-1]]
        step_ms = sum(stage_ms)
        per_token_ms = 1e3 / result.tokens_per_s if result.tokens_per_s else float("nan")
        print(
            f"| {precision} | {step_ms:.2f} | "
            + " | ".join(f"{ms:.2f} ({100 * ms / step_ms:.0f} %)" for ms in stage_ms)
            + f" | {per_token_ms - step_ms:.2f} |"
        )
        engine.unload()
    print(
        f"\nprompt {args.prompt} ({len(ids)} tokens), {args.new_tokens} new tokens; ms per decode step, averaged over "
        f"the reply's steps; outside the step: 1000 / decode tokens/s less the step; load average {load}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
