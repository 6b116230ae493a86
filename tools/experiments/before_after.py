"""This checkout against another checkout of Redline (an earlier commit), interleaved in one run: a same-run
before/after for a change that must keep behaviour and speed.

    git worktree add /tmp/before <commit>
    python tools/experiments/before_after.py --before /tmp/before --rounds 3       # redline bench, fast configs
    python tools/experiments/before_after.py --before /tmp/before --rounds 2 --concurrency
                                                   # + tools/benchmarks/concurrency_bench.py, 4 requests
    python tools/experiments/before_after.py --before . --before-env REDLINE_KERNELS_VARIANT=avx2  # two builds
    python tools/experiments/before_after.py --before /tmp/before --model my.Q4_0.gguf --configs fast:gguf
                                                   # another model
    python tools/experiments/before_after.py --before . --before-env X=0 --prompts long --prompt-tokens 300 \\
        --new-tokens 4                             # a prompt's read (TTFT) A/B

Each round runs ``redline bench`` (the starter, one short prompt, greedy) from one side and then the other,
alternating which goes first (A B, B A, …); the table gives each side's median tokens/s and TTFT and the median
of the per-round ratios (after ÷ before). Both sides run with this venv's Python; the other side's ``redline``
is imported from its folder (a link named ``redline`` first on ``sys.path``). With ``--concurrency`` each round
also runs each side's own ``tools/benchmarks/concurrency_bench.py`` once (its table printed as it comes) and compares
the continuous-batching tokens/s. For the server, ``tools/benchmarks/bench_server.py --versus DIR`` does the same.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = "fast:bf16,fast:q8,fast:q4,kv:bf16"


def side_env(root: Path) -> dict:
    """The environment that imports ``redline`` from ``root``: a link named ``redline`` first on PYTHONPATH
    (ahead of whichever checkout the venv's editable install points at)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shim = Path(tempfile.mkdtemp(prefix="before-after-"))
    atexit.register(shutil.rmtree, shim, ignore_errors=True)
    (shim / "redline").symlink_to(root.resolve())
    env["PYTHONPATH"] = str(shim)
    return env


def bench(env: dict, args) -> dict:
    cmd = [sys.executable, "-m", "redline", "bench", "--model", args.model, "--configs", args.configs]
    cmd += ["--max-prompts", "1", "--new-tokens", str(args.new_tokens), "--samples", str(args.samples)]
    cmd += ["--prompts", args.prompts] + (["--prompt-tokens", str(args.prompt_tokens)] if args.prompt_tokens else [])
    cmd += ["--warmup", "1", "--json"]
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"redline bench failed: {proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    return {r["config"]: (r["tokens_per_s"], r.get("ttft_ms")) for r in report["results"]}


def concurrency(env: dict, root: Path, args) -> float | None:
    # That side's own copy: tools/benchmarks/ since the tools were grouped by kind, tools/ in older checkouts.
    script = next(p for p in (root / "tools" / "benchmarks", root / "tools") if (p / "concurrency_bench.py").exists())
    cmd = [sys.executable, str(script / "concurrency_bench.py"), "--rounds", "1", "--levels", "1,4"]
    cmd += ["--modes", "continuous,one-at-a-time", "--kv-level", "0", "--tokens", str(args.new_tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"concurrency_bench failed: {proc.stderr[-2000:]}")
    print(proc.stdout, file=sys.stderr)
    m = re.search(r"\| 4 \| \d+ \| continuous \| ([\d.]+) \|", proc.stdout)
    return float(m.group(1)) if m else None


def short_sha(root: Path) -> str:
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or root.name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True, help="the other checkout (e.g. a git worktree)")
    ap.add_argument("--after", type=Path, default=ROOT, help="the checkout measured against it (default: this one)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="starter", help="a name, folder or GGUF file (default: the starter)")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--prompts", default="short", help="redline bench's prompt set (its first prompt)")
    ap.add_argument("--prompt-tokens", type=int, help="cap the prompt at this many tokens (a prompt-read A/B)")
    ap.add_argument("--concurrency", action="store_true", help="also tools/benchmarks/concurrency_bench.py, 4 requests")
    ap.add_argument(
        "--before-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set for the before side only, e.g. --before . --before-env REDLINE_KERNELS_VARIANT=avx2 (one "
        "checkout, two kernel builds)",
    )
    ap.add_argument("--after-env", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args(argv)

    sides = {"after": (side_env(args.after), args.after), "before": (side_env(args.before), args.before)}
    for side, extra in (("after", args.after_env), ("before", args.before_env)):
        for item in extra:
            name, _, value = item.partition("=")
            sides[side][0][name] = value
    got: dict = {side: [] for side in sides}
    conc: dict = {side: [] for side in sides}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            env, root = sides[side]
            got[side].append(bench(env, args))
            line = ", ".join(f"{c} {v[0]:.1f} tok/s" for c, v in got[side][-1].items())
            print(f"round {r + 1} {side}: {line}; load {os.getloadavg()[0]:.2f}", file=sys.stderr)
            if args.concurrency:
                conc[side].append(concurrency(env, root, args))
    load_after = os.getloadavg()
    sha, here = short_sha(args.before), short_sha(args.after)
    here += "".join(f" {e}" for e in args.after_env)
    sha += "".join(f" {e}" for e in args.before_env)
    print(
        f"after = {here}, before = {sha}; {args.rounds} rounds A B / B A; "
        f"load average {load_before[0]:.2f} → {load_after[0]:.2f}"
    )
    print()
    print(
        "| config | after tok/s | before tok/s | after ÷ before (per round) | after TTFT ms | before TTFT ms "
        "| TTFT before ÷ after (per round) |"
    )
    print("|---|---|---|---|---|---|---|")
    med = statistics.median
    for config in args.configs.split(","):
        a = [x[config] for x in got["after"] if config in x]
        b = [x[config] for x in got["before"] if config in x]
        ratios = [x[0] / y[0] for x, y in zip(a, b) if y[0]]
        ttft_a = [x[1] for x in a if x[1]]
        ttft_b = [x[1] for x in b if x[1]]
        # > 1: the after side's first token came sooner (the same direction as the tokens/s ratio)
        sooner = [y[1] / x[1] for x, y in zip(a, b) if x[1] and y[1]]
        print(
            f"| {config} | {med(x[0] for x in a):.1f} | {med(x[0] for x in b):.1f} | **{med(ratios):.2f}×** "
            f"({', '.join(f'{x:.2f}' for x in ratios)}) | {med(ttft_a) if ttft_a else float('nan'):.0f} "
            f"| {med(ttft_b) if ttft_b else float('nan'):.0f} "
            f"| {f'**{med(sooner):.2f}×** (' + ', '.join(f'{x:.2f}' for x in sooner) + ')' if sooner else '–'} |"
        )
    if args.concurrency:
        pairs = [(a, b) for a, b in zip(conc["after"], conc["before"]) if a and b]
        if pairs:
            ratios = [a / b for a, b in pairs]
            print(
                f"\n4 requests, continuous batching total tok/s: after {med(a for a, _ in pairs):.1f}, before "
                f"{med(b for _, b in pairs):.1f}, after ÷ before {med(ratios):.2f}× "
                f"({', '.join(f'{x:.2f}' for x in ratios)})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
