"""TTFT of the fast path with the crossover from the whole step to the operator-by-operator prefill
(``kernels.ops.GEMM_ROWS``), or with ``--name BLAS_ROWS`` the bf16 products' crossover from the kernel to torch's
BLAS, at two values, interleaved on one engine (A B A B …), the median of the per-round ratios:

    python tools/gemm_rows_ab.py [--old 32] [--new 128] [--rounds 5] [--precision q8] [--prompt-tokens 200]
    python tools/gemm_rows_ab.py --name BLAS_ROWS --old 128 --new 512 --model M --prompt-tokens 300

``--prompt-tokens N``: the first N tokens of the long prompt set's first prompt instead of the short chat prompt.
"""

from __future__ import annotations

import argparse
import os
import statistics


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--prompt-tokens", type=int, default=0)
    ap.add_argument("--name", choices=("GEMM_ROWS", "BLAS_ROWS"), default="GEMM_ROWS")
    ap.add_argument("--model", default="starter")
    args = ap.parse_args(argv)

    from redline.inference import Engine, SamplingSettings, load_prompt_set, resolve_precision
    from redline.inference.decoding.options import DecodeOptions
    from redline.inference.decoding.prompt import build_prompt
    from redline.inference.generation.run import generate
    from redline.inference.kernels import ops

    engine = Engine()
    engine.record_memory = False
    engine.load(args.model, resolve_precision(args.precision, engine.device))
    target = engine.target
    ids = build_prompt(target.tokenizer, load_prompt_set("short").prompts[0].messages, 4096, 64).input_ids
    if args.prompt_tokens:
        long_ids = build_prompt(target.tokenizer, load_prompt_set("long").prompts[0].messages, 4096, 64).input_ids
        ids = long_ids[: args.prompt_tokens]
    sampling = SamplingSettings(max_new_tokens=16, temperature=0, min_new_tokens=16)
    generate(target, ids, sampling, DecodeOptions(strategy="fast"))  # warm-up
    before = os.getloadavg()
    ttft = {args.old: [], args.new: []}
    for r in range(args.rounds):
        for rows in (args.old, args.new) if r % 2 == 0 else (args.new, args.old):
            setattr(ops, args.name, rows)
            ttft[rows].append(generate(target, ids, sampling, DecodeOptions(strategy="fast")).ttft_ms)
    ratio = statistics.median(a / b for a, b in zip(ttft[args.old], ttft[args.new]))
    print(
        f"{args.precision}, prompt {len(ids)} tokens; TTFT ms by {args.name}: "
        + "; ".join(f"{k}: {[round(x) for x in v]}" for k, v in ttft.items())
    )
    print(f"median ratio {args.old}/{args.new}: {ratio:.2f}; load average {before[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
