"""Two conversations taking turns through `redline serve`: does the first token come as quickly at turn 8 as at turn 2,
when the other conversation ran in between?

Conversation A's turn 1, then B's turn 1, then A's turn 2, … (each turn a user message of about ``--turn-tokens``
tokens, ``--max-tokens`` new tokens, greedy, streamed; the client sends the whole history, as every OpenAI client
does). TTFT is from sending the request to the first content chunk. With ``--before FOLDER`` a second server runs
another checkout (its ``redline`` imported from that folder, as tools/experiments/before_after.py does), and the
rounds alternate which server goes first; the table gives the median TTFT per turn over rounds and conversations,
and the median of the per-round ratios turn N ÷ turn 2.

    REDLINE_NATIVE_KERNELS=0 python tools/benchmarks/two_conversations_bench.py --model starter --precision bf16 \\
        [--before /tmp/before] [--turns 8] [--rounds 2]

REDLINE_NATIVE_KERNELS=0 (passed on to the servers) measures the GPU's branch on a CPU.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import free_port, wait_ready  # noqa: E402
from conversation_bench import load_average, turn, turn_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def two_conversations(base: str, model: str, args, label: str, turns: int) -> dict[str, list[dict]]:
    """A's turn, B's turn, … ``turns`` each. ``label`` starts each conversation (a round's own: the prefix cache
    keeps every earlier round's pages, and the same words would hit them)."""
    import httpx

    histories = {"A": [], "B": []}
    rows: dict[str, list[dict]] = {"A": [], "B": []}
    with httpx.Client(timeout=args.timeout, trust_env=False) as client:
        for i in range(turns):
            for name, history in histories.items():
                text = f"Conversation {name} of {label}. " + turn_text(i, args.turn_tokens)
                history.append({"role": "user", "content": text})
                rows[name].append(turn(client, base, model, history, args.max_tokens))
    return rows


def start_server(root: Path, args, log) -> tuple[subprocess.Popen, int]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    shim = Path(tempfile.mkdtemp(prefix="two-conv-"))
    atexit.register(shutil.rmtree, shim, ignore_errors=True)
    (shim / "redline").symlink_to(root.resolve())
    env["PYTHONPATH"] = str(shim)
    port = free_port()
    cmd = [sys.executable, "-m", "redline", "serve", "--model", args.model, "--precision", args.precision,
           "--host", "127.0.0.1", "--port", str(port), "--max-tokens", str(args.max_tokens)]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=tempfile.gettempdir()), port


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--turn-tokens", type=int, default=130)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--before", help="another checkout, served beside this one")
    args = ap.parse_args(argv)

    roots = {"after": ROOT} | ({"before": Path(args.before)} if args.before else {})
    logs = {name: tempfile.TemporaryFile() for name in roots}
    servers = {name: start_server(root, args, logs[name]) for name, root in roots.items()}
    results: dict[str, list[dict[str, list[dict]]]] = {name: [] for name in roots}
    loads = [load_average()]
    try:
        models = {
            name: wait_ready(f"http://127.0.0.1:{port}/v1", proc, 600, name) for name, (proc, port) in servers.items()
        }
        # This run's own words: pages an earlier run left on disk (disk_pages.py) would hit the same ones.
        run = f"{time.time():.0f}"
        # Unmeasured: a server's first requests pay one-time costs (turns 1 and 2 took 6-7 s here against 0.2 s
        # later), which would flatter a later turn against turn 2.
        for name, (_proc, port) in servers.items():
            two_conversations(f"http://127.0.0.1:{port}/v1", models[name], args, f"the warm-up of run {run}", 2)
        for r in range(args.rounds):
            for name in list(roots) if r % 2 == 0 else list(roots)[::-1]:
                base = f"http://127.0.0.1:{servers[name][1]}/v1"
                rows = two_conversations(base, models[name], args, f"round {r + 1} of run {run}", args.turns)
                results[name].append(rows)
                for conv, turns in rows.items():
                    ttfts = ", ".join(f"{row['ttft_ms']:.0f} ({row['cached_tokens']})" for row in turns)
                    print(f"round {r + 1} {name} {conv}: {ttfts}", file=sys.stderr, flush=True)
    finally:
        for proc, _port in servers.values():
            proc.terminate()
        for proc, _port in servers.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    loads.append(load_average())

    names = list(roots)
    print("| turn | prompt tokens | " + " | ".join(f"{n} TTFT ms (cached)" for n in names) + " |")
    print("|---" * (2 + len(names)) + "|")
    for t in range(args.turns):
        cells = []
        for n in names:
            ttfts = [rows[c][t]["ttft_ms"] for rows in results[n] for c in rows]
            cached = results[n][-1]["A"][t]["cached_tokens"]
            cells.append(f"{statistics.median(ttfts):.0f} ({cached})")
        print(f"| {t + 1} | {results[names[0]][-1]['A'][t]['prompt_tokens']} | " + " | ".join(cells) + " |")
    for n in names:
        ratios = [rows[c][-1]["ttft_ms"] / rows[c][1]["ttft_ms"] for rows in results[n] for c in rows]
        print(
            f"{n}: turn {args.turns} ÷ turn 2, median of per-round, per-conversation ratios "
            f"{statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})"
        )
    print(
        f"{args.model} at {args.precision}, REDLINE_NATIVE_KERNELS={os.environ.get('REDLINE_NATIVE_KERNELS', '1')}, "
        f"{args.turns} turns of ~{args.turn_tokens} tokens, {args.max_tokens} new tokens, {args.rounds} rounds; "
        f"load average {loads[0]} -> {loads[1]}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
