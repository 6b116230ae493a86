"""How close is the speed model to what this machine measures? Before and after one calibration run.

Runs the speed lab's ladder (``inference/bench/sets.ladder``) for the model several rounds on one engine,
with a fresh speed calibration (a temporary ``REDLINE_DATA_DIR``) so round 1 starts from the defaults:

- **before calibration**: each row's uncorrected prediction (the defaults, no measurement of this machine
  except its bandwidth and FLOP/s) against what the row measured;
- **after calibration**: from round 2 on, the prediction each row showed *before* it ran — learned from the
  earlier rounds' rows — against what it then measured.

The error is (predicted − measured) ÷ measured; the table quotes per row the median over rounds, with the
load average at each round's start and end (a shared machine drifts). The last column is the noise floor:
the error of "the same as last round", what the machine's own run-to-run variation allows. Usage:

    python tools/accuracy/speed_accuracy.py [--model starter] [--rounds 3] [--new-tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--configs", default=None, help="comma-separated configurations instead of the ladder")
    ap.add_argument("--keep-calibration", action="store_true", help="use (and feed) this machine's own calibration")
    ap.add_argument("--json", help="also write the rounds and the table as JSON")
    args = ap.parse_args(argv)
    if not args.keep_calibration:
        os.environ["REDLINE_DATA_DIR"] = tempfile.mkdtemp(prefix="redline-speed-accuracy-")

    from redline.inference import BenchSpec, load_prompt_set, parse_configs, run_bench
    from redline.inference.bench.sets import configs_text, ladder
    from redline.inference.estimate.model_shapes import read_shape
    from redline.inference.precision import resolve_precision
    from redline.inference.speed.arithmetic import predict, this_machine

    engine = harness.new_engine()
    text = args.configs or configs_text(ladder(engine.device, args.model))
    configs = parse_configs(text)
    prompts = load_prompt_set("short")
    prompts.prompts = prompts.prompts[:1]
    machine = this_machine(engine.device)
    shape = read_shape(args.model)
    rounds = []
    for r in range(args.rounds):
        load_start = os.getloadavg()[0]
        t0 = time.time()
        spec = BenchSpec(
            args.model, configs, prompts, new_tokens=args.new_tokens, warmup=1, samples=args.samples, baseline=0
        )
        report = run_bench(engine, spec)
        rows = []
        for c, row in zip(configs, report.results):
            draft = read_shape(c.draft) if c.draft else None
            prior = predict(
                shape,
                resolve_precision(c.precision, engine.device),
                c.strategy,
                machine,
                int(row.prompt_tokens or 1),
                int(row.new_tokens or 1),
                k=c.k,
                draft=draft,
                draft_spec=resolve_precision(c.draft_precision, engine.device) if c.draft else None,
                compile=c.compile,
            )
            rows.append(
                {
                    "config": c.label,
                    "status": row.status,
                    "measured": row.tokens_per_s,
                    "prior": prior.uncorrected_tokens_per_s,
                    "shown": row.predicted_tokens_per_s,
                    "calibration": row.prediction_calibration,
                    "acceptance": row.acceptance_rate,
                }
            )
        load_end = os.getloadavg()[0]
        rounds.append(
            {"round": r + 1, "load_start": load_start, "load_end": load_end, "seconds": time.time() - t0, "rows": rows}
        )
        print(
            f"round {r + 1}: {time.time() - t0:.0f} s, load average {load_start:.2f} → {load_end:.2f}", file=sys.stderr
        )
        for x in rows:
            print(
                f"  {x['config']:<42} measured {x['measured'] or 0:6.2f}  prior {x['prior']:6.2f}  "
                f"shown {x['shown'] or 0:6.2f} ({x['calibration']})",
                file=sys.stderr,
            )

    def err(pred, meas):
        return 100.0 * (pred - meas) / meas if pred and meas else None

    table = []
    for i, c in enumerate(configs):
        cells = [rd["rows"][i] for rd in rounds if rd["rows"][i]["status"] == "ok"]
        before = [err(x["prior"], x["measured"]) for x in cells]
        after = [err(x["shown"], x["measured"]) for x in cells[1:] if x["calibration"] == "class"]
        floor = [err(a["measured"], b["measured"]) for a, b in zip(cells, cells[1:])]
        table.append(
            {
                "config": c.label,
                "measured": statistics.median([x["measured"] for x in cells]) if cells else None,
                "prior": statistics.median([x["prior"] for x in cells]) if cells else None,
                "error_before_pct": statistics.median([e for e in before if e is not None]) if before else None,
                "calibrated": statistics.median([x["shown"] for x in cells[1:]]) if cells[1:] else None,
                "error_after_pct": statistics.median([e for e in after if e is not None]) if after else None,
                "worst_after_pct": max(after, key=abs) if after else None,
                "run_to_run_pct": statistics.median([abs(e) for e in floor if e is not None]) if floor else None,
            }
        )
    print(
        "| config | measured tok/s | predicted before calibration | error | predicted after | error | worst after "
        "| run to run |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def f(x, pct=False):
        if x is None:
            return "—"
        return f"{x:+.0f} %" if pct else f"{x:.2f}"

    for t in table:
        print(
            f"| {t['config']} | {f(t['measured'])} | {f(t['prior'])} | {f(t['error_before_pct'], True)} | "
            f"{f(t['calibrated'])} | {f(t['error_after_pct'], True)} | {f(t['worst_after_pct'], True)} | "
            f"{'—' if t['run_to_run_pct'] is None else format(t['run_to_run_pct'], '.0f') + ' %'} |"
        )
    loads = ", ".join(f"{rd['load_start']:.2f}→{rd['load_end']:.2f}" for rd in rounds)
    print(
        f"\nload average per round (start→end): {loads}; machine {machine.bandwidth_bytes_per_s / 1e9:.1f} GB/s, "
        f"{(machine.flops or 0) / 1e9:.0f} GFLOP/s"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rounds": rounds, "table": table, "machine": machine.to_dict()}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
