"""Decode speed of an installed wheel (its shipped kernels) against this checkout (its first-use build), interleaved:
``redline bench`` on the starter, fast:bf16, fast:q8 and fast:q4, run by each side's Python in turn (A B, then B A,
…), the ratio the median of the per-round ratios (wheel ÷ checkout)::

    python -m build --wheel --outdir /tmp/whl . && python -m venv /tmp/wheelvenv
    /tmp/wheelvenv/bin/pip install --no-deps /tmp/whl/redline-*.whl   # its dependencies: this venv's, via a .pth
    python tools/release/wheel_vs_checkout.py --wheel-python /tmp/wheelvenv/bin/python --rounds 3

Each side runs in its own process with a PATH that has no compiler for the wheel (so it can only use what it
ships) and says which kernels it ran (the machine line's ``cpu_kernels``).

``--bundle dist/redline/redline`` puts the desktop bundle (``make dist``) in the checkout's place: the bundle
against the wheel, both with a PATH without a compiler.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = "fast:bf16,fast:q8,fast:q4"


def bench(python: str, env: dict, args) -> tuple[dict, str]:
    program = [python] if Path(python).name == "redline" else [python, "-m", "redline"]  # a bundle, or a Python
    cmd = [*program, "bench", "--model", "starter", "--configs", args.configs, "--max-prompts", "1"]
    cmd += ["--new-tokens", str(args.new_tokens), "--samples", str(args.samples), "--warmup", "1", "--json"]
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{python}: redline bench failed: {proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    rates = {r["config"]: r["tokens_per_s"] for r in report["results"]}
    return rates, report["machine"].get("cpu_kernels", "?")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel-python", required=True)
    ap.add_argument("--checkout-python", default=sys.executable)
    ap.add_argument("--bundle", help="the bundle's executable (dist/redline/redline), measured instead of the checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--configs", default=CONFIGS)
    args = ap.parse_args(argv)

    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CXX", "CC")}
    bare = tempfile.mkdtemp()  # the wheel's PATH: its own scripts only, no compiler, no ninja
    sides = {
        "wheel": (args.wheel_python, dict(base, PATH=os.pathsep.join([str(Path(args.wheel_python).parent), bare]))),
        "checkout": (args.checkout_python, dict(base)),
    }
    if args.bundle:
        sides["checkout"] = (str(Path(args.bundle).resolve()), dict(base, PATH=bare))
    rates: dict = {side: [] for side in sides}
    kernels: dict = {}
    before = os.getloadavg()
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            got, kernels[side] = bench(*sides[side], args)
            rates[side].append(got)
            print(f"round {r + 1} {side}: " + ", ".join(f"{c} {v:.1f}" for c, v in got.items()), file=sys.stderr)
    after = os.getloadavg()
    print(f"{args.rounds} rounds, A B / B A; load average {before[0]:.2f} → {after[0]:.2f}")
    other = "bundle" if args.bundle else "checkout"
    print(f"kernels: wheel {kernels['wheel']}; {other} {kernels['checkout']}")
    print()
    print(f"| config | wheel tok/s (median) | {other} tok/s (median) | wheel ÷ {other} (median of per-round ratios) |")
    print("|---|---|---|---|")
    for config in args.configs.split(","):
        w = [x[config] for x in rates["wheel"]]
        c = [x[config] for x in rates["checkout"]]
        ratios = [a / b for a, b in zip(w, c)]
        per_round = ", ".join(f"{x:.2f}" for x in ratios)
        print(
            f"| {config} | {statistics.median(w):.1f} | {statistics.median(c):.1f} | "
            f"**{statistics.median(ratios):.2f}×** ({per_round}) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
