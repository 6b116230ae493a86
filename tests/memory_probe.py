"""Run in a fresh process by test_estimator_accuracy: load a model, generate briefly, print predicted vs measured.

A fresh process per precision, so one precision's memory cannot pollute the next's.
Usage: python -m tests.memory_probe MODEL PRECISION [MAX_NEW_TOKENS] [STRATEGY]
With REDLINE_PROBE_RECORDS=1 the load's memory check is recorded, as the app records a user's (the per-machine
correction learns from it: tests/model_browser_accuracy.py --calibrate); otherwise nothing is learned.
REDLINE_PROBE_REPLIES=N (default 1): N replies in the process, their median decode rate reported (one 32-token
reply is a few hundred ms: one moment of a machine that drifts by 40 % within minutes).
"""

import json
import os
import statistics
import sys


def main() -> None:
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.engine import Engine
    from redline.inference.precision import parse_precision

    model, precision = sys.argv[1], sys.argv[2]
    max_new = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    options = DecodeOptions(strategy=sys.argv[4]) if len(sys.argv) > 4 else DecodeOptions()
    engine = Engine("cpu")
    engine.record_memory = os.environ.get("REDLINE_PROBE_RECORDS") == "1"
    engine.load(model, parse_precision(precision))
    replies = max(1, int(os.environ.get("REDLINE_PROBE_REPLIES", "1")))
    results = [
        engine.chat(
            [{"role": "user", "content": "Write one sentence about the sea."}],
            SamplingSettings(max_new_tokens=max_new, temperature=0),
            options,
        )
        for _ in range(replies)
    ]
    result = results[0]
    rates = [r.tokens_per_s for r in results if r.tokens_per_s]
    check = engine.memory_check
    print(
        json.dumps(
            {
                "precision": precision,
                "predicted_bytes": check.predicted_bytes if check else None,
                "measured_bytes": check.measured_bytes if check else None,
                "error_pct": check.error_pct if check else None,
                "load_peak_bytes": engine.target.peak_memory_bytes,
                "baseline_bytes": engine.target.baseline_rss_bytes,  # the engine's own, taken inside the load
                "generation_peak_bytes": max(r.peak_memory_bytes or 0 for r in results) or None,
                "prompt_tokens": result.prompt_tokens,
                "new_tokens": result.new_tokens,
                "tokens_per_s": statistics.median(rates) if rates else None,
                "tokens_per_s_each": rates,
                "strategy": result.strategy,
                "finish_reason": result.finish_reason,
                "error": result.error,
            }
        )
    )


if __name__ == "__main__":
    main()
