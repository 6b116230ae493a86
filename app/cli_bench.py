"""`redline bench`: the speed lab without the window — same runner, same table."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from pathlib import Path

from ..inference import (
    ACCEPTED_FORMS,
    SEED_PRESET,
    SWEEP_MODES,
    BenchConcurrencyRow,
    BenchPhase,
    BenchRow,
    BenchSpec,
    BenchSweepRow,
    Engine,
    EngineService,
    KernelsReport,
    RedlineError,
    builtin_prompt_sets,
    configs_text,
    every_precision,
    kv_form_job,
    kv_forms,
    ladder,
    load_prompt_set,
    parse_configs,
    probe_machine,
    run_bench,
    save_report,
    to_csv,
    to_json,
    to_markdown,
    to_text,
)
from .cli_args import SEED_MAX, at_least, whole_number, whole_number_list
from .cli_chat import add_kv_argument
from .server_keys import ServerKeys
from .terminal import TerminalProgress

DEFAULT_CONFIGS = "naive:fp32,kv:fp32"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="compare decoding configurations side by side (the speed lab, headless)",
        description="Run one model under several decoding configurations with warm-up and repeated samples, "
        "and print TTFT, per-token latency, tokens/s, peak memory, acceptance, speedup vs the "
        "baseline and whether the output matches the baseline's.",
        epilog="Configuration syntax: strategy[:precision][+keep=M,..][+draft=MODEL[@PRECISION]][/k=N]"
        "[+schedule=heuristic][+lookup=N][+compile]; e.g. naive:fp32,kv:bf16,kv:int8,kv:nf4,"
        "speculative:bf16+draft=starter@int8/k=5,prompt-lookup:bf16. See the README's Speed lab section.",
    )
    p.add_argument("--model", default="starter", help=f"the model: {ACCEPTED_FORMS}")
    p.add_argument(
        "--configs", default=DEFAULT_CONFIGS, help=f"comma-separated configurations (default {DEFAULT_CONFIGS})"
    )
    p.add_argument(
        "--set",
        dest="ready_set",
        choices=("ladder", "every-precision", "kv-forms"),
        help="a ready-made set instead of --configs: the ladder (naive → kv → quantised → speculative → static, "
        "the model drafting for itself), every precision with kv, or the fast path with its KV cache in 16 and in "
        "8 bits side by side (kv-forms: the q8 rows' quality columns compare them)",
    )
    p.add_argument(
        "--baseline",
        default="1",
        help="the configuration the others are compared with: its position (1 = first) or its text",
    )
    p.add_argument(
        "--prompts", default="short", help=f"a built-in prompt set ({', '.join(builtin_prompt_sets())}) or a JSON file"
    )
    p.add_argument(
        "--max-prompts",
        default=None,
        metavar="N",
        help="use only the first N prompts of the set (quicker runs)",
        **whole_number(1),
    )
    p.add_argument(
        "--prompt-tokens",
        default=None,
        help="cap every prompt at this many tokens (keeps its end); default: as written",
        **whole_number(1),
    )
    p.add_argument("--new-tokens", default=64, help="new tokens per generation (default 64)", **whole_number(1))
    p.add_argument(
        "--warmup", default=None, help="warm-up generations per configuration (default 1)", **whole_number(0)
    )
    p.add_argument(
        "--samples",
        default=None,
        help="measured generations per prompt and configuration (default 3)",
        **whole_number(1),
    )
    p.add_argument(
        "--textbook-protocol",
        "--seed-preset",
        dest="seed_preset",
        action="store_true",
        help=f"the textbook protocol: {SEED_PRESET['warmup']} warm-up runs, {SEED_PRESET['samples']} samples (slow)",
    )
    p.add_argument(
        "--stop-at-eos",
        action="store_true",
        help="let a reply end at end-of-sequence (default: exactly --new-tokens tokens, so every "
        "configuration does the same work)",
    )
    p.add_argument("--seed", default=0, **whole_number(0, maximum=SEED_MAX))
    p.add_argument(
        "--temperature",
        default=0.0,
        help="0 = greedy (default), so outputs compare",
        **at_least(0.0, "0 is greedy"),
    )
    p.add_argument(
        "--batch-sweep",
        default=None,
        metavar="SIZES",
        help="also sweep batch sizes, e.g. 1,2,4,8, for the baseline configuration",
        **whole_number_list(),
    )
    p.add_argument(
        "--concurrency",
        default=None,
        metavar="LEVELS",
        help="also run the concurrency sweep, e.g. 1,2,4,8: that many requests arriving --arrival-gap apart, "
        "decoded together (continuous batching), one at a time, and by transformers' continuous batching",
        **whole_number_list(),
    )
    p.add_argument(
        "--arrival-gap", default=0.5, help="seconds between the concurrency sweep's arrivals", **at_least(0.0)
    )
    p.add_argument(
        "--batch-mode",
        default="auto",
        choices=SWEEP_MODES,
        help=(
            "transformers = transformers' continuous batching (generate_batch); padded = batched generate(); "
            "auto tries transformers first"
        ),
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON: machine, settings, results, sweep")
    fmt.add_argument("--csv", action="store_true", help="print CSV")
    fmt.add_argument("--markdown", action="store_true", help="print a Markdown table with machine info")
    p.add_argument("--output", "-o", help="write the result to this file instead of stdout")
    p.add_argument(
        "--save",
        metavar="DIR",
        help="also keep the full run (per-position latencies, token ids) as a JSON file in DIR, "
        "the format the speed lab panel reopens",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    add_kv_argument(p)
    p.set_defaults(func=run)


def _baseline_index(text: str, labels: list[str]) -> int:
    if text.isdigit():
        index = int(text) - 1
        if 0 <= index < len(labels):
            return index
        raise RedlineError(
            f"--baseline {text}: there are {len(labels)} configurations.", f"Give a number from 1 to {len(labels)}."
        )
    if text in labels:
        return labels.index(text)
    raise RedlineError(
        f"--baseline {text!r} is not one of the configurations.", f"Give its position or one of: {', '.join(labels)}."
    )


def spec_from_args(args) -> BenchSpec:
    if args.ready_set == "ladder":
        configs = parse_configs(configs_text(ladder(probe_machine(include_gpus=True).device, args.model)))
    elif args.ready_set == "every-precision":
        configs = every_precision("kv")
    elif args.ready_set == "kv-forms":
        configs = parse_configs(configs_text(kv_forms(probe_machine(include_gpus=True).device)))
    else:
        configs = parse_configs(args.configs)
    warmup = args.warmup if args.warmup is not None else (SEED_PRESET["warmup"] if args.seed_preset else 1)
    samples = args.samples if args.samples is not None else (SEED_PRESET["samples"] if args.seed_preset else 3)
    prompts = load_prompt_set(args.prompts)
    if args.max_prompts is not None:
        prompts.prompts = prompts.prompts[: args.max_prompts]
    return BenchSpec(
        model=args.model,
        configs=configs,
        prompts=prompts,
        new_tokens=args.new_tokens,
        prompt_tokens=args.prompt_tokens,
        warmup=warmup,
        samples=samples,
        seed=args.seed,
        baseline=_baseline_index(args.baseline, [c.label for c in configs]),
        temperature=args.temperature,
        batch_sizes=args.batch_sweep or [],
        batch_mode=args.batch_mode,
        concurrency=args.concurrency or [],
        arrival_gap_s=args.arrival_gap,
        fixed_length=not args.stop_at_eos,
        server_keys=_server_keys(configs),
    )


def _server_keys(configs) -> dict:
    """The API key of each server a remote:URL configuration names: $REDLINE_REMOTE_API_KEY or the saved one."""

    keys, saved, env = {}, ServerKeys(), os.environ.get("REDLINE_REMOTE_API_KEY", "").strip()
    for c in configs:
        if c.strategy == "remote":
            key = env or saved.get(c.server)
            if key:
                keys[c.server.partition("#")[0].rstrip("/")] = key
    return keys


def _say_kernels(report, spec) -> None:
    """When Redline's CPU kernels could not run this CPU run, the machine line says so once: why, what it costs
    (the speed model's tok/s with and without them) and how to fix it (``KernelsReport``, the window's words)."""
    machine = getattr(report, "machine", None)
    if not isinstance(machine, dict) or str(machine.get("device") or "cpu").startswith("cuda"):
        return
    if machine.get("cpu_kernels") == "on":
        return
    fast = [c.precision for c in spec.configs if c.strategy == "fast" and c.precision in ("q8", "q4", "bf16")]
    kernels = KernelsReport.here("cpu", model=spec.model, precision=fast[0] if fast else None)
    if kernels.on:  # they load at first use and no configuration asked for them
        return
    machine["cpu_kernels"] = "off: " + kernels.clause()
    machine["cpu_kernels_report"] = kernels.to_dict()


def run(args) -> int:
    try:
        spec = spec_from_args(args)
    except RedlineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # The run is one job of the engine service, which has the engine to itself while it runs (the same
    # request API the window's speed lab uses).
    service = EngineService(lambda: Engine(args.device))
    bar = TerminalProgress()
    cancel = threading.Event()
    service.call(kv_form_job(args.kv), "the KV cache's form")  # for every load of the run, in order before it
    handle = service.call(lambda engine, report: run_bench(engine, spec, report, cancel.is_set), "the speed lab")

    def on_event(ev) -> None:
        if isinstance(ev, BenchPhase):
            bar(ev.fraction, ev.phase)
        elif isinstance(ev, BenchRow):
            r = ev.result
            tps = f"{r.tokens_per_s:.1f} tok/s" if r.tokens_per_s else (r.error or r.status)
            bar.done()
            print(f"  {r.config}: {r.status}, {tps}", file=sys.stderr, flush=True)
        elif isinstance(ev, BenchSweepRow):
            bar.done()
            print(f"  batch {ev.row.batch_size} ({ev.row.mode}): {ev.row.status}", file=sys.stderr, flush=True)
        elif isinstance(ev, BenchConcurrencyRow):
            bar.done()
            c = ev.row
            tps = f"{c.throughput_tokens_per_s:.1f} tok/s" if c.throughput_tokens_per_s else (c.error or c.status)
            print(f"  {c.concurrency} concurrent ({c.mode}): {tps}", file=sys.stderr, flush=True)

    def on_sigint(signum, frame):
        if cancel.is_set():  # a second Ctrl-C stops at once
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        print("\n(cancelling after the current step; Ctrl-C again to quit now)", file=sys.stderr, flush=True)
        cancel.set()

    previous = (
        signal.signal(signal.SIGINT, on_sigint) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        for ev in handle.events():
            on_event(ev)
        report = handle.result()
    except KeyboardInterrupt:
        return 130
    except RedlineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        service.shutdown()
    bar.done()
    _say_kernels(report, spec)
    if args.save:
        print(f"saved {save_report(report, Path(args.save))}", file=sys.stderr)
    argv = getattr(args, "argv", None)
    command = ("redline " + " ".join(shlex.quote(a) for a in argv)) if argv else None
    if args.json:
        text = to_json(report)
    elif args.csv:
        text = to_csv(report)
    elif args.markdown:
        text = to_markdown(report, command)
    else:
        text = to_text(report)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    failed = [r for r in report.results if r.status not in ("ok",)]
    if report.cancelled:
        return 130
    return 1 if failed and len(failed) == len(report.results) else 0
