"""Does a batched decode step cost what its sequences use, or what the longest one does? Four sequences, three at
position 100 and one at 4,000, against four at 4,000, on the fast decoder's own step (``FastDecoder.step``), in one
process, interleaved round by round; with ``--before FOLDER`` the same measurement of another checkout runs in
turns with this one (each side imports ``redline`` from its own folder, as tools/experiments/before_after.py does).

    REDLINE_NATIVE_KERNELS=0 python tools/benchmarks/paged_step_bench.py [--before /tmp/before] [--rounds 5]

REDLINE_NATIVE_KERNELS=0 measures the GPU's branch on a CPU (torch's operators, kernels/paged_torch.py). The KV
values are random (the cost does not depend on them); the model is the starter unless --model says otherwise.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIXED = [100, 100, 100, 4000]
LONG = [4000, 4000, 4000, 4000]


def measure(model: str, precision: str, steps: int, rounds: int) -> dict:
    """One side: ``steps`` × ``rounds`` pairs of a MIXED step and a LONG step (alternating which goes first); ms."""
    import torch

    from redline.inference.decoding.fastpath import FastDecoder
    from redline.inference.engine import Engine
    from redline.inference.precision import parse_precision

    torch.manual_seed(0)
    engine = Engine("cpu")
    engine.record_memory = False
    engine.load(model, parse_precision(precision))
    dec = FastDecoder(engine.target.model, 256)
    groups = {"mixed": ([1, 2, 3, 4], MIXED), "long": ([5, 6, 7, 8], LONG)}
    for seqs, positions in groups.values():
        for s, p in zip(seqs, positions):
            dec.kv.reserve(s, p + steps + 2)
    dec.ensure_context(max(LONG) + steps + 2)
    with torch.inference_mode():
        dec.kv.k.normal_(0, 1)  # finite values everywhere (an untouched pool could hold denormals or NaN)
        dec.kv.v.normal_(0, 1)
    tokens = torch.tensor([11, 12, 13, 14])
    out = {"mixed": [], "long": []}

    def one(name: str, i: int) -> float:
        seqs, positions = groups[name]
        started = time.perf_counter()
        dec.step(tokens, [p + 1 + i for p in positions], seqs)
        return (time.perf_counter() - started) * 1000

    one("mixed", -1), one("long", -1)  # warm
    # Step by step, alternating (a busy machine's slow spell then falls on both of a pair, not on one side).
    for i in range(steps * rounds):
        for name in ("mixed", "long") if i % 2 == 0 else ("long", "mixed"):
            out[name].append(one(name, i))
    return {"native": dec.native, "pool_bytes": dec.kv.nbytes, **out}


def env_for(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shim = Path(tempfile.mkdtemp(prefix="paged-step-"))
    atexit.register(shutil.rmtree, shim, ignore_errors=True)
    (shim / "redline").symlink_to(root.resolve())
    env["PYTHONPATH"] = str(shim)
    return env


def side(root: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--side", "--model", args.model, "--precision", args.precision]
    cmd += ["--steps", str(args.steps), "--rounds", "1"]  # one side's run: ``steps`` pairs
    proc = subprocess.run(
        cmd, env=env_for(root), capture_output=True, text=True, timeout=1800, cwd=tempfile.gettempdir()
    )
    if proc.returncode:
        raise SystemExit(f"{root}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path.home() / ".cache/redline/models/SmolLM2-135M-Instruct-bf16"))
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--before", help="another checkout to measure in turns with this one")
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        print(json.dumps(measure(args.model, args.precision, args.steps, args.rounds)))
        return
    sides = {"after": ROOT} | ({"before": Path(args.before)} if args.before else {})
    rows = {name: [] for name in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            got = side(sides[name], args)
            got["ratio"] = statistics.median(m / lo for m, lo in zip(got["mixed"], got["long"]))
            got["mixed_ms"], got["long_ms"] = statistics.median(got["mixed"]), statistics.median(got["long"])
            rows[name].append(got)
            print(
                f"round {r + 1} {name:6}: mixed {got['mixed_ms']:7.1f} ms  long {got['long_ms']:7.1f} ms  "
                f"median of per-pair mixed/long {got['ratio']:.2f}",
                flush=True,
            )
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, got in rows.items():
        ratios = [g["ratio"] for g in got]
        print(
            f"{name}: median mixed {statistics.median(g['mixed_ms'] for g in got):.1f} ms, long "
            f"{statistics.median(g['long_ms'] for g in got):.1f} ms; mixed/long, median over rounds "
            f"{statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})"
        )
    if "before" in rows:
        for key in ("mixed_ms", "long_ms"):
            per = [a[key] / b[key] for a, b in zip(rows["after"], rows["before"])]
            print(
                f"{key[:-3]}: after/before median {statistics.median(per):.2f} ({', '.join(f'{x:.2f}' for x in per)})"
            )


if __name__ == "__main__":
    main()
