"""`redline estimate`: memory and speed of a model, per precision, before loading it; and what to load."""

from __future__ import annotations

import json
import sys

from ..inference import (
    CHAT_NEW_TOKENS,
    CHAT_PROMPT_TOKENS,
    CONSUMER_GPUS,
    DEFAULT_CONTEXT_CAP,
    DEFAULT_PRIORITY,
    KV_FORMS,
    MB,
    NEXT_TURN_TOKENS,
    PRECISIONS,
    PRIORITIES,
    Engine,
    Estimate,
    KernelsReport,
    Planner,
    RedlineError,
    SpeedModel,
    advise,
    cached_machine,
    card_machine,
    choose,
    correction_bytes,
    detect_target,
    format_bytes,
    measure_acceptance,
    parse_precision,
    precisions_for,
    read_shape,
    suggest,
    this_machine,
)
from .cli_args import above, whole_number
from .terminal import TerminalProgress


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
    p.add_argument(
        "--kv",
        default="bf16",
        choices=KV_FORMS,
        help="the KV cache's form: bf16 (default, the model's float dtype) or q8 (8-bit rows, about half the "
        "memory a token; the fast path keeps it, as `redline chat --kv q8`)",
    )
    p.add_argument("--draft", help="a draft model for speculative decoding (its weights and KV cache are added)")
    p.add_argument("--draft-precision", default=None, help="the draft's precision (default: the same)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--free-gb", default=None, help="plan for this much free memory (GB)", **above(0.0))
    where.add_argument("--gpu", help="plan for a consumer GPU from the built-in list, e.g. 'RTX 3060 12GB'")
    p.add_argument("--list-gpus", action="store_true", help="list the built-in GPUs and exit")
    p.add_argument(
        "--priority",
        default=DEFAULT_PRIORITY,
        choices=PRIORITIES,
        help="what 'auto' favours: quality (highest precision that fits), balanced (default: the fastest with "
        "8-bit weights or more), speed (the fastest)",
    )
    p.add_argument(
        "--draft-tokens", default=5, help="draft tokens per step for the --draft advice (default 5)", **whole_number(1)
    )
    p.add_argument(
        "--measure-acceptance",
        action="store_true",
        help="with --draft: load both models and run a few dozen tokens through speculative decoding to measure "
        "how many draft tokens the target accepts (kept for next time)",
    )
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
    planner = Planner(shape, target, args.batch, draft, draft_spec, correction, args.kv)
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
        "max_positions": shape.max_positions,
        "sliding_window": max((w for w in shape.layer_windows if w), default=None),
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
    report["kv"] = args.kv
    report["speed"] = speed_report(args, shape, draft, target, planner, context, names)
    # Each length at the precision auto takes for --priority (the memory suggestion's where auto has none).
    chosen = report["speed"]["auto"][args.priority]["precision"] or advice.precision or names[0]
    report["lengths"] = length_costs(planner, parse_precision(chosen), context)
    report["_estimates"] = estimates
    return report


def length_costs(planner, spec, context: int) -> dict:
    """What each context length costs at ``spec``: the KV cache a token in each form, and the memory at lengths from
    2,048 tokens doubling up to the model's own limit (the length asked among them), with whether each fits."""
    shape = planner.shape
    per_token = {kv: planner.with_kv(kv).estimate(spec, 1, strategy="fast").kv_cache_bytes for kv in KV_FORMS}
    lengths, n = {context, shape.max_positions}, 2048
    while n < shape.max_positions:
        lengths.add(n)
        n *= 2
    rows = []
    for length in sorted(lengths):
        e = {kv: planner.with_kv(kv).estimate(spec, length, strategy="fast") for kv in KV_FORMS}
        row = {"context": length, "fits": bool(e[planner.kv].fits), "total_bytes": e[planner.kv].total_bytes}
        row |= {f"kv_{kv}_bytes": e[kv].kv_cache_bytes for kv in KV_FORMS} | {"fits_q8": bool(e["q8"].fits)}
        rows.append(row)
    return {"precision": spec.label(), "kv_bytes_per_token": per_token, "rows": rows}


