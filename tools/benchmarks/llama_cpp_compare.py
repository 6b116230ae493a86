"""Redline's fast path against llama.cpp on the starter, measured in the same run.

    python tools/benchmarks/llama_cpp_compare.py --llama-python PATH/TO/venv/bin/python --gguf F16=a.gguf \\
        --gguf Q8_0=b.gguf --gguf Q4_0=c.gguf [--rounds 5] [--new-tokens 64] [--prompts short,long]

llama.cpp runs through llama-cpp-python in another interpreter (``tools/benchmarks/llama_cpp_worker.py``): a measuring
tool, never a dependency. Each Redline configuration is paired with the llama.cpp file of the same class
(bf16 ↔ F16, q8 ↔ Q8_0, q4 ↔ Q4_0); each round runs every pair, alternating which side goes first, so the
machine's drift falls on both. The table gives medians over rounds and the median of the per-round ratios
(Redline ÷ llama.cpp for tokens/s; llama.cpp ÷ Redline for TTFT, so > 1 is Redline ahead in both), with the
load average before and after. Both sides get the same prompt token ids (the model's chat template) and make
exactly ``--new-tokens`` tokens greedily; decode tokens/s counts the tokens after the first over their time,
TTFT includes the prefill.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402

PAIRS = {"bf16": "F16", "q8": "Q8_0", "q4": "Q4_0", "fp32": "F16"}


class LlamaCpp:
    def __init__(self, python: str):
        worker = Path(__file__).with_name("llama_cpp_worker.py")
        self.proc = subprocess.Popen([python, str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, model: str, tokens: list[int], new_tokens: int) -> dict:
        self.proc.stdin.write(json.dumps({"model": model, "tokens": tokens, "new_tokens": new_tokens}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the llama.cpp worker stopped (is llama-cpp-python installed in that interpreter?)")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", required=True, help="a Python interpreter with llama-cpp-python installed")
    ap.add_argument("--gguf", action="append", default=[], help="CLASS=path, CLASS one of F16, Q8_0, Q4_0")
    ap.add_argument("--precisions", default="bf16,q8,q4", help="Redline's fast-path precisions to compare")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", default="short,long", help="built-in prompt sets whose first prompt to use")
    ap.add_argument("--model", default="starter")
    ap.add_argument("--json", type=Path, help="also write every measurement here")
    args = ap.parse_args(argv)

    from redline.inference.kernels.cpu import library as native

    ggufs = dict(item.split("=", 1) for item in args.gguf)
    precisions = [p for p in args.precisions.split(",") if p]
    load = harness.LoadAverage()
    engines = {p: harness.load(args.model, p) for p in precisions}
    kernels = native.status()
    tokenizer = next(iter(engines.values())).target.tokenizer
    prompts = {
        name: harness.prompt_ids(tokenizer, name, context=8192, new_tokens=args.new_tokens)
        for name in args.prompts.split(",")
    }
    llama = LlamaCpp(args.llama_python)
    rows: dict = {}
    try:
        for rnd in range(args.rounds):
            for p in precisions:
                gguf = ggufs.get(PAIRS[p])
                for prompt_name, ids in prompts.items():
                    for side in harness.order(("redline", "llama"), rnd):
                        key = (p, prompt_name, side)
                        if side == "redline":
                            r = harness.reply(engines[p].target, ids, args.new_tokens)
                            rec = {"ttft_ms": r.ttft_ms, "decode_tokens_per_s": r.tokens_per_s, "tokens": r.new_tokens}
                        elif gguf:
                            rec = llama.run(str(Path(gguf).resolve()), ids, args.new_tokens)
                        else:
                            continue
                        rows.setdefault(key, []).append(rec)
            print(f"round {rnd + 1}/{args.rounds} done (load {load})", file=sys.stderr)
    finally:
        llama.close()

    print(
        f"Redline fast path vs llama.cpp, model {args.model}, {args.new_tokens} new tokens, {args.rounds} rounds "
        f"(alternating order); native kernels: {'on' if kernels['loaded'] else 'off (' + str(kernels['reason']) + ')'}"
    )
    print(f"load average {load}")
    print()
    print(
        "| Redline | llama.cpp | prompt (tokens) | Redline decode tok/s | llama.cpp decode tok/s | ratio (median "
        "of rounds) | Redline TTFT ms | llama.cpp TTFT ms | TTFT ratio llama/Redline |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for p in precisions:
        for prompt_name, ids in prompts.items():
            ours, theirs = rows.get((p, prompt_name, "redline"), []), rows.get((p, prompt_name, "llama"), [])
            if not ours or not theirs:
                continue
            dec = [a["decode_tokens_per_s"] / b["decode_tokens_per_s"] for a, b in zip(ours, theirs)]
            ttft = [b["ttft_ms"] / a["ttft_ms"] for a, b in zip(ours, theirs)]
            med = statistics.median
            print(
                f"| fast:{p} | {PAIRS[p]} | {prompt_name} ({len(ids)}) "
                f"| {med(a['decode_tokens_per_s'] for a in ours):.1f} "
                f"| {med(b['decode_tokens_per_s'] for b in theirs):.1f} | {med(dec):.2f}× "
                f"({', '.join(f'{x:.2f}' for x in dec)}) | {med(a['ttft_ms'] for a in ours):.0f} "
                f"| {med(b['ttft_ms'] for b in theirs):.0f} | {med(ttft):.2f}× |"
            )
    if args.json:
        args.json.write_text(json.dumps({f"{k[0]}|{k[1]}|{k[2]}": v for k, v in rows.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
