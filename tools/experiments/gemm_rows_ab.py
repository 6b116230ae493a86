"""TTFT of the fast path with the crossover from the whole step to the operator-by-operator prefill
(``kernels.ops.GEMM_ROWS``), or with ``--name BLAS_ROWS`` the bf16 products' crossover from the kernel to torch's
BLAS (``kernels.cpu.backend.BLAS_ROWS``), at two values, interleaved on one engine (A B A B …), the median of the
per-round ratios:

    python tools/experiments/gemm_rows_ab.py [--old 32] [--new 128] [--rounds 5] [--precision q8] [--prompt-tokens 200]
    python tools/experiments/gemm_rows_ab.py --name BLAS_ROWS --old 128 --new 512 --model M --prompt-tokens 300

``--prompt-tokens N``: the first N tokens of the long prompt set's first prompt instead of the short chat prompt.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402


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

    from redline.inference.kernels import ops
    from redline.inference.kernels.cpu import backend as cpu_ops

    target = harness.load(args.model, args.precision).target
    ids = harness.prompt_ids(target.tokenizer, "short")
    if args.prompt_tokens:
        ids = harness.prompt_ids(target.tokenizer, "long")[: args.prompt_tokens]
    harness.reply(target, ids, 16)  # warm-up
    load = harness.LoadAverage()
    ttft = {args.old: [], args.new: []}
    for r in range(args.rounds):
        for rows in harness.order((args.old, args.new), r):
            setattr(ops if args.name == "GEMM_ROWS" else cpu_ops, args.name, rows)
            ttft[rows].append(harness.reply(target, ids, 16).ttft_ms)
    print(
        f"{args.precision}, prompt {len(ids)} tokens; TTFT ms by {args.name}: "
        + "; ".join(f"{k}: {[round(x) for x in v]}" for k, v in ttft.items())
    )
    ratio = harness.median_ratio(ttft[args.old], ttft[args.new])
    print(f"median ratio {args.old}/{args.new}: {ratio:.2f}; load average {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
