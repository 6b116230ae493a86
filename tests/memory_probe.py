"""Run in a fresh process by test_estimator_accuracy: load a model, generate briefly, print predicted vs measured.

A fresh process per precision, so one precision's memory cannot pollute the next's.
Usage: python -m tests.memory_probe MODEL PRECISION [MAX_NEW_TOKENS] [STRATEGY]
With REDLINE_PROBE_RECORDS=1 the load's memory check is recorded, as the app records a user's (the per-machine
correction learns from it: tests/model_browser_accuracy.py --calibrate); otherwise nothing is learned.
"""

import json
import os
import sys


def main() -> None:
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.engine import Engine
    from redline.inference.loading.precision import parse_precision

    model, precision = sys.argv[1], sys.argv[2]
    max_new = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    options = DecodeOptions(strategy=sys.argv[4]) if len(sys.argv) > 4 else DecodeOptions()
    engine = Engine("cpu")
    engine.record_memory = os.environ.get("REDLINE_PROBE_RECORDS") == "1"
    engine.load(model, parse_precision(precision))
    result = engine.chat(
        [{"role": "user", "content": "Write one sentence about the sea."}],
        SamplingSettings(max_new_tokens=max_new, temperature=0),
        options,
    )
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
                "generation_peak_bytes": result.peak_memory_bytes,
                "prompt_tokens": result.prompt_tokens,
                "new_tokens": result.new_tokens,
                "tokens_per_s": result.tokens_per_s,
                "strategy": result.strategy,
                "finish_reason": result.finish_reason,
                "error": result.error,
            }
        )
    )


if __name__ == "__main__":
    main()
