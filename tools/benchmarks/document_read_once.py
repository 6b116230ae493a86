"""A document is read once (issue 50, item 5 and its targets): a PDF of about 6,000 tokens attached to a question,
then a second question about the same document asked in a new process, as a user would ask it tomorrow.

Each round, in a prefix-cache pages folder of its own (so no earlier round warms it):

1. **first**: ``redline chat QUESTION --attach doc.pdf --json`` in a new process: the document is read (prefilled);
   its pages go to disk when the process quits;
2. **second**: ``redline chat OTHER --attach doc.pdf --json`` in another new process: its pages come from disk.

Before the rounds, the chip's prediction: ``attachment_cost_job`` on the same model (what the window shows before
sending), its seconds to first token against the first question's measured TTFT (target: within 35 %).

It prints per round the TTFT of each, the tokens read from the cache, the ratio first ÷ second (target ≥ 5×) and
whether the first answer holds the fact from the document's middle; then the medians and the load average.

    python tools/benchmarks/document_read_once.py [--model starter] [--precision q8] [--pages 24] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
import harness  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the tests' modules import each other by name
from tests.test_attachments_engine import FACT, QUESTION, write_pdf  # noqa: E402 - the tests' own PDF

OTHER = "In which year was the bridge at Calvera rebuilt?"


def chat(question: str, pdf: Path, model: str, precision: str, pages: Path) -> dict:
    env = {**os.environ, "REDLINE_KV_PAGES_DIR": str(pages)}
    cmd = [sys.executable, "-m", "redline", "chat", question, "--attach", str(pdf), "--model", model]
    cmd += ["--precision", precision, "--temperature", "0", "--max-new-tokens", "32", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"redline chat failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def predicted(pdf: Path, model: str, precision: str):
    from redline.inference import EngineService, attachment_cost_job, parse_precision, read_attachment

    svc = EngineService(lambda: harness.new_engine("cpu"))
    try:
        svc.load(model, parse_precision(precision)).result(600)
        return svc.call(attachment_cost_job([read_attachment(pdf)], 0)).result(600)
    finally:
        svc.shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--pages", type=int, default=24, help="pages of filler (24: about 6,000 tokens on the starter)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    load = harness.LoadAverage()
    with tempfile.TemporaryDirectory() as tmp:
        pdf = write_pdf(Path(tmp) / "calvera.pdf", pages=args.pages, fact_page=args.pages // 2, sentences=14)
        cost = predicted(pdf, args.model, args.precision)
        print(
            f"document: {pdf.name}, {args.pages} pages; the chip: {cost.text}"
            + (f" ({cost.warning})" if cost.warning else "")
        )
        firsts, ratios = [], []
        for r in range(args.rounds):
            pages = Path(tmp) / f"pages-{r}"
            first = chat(QUESTION, pdf, args.model, args.precision, pages)
            second = chat(OTHER, pdf, args.model, args.precision, pages)
            firsts.append(first["ttft_ms"])
            ratios.append(first["ttft_ms"] / second["ttft_ms"])
            print(
                f"round {r + 1}: first TTFT {first['ttft_ms']:.0f} ms ({first['prompt_tokens']} tokens, "
                f"{first['cached_tokens']} cached) · second {second['ttft_ms']:.0f} ms ({second['prompt_tokens']} "
                f"tokens, {second['cached_tokens']} cached) · {ratios[-1]:.1f}× · first answer: "
                f"{first['text'].strip()!r}" + ("" if "Ottilie" in first["text"] else "  (the fact is not in it)")
            )
    measured = statistics.median(firsts) / 1000
    error = (cost.ttft_s - measured) / measured * 100
    print(
        f"median: first ÷ second {statistics.median(ratios):.1f}× (target ≥ 5×); predicted TTFT {cost.ttft_s:.2f} s "
        f"against a measured {measured:.2f} s: {error:+.0f} % (target within 35 %); fact from page "
        f"{args.pages // 2}: {FACT!r}; load {load}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
