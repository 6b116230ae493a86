"""What offering tools costs a conversation's next turn (issue 51, item 4 and its target: with 20 tools enabled, turn
2's TTFT ≤ 1.3× a turn without tools, the definitions being cached).

Through ``redline serve``'s chat completions (in process, on 127.0.0.1, a free port), the model loaded once: per round
a conversation of two turns with 20 function tools offered (``tool_choice: "auto"``: read, and called or not, as
an agent's turns), and the same two turns with none, alternated (A B A B). Each round opens with words of its
own, so only what is the same in every round — the tools' definitions — can come from the prefix cache. Turn 2
sends back a fixed assistant reply, not the model's: a model with random weights (``--model`` a folder from
tools/accuracy/make_shaped_model.py) writes tokens whose text reads back as other tokens, and turn 2 then read 18
to 41 new tokens by chance, which swamped what the tools cost; with a fixed reply both arms read the same new
tokens (the reply, the question, the template's turn marks). It prints turn 2's TTFT (the server's
``timings.prompt_ms``: the reply's own prefill) and the tokens the cache held, the median ratio of the per-round
ratios, and the load average.

    python tools/benchmarks/tools_turn_cost.py [--model starter] [--precision q8] [--tools 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402

REPLY = "Rivers carry water from high ground to the sea."
WORDS = "amber basil cedar delta ember fjord garnet harbor iris juniper kestrel lumen".split()


def tool(i: int) -> dict:
    return {
        "type": "function",
        "function": {
            "name": f"lookup_{WORDS[i % len(WORDS)]}_{i}",
            "description": f"Look up record {i} of the {WORDS[i % len(WORDS)]} catalogue by its key and year.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}, "year": {"type": "integer"}},
                "required": ["key"],
            },
        },
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--tools", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    import httpx

    from redline.inference import ApiServer, EngineService, ServerConfig, parse_precision

    load = harness.LoadAverage()
    service = EngineService(lambda: harness.new_engine("cpu"))
    service.load(args.model, parse_precision(args.precision)).result(600)
    server = ApiServer(service, ServerConfig(port=0))
    server.start()
    tools = [tool(i) for i in range(args.tools)]
    name = service.target.name

    def turn(messages, offered):
        body = {"model": name, "messages": messages, "max_tokens": 8, "temperature": 0}
        if offered:
            body.update(tools=tools, tool_choice="auto")
        r = httpx.post(server.address + "/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        return r.json()["timings"]

    ratios = []
    try:
        for r in range(args.rounds):
            seen = {}
            for offered in (True, False):  # A B within each round
                opener = f"Round {r} {'with' if offered else 'without'} tools: {WORDS[r]} {WORDS[-r - 1]}."
                first = [{"role": "user", "content": f"{opener} Tell me about rivers."}]
                t1 = turn(first, offered)
                second = first + [{"role": "assistant", "content": REPLY}, {"role": "user", "content": "And lakes?"}]
                t2 = turn(second, offered)
                seen[offered] = (t1, t2)
                print(
                    f"round {r + 1} {'tools' if offered else 'none '}: turn 1 {t1['prompt_ms']:.0f} ms "
                    f"({t1['prompt_n']} tokens, {t1['cache_n']} cached) · turn 2 {t2['prompt_ms']:.0f} ms "
                    f"({t2['prompt_n']} tokens, {t2['cache_n']} cached)"
                )
            ratios.append(seen[True][1]["prompt_ms"] / seen[False][1]["prompt_ms"])
    finally:
        server.stop(10)
        service.shutdown(30)
    print(
        f"turn 2 with {args.tools} tools ÷ without: median {statistics.median(ratios):.2f}× "
        f"({', '.join(f'{x:.2f}' for x in ratios)}); target ≤ 1.3×; load {load}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
