"""One conversation of several turns in the real window: each turn's time to first token and how many of its
prompt tokens came from the prefix cache, as the reply's footer shows them (issue 27's target: turn 8 within 1.3x
turn 1). The window runs offscreen (or on DISPLAY) with a throwaway profile; the turns are
``tools/benchmarks/conversation_bench.py``'s (about 130 new tokens each), greedy, 32 new tokens.

    python tools/benchmarks/window_conversation.py --model starter --precision q8 [--turns 8]
    python tools/benchmarks/window_conversation.py --model /path/to/llama-1b-random --precision q8
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for gui_session
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--turn-tokens", type=int, default=130)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args(argv)

    from gui_session import throwaway_profile

    throwaway_profile("redline-window-conversation-")
    from bench_app import Gui, write_settings
    from conversation_bench import turn_text

    load = os.getloadavg()[0]
    write_settings(
        model=args.model, precision=args.precision, strategy="fast", temperature=0.0, max_new_tokens=args.new_tokens
    )
    gui = Gui()
    window = gui.open_window()
    rows = []
    try:
        for i in range(args.turns):
            result = gui.send(window, turn_text(i, args.turn_tokens))
            if result.finish_reason == "error":
                raise SystemExit(f"turn {i + 1} failed: {result.text[:300]}")
            rows.append((i + 1, result.prompt_tokens, result.ttft_ms, result.cached_tokens))
    finally:
        window.shutdown()
    print(f"{args.model}, {args.precision}, the window; load average {load:.2f} → {os.getloadavg()[0]:.2f}\n")
    print("| turn | prompt tokens | TTFT ms | cached tokens |\n|---|---|---|---|")
    for turn, prompt, ttft, cached in rows:
        print(f"| {turn} | {prompt:,} | {ttft:,.0f} | {cached:,} |")
    first, last = rows[0][2], rows[-1][2]
    print(f"\nturn {rows[-1][0]} ÷ turn 1: {last / first:.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
