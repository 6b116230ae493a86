"""Continuous batching against one request at a time (and transformers' own continuous batching), measured in
the same run on the starter: the concurrency targets of the engine service.

    python tools/benchmarks/concurrency_bench.py [--precision bf16] [--rounds 3] [--levels 1,4] [--tokens 128]
        [--gap 0.5] [--kv-level 8 --kv-tokens 256] [--modes continuous,one-at-a-time,transformers]

Each round runs every mode at every level, in an order that alternates between rounds; the table gives medians
over rounds and the median per-round ratio continuous ÷ one-at-a-time, with the load average.
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
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--levels", default="1,4")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--gap", type=float, default=0.5)
    ap.add_argument("--kv-level", type=int, default=8)
    ap.add_argument("--kv-tokens", type=int, default=256)
    ap.add_argument("--modes", default="continuous,one-at-a-time,transformers")
    args = ap.parse_args(argv)

    from redline.inference import load_prompt_set
    from redline.inference.bench.concurrency import run_concurrency, schedule_ceiling

    load = harness.LoadAverage()
    target = harness.load(args.model, args.precision).target
    count = len(load_prompt_set("short").prompts)
    prompts = [harness.prompt_ids(target.tokenizer, "short", i, new_tokens=args.tokens) for i in range(count)]
    modes = args.modes.split(",")
    levels = [int(x) for x in args.levels.split(",")]
    rows: dict = {}
    for r in range(args.rounds):
        for mode in harness.order(modes, r):
            for row in run_concurrency(target, prompts, levels, args.tokens, args.gap, [mode]):
                rows.setdefault((row.concurrency, mode, args.tokens), []).append(row)
        if args.kv_level:
            for row in run_concurrency(target, prompts, [args.kv_level], args.kv_tokens, args.gap, ["continuous"]):
                rows.setdefault((row.concurrency, "continuous", args.kv_tokens), []).append(row)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = statistics.median
    print(
        f"model {args.model}, {args.precision}, fast path; arrivals {args.gap} s apart; {args.rounds} rounds; "
        f"load average {load}"
    )
    print(
        "| requests | tokens each | mode | total tok/s | TTFT p50 ms | TTFT p95 ms | latency p95 ms "
        "| KV peak ÷ needed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (n, mode, tokens), rs in sorted(rows.items()):
        ok = [x for x in rs if x.status == "ok"]
        if not ok:
            print(f"| {n} | {tokens} | {mode} | {rs[0].status}: {rs[0].error} |")
            continue
        kv = [x.kv_overhead for x in ok if x.kv_overhead]
        print(
            f"| {n} | {tokens} | {mode} | {med(x.throughput_tokens_per_s for x in ok):.1f} | "
            f"{med(x.ttft_ms_p50 for x in ok):.0f} | {med(x.ttft_ms_p95 for x in ok):.0f} | "
            f"{med(x.latency_ms_p95 for x in ok):.0f} | {f'{med(kv):.2f}×' if kv else '—'} |"
        )
    for n in levels:
        cont, solo = rows.get((n, "continuous", args.tokens), []), rows.get((n, "one-at-a-time", args.tokens), [])
        pairs = [(a, b) for a, b in zip(cont, solo) if a.status == b.status == "ok"]
        if pairs:
            ratios = harness.ratios(
                [a.throughput_tokens_per_s for a, _ in pairs], [b.throughput_tokens_per_s for _, b in pairs]
            )
            print(
                f"{n} requests: continuous ÷ one-at-a-time total tok/s, median of rounds {med(ratios):.2f}× "
                f"({', '.join(f'{x:.2f}' for x in ratios)})"
            )
            ceilings = [c for c in (schedule_ceiling(b) for a, b in pairs) if c]
            if ceilings and n > 1:
                reached = [r / c for r, c in zip(ratios, ceilings)]
                print(
                    f"{n} requests: the arrivals' ceiling for that ratio (no schedule can do better: the last "
                    f"arrival plus one request's own time), median {med(ceilings):.2f}× "
                    f"({', '.join(f'{x:.2f}' for x in ceilings)}); continuous reached {100 * med(reached):.0f} % of it"
                )
    alone = rows.get((1, "continuous", args.tokens), [])
    for n in levels:
        if n > 1 and alone:
            cont = rows.get((n, "continuous", args.tokens), [])
            ratios = [max(c.ttft_ms[1:]) / a.ttft_ms[0] for c, a in zip(cont, alone) if c.status == a.status == "ok"]
            if ratios:
                print(f"{n} requests: TTFT of the later arrivals (worst) ÷ TTFT alone, median {med(ratios):.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
