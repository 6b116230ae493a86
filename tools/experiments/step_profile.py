"""Where a decode step's time goes: the whole-step operator's own stage profile (``redline::step_profile``,
wall time between its barriers on thread 0), per precision, for a real reply on the starter, and the time
per token outside the step (sampling, streaming, Python):

    python tools/step_profile.py [--precisions bf16,q8,q4] [--new-tokens 64] [--prompt short|long]
"""

from __future__ import annotations

import argparse
import os

STAGES = ["norm", "qkv", "rotary+cache", "attention", "quantise", "o", "norm", "gate_up", "silu·up", "down", "head"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precisions", default="bf16,q8,q4")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt", default="short")
    ap.add_argument("--model", default="starter", help="a name, folder or GGUF file")
    args = ap.parse_args(argv)

    import torch

    from redline.inference import Engine, SamplingSettings, load_prompt_set, resolve_precision
    from redline.inference.decoding.fastpath import get_decoder
    from redline.inference.decoding.options import DecodeOptions
    from redline.inference.decoding.prompt import build_prompt
    from redline.inference.generation.run import generate

    before = os.getloadavg()
    print("| precision | step ms | " + " | ".join(STAGES) + " | outside the step ms |")
    print("|---" * (len(STAGES) + 3) + "|")
    for precision in args.precisions.split(","):
        engine = Engine()
        engine.record_memory = False
        engine.load(args.model, resolve_precision(precision, engine.device))
        target = engine.target
        ids = build_prompt(target.tokenizer, load_prompt_set(args.prompt).prompts[0].messages, 4096, 64).input_ids
        n = args.new_tokens
        fast = DecodeOptions(strategy="fast")
        generate(target, ids, SamplingSettings(max_new_tokens=n, temperature=0, min_new_tokens=n), fast)  # warm-up
        dec = get_decoder(target, len(ids) + n)
        if not dec.whole_step:
            print(f"| {precision} | no whole step here: {dec.whole_step_reason} |")
            continue
        # The reply's decode steps alone: a reply of n tokens less one of a single token (its prefill).
        profiles, result = [], None
        for tokens in (n, 1):
            torch.ops.redline.step_profile(True)
            run = generate(
                target, ids, SamplingSettings(max_new_tokens=tokens, temperature=0, min_new_tokens=tokens), fast
            )
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
        f"the reply's steps; outside the step: 1000 / decode tokens/s less the step; load average "
        f"{before[0]:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
