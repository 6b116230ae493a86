"""One conversation, turn by turn, through `redline serve` and llama.cpp's server on the same model, same run:
does the first token come as quickly at turn 8 as at turn 1?

Each turn adds a user message of about ``--turn-tokens`` tokens and asks for ``--max-tokens`` tokens, greedy,
streamed; the client sends the whole history every time, as every OpenAI client does (each server's own
replies become its history). TTFT is from sending the request to the first content chunk. Each round runs
the whole conversation on one server and then the other, alternating which goes first (A B, B A, …); the
table gives, per turn, the median TTFT over rounds, and the median of the per-round ratios (llama.cpp ÷
Redline: > 1 is Redline first). Redline's ``usage.prompt_tokens_details.cached_tokens`` (when it says) is
shown beside its TTFT.

    python tools/benchmarks/conversation_bench.py --model FILE_OR_FOLDER [--gguf FILE.gguf] \\
        [--llama-python PATH/TO/venv/bin/python] [--precision q8] [--turns 8] [--rounds 3]

llama.cpp's server is llama-cpp-python's (`python -m llama_cpp.server`), in its own interpreter: a measuring
tool, never a dependency. Without --llama-python only Redline runs. Both servers listen on 127.0.0.1 on free
ports and are stopped at the end; every request has a timeout.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import free_port, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PARAGRAPH = (
    "Local language models run on the graphics card a person already owns, and the questions people bring are "
    "about speed and memory: how many tokens a second, how long before the first one, whether a model fits in "
    "eight gigabytes with a long context, and what quantisation costs in quality. "
)


def turn_text(i: int, tokens: int, opening: str = "") -> str:
    """Turn ``i``'s message; ``opening`` starts the first one (a conversation of its own: see ``conversation``)."""
    words = max(1, int(tokens * 0.75))
    body = (PARAGRAPH * (1 + words // 60)).split()[:words]
    return (opening if i == 0 else "") + f"Turn {i + 1}. " + " ".join(body) + " What should I try next?"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def turn(client, base: str, model: str, messages: list, max_tokens: int) -> dict:
    """One streamed turn of the conversation ``messages`` (the reply is appended to it): its TTFT from sending to the
    first content chunk (NaN without one), and the prompt and cached tokens the server reported."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent, first, text, usage = time.perf_counter(), None, [], {}
    with client.stream("POST", base + "/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{base}: {response.status_code} {response.text[:300]}")
        for line in response.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            obj = json.loads(line[5:])
            usage = obj.get("usage") or usage
            for choice in obj.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    messages.append({"role": "assistant", "content": "".join(text)})
    details = usage.get("prompt_tokens_details") or {}
    return {
        "ttft_ms": (first - sent) * 1000 if first else float("nan"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens"),
    }


def conversation(
    base: str, model: str, turns: int, turn_tokens: int, max_tokens: int, timeout_s: float, opening: str = ""
) -> list[dict]:
    """The conversation, turn by turn. Each round opens with words of its own (``opening``): the same greedy
    conversation again was served from the previous round's cached pages (78-516 ms a turn against 1.4-4.3 s
    cold), so only the first round measured the turns."""
    import httpx

    messages: list = []
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        rows = []
        for i in range(turns):
            messages.append({"role": "user", "content": turn_text(i, turn_tokens, opening)})
            rows.append(turn(client, base, model, messages, max_tokens))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="what Redline serves (a folder, a .gguf, starter)")
    ap.add_argument("--gguf", help="the GGUF llama.cpp serves (default: --model)")
    ap.add_argument("--llama-python", help="an interpreter with llama-cpp-python[server]")
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--turn-tokens", type=int, default=130)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONPATH=str(ROOT))
    # Disk pages of this run alone: an earlier run's pages of the same conversation would make round 1 warm.
    pages = tempfile.TemporaryDirectory(prefix="conversation-bench-pages-")
    env["REDLINE_KV_PAGES_DIR"] = pages.name
    servers = {}
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "redline"), "serve", "--model", args.model, "--precision",
           args.precision, "--host", "127.0.0.1", "--port", str(port),
           "--max-tokens", str(args.max_tokens)]  # fmt: skip
    # Each server's log to a file of its own: a pipe nobody reads fills up and stops the server (llama.cpp logs
    # every request), which read as "did not answer".
    logs = {name: tempfile.TemporaryFile() for name in ("redline", "llama.cpp")}
    servers["redline"] = (subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=logs["redline"]), port)
    if args.llama_python:
        port = free_port()
        cmd = [args.llama_python, "-m", "llama_cpp.server", "--model", args.gguf or args.model, "--host",
               "127.0.0.1", "--port", str(port), "--n_ctx", str(args.context), "--n_threads", str(args.threads),
               "--n_threads_batch", str(args.threads)]  # fmt: skip
        servers["llama.cpp"] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=logs["llama.cpp"]), port)
    results: dict[str, list[list[dict]]] = {name: [] for name in servers}
    before = load_average()
    try:
        models = {
            name: wait_ready(f"http://127.0.0.1:{port}/v1", proc, 600, name) for name, (proc, port) in servers.items()
        }
        order = list(servers)
        run_id = os.urandom(3).hex()
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                base = f"http://127.0.0.1:{servers[name][1]}/v1"
                opening = f"Conversation {r + 1} of run {run_id}. "  # both servers, one round: the same words
                rows = conversation(
                    base, models[name], args.turns, args.turn_tokens, args.max_tokens, args.timeout, opening
                )
                results[name].append(rows)
                print(f"round {r + 1} {name}: " + ", ".join(f"{row['ttft_ms']:.0f}" for row in rows), file=sys.stderr)
    finally:
        for proc, _port in servers.values():
            proc.terminate()
        for proc, _port in servers.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    after = load_average()

    def median_ttft(name: str, turn: int) -> float:
        return statistics.median(rows[turn]["ttft_ms"] for rows in results[name])

    head = "| turn | prompt tokens | Redline TTFT ms (cached tokens) |"
    if "llama.cpp" in results:
        head += " llama.cpp TTFT ms | llama.cpp ÷ Redline |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for t in range(args.turns):
        last = results["redline"][-1][t]
        line = f"| {t + 1} | {last['prompt_tokens']} | {median_ttft('redline', t):.0f} ({last['cached_tokens']}) |"
        if "llama.cpp" in results:
            ratios = [ll[t]["ttft_ms"] / rl[t]["ttft_ms"] for rl, ll in zip(results["redline"], results["llama.cpp"])]
            line += f" {median_ttft('llama.cpp', t):.0f} | {statistics.median(ratios):.2f}× |"
        print(line)
    turn1, turn_n = median_ttft("redline", 0), median_ttft("redline", args.turns - 1)
    print(
        f"\nRedline turn {args.turns} ÷ turn 1: {turn_n / turn1:.2f}×. {args.model} at {args.precision}, "
        f"{args.turns} turns of ~{args.turn_tokens} tokens, {args.max_tokens} new tokens each, {args.rounds} rounds; "
        f"load average {before} -> {after}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
