"""`redline estimate`: memory needed by a model, per precision, before loading it; and what to load."""

from __future__ import annotations

import json
import sys

from redline.app.cli_args import above, whole_number
from redline.inference import (
    CONSUMER_GPUS,
    MB,
    PRECISIONS,
    Estimate,
    Planner,
    RedlineError,
    correction_bytes,
    detect_target,
    format_bytes,
    parse_precision,
    precisions_for,
    read_shape,
    suggest,
)

DEFAULT_CONTEXT_CAP = 8192  # the default context: the model's own, capped here


def add_parser(sub) -> None:
    p = sub.add_parser(
        "estimate",
        help="predict the memory a model needs, and suggest what to load",
        description="Predict, from the model's config alone (no weights read), the memory needed "
        "for each precision, whether it fits, and the configuration to load.",
    )
    p.add_argument("model", nargs="?", help="starter, a model folder, a .gguf file or a hub id")
    p.add_argument(
        "--precision", default="all", help=f"all (default) or one of {', '.join(PRECISIONS)} (mixed: nf4+keep=lm_head)"
    )
    p.add_argument(
        "--context",
        default=None,
        help=f"context length in tokens (default: the model's, at most {DEFAULT_CONTEXT_CAP})",
        **whole_number(1),
    )
    p.add_argument("--batch", default=1, **whole_number(1))
    p.add_argument("--draft", help="a draft model for speculative decoding (its weights and KV cache are added)")
    p.add_argument("--draft-precision", default=None, help="the draft's precision (default: the same)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--free-gb", default=None, help="plan for this much free memory (GB)", **above(0.0))
    where.add_argument("--gpu", help="plan for a consumer GPU from the built-in list, e.g. 'RTX 3060 12GB'")
    p.add_argument("--list-gpus", action="store_true", help="list the built-in GPUs and exit")
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    p.set_defaults(func=run)


def _mb(n: int) -> str:
    return f"{n / MB:,.0f} MB" if abs(n) < 10_000 * MB else format_bytes(n)


def table(estimates: list[Estimate]) -> str:
    cols = ("precision", "weights", "KV cache", "activations", "overhead", "loading", "draft", "total", "fits")
    rows = [cols]
    for e in estimates:
        rows.append(
            (
                e.precision,
                _mb(e.weights_bytes),
                _mb(e.kv_cache_bytes),
                _mb(e.activation_bytes),
                _mb(e.overhead_bytes),
                _mb(e.loading_bytes),
                _mb(e.draft_bytes),
                _mb(e.total_bytes),
                "yes" if e.fits else "no",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = []
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


def build_report(args) -> dict:
    shape = read_shape(args.model)
    draft = read_shape(args.draft) if args.draft else None
    target = detect_target(args.free_gb, args.gpu)
    context = args.context or min(shape.max_positions, DEFAULT_CONTEXT_CAP)
    correction = correction_bytes(target.device, key=target.calibration_key) if target.calibration_key else 0
    draft_spec = parse_precision(args.draft_precision) if args.draft_precision else None
    planner = Planner(shape, target, args.batch, draft, draft_spec, correction)
    names = precisions_for(shape) if args.precision in ("all", "auto") else [args.precision]
    estimates = [planner.estimate(parse_precision(p), context) for p in names]
    advice = suggest(planner, context, None if args.precision in ("all", "auto") else args.precision)
    notes = []
    if context > shape.max_positions:
        notes.append(f"The model was trained for at most {shape.max_positions} tokens; {context} is beyond that.")
    if correction:
        notes.append(f"Includes a correction of {_mb(correction)} learned from loads measured on this machine.")
    if shape.file_types:
        types = ", ".join(f"{k} ×{v}" for k, v in sorted(shape.file_types.items(), key=lambda kv: (-kv[1], kv[0])))
        bits: dict[int, int] = {}
        for row in shape.packed:
            bits[int(row[3])] = bits.get(int(row[3]), 0) + 1
        kept = ", ".join(f"q{b} ×{n}" for b, n in sorted(bits.items())) or "none"
        notes.append(
            f"GGUF file {format_bytes(shape.file_bytes)}; tensors {types}; layers kept quantised: {kept} "
            "(gguf = as the file is)."
        )
    report = {
        "model": shape.name,
        "architecture": shape.architecture,
        "parameters": shape.parameters,
        "layers": shape.layers,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "context": context,
        "batch": args.batch,
        "draft": draft.name if draft else None,
        "device": target.device,
        "target": target.label,
        "available_bytes": target.available_bytes,
        "correction_bytes": correction,
        "estimates": [e.to_dict() for e in estimates],
        "suggestion": advice.to_dict(),
        "notes": notes,
    }
    if target.bandwidth_gb_s:
        # Batch 1 decoding reads every weight once per token: tokens/s ≤ bandwidth ÷ weight bytes.
        report["bandwidth_bound_tokens_per_s"] = {
            e.precision: round(target.bandwidth_gb_s * 1e9 / (e.weights_bytes + e.draft_bytes), 1) for e in estimates
        }
    report["_estimates"] = estimates
    return report


def print_report(report: dict) -> None:
    print(
        f"{report['model']}: {report['parameters']:,} parameters ({report['architecture']}, "
        f"{report['layers']} layers, {report['kv_heads']} KV heads x {report['head_dim']})"
    )
    draft = f", draft {report['draft']}" if report["draft"] else ""
    print(
        f"context {report['context']} tokens, batch {report['batch']}{draft}; "
        f"{report['target']}: {format_bytes(report['available_bytes'])} available\n"
    )
    print(table(report["_estimates"]))
    if "bandwidth_bound_tokens_per_s" in report:
        bounds = ", ".join(f"{p} {v:g}" for p, v in report["bandwidth_bound_tokens_per_s"].items())
        print(f"\nbandwidth bound at batch 1 (tokens/s at most): {bounds}")
    print("\n" + report["suggestion"]["text"])
    for option in report["suggestion"]["options"]:
        print("  - " + option["text"])
    for note in report["notes"]:
        print(f"note: {note}")
    print("\n'fits' keeps a safety margin of 10 % or 300 MB, whichever is larger (the estimate's accuracy target).")


def run(args) -> int:
    if args.list_gpus:
        for g in CONSUMER_GPUS:
            print(
                f"{g.name:<24} {g.memory_gb_label:>6}  {g.bandwidth_gb_s:>5.0f} GB/s  "
                f"{'bf16' if g.bf16 else 'fp16 only'}"
            )
        return 0
    if not args.model:
        print("error: name a model (starter, a folder, a .gguf file or a hub id), or pass --list-gpus", file=sys.stderr)
        return 2
    try:
        report = build_report(args)
    except RedlineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        report.pop("_estimates")
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    return 0
