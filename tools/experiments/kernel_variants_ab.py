"""Two builds of Redline's CPU kernels on the same products, interleaved (A B, B A, …): the starter's three
product shapes (gate/up [3072, 576], down [576, 1536], the attention's [960, 576]) in bf16, Q8_0 and Q4_0, at
1, 4 and 44 activation rows (one decode row, a batch, a short chat prompt). Checks that both builds give the same
bits first; prints each build's median ms, the median of the per-round ratios, and torch's fp32 product for bf16.

    python tools/experiments/kernel_variants_ab.py --variants avx2,avx512-vnni [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="avx2,avx512-vnni", help="baseline first")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rows", default="1,4,44")
    args = ap.parse_args(argv)

    import torch

    from redline.inference.kernels import block_quant
    from redline.inference.kernels.cpu import library as native

    torch.manual_seed(0)
    variants = args.variants.split(",")
    libs = {v: native.library_for(v) for v in variants}
    shapes = [(3072, 576), (576, 1536), (960, 576)]
    ws = [torch.randn(*s) * 0.05 for s in shapes]
    q8 = [block_quant.quantize_q8(w) for w in ws]
    q4 = [block_quant.quantize_q4(w) for w in ws]
    wf = [w.bfloat16() for w in ws]
    bf16 = {v: [libs[v].bind_bf16(w) for w in wf] for v in variants}

    def products(v: str, kind: str, x):
        parts = [x[:, : s[1]].contiguous() for s in shapes]
        if kind == "bf16":
            return [b(p) for b, p in zip(bf16[v], parts)]
        if kind == "q8":
            return [libs[v].linear_q8(p, b.qweight, b.scales) for p, b in zip(parts, q8)]
        return [libs[v].linear_q4(p, b.qweight, b.scales, b.mins) for p, b in zip(parts, q4)]

    def timed(fn, n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n * 1e3

    load = os.getloadavg()[0]
    print(f"builds {', '.join(variants)}; {args.rounds} rounds, alternating order")
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, 1536)
        n = 100 if rows <= 8 else 20
        for kind in ("bf16", "q8", "q4"):
            want = products(variants[0], kind, x)
            for v in variants[1:]:
                same = all(torch.equal(a, b) for a, b in zip(want, products(v, kind, x)))
                assert same, f"{v} and {variants[0]} differ on {kind}, {rows} rows"
            times: dict = {v: [] for v in variants}
            blas = []
            for r in range(args.rounds):
                for v in variants if r % 2 == 0 else variants[::-1]:
                    times[v].append(timed(lambda v=v, kind=kind, x=x: products(v, kind, x), n))
                if kind == "bf16":
                    parts = [x[:, : s[1]] for s in shapes]
                    blas.append(
                        timed(lambda ps=parts: [torch.nn.functional.linear(p, w.float()) for p, w in zip(ps, wf)], n)
                    )
            base = times[variants[0]]
            line = f"{rows:>3} rows {kind:>4}: {variants[0]} {statistics.median(base):.3f} ms"
            for v in variants[1:]:
                ratio = statistics.median(b / a for a, b in zip(times[v], base))
                line += f" | {v} {statistics.median(times[v]):.3f} ms ({ratio:.2f}x faster)"
            if blas:
                line += f" | torch fp32 product {statistics.median(blas):.3f} ms"
            print(line, flush=True)
    print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
