"""What the tool-call grammar's mask costs per decode step (issue 29: < 10 % of a step with tools offered in auto
mode while the model writes free text; 0 when no grammar is active).

On the starter model's fast path, in interleaved rounds, the same greedy reply (same prompt: the tools' fallback
system prompt and a question) runs with each logits processor the server builds (``preparation.py``):
none; tools + ``auto`` (the lazy grammar); tools + ``required`` (the grammar from the first token); a
``response_format`` json_schema. Each processor is wrapped in a timer that the engine calls exactly where it calls
the processor, so the table gives both the per-token step (the engine's own ``per_token_ms``) and the processor's
own share of it. Prints medians over rounds, as ms per token and as % of the plain step, and the load average.

    .venv/bin/python tools/benchmarks/grammar_cost.py --precision q8,bf16 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
                "required": ["city"],
            },
        },
    }
]
SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "schema": TOOLS[0]["function"]["parameters"]},
}
QUESTION = "Write a short paragraph about the history of the bicycle."


class Timed:
    """A logits processor wrapped in a timer: called as the engine calls the processor it wraps."""

    def __init__(self, inner):
        self.inner, self.ms = inner, []

    @property
    def error(self) -> str:
        return getattr(self.inner, "error", "")

    def __call__(self, input_ids, scores):
        t0 = time.perf_counter()
        out = self.inner(input_ids, scores)
        if out.device.type != "cpu":
            import torch

            torch.cuda.synchronize(out.device)
        self.ms.append((time.perf_counter() - t0) * 1e3)
        return out


def processors(tok, vocab: int):
    """The processors the server builds for each case (None: no processor installed at all)."""
    from redline.inference.decoding.tool_calls import family_of, tool_grammar
    from redline.inference.server.structured import GrammarProcessor, GrammarTokenizers, grammar_for

    lltok = GrammarTokenizers().get(tok, vocab)
    family, _ = family_of(tok)
    return {
        "no tools": lambda: None,
        "tools auto (lazy)": lambda: tool_grammar(lltok, tok, family, TOOLS, "auto", True),
        "tools required": lambda: tool_grammar(lltok, tok, family, TOOLS, "required", True),
        "json_schema": lambda: GrammarProcessor(lltok, grammar_for(SCHEMA)),
    }


def reply(batcher, ids: list[int], processor, tokens: int):
    from redline.inference import DecodeOptions, GenerationRequest, SamplingSettings
    from redline.inference.generation.lifecycle import DirectSink

    request = GenerationRequest(input_ids=list(ids), sampling=SamplingSettings(max_new_tokens=tokens, temperature=0))
    request.options = DecodeOptions("fast")
    request.record = False
    request.logits_processor = processor
    return batcher.run_one(DirectSink(), request, time.perf_counter())


def measure(precision: str, args) -> None:
    from redline.inference.decoding.tool_calls import fallback_system, family_of

    engine = harness.load(args.model, precision)
    target = engine.target
    tok = target.tokenizer
    vocab = getattr(target.model.config, "vocab_size", None)
    _, native = family_of(tok)
    system = {"role": "system", "content": "You are a helpful assistant." if native else fallback_system(TOOLS)}
    messages = [system, {"role": "user", "content": QUESTION}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    batcher = target.batcher()
    makers = processors(tok, vocab)
    names = list(makers)
    reply(batcher, ids, None, args.tokens)  # warms the kernels
    step: dict[str, list[float]] = {n: [] for n in names}
    own: dict[str, list[float]] = {n: [] for n in names}
    ratio: dict[str, list[float]] = {n: [] for n in names}
    count: dict[str, int] = {}
    load = harness.LoadAverage()
    for r in range(args.rounds):
        got = {}
        for name in harness.order(names, r):
            inner = makers[name]()
            timed = Timed(inner) if inner is not None else None
            result = reply(batcher, ids, timed, args.tokens)
            ms = statistics.median(result.per_token_ms[1:] or result.per_token_ms)
            got[name] = ms
            count[name] = len(result.per_token_ms)
            own[name].append(statistics.median(timed.ms) if timed and timed.ms else 0.0)
        plain = got["no tools"]
        for name in names:
            step[name].append(got[name])
            ratio[name].append(got[name] / plain)
        print(f"{precision}: round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = statistics.median
    base = med(step["no tools"])
    print(
        f"\nmodel {args.model}, {precision}, device {engine.device}, vocabulary {vocab}; {args.rounds} interleaved "
        f"rounds, greedy replies of up to {args.tokens} tokens; load average {load}"
    )
    print(f"{'case':<20} {'tokens':>6} {'step ms':>8} {'vs plain':>9} {'processor ms':>13} {'% of step':>10}")
    for name in names:
        extra = (med(ratio[name]) - 1) * 100
        print(
            f"{name:<20} {count[name]:>6} {med(step[name]):>8.2f} {extra:>+8.1f}% {med(own[name]):>13.3f} "
            f"{med(own[name]) / base * 100:>9.1f}%"
        )
    engine.unload()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="q8,bf16", help="comma-separated precisions, each loaded in turn")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    import torch

    with torch.inference_mode():
        for precision in args.precision.split(","):
            measure(precision.strip(), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
