"""4-bit products (Q4_1 blocks, ``linear_q4``) of this checkout against another's, interleaved (A B, B A, …):
in the cache at 1 and 44 activation rows (a decode row, a short chat prompt; GMAC/s) on the starter's and a
1B-shaped model's shapes, and one row streaming from memory (several weights of a shape cycled so that they leave
the L3; GB/s of weights and scales read), where a decode step is bound. Each side runs in its own process, with
the kernels its checkout builds.

    git worktree add /tmp/before <commit>
    python tools/experiments/q4_products.py --before /tmp/before [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IN_CACHE = ((3072, 576), (576, 1536), (49152, 576), (16384, 2048), (2048, 8192))
FROM_MEMORY = ((3072, 2048, 12), (2048, 8192, 8), (16384, 2048, 4), (1536, 576, 40))


def measure() -> dict:
    """One side's figures (run inside that side's process)."""
    import torch

    from redline.inference.kernels import block_quant
    from redline.inference.kernels.cpu.library import native

    torch.manual_seed(0)
    k, out = native(), {}
    for N, K in IN_CACHE:
        q = block_quant.quantize_q4(torch.randn(N, K) * 0.05)
        for T in (1, 44):
            x = torch.randn(T, K)
            k.linear_q4(x, q.qweight, q.scales, q.mins)
            reps = max(3, int(2e8 / (N * K * T)))
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(reps):
                    k.linear_q4(x, q.qweight, q.scales, q.mins)
                times.append((time.perf_counter() - t0) / reps)
            out[f"{N}x{K}, {T} rows, GMAC/s"] = N * K * T / statistics.median(times) / 1e9
    for N, K, copies in FROM_MEMORY:
        ws = [block_quant.quantize_q4(torch.randn(N, K) * 0.05) for _ in range(copies)]
        x = torch.randn(1, K)
        times = []
        for _ in range(8):
            t0 = time.perf_counter()
            for q in ws:
                k.linear_q4(x, q.qweight, q.scales, q.mins)
            times.append(time.perf_counter() - t0)
        read = sum(q.qweight.numel() + 2 * q.scales.numel() * 2 for q in ws)
        out[f"{N}x{K}, 1 row from memory, GB/s"] = read / statistics.median(times[1:]) / 1e9
    return out


def side(root: Path) -> dict:
    shim = Path(tempfile.mkdtemp(prefix="q4-products-"))
    (shim / "redline").symlink_to(root.resolve())
    env = {**os.environ, "PYTHONPATH": str(shim)}
    code = "import json, sys; sys.path.insert(0, sys.argv[1]); import q4_products as m; print(json.dumps(m.measure()))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).resolve().parent)],
        env=env,
        cwd=shim,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"{root}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True, help="the other checkout (e.g. a git worktree)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    runs = {"after": [], "before": []}
    for r in range(args.rounds):
        for name in ("after", "before") if r % 2 == 0 else ("before", "after"):
            runs[name].append(side(ROOT if name == "after" else args.before))
    print(f"{args.rounds} rounds A B / B A; load average {load:.2f} → {os.getloadavg()[0]:.2f}\n")
    print("| product | after | before | after ÷ before (per round) |\n|---|---|---|---|")
    for key in runs["after"][0]:
        a, b = [x[key] for x in runs["after"]], [x[key] for x in runs["before"]]
        ratios = [x / y for x, y in zip(a, b)]
        each = ", ".join(f"{x:.2f}" for x in ratios)
        a_mid, b_mid, ratio = statistics.median(a), statistics.median(b), statistics.median(ratios)
        print(f"| {key} | {a_mid:.0f} | {b_mid:.0f} | {ratio:.2f}× ({each}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