def print_lengths(report: dict) -> None:
    lengths = report["lengths"]
    per = lengths["kv_bytes_per_token"]
    windows = " (sliding-window layers keep only their window)" if report.get("sliding_window") else ""
    print(
        f"\nKV cache per token: {per['bf16']:,} bytes in 16 bits, {per['q8']:,} in 8 bits (--kv q8){windows}; "
        f"each length at {lengths['precision']} with the {report['kv']} cache, up to the model's "
        f"{report['max_positions']:,} tokens:"
    )
    rows = [("context", "KV bf16", "KV q8", "total", "fits", "fits with q8 KV")]
    for r in lengths["rows"]:
        rows.append(
            (
                f"{r['context']:,}",
                _mb(r["kv_bf16_bytes"]),
                _mb(r["kv_q8_bytes"]),
                _mb(r["total_bytes"]),
                "yes" if r["fits"] else "no",
                "yes" if r["fits_q8"] else "no",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def speed_machine(args, target):
    """This machine's measured bandwidth and FLOP/s (from the cache, measured once if missing), or a card's
    published bandwidth."""
    if args.gpu:
        return card_machine(target.label.removeprefix("an "), target.bandwidth_gb_s)
    machine = cached_machine(target.device, target.calibration_key)
    if machine is None or machine.flops is None:
        machine = this_machine(target.device)  # imports torch and measures, once per machine
    return machine


def speed_report(args, shape, draft, target, planner, context, names) -> dict:
    machine = speed_machine(args, target)
    speed = SpeedModel(machine)
    rows = []
    for name in names:
        spec = parse_precision(name)
        for strategy in ("kv", "fast"):
            kv = planner.kv_form(spec, strategy)  # --kv q8 where the fast path keeps the cache
            p = speed.predict(shape, spec, strategy, CHAT_PROMPT_TOKENS, CHAT_NEW_TOKENS, kv=kv)
            if strategy == "fast" and p.path != "fast":
                continue  # the fast path does not run this one: it would be kv again
            full_prompt = max(1, context - CHAT_NEW_TOKENS)
            full = speed.predict(shape, spec, strategy, full_prompt, CHAT_NEW_TOKENS, kv=kv)
            # The next turn of that conversation: the prefix cache (the fast path's) holds all but its new message.
            turn = speed.next_turn(shape, spec, strategy, context, kv=kv)
            rows.append(
                {
                    "precision": name,
                    "strategy": strategy,
                    "kv": kv,
                    "tokens_per_s": round(p.tokens_per_s, 2),
                    "ttft_ms": round(p.ttft_ms, 1),
                    "tokens_per_s_full_context": round(full.tokens_per_s, 2),
                    "ttft_ms_full_context": round(full.ttft_ms, 1),
                    "ttft_ms_next_turn": round(turn.ttft_ms, 1),
                    "next_turn_cached_tokens": turn.cached_tokens,
                    "bytes_per_token": p.bytes_per_token,
                    "weights_read_bytes": p.weights_read_bytes,
                    "roofline_tokens_per_s": round(p.roofline_tokens_per_s, 2),
                    "bound": p.bound,
                    "calibration": p.calibration,
                    "decode_factor": round(p.decode_factor, 4),
                    "measured_tokens_per_s": p.measured_tokens_per_s,
                    "notes": p.notes,
                }
            )
    out = {
        "machine": machine.to_dict(),
        "prompt_tokens": CHAT_PROMPT_TOKENS,
        "new_tokens": CHAT_NEW_TOKENS,
        "next_turn_tokens": NEXT_TURN_TOKENS,
        "context": context,
        "predictions": rows,
        "priority": args.priority,
    }
    pinned = None if args.precision in ("all", "auto") else args.precision
    out["auto"] = {
        priority: choose(
            shape,
            planner_without_draft(planner),
            speed,
            context,
            priority,
            pinned or "auto",
            "auto",
            CHAT_PROMPT_TOKENS,
            CHAT_NEW_TOKENS,
        ).to_dict()
        for priority in PRIORITIES
    }
    if target.device == "cpu":
        # Said once when Redline's CPU kernels cannot run here (the predictions above are already of the path that
        # will run): why, what it costs, how to fix it, in the words the window and `redline bench` use.
        chosen = out["auto"][args.priority].get("precision")
        kernels = KernelsReport.here(
            "cpu", precision=chosen if chosen in ("q8", "q4", "bf16") else None, machine=machine, shape=shape
        )
        out["kernels"] = kernels.to_dict()
    if draft is not None:
        tprec = out["auto"][args.priority]["precision"] or "bf16"
        dprec = args.draft_precision or tprec
        measured = None
        if args.measure_acceptance:
            measured = measure(args, tprec, dprec)
            out["acceptance_run"] = measured.to_dict()
        adv = advise(
            speed,
            shape,
            tprec,
            draft,
            dprec,
            args.draft_tokens,
            CHAT_PROMPT_TOKENS,
            measured.acceptance_rate if measured else None,
        )
        out["draft_advice"] = adv.to_dict()
    return out


def planner_without_draft(planner: Planner) -> Planner:
    return Planner(planner.shape, planner.target, planner.batch, None, None, planner.correction, planner.kv)


def measure(args, target_precision: str, draft_precision: str):

    engine = Engine()
    progress = TerminalProgress()
    try:
        return measure_acceptance(
            engine, args.model, target_precision, args.draft, draft_precision, args.draft_tokens, progress=progress
        )
    finally:
        progress.done()


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
    print_lengths(report)
    if "bandwidth_bound_tokens_per_s" in report:
        bounds = ", ".join(f"{p} {v:g}" for p, v in report["bandwidth_bound_tokens_per_s"].items())
        print(f"\nbandwidth bound at batch 1 (tokens/s at most): {bounds}")
    print("\n" + report["suggestion"]["text"])
    for option in report["suggestion"]["options"]:
        print("  - " + option["text"])
    print_speed(report["speed"])
    for note in report["notes"]:
        print(f"note: {note}")
    print("\n'fits' keeps a safety margin of 10 % or 300 MB, whichever is larger (the estimate's accuracy target).")


def print_speed(speed: dict) -> None:
    m = speed["machine"]
    flops = f", {m['flops'] / 1e9:,.0f} GFLOP/s" if m.get("flops") else ""
    print(
        f"\nspeed on {m['label']} ({m['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s{flops}): decode tokens/s for a "
        f"{speed['new_tokens']}-token reply to a {speed['prompt_tokens']}-token prompt, and once the "
        f"conversation fills {speed['context']} tokens; TTFT next turn: a {speed['next_turn_tokens']}-token message "
        f"at that point, the rest read from the prefix cache (the fast path; kv reads it all again)\n"
    )
    cols = ("precision", "strategy", "MB/token", "tok/s", f"tok/s at {speed['context']}", "TTFT", "TTFT next turn")
    cols += ("measured here",)
    rows = [cols]
    for r in speed["predictions"]:
        measured = f"{r['measured_tokens_per_s']:.1f}" if r["measured_tokens_per_s"] else "—"
        if r["calibration"] == "device" and not r["measured_tokens_per_s"]:
            measured = "— (learned from others)"
        rows.append(
            (
                r["precision"],
                r["strategy"],
                f"{r['bytes_per_token'] / MB:,.0f}",
                f"≈ {r['tokens_per_s']:.1f}",
                f"≈ {r['tokens_per_s_full_context']:.1f}",
                f"{r['ttft_ms']:.0f} ms",
                f"{r['ttft_ms_next_turn']:,.0f} ms",
                measured,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    for r in rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    kernels = speed.get("kernels")
    if kernels and not kernels["on"]:
        print("\n" + kernels["sentence"])
    choice = speed["auto"][speed["priority"]]
    print("\n" + choice["reason"])
    if "acceptance_run" in speed:
        a = speed["acceptance_run"]
        print(
            f"acceptance run: {a['accepted']} of {a['proposed']} draft tokens accepted over {a['new_tokens']} tokens "
            f"({a['seconds']:.1f} s)"
        )
    if "draft_advice" in speed:
        print("draft: " + speed["draft_advice"]["text"])


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
