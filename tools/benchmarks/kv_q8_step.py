"""Is a decode step faster with the KV cache in 8 bits (``--kv q8``) than in bf16, at a long position?

One decoder (the same fused weights), two pools (bf16 and q8) each holding the same ``--position`` tokens of real
text (the ``long`` prompt set's documents, repeated to length, read by the decoder's own prefill into each pool), then
rounds of ``--steps`` decode steps of one sequence at positions ``--position``.. on each pool in turn (A B, then B A:
``harness.order``). A round's figure is its median step; the result is the median of the per-round ratios bf16 ÷ q8
(above 1: q8 is faster), with the load average at the start and the end.

    python tools/benchmarks/kv_q8_step.py [--model starter] [--precision q8] [--position 4000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness (tools/ is not a package)
import harness  # noqa: E402


def text_ids(tokenizer, n: int) -> list[int]:
    from redline.inference import load_prompt_set

    text = "\n\n".join(p.messages[-1]["content"] for p in load_prompt_set("long").prompts)
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    return (ids * (n // len(ids) + 1))[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--position", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=24, help="decode steps per arm and round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from redline.inference.decoding.fastpath import get_decoder
    from redline.inference.decoding.kv_cache import PagedKV

    load = harness.LoadAverage()
    engine = harness.load(args.model, args.precision)
    target = engine.target
    end = args.position + args.steps + 1
    dec = get_decoder(target, end + 64)
    own = dec.kv
    ids = text_ids(target.tokenizer, end)
    arms = {}
    with torch.inference_mode():
        for form in ("bf16", "q8"):
            kv = PagedKV(own.layers, own.kv_heads, own.head_dim, own.dtype, own.device, end, own.cleared, form=form)
            dec.kv = kv
            kv.reserve(0, end)
            for start in range(0, args.position, 512):  # the prompt in chunks, as a reply reads a long one
                dec.prefill(torch.tensor(ids[start : min(start + 512, args.position)]), start, seq=0)
            arms[form] = kv
        times: dict[str, list[float]] = {"bf16": [], "q8": []}
        for r in range(args.rounds):
            for form in harness.order(("bf16", "q8"), r):
                dec.kv = arms[form]
                each = []
                for i in range(args.steps):
                    p = args.position + i
                    started = time.perf_counter()
                    dec.step(torch.tensor([ids[p]]), [p], [0])
                    each.append((time.perf_counter() - started) * 1000)
                times[form].append(statistics.median(each))
    dec.kv = own
    ratio = harness.median_ratio(times["bf16"], times["q8"])
    result = {
        "model": args.model,
        "precision": target.precision.label(),
        "position": args.position,
        "kernels": "native whole step" if dec.whole_step else ("native operators" if dec.native else "torch"),
        "threads": torch.get_num_threads(),
        "bf16_kv_step_ms": times["bf16"],
        "q8_kv_step_ms": times["q8"],
        "bf16_over_q8": ratio,
        "per_round": harness.ratio_text(times["bf16"], times["q8"]),
        "kv_bytes_per_token": {f: arms[f].bytes_per_token for f in arms},
        "load_average": str(load),
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"{args.model} {result['precision']} ({result['kernels']}, {result['threads']} threads), step at position "
            f"{args.position}: bf16 KV {statistics.median(times['bf16']):.2f} ms, q8 KV "
            f"{statistics.median(times['q8']):.2f} ms (medians of {args.rounds} rounds of {args.steps} steps); "
            f"bf16 ÷ q8 per round: {result['per_round']}; KV bytes a token "
            f"{result['kv_bytes_per_token']['bf16']:,} → {result['kv_bytes_per_token']['q8']:,}; "
            f"load average {load}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
