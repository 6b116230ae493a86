"""Does a long prompt stall a reply that is streaming? (issue 27.5) One reply streams; once it has made some
tokens, a ~2,000-token prompt arrives beside it in the same batch. The streaming reply's longest gap between
tokens while that prompt is read, against its normal step (the median gap before the prompt arrived), for the
batcher's fixed 256-token chunks and for its paced chunks, in interleaved rounds on the same loaded model.

    python tools/benchmarks/prefill_stall_bench.py [--model starter] [--precision q8] [--prompt-tokens 2000]
        [--rounds 3] [--kv bf16|q8]

Prints, per mode, the median over rounds of: the normal step, the longest gap, their ratio (target: ≤ 3), the 99th
and 95th percentile gaps' ratios (what a single late wake-up of a shared machine does not move), the share of gaps
over 3 steps, and the long prompt's time to first token (what pacing costs the newcomer), with the load average;
and the same gaps of the streaming reply alone over as many steps (no prompt beside it: the machine's own jitter).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import NamedTuple


class Round(NamedTuple):
    """One round's measures of the streaming reply (seconds, and the share of its gaps over 3 normal steps)."""

    step: float  # its normal step: the median gap before the long prompt arrived
    longest: float
    ttft: float  # the long prompt's first token, from its arrival
    p99: float
    p95: float
    over_3: float


def one_round(target, batcher_cls, fixed, prompt_ids, long_ids, warm_tokens: int, alone_steps: int = 0):
    """``long_ids`` None: the streaming reply alone for ``alone_steps`` steps (its own jitter, the baseline)."""
    from redline.inference import DecodeOptions, GenerationRequest, SamplingSettings, percentile
    from redline.inference.events import TokenEvent
    from redline.inference.generation.lifecycle import DirectSink

    b = batcher_cls(target, 2, prefill_chunk=fixed)
    stream_times: list[float] = []
    long_first: list[float] = []

    def on_stream(event):
        if isinstance(event, TokenEvent):
            stream_times.append(time.perf_counter())

    def on_long(event):
        if isinstance(event, TokenEvent) and not long_first:
            long_first.append(time.perf_counter())

    options = DecodeOptions(strategy="fast", reuse_prefix=False)
    stream = GenerationRequest(
        input_ids=prompt_ids,
        # It must outlive the long prompt's read, which at a token a step takes thousands of steps (it is stopped then).
        sampling=SamplingSettings(max_new_tokens=6000, temperature=0, min_new_tokens=6000),
        options=options,
        record=False,
    )
    stream_sink = DirectSink(on_stream)
    b.add(stream_sink, stream, time.perf_counter())
    while len(stream_times) < warm_tokens:
        b.step()
    normal = statistics.median(t1 - t0 for t0, t1 in zip(stream_times[-20:], stream_times[-19:]))
    arrived = time.perf_counter()
    before = len(stream_times)
    if long_ids is None:
        for _ in range(alone_steps):
            b.step()
        long_first.append(arrived)
    else:
        long = GenerationRequest(
            input_ids=long_ids,
            sampling=SamplingSettings(max_new_tokens=4, temperature=0, min_new_tokens=4),
            options=options,
            record=False,
        )
        b.add(DirectSink(on_long), long, arrived)
        while not long_first:
            b.step()
        for _ in range(3):
            b.step()
    gaps = [t1 - t0 for t0, t1 in zip(stream_times[before - 1 :], stream_times[before:])]
    if not any(a.sink is stream_sink for a in b.active):
        raise SystemExit("the streaming reply ended before the long prompt was read: raise its max_new_tokens")
    b.cancel_all("benchmark over")
    while len(b):
        b.step()
    return Round(
        step=normal,
        longest=max(gaps),
        ttft=long_first[0] - arrived,
        p99=percentile(gaps, 0.99),
        p95=percentile(gaps, 0.95),
        over_3=sum(g > 3 * normal for g in gaps) / len(gaps),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-tokens", type=int, default=40)
    ap.add_argument("--kv", default="bf16", choices=("bf16", "q8"), help="the fast path's KV cache (default bf16)")
    args = ap.parse_args(argv)

    import torch

    from redline.inference import Engine, resolve_precision
    from redline.inference.generation.batch import PREFILL_CHUNK, Batcher

    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    engine = Engine()
    engine.record_memory = False
    engine.limits.kv = args.kv  # what `--kv` sets for a load (jobs.kv_form_job)
    engine.load(args.model, resolve_precision(args.precision, engine.device))
    target = engine.target
    vocab = target.tokenizer.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(100, vocab, (40,), generator=g).tolist()
    long_ids = torch.randint(100, vocab, (args.prompt_tokens,), generator=g).tolist()
    modes = {f"fixed {PREFILL_CHUNK}": PREFILL_CHUNK, "paced": None}
    rows: dict[str, list[Round]] = {m: [] for m in modes}
    rows["alone"] = []  # the streaming reply with no prompt beside it, as many steps as the paced read took
    with torch.inference_mode():
        for r in range(args.rounds):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for mode in order:
                rows[mode].append(one_round(target, Batcher, modes[mode], prompt_ids, long_ids, args.warm_tokens))
            paced = rows["paced"][-1]
            steps = max(1, round(paced.ttft / paced.step))  # its newcomer's TTFT in steps
            rows["alone"].append(one_round(target, Batcher, None, prompt_ids, None, args.warm_tokens, steps))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    med = statistics.median
    print(
        f"model {args.model}, {args.precision}, {args.kv} KV; "
        f"a {args.prompt_tokens}-token prompt arrives beside a streaming reply; "
        f"{args.rounds} interleaved rounds; load average {load_before} → {load_after}"
    )
    print(
        f"{'mode':<12} {'step ms':>8} {'longest gap ms':>15} {'gap / step':>11} {'p99 gap / step':>15} "
        f"{'p95 gap / step':>15} {'gaps over 3 steps':>18} {'newcomer TTFT s':>16}"
    )
    for mode, rs in rows.items():
        print(
            f"{mode:<12} {med(x.step for x in rs) * 1000:>8.1f} {med(x.longest for x in rs) * 1000:>15.1f} "
            f"{med(x.longest / x.step for x in rs):>11.2f} {med(x.p99 / x.step for x in rs):>15.2f} "
            f"{med(x.p95 / x.step for x in rs):>15.2f} {med(x.over_3 for x in rs):>17.2%} "
            f"{(f'{med(x.ttft for x in rs):.2f}' if mode != 'alone' else '–'):>16}"
        )
    print(
        "alone: the streaming reply with no prompt beside it for about as many steps as the paced read took; its "
        "longest gap is this machine's own jitter, the floor under the others'"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
