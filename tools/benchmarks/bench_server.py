"""Redline's server against `transformers serve --continuous-batching`, same model, same run.

Both servers are started here, on free loopback ports, with the same model and dtype, and stopped at the end.
Each round runs every concurrency level (1, 4, 8 streaming clients by default) against one server and then the
other, alternating which goes first (A B, B A, …), so drift in the machine's speed hits both alike. A client
sends one streamed chat completion (greedy, the same prompt set for both) and records its time to first token
(from sending the request to the first content chunk) and its completion tokens (the server's ``usage``).
Per level: TTFT p50/p95 over every request of every round, total tokens/s (all clients' tokens over the
level's wall time) as the median over rounds, and the median of the per-round ratios Redline ÷ transformers.

    python tools/benchmarks/bench_server.py                      # the starter, bf16, 1/4/8 clients, 3 rounds
    python tools/benchmarks/bench_server.py --clients 1,4 --rounds 2 --max-tokens 32 --markdown
    python tools/benchmarks/bench_server.py --versus /tmp/before   # this checkout against another checkout's Redline

With ``--versus DIR`` the second server is Redline from the checkout in DIR (an earlier commit, e.g. a
``git worktree``), run by this venv's Python with ``redline`` imported from DIR: a same-run before/after.

Only loopback traffic; every request has a timeout and every loop a bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short poem about a lighthouse.",
    "List five uses for a paperclip.",
    "What is the difference between a list and a tuple in Python?",
    "Describe the water cycle for a ten-year-old.",
    "Give three tips for learning a new language.",
    "Why do cats purr?",
    "Summarise the plot of Romeo and Juliet in four sentences.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values, q) -> float:
    """``redline.inference.percentile`` (the definition every figure of Redline's uses), NaN where nothing was
    measured (every request failed), so the table still prints."""
    from redline.inference import percentile

    value = percentile(values, q)
    return float("nan") if value is None else value


def wait_ready(base: str, proc: subprocess.Popen, timeout_s: float, name: str) -> str:
    """The model id the server lists, once /models answers (bounded)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before it answered")
        try:
            r = httpx.get(base + "/models", timeout=2, trust_env=False)
            if r.status_code == 200 and r.json().get("data"):
                return r.json()["data"][0]["id"]
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{name} did not answer within {timeout_s:.0f} s")


def importable(root: Path) -> str:
    """A folder to put first on PYTHONPATH so that ``import redline`` finds the checkout at ``root`` (a link named
    ``redline``), whichever checkout the venv's editable install points at."""
    shim = Path(tempfile.mkdtemp(prefix="bench-server-"))
    (shim / "redline").symlink_to(Path(root).resolve())
    return str(shim)


def start_servers(args, model_dir: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    bindir = Path(sys.executable).parent
    servers = {}
    port = free_port()
    redline = [sys.executable, "-m", "redline", "serve", "--model", model_dir, "--precision", args.precision,
               "--host", "127.0.0.1", "--port", str(port), "--max-tokens", str(args.max_tokens),
               "--parallel", str(args.parallel)]  # fmt: skip
    renv = dict(env, PYTHONPATH=importable(ROOT))
    servers["redline"] = (subprocess.Popen(redline, env=renv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), port)
    port = free_port()
    if args.versus:
        # The other checkout's package, found first on sys.path.
        other = list(redline)
        other[other.index("--port") + 1] = str(port)
        benv = dict(env, PYTHONPATH=importable(Path(args.versus)))
        proc = subprocess.Popen(other, env=benv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        servers["baseline"] = (proc, port)
        return servers
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[args.precision]
    hf = [str(bindir / "transformers"), "serve", "--continuous-batching", "--host", "127.0.0.1", "--port", str(port),
          "--device", "cpu", "--dtype", dtype, model_dir]  # fmt: skip
    servers["baseline"] = (subprocess.Popen(hf, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), port)
    return servers


def baseline_label(args) -> str:
    if not args.versus:
        return "transformers"
    sha = subprocess.run(["git", "-C", args.versus, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"Redline {sha.stdout.strip() or Path(args.versus).name}"


async def one_request(client, base: str, model: str, prompt: str, max_tokens: int, timeout_s: float) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    first, chunks, usage = None, 0, None
    async with asyncio.timeout(timeout_s):
        async with client.stream("POST", base + "/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return {"error": f"{response.status_code}: {response.text[:200]}"}
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if obj.get("usage"):
                    usage = obj["usage"]
                for choice in obj.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        chunks += 1
                        if first is None:
                            first = time.perf_counter()
    end = time.perf_counter()
    tokens = usage.get("completion_tokens") if usage else chunks
    return {"ttft_ms": (first - sent) * 1000 if first else None, "tokens": tokens, "end": end}


async def level(base: str, model: str, clients: int, max_tokens: int, timeout_s: float, offset: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, trust_env=False) as client:
        started = time.perf_counter()
        results = await asyncio.gather(
            *[
                one_request(client, base, model, PROMPTS[(offset + i) % len(PROMPTS)], max_tokens, timeout_s)
                for i in range(clients)
            ],
            return_exceptions=True,
        )
        wall = time.perf_counter() - started
    errors = [r for r in results if isinstance(r, BaseException) or "error" in r]
    good = [r for r in results if not isinstance(r, BaseException) and "error" not in r]
    return {
        "ttft_ms": [r["ttft_ms"] for r in good if r["ttft_ms"] is not None],
        "tokens": sum(r["tokens"] for r in good),
        "wall_s": wall,
        "tokens_per_s": sum(r["tokens"] for r in good) / wall if wall > 0 else 0.0,
        "errors": [repr(e) if isinstance(e, BaseException) else e["error"] for e in errors],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model folder (default: the starter)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--clients", default="1,4,8", help="concurrency levels (default 1,4,8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--warmup", type=int, default=1, help="requests per server before measuring")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument(
        "--parallel", type=int, default=4, help="Redline's replies decoded together at most (redline serve --parallel)"
    )
    parser.add_argument("--versus", help="a checkout of Redline to run as the baseline instead of transformers serve")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    if args.model is None:
        sys.path.insert(0, str(ROOT.parent))
        from redline.inference.sources.starter import ensure_starter

        args.model = str(ensure_starter())
    load_before = os.getloadavg()
    servers = start_servers(args, args.model)
    figures: dict = {name: {c: [] for c in levels} for name in servers}
    try:
        models = {}
        for name, (proc, port) in servers.items():
            models[name] = wait_ready(f"http://127.0.0.1:{port}/v1", proc, args.startup_timeout, name)
            print(f"{name} ready on port {port} ({models[name]})", file=sys.stderr)
        for name, (_proc, port) in servers.items():  # warm-up: first-request costs are nobody's throughput
            for _ in range(args.warmup):
                asyncio.run(level(f"http://127.0.0.1:{port}/v1", models[name], 1, 8, args.timeout, 0))
        names = list(servers)
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for c in levels:
                for name in order:
                    port = servers[name][1]
                    out = asyncio.run(level(f"http://127.0.0.1:{port}/v1", models[name], c, args.max_tokens,
                                            args.timeout, r * c))  # fmt: skip
                    figures[name][c].append(out)
                    print(
                        f"round {r + 1} {name:12s} {c} clients: {out['tokens_per_s']:.1f} tok/s, "
                        f"TTFT p50 {pct(out['ttft_ms'], 0.5):.0f} ms, errors {len(out['errors'])}, "
                        f"load {os.getloadavg()[0]:.2f}",
                        file=sys.stderr,
                    )
    finally:
        for proc, _port in servers.values():
            proc.terminate()
        for proc, _port in servers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    load_after = os.getloadavg()
    rows = []
    for c in levels:
        row = {"clients": c}
        for name in servers:
            runs = figures[name][c]
            ttfts = [t for run in runs for t in run["ttft_ms"]]
            row[name] = {
                "ttft_p50_ms": pct(ttfts, 0.5),
                "ttft_p95_ms": pct(ttfts, 0.95),
                "tokens_per_s": statistics.median(run["tokens_per_s"] for run in runs),
                "errors": sum(len(run["errors"]) for run in runs),
            }
        ratios = [
            a["tokens_per_s"] / b["tokens_per_s"]
            for a, b in zip(figures["redline"][c], figures["baseline"][c])
            if b["tokens_per_s"]
        ]
        row["ratio"] = statistics.median(ratios) if ratios else float("nan")
        rows.append(row)
    command = "python tools/benchmarks/bench_server.py " + " ".join(sys.argv[1:])
    other = baseline_label(args)
    lines = [
        "| clients | Redline TTFT p50 / p95 (ms) | Redline tok/s "
        f"| {other} TTFT p50 / p95 (ms) | {other} tok/s | Redline ÷ {other} (median of rounds) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        a, b = row["redline"], row["baseline"]
        lines.append(
            f"| {row['clients']} | {a['ttft_p50_ms']:.0f} / {a['ttft_p95_ms']:.0f} | {a['tokens_per_s']:.1f} "
            f"| {b['ttft_p50_ms']:.0f} / {b['ttft_p95_ms']:.0f} | {b['tokens_per_s']:.1f} | {row['ratio']:.2f}× |"
        )
    print("\n".join(lines))
    print(
        f"\n`{command.strip()}`; {args.rounds} rounds, {args.max_tokens} new tokens a request, {args.precision}, "
        f"Redline --parallel {args.parallel}, "
        f"load average {load_before[0]:.2f} before and {load_after[0]:.2f} after (1 min), "
        f"errors: Redline {sum(r['redline']['errors'] for r in rows)}, "
        f"{other} {sum(r['baseline']['errors'] for r in rows)}."
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "raw": figures, "load": [load_before, load_after]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
