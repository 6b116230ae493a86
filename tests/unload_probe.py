"""Run in a fresh process by test_long_day: on a worker thread (as in the app), load the starter in bf16,
reply, unload, twice; print the process's resident memory before the first load and after each unload.

A fresh process, so the C heap starts as the app's does; bf16, because converting the weights allocates a
heap's worth of blocks that glibc would otherwise keep after the unload."""

import json
import sys
import threading


def main() -> None:
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.engine import Engine
    from redline.inference.memory.measured import process_rss
    from redline.inference.precision import parse_precision

    model = sys.argv[1]
    figures = {}

    def work():
        engine = Engine("cpu")
        engine.record_memory = False
        # The libraries warm (imported, first products run) before the baseline, as in the app after start-up.
        engine.load(model, parse_precision("fp32"))
        engine.chat(
            [{"role": "user", "content": "Hi"}], SamplingSettings(max_new_tokens=2, temperature=0), DecodeOptions()
        )
        engine.unload()
        figures["before"] = process_rss()
        figures["after"] = []
        for strategy in ("kv", "fast"):
            engine.load(model, parse_precision("bf16"))
            engine.chat(
                [{"role": "user", "content": "Name a colour."}],
                SamplingSettings(max_new_tokens=8, temperature=0),
                DecodeOptions(strategy),
            )
            figures.setdefault("loaded", process_rss())
            engine.unload()
            figures["after"].append(process_rss())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
