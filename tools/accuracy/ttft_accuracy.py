"""How close is the speed model's time to first token, on a model it was not calibrated on? Including a turn
whose prefix is cached.

With a fresh speed calibration (a temporary ``REDLINE_DATA_DIR``), the starter answers prompts of several
lengths at each precision on the fast path (its replies teach the calibration, as a user's chats would). Then
another model (e.g. the 1B-shaped folder of ``tools/accuracy/make_shaped_model.py``) answers:

- fresh prompts of the same lengths (no page of them cached);
- a conversation's next turn: the prompt of the longest length, answered once, then sent again with ~130 new
  tokens after it, so the cache holds all but the new part.

Before each of those replies the calibrated prediction is taken (with the cached tokens the engine reports for
that turn), and compared with the TTFT the reply measured. Every reply's measurement also feeds the
calibration, as in the app, but the prediction is always taken before the reply runs. Usage:

    python tools/accuracy/ttft_accuracy.py --model /tmp/models/llama-1b [--precisions bf16,q8,q4] [--lengths 44,300,900]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the model to predict (a folder)")
    ap.add_argument("--calibrate-on", default="starter")
    ap.add_argument("--precisions", default="bf16,q8,q4")
    ap.add_argument("--lengths", default="44,300,900")
    ap.add_argument("--turn-tokens", type=int, default=130)
    ap.add_argument("--samples", type=int, default=2, help="replies per length and model")
    ap.add_argument("--keep-calibration", action="store_true", help="use (and feed) this machine's own calibration")
    args = ap.parse_args(argv)
    if not args.keep_calibration:
        os.environ["REDLINE_DATA_DIR"] = tempfile.mkdtemp(prefix="redline-ttft-accuracy-")
    # Pages on disk of its own: a run's prompts are the same as the last run's, and the user's folder would hand
    # this run's "fresh" prompts the pages the last one left (their TTFT a disk read, not a prefill).
    pages = tempfile.mkdtemp(prefix="redline-ttft-accuracy-pages-")
    os.environ["REDLINE_KV_PAGES_DIR"] = pages

    from redline.inference.decoding.options import DecodeOptions
    from redline.inference.generation.run import generate
    from redline.inference.speed.calibration import predict_generation

    lengths = [int(x) for x in args.lengths.split(",")]
    precisions = args.precisions.split(",")
    sampling = harness.greedy(16)
    engine = harness.new_engine()
    text_ids: list[int] = []
    salt = [0]

    def prompt(n: int) -> list[int]:
        # Real text (the tokenizer's ids of a long passage), started by a different token each time so that no
        # page of it is in the prefix cache: a fresh prompt.
        salt[0] += 1
        return [100 + salt[0] % 20000] + (text_ids * (1 + n // max(1, len(text_ids))))[: n - 1]

    def single(pred) -> float:
        # What one factor per class predicts (the model before the two-part fit), beside the fit, same replies.
        return pred.uncorrected_ttft_ms * pred.ttft_factor

    def reply(ids: list[int], options: DecodeOptions, cached: int = 0):
        pred, _key, _cal = predict_generation(engine.target, "fast", len(ids), 16, cached_tokens=cached)
        result = generate(engine.target, ids, sampling, options)
        return pred, result

    rows = []
    load_start = os.getloadavg()[0]
    for model in (args.calibrate_on, args.model):
        for precision in precisions:
            harness.load(model, precision, engine=engine)
            if not text_ids:
                passage = " ".join(["The lighthouse keeper wrote in his log every evening about the sea."] * 80)
                text_ids.extend(engine.target.tokenizer(passage)["input_ids"])
            options = DecodeOptions(strategy="fast")
            generate(engine.target, prompt(32), sampling, options)  # warm-up: first-call costs are nobody's TTFT
            for n in lengths:
                for _ in range(args.samples):
                    pred, result = reply(prompt(n), options)
                    if result.cached_tokens:
                        raise SystemExit(f"a fresh prompt took {result.cached_tokens} tokens from the cache")
                    rows.append((model, precision, n, 0, pred.ttft_ms, result.ttft_ms, single(pred)))
            # The next turn of a conversation: the same prompt again with new tokens after it.
            for _ in range(args.samples):
                first = prompt(max(lengths))
                generate(engine.target, first, sampling, options)
                turn = first + text_ids[: args.turn_tokens]
                # What the cache will hold of it: the full pages of the first turn's prompt (the engine reports
                # the figure afterwards; the prediction must be made before).
                pred, result = reply(turn, options, cached=(len(first) // 64) * 64)
                rows.append(
                    (model, precision, len(turn), result.cached_tokens, pred.ttft_ms, result.ttft_ms, single(pred))
                )
            print(f"{model} {precision} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
            engine.unload()
    load_end = os.getloadavg()[0]
    import shutil

    shutil.rmtree(pages, ignore_errors=True)
    print(f"calibrated on {args.calibrate_on}; load average {load_start:.2f} → {load_end:.2f}")
    print()
    print(
        "| model | precision | prompt tokens | cached | predicted TTFT ms | measured TTFT ms | error "
        "| one factor: predicted | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    groups: dict = {}
    for model, precision, n, cached, pred, meas, one in rows:
        groups.setdefault((model, precision, n, cached > 0), []).append((pred, meas, cached, one))
    errors, single_errors = [], []
    for (model, precision, n, was_cached), xs in groups.items():
        pred = statistics.median(x[0] for x in xs)
        meas = statistics.median(x[1] for x in xs)
        one = statistics.median(x[3] for x in xs)
        err, one_err = 100.0 * (pred - meas) / meas, 100.0 * (one - meas) / meas
        if model == args.model:
            errors.append(abs(err))
            single_errors.append(abs(one_err))
        name = os.path.basename(str(model).rstrip("/"))
        print(
            f"| {name} | {precision} | {n} | {max(x[2] for x in xs) if was_cached else 0} | {pred:.0f} | "
            f"{meas:.0f} | {err:+.0f} % | {one:.0f} | {one_err:+.0f} % |"
        )
    if errors:
        print(f"\nworst error on {args.model}: {max(errors):.0f} %, median {statistics.median(errors):.0f} %")
        worst, median = max(single_errors), statistics.median(single_errors)
        print(f"with one factor per class: worst {worst:.0f} %, median {median:.0f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
