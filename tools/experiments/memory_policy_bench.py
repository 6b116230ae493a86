"""What Redline's memory policies (inference/memory/policy.py) cost and save, measured on the starter in bf16.

  heap     decode tokens/s with glibc's heap thresholds tight (128 KiB: every block of that size gets its own
           mapping and a heap's free top goes back at once) vs wide (32 MiB / 64 MiB, where glibc's dynamic
           thresholds end up), alternating reply by reply in one process. Redline keeps them tight only
           while it loads and frees a model; this shows why not all the time.
  caches   oneDNN's and ideep's kernel caches at Redline's capacity vs the libraries' default (1024 entries),
           each in its own process, alternated: C-heap memory in use after a conversation of 30 turns
           (every turn a new prompt length, so new kernels), and decode tokens/s.

Each ratio compares figures measured in the same run. Linux (glibc) only: it reads mallinfo2.

Usage: python tools/experiments/memory_policy_bench.py [--part heap,caches] [--rounds N]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402

PROMPT = [{"role": "user", "content": "Explain in two sentences why the sky is blue."}]


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def heap_in_use_mb() -> float:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20  # heap blocks in use + blocks in their own mappings


def _engine():
    return harness.load("starter", "bf16")


def _decode_rate(engine, strategy: str, tokens: int = 64) -> float:
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings

    settings = SamplingSettings(max_new_tokens=tokens, min_new_tokens=tokens, temperature=0.0)
    return engine.chat(PROMPT, settings, DecodeOptions(strategy=strategy)).tokens_per_s


def part_heap(rounds: int) -> None:
    from redline.inference.memory import policy as memory_policy

    lib = memory_policy._glibc()
    if not lib:
        print("heap: not glibc; nothing to measure")
        return
    engine = _engine()
    policies = {
        "wide": (memory_policy.DECODE_MMAP_BYTES, memory_policy.DECODE_TRIM_BYTES),
        "tight": (memory_policy.OWN_MAPPING_BYTES, memory_policy.OWN_MAPPING_BYTES),
    }
    for strategy in ("kv", "fast"):
        _decode_rate(engine, strategy)  # warm-up: the fast path fuses its weights on first use
        rates = {name: [] for name in policies}
        for _ in range(rounds):
            for name, (mmap_bytes, trim_bytes) in policies.items():
                lib.mallopt(memory_policy.M_MMAP_THRESHOLD, mmap_bytes)
                lib.mallopt(memory_policy.M_TRIM_THRESHOLD, trim_bytes)
                rates[name].append(_decode_rate(engine, strategy))
        memory_policy._apply()  # back to Redline's own setting
        wide, tight = (statistics.median(rates[n]) for n in ("wide", "tight"))
        slower = sum(t < w for t, w in zip(rates["tight"], rates["wide"]))
        print(
            f"heap, {strategy}:bf16, 64 tokens × {rounds} rounds: wide {wide:.1f} tok/s, tight {tight:.1f} tok/s "
            f"→ tight/wide {tight / wide:.2f} (tight slower in {slower} of {rounds} pairs)",
            flush=True,
        )


def child_caches(capacity: str, turns: int, samples: int) -> None:
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = os.environ["LRU_CACHE_CAPACITY"] = capacity
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings

    engine = _engine()
    short = SamplingSettings(max_new_tokens=4, temperature=0.0)
    history: list[dict] = []
    engine.chat([{"role": "user", "content": "Hi"}], short, DecodeOptions())
    start = heap_in_use_mb()
    for k in range(turns):
        history.append({"role": "user", "content": f"Name colour number {k}."})
        history.append({"role": "assistant", "content": engine.chat(history, short, DecodeOptions()).text})
    grown = heap_in_use_mb() - start
    rates = [_decode_rate(engine, "kv") for _ in range(samples)]
    print("RESULT " + json.dumps(dict(grown_mb=grown, rate=statistics.median(rates))), flush=True)


def part_caches(rounds: int, capacities: list[int], turns: int = 30, samples: int = 3) -> None:
    from redline.inference.memory.policy import KERNEL_CACHE_ENTRIES

    figures: dict[int, list[dict]] = {c: [] for c in sorted(set(capacities) | {KERNEL_CACHE_ENTRIES, 1024})}
    for _ in range(rounds):
        for capacity in figures:
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(capacity), str(turns), str(samples)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                check=True,
            )
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
            figures[capacity].append(json.loads(line[len("RESULT ") :]))
    default_rate = statistics.median(f["rate"] for f in figures[1024])
    print(
        f"caches, kv:bf16 on the starter, a {turns}-turn conversation then {samples} replies of 64 tokens, "
        f"{rounds} processes per capacity, alternated:"
    )
    for capacity, runs in figures.items():
        rate = statistics.median(f["rate"] for f in runs)
        each = ", ".join(f"{f['rate']:.1f}" for f in runs)
        mark = (
            "  ← Redline's"
            if capacity == KERNEL_CACHE_ENTRIES
            else ("  ← the libraries' default" if capacity == 1024 else "")
        )
        print(
            f"  {capacity:5d} entries: C heap grew {statistics.median(f['grown_mb'] for f in runs):6.1f} MB over "
            f"the conversation; decode {rate:5.1f} tok/s = {rate / default_rate:.2f}× the default "
            f"(per process: {each}){mark}",
            flush=True,
        )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_caches(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default="heap,caches")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--capacities", default="16,64,1024", help="kernel cache sizes to compare")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} at start (other processes skew decode speed)")
    if "heap" in args.part:
        part_heap(args.rounds)
    if "caches" in args.part:
        part_caches(max(2, args.rounds // 2), [int(c) for c in args.capacities.split(",")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
