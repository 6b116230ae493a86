"""Load and faults against the window's server: does the window stay responsive, does every request end, does
memory come back?

The real window (offscreen unless a display is set, on a throwaway profile) loads the model and turns its
Server switch on (127.0.0.1, a free port). A child process then runs ``tests/server_load.py``'s load — by
default 8 clients × 25 requests, streamed and whole completions mixed with random disconnects and malformed
bodies — while the window sends chat replies of its own and a 5 ms QTimer measures the UI thread's longest
stall (as tools/benchmarks/bench_app.py does). Reported: every outcome, the rule breaks (a well-formed request without a
complete answer or a clear error, a malformed one without a 4xx error object, anything that hung), the longest
stall, and the process's RSS before the load and after it (once the server is idle again).

    python tools/benchmarks/bench_server_load.py                         # the starter, 8 × 25
    python tools/benchmarks/bench_server_load.py --model PATH --clients 4 --requests 5

Only loopback traffic; every request has a timeout and the load a deadline. Prints a RESULT line (JSON).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(__file__).resolve().parent
BUDGET_STALL_MS = 50.0
BUDGET_MEMORY_PCT = 10.0


LOAD_TOOL = str(ROOT / "tests" / "server_load.py")  # the test suite's load, run larger here


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="starter")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=25)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=3000.0, help="seconds the whole load may take")
    parser.add_argument("--chat-replies", type=int, default=3, help="window replies sent during the load")
    args = parser.parse_args()

    profile = Path(tempfile.mkdtemp(prefix="redline-load-"))
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["XDG_CONFIG_HOME"] = str(profile / "config")
    os.environ["XDG_DATA_HOME"] = str(profile / "data")
    os.environ["REDLINE_DATA_DIR"] = str(profile / "redline-data")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(TOOLS))
    from bench_app import Gui

    cfg = profile / "config" / "redline"
    cfg.mkdir(parents=True)
    settings = {"model": args.model, "precision": args.precision, "strategy": "fast", "server_port": 0,
                "temperature": 0, "max_new_tokens": args.max_tokens}  # fmt: skip
    (cfg / "settings.json").write_text(json.dumps(settings))
    load_before = os.getloadavg()
    gui = Gui()
    window = gui.open_window()
    window.set_serving(True)
    gui.wait_until(lambda: window.server.running and not window.server.busy, 60, "the server to start")
    address = window.server.server.address
    model_id = window.engine.engine.target.name
    # Warm up (the server's tokenizer, the first batch) so the baseline holds what any served model holds.
    warm = subprocess.run(
        [sys.executable, LOAD_TOOL, address, model_id, "--clients", "1", "--requests", "2", "--max-tokens", "4",
         "--seed", "99"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    gui.send(window, "Warm up: say hi.")
    gui.settle(2.0)
    gc.collect()
    rss_before = rss_mb()
    gui.start_meter()
    proc = subprocess.Popen(
        [sys.executable, LOAD_TOOL, address, model_id, "--clients", str(args.clients),
         "--requests", str(args.requests), "--max-tokens", str(args.max_tokens),
         "--seed", str(args.seed), "--deadline", str(args.deadline)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started = time.monotonic()
    replies = []
    for i in range(args.chat_replies):  # the chat keeps working while the API is under load
        if proc.poll() is not None:
            break
        replies.append(gui.send(window, f"Chat reply {i + 1} during the load: name a fruit.", timeout_s=args.deadline))
    gui.wait_until(lambda: proc.poll() is not None, args.deadline + 60, "the load to end")
    out, err = proc.communicate(timeout=60)
    seconds = time.monotonic() - started
    gui.wait_until(lambda: window.server.server.stats.active == 0, 60, "the server to be idle")
    gui.settle(2.0)
    gui.stop_meter()
    gc.collect()
    rss_after = rss_mb()
    status = window.engine.status()
    line = next((x for x in out.splitlines() if x.startswith("LOAD ")), None)
    load = json.loads(line[5:]) if line else {"problems": [f"the load process printed no result: {err[-400:]}"]}
    window.set_serving(False)
    gui.wait_until(lambda: not window.server.running and not window.server.busy, 30, "the server to stop")
    window.shutdown()
    load_after = os.getloadavg()
    growth_pct = 100.0 * (rss_after - rss_before) / rss_before
    result = {
        "model": model_id,
        "clients": args.clients,
        "requests_each": args.requests,
        "seconds": round(seconds, 1),
        "load": load,
        "chat_replies": [r.finish_reason if r is not None else "failed" for r in replies],
        "longest_stall_ms": round(gui.longest_gap_ms, 1),
        "gaps_over_50_ms": gui.gaps_over_50,
        "rss_before_mb": round(rss_before, 1),
        "rss_after_mb": round(rss_after, 1),
        "rss_growth_pct": round(growth_pct, 1),
        "engine_after": status,
        "warm_up_ok": warm.returncode == 0,
        "load_average": [round(load_before[0], 2), round(load_after[0], 2)],
        "command": "python tools/benchmarks/bench_server_load.py " + " ".join(sys.argv[1:]),
    }
    print("RESULT " + json.dumps(result), flush=True)
    ok = (
        not load.get("problems")
        and load.get("hung", 1) == 0
        and gui.longest_gap_ms <= BUDGET_STALL_MS
        and growth_pct <= BUDGET_MEMORY_PCT
        and status["active"] == 0
        and status["queued"] == 0
    )
    print(
        f"{load.get('requests', 0)} requests from {args.clients} clients in {seconds:.0f} s: "
        f"{len(load.get('problems', []))} rule breaks, {load.get('hung', '?')} hung; longest UI stall "
        f"{gui.longest_gap_ms:.0f} ms (budget {BUDGET_STALL_MS:.0f}); RSS {rss_before:.0f} → {rss_after:.0f} MB "
        f"({growth_pct:+.1f} %, budget {BUDGET_MEMORY_PCT:.0f} %); "
        f"load average {load_before[0]:.2f} → {load_after[0]:.2f}",
        file=sys.stderr,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
