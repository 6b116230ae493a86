"""A bounded load of well-formed, malformed and abandoned requests against an OpenAI-compatible server.

``run_load(address, model, clients, requests, …)`` starts ``clients`` threads; each sends ``requests``
requests, one after another, drawn from a seeded mix: streamed and whole chat completions (which must end
with a complete answer or a clear OpenAI error object), streams the client abandons after a few chunks
(random disconnects), and malformed bodies (bad JSON, an unknown field, a mistyped field, another model),
which must get a 4xx error object. Nothing may hang: every request has a timeout and the whole load a
deadline. Used by tools/benchmarks/bench_server_load.py (8 clients × 25 requests) and tests/test_server_load.py
(a smaller version). Loopback only.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

KINDS = ("stream", "stream", "stream", "whole", "disconnect", "malformed")
MALFORMED = ("bad-json", "unknown-field", "wrong-type", "other-model", "empty-messages")


@dataclass
class LoadResult:
    outcomes: Counter = field(default_factory=Counter)  # (kind, outcome) → count
    problems: list = field(default_factory=list)  # what broke the rules, in a sentence each
    latencies_s: list = field(default_factory=list)
    seconds: float = 0.0
    hung: int = 0

    def summary(self) -> dict:
        return {
            "outcomes": {f"{k}:{o}": n for (k, o), n in sorted(self.outcomes.items())},
            "problems": self.problems[:20],
            "requests": sum(self.outcomes.values()),
            "seconds": round(self.seconds, 1),
            "hung": self.hung,
        }


def _body(model: str, rng: random.Random, max_tokens: int, stream: bool) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": rng.choice(["Hi!", "Name a colour.", "Count to five.", "Why?"])}],
        "max_tokens": max_tokens,
        "temperature": rng.choice([0, 0.7]),
        "seed": rng.randrange(1000),
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _is_error_object(response) -> bool:
    try:
        error = response.json()["error"]
        return bool(error["message"]) and "Traceback" not in response.text
    except Exception:
        return False


def one(client, address: str, model: str, kind: str, rng: random.Random, max_tokens: int, result: LoadResult, lock):
    url = address + "/chat/completions"
    outcome, problem = "ok", None
    try:
        if kind == "malformed":
            what = rng.choice(MALFORMED)
            good = _body(model, rng, max_tokens, False)
            if what == "bad-json":
                response = client.post(
                    url, content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"}
                )
            else:
                if what == "unknown-field":
                    good["temperatur"] = 1
                elif what == "wrong-type":
                    good["max_tokens"] = "many"
                elif what == "other-model":
                    good["model"] = "no-such-model"
                else:
                    good["messages"] = []
                response = client.post(url, json=good)
            outcome = f"{response.status_code}"
            if response.status_code not in (400, 404) or not _is_error_object(response):
                problem = f"malformed ({what}) got {response.status_code}: {response.text[:120]}"
        elif kind == "whole":
            response = client.post(url, json=_body(model, rng, max_tokens, False))
            outcome = f"{response.status_code}"
            if response.status_code == 200:
                reply = response.json()
                if reply["choices"][0]["finish_reason"] not in ("stop", "length") or "usage" not in reply:
                    problem = f"incomplete answer: {str(reply)[:120]}"
            elif not _is_error_object(response):
                problem = f"whole request got {response.status_code} without an error object"
        else:
            body = _body(model, rng, max_tokens if kind == "stream" else max(max_tokens, 64), True)
            with client.stream("POST", url, json=body) as response:
                outcome = f"{response.status_code}"
                if response.status_code != 200:
                    response.read()
                    if not _is_error_object(response):
                        problem = f"stream got {response.status_code} without an error object"
                else:
                    leave_after = rng.randint(1, 4) if kind == "disconnect" else None
                    chunks, done, finish = 0, False, None
                    for line in response.iter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            done = True
                            break
                        obj = json.loads(data)
                        if "error" in obj:
                            outcome = "error-event"
                            break
                        for choice in obj.get("choices") or []:
                            finish = choice.get("finish_reason") or finish
                        chunks += 1
                        if leave_after is not None and chunks >= leave_after:
                            outcome = "left"
                            break
                    if kind == "stream" and outcome == "200" and not (done and finish in ("stop", "length")):
                        problem = f"stream ended without its end (done={done}, finish={finish})"
    except Exception as exc:  # a timeout is a hang; anything else is a broken answer
        name = type(exc).__name__
        outcome = name
        problem = f"{kind}: {name}: {exc}"[:200]
        if "Timeout" in name:
            with lock:
                result.hung += 1
    with lock:
        result.outcomes[(kind, outcome)] += 1
        if problem:
            result.problems.append(problem)


def run_load(
    address: str,
    model: str,
    clients: int = 8,
    requests: int = 25,
    max_tokens: int = 24,
    seed: int = 0,
    request_timeout_s: float = 300.0,
    deadline_s: float = 3600.0,
) -> LoadResult:
    import httpx

    result = LoadResult()
    lock = threading.Lock()
    started = time.monotonic()
    stop_at = started + deadline_s

    def client_loop(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        with httpx.Client(timeout=request_timeout_s, trust_env=False) as client:
            for _ in range(requests):
                if time.monotonic() > stop_at:
                    return
                t = time.monotonic()
                one(client, address, model, rng.choice(KINDS), rng, max_tokens, result, lock)
                with lock:
                    result.latencies_s.append(time.monotonic() - t)

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, stop_at - time.monotonic()) + 5)
    still = sum(t.is_alive() for t in threads)
    if still:
        result.hung += still
        result.problems.append(f"{still} client(s) still running at the deadline")
    result.seconds = time.monotonic() - started
    return result


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Run the bounded load against ADDRESS (loopback only).")
    parser.add_argument("address")
    parser.add_argument("model")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=25)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=3000.0)
    args = parser.parse_args()
    from urllib.parse import urlsplit

    host = urlsplit(args.address).hostname or ""
    if not (host == "localhost" or host.startswith("127.") or host == "::1"):
        parser.error("the load is for loopback addresses only (127.0.0.1, localhost, ::1)")
    result = run_load(args.address, args.model, args.clients, args.requests, args.max_tokens, args.seed,
                      deadline_s=args.deadline)  # fmt: skip
    print("LOAD " + json.dumps(result.summary()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
