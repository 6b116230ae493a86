"""The run: arguments, the sections in order with their shares of the budget, the report, and how it ends
(complete, with failures, cut, or stopped by a signal: the report says which and where)."""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from gpu_check import FAKE_CUDA_COVERED, PLAN
from gpu_check.report import Clock, Cut, Report, Section

DEFAULT_BUDGET_S = 480.0  # 8 minutes: the lent window is 10, a cold start and the transfers take the rest
GAP_MS = 250.0  # a pause a reader sees as a stall

SPEED = (
    ("tok/s", "tokens_per_s"),
    ("ms/step", "wall_ms"),
    ("kernel ms", "kernel_ms"),
    ("kernels/step", "kernels_per_step"),
    ("GB/step", "gb_per_step"),
    ("% roofline", "roofline_pct"),
    ("4090 tok/s", "rtx4090_tok_s"),
    ("4070 tok/s", "rtx4070_tok_s"),
    ("graph steps", "graphed"),
    ("cudagraph_skips", "cudagraph_skips"),
    ("compile s", "compile_s"),
    ("s", "seconds"),
)

# (key, title, share of the budget, report columns), in order of value.
SECTIONS = (
    ("batch1", "An 8B-shaped model at batch 1: eager against graphed, bf16 and q4", 0.40, SPEED),
    (
        "batches",
        "Continuous batching: 1, 2, 4 and 8 replies",
        0.10,
        (
            ("tok/s (all)", "tokens_per_s"),
            ("tok/s each", "per_reply_tok_s"),
            ("ms/step", "step_ms"),
            ("graph steps", "graphed"),
            ("cudagraph_skips", "cudagraph_skips"),
            ("compile s", "compile_s"),
            ("s", "seconds"),
        ),
    ),
    (
        "turns",
        "A 2k-token prompt's time to first token, and the next turn's through the prefix cache",
        0.06,
        (
            ("TTFT ms", "ttft_ms"),
            ("prompt", "prompt_tokens"),
            ("cached", "cached_tokens"),
            ("× turn 1", "vs_turn_1"),
            ("tok/s", "tokens_per_s"),
            ("s", "seconds"),
        ),
    ),
    (
        "logits",
        "Teacher-forced logits against an fp32 reference",
        0.07,
        (
            ("max abs err", "max_abs_err"),
            ("max rel err", "max_rel_err"),
            ("mean abs err", "mean_abs_err"),
            ("× transformers bf16", "vs_transformers_bf16"),
            ("top-1 decided", "top1_decided"),
            ("agree there", "top1_agree_where_decided"),
            ("graph steps", "graphed"),
            ("s", "seconds"),
        ),
    ),
    (
        "baselines",
        "transformers' own paths in the same run (bf16)",
        0.13,
        (
            ("tok/s", "tokens_per_s"),
            ("TTFT ms", "ttft_ms"),
            ("ran", "ran"),
            ("compile s", "compile_s"),
            ("s", "seconds"),
        ),
    ),
    (
        "streaming",
        "A reply streaming while the graphs are captured",
        0.04,
        (
            ("longest gap ms", "longest_gap_ms"),
            ("median gap ms", "median_gap_ms"),
            ("gaps over limit", "gaps_over_limit"),
            ("limit ms", "gap_limit_ms"),
            ("replies", "replies"),
            ("tokens", "tokens"),
            ("compiling after 1st reply", "compiling_after_first_reply"),
            ("s", "seconds"),
        ),
    ),
    (
        "memory",
        "Memory predicted vs measured under 24, 12 and 8 GB caps",
        0.10,
        (
            ("held before GB", "held_before_gb"),
            ("predicted GB", "predicted_gb"),
            ("predicted fits", "predicted_fits"),
            ("measured GB", "measured_gb"),
            ("fits", "measured_fits"),
            ("error %", "predicted_error_pct"),
            ("torch said", "torch_message"),
            ("Redline said", "redline_message"),
            ("s", "seconds"),
        ),
    ),
    (
        "matrix",
        "The starter-shaped matrix (only with the time left)",
        0.10,
        (
            ("tok/s", "tokens_per_s"),
            ("TTFT ms", "ttft_ms"),
            ("ran", "ran"),
            ("predicted MB", "predicted_mb"),
            ("measured MB", "measured_mb"),
            ("greedy same as fp32 until", "greedy_same_as_fp32_until"),
            ("s", "seconds"),
        ),
    ),
)


def section_functions() -> dict:
    from gpu_check.baselines import section_baselines
    from gpu_check.logits import section_logits
    from gpu_check.matrix import section_matrix
    from gpu_check.memory import section_memory
    from gpu_check.speed import section_batch1, section_batches
    from gpu_check.turns import section_streaming, section_turns

    return {
        "batch1": section_batch1,
        "batches": section_batches,
        "turns": section_turns,
        "logits": section_logits,
        "baselines": section_baselines,
        "streaming": section_streaming,
        "memory": section_memory,
        "matrix": section_matrix,
    }


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="gpu_check", description=(__import__("gpu_check").__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for all sections (default 480)")
    ap.add_argument("--gap-ms", type=float, default=GAP_MS, help="longest gap a streaming reply may show (ms)")
    ap.add_argument("--only", default="", help="comma-separated section keys to run (the others are skipped)")
    ap.add_argument("--dry-run", action="store_true", help="every section on the CPU, tiny model, tiny sizes")
    ap.add_argument("--exit-after-cells", type=int, default=None, help=argparse.SUPPRESS)  # tests: a killed run
    return ap.parse_args(argv)


def dry_run_setup() -> None:
    """The CPU runs the GPU's branch of the fast path, and compiles with an eager backend (tracing, guards and the
    compiled step's switching are exercised; Inductor's C++ build on a busy 2-core machine is not the point)."""
    os.environ["REDLINE_NATIVE_KERNELS"] = "0"
    import torch

    # One thread: on a shared machine OpenMP's barriers stall a tiny model's every product (a 64-wide bf16 step
    # took 230 ms on 2 busy cores with 2 threads, 5 ms with one).
    torch.set_num_threads(1)

    original = torch.compile

    def compile_eager(*args, **kwargs):
        kwargs.pop("mode", None)
        kwargs.pop("options", None)
        kwargs["backend"] = "eager"
        return original(*args, **kwargs)

    torch.compile = compile_eager


def main(argv=None) -> int:
    args = parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.log").write_text("")
    work = Path(tempfile.mkdtemp(prefix="redline-gpu-check-"))
    # Compiled steps saved where this run alone finds them: the compile times reported are a fresh machine's.
    os.environ["REDLINE_COMPILED_DIR"] = str(work / "compiled")
    if args.dry_run:
        dry_run_setup()
    import torch
    import transformers

    cuda = torch.cuda.is_available() and not args.dry_run
    info = {
        "device": torch.cuda.get_device_name(0) if cuda else (platform.processor() or "cpu"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "dry_run": args.dry_run,
        "findings": [],
    }
    sections = [Section(i + 1, key, title, share, cols) for i, (key, title, share, cols) in enumerate(SECTIONS)]
    report = Report(out, info, sections, extra_md)
    report.exit_after_cells = args.exit_after_cells
    if not cuda and not args.dry_run:
        report.log("No CUDA device: nothing to check here (use --dry-run to exercise the script on the CPU).")
        return 2
    ctx = make_context(args, report, cuda, work, info)
    clock = Clock(args.budget)  # from here: the budget is the sections' (setting up took its own few seconds)
    report.clock = clock
    current: dict = {}

    def stopped(signum, _frame):
        sec = current.get("section")
        where = f" in section {sec.number} ({sec.title})" if sec is not None else ""
        report.state = f"stopped by {signal.Signals(signum).name} after {clock.elapsed():.0f} s{where}"
        if sec is not None:
            sec.status = "stopped while running"
        report.write()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    report.log(f"gpu-check on {info['device']} (torch {info['torch']}, CUDA {info['cuda']}), dry run: {args.dry_run}")
    functions = section_functions()
    only = {k.strip() for k in args.only.split(",") if k.strip()}
    planned = clock.started
    try:
        for sec in sections:
            planned += sec.share * clock.budget_s
            if only and sec.key not in only:
                sec.status = "skipped: not asked for (--only)"
                report.write()
                continue
            if clock.elapsed() >= clock.budget_s:
                sec.status = f"skipped: the run's budget ({clock.budget_s:.0f} s) was spent before it started"
                report.write()
                continue
            current["section"] = sec
            sec.open(clock, planned)
            report.state = f"running section {sec.number} ({sec.key})"
            report.write()
            try:
                functions[sec.key](ctx, sec)
                bad = [c for c in sec.cells if str(c.get("status", "")).startswith(("fail", "error"))]
                cut = [c for c in sec.cells if str(c.get("status", "")).startswith("cut")]
                sec.status = "ok"
                if bad:
                    sec.status = f"{len(bad)} of {len(sec.cells)} cells failed"
                elif cut:
                    sec.status = cut[0]["status"]
            except Cut as c:
                sec.status = f"cut after {time.perf_counter() - sec.started:.0f} s: {c}"
            except Exception as exc:
                sec.status = f"error: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
                report.log(traceback.format_exc(limit=8))
            sec.seconds = time.perf_counter() - sec.started
            current.pop("section", None)
            report.write()
        report.state = "complete" + (f" ({', '.join(ctx.background)})" if ctx.background else "")
    finally:
        report.write()
        shutil.rmtree(work, ignore_errors=True)
    cells = [c for s in sections for c in s.cells]
    failed = [c for c in cells if str(c.get("status", "")).startswith(("fail", "error"))]
    report.log(f"{len(cells)} cells, {len(failed)} failed, {clock.elapsed():.0f} s; report in {out}")
    return 1 if failed else 0


def make_context(args, report: Report, cuda: bool, work: Path, info: dict):
    from gpu_check.context import Ctx, Sizes
    from gpu_check.models import big_config, tiny_config, write_folder
    from redline.inference.decoding.compiled import SCRATCH_SEQ
    from redline.inference.generation.lifecycle import DirectSink

    probe = DirectSink()
    if probe.id == SCRATCH_SEQ:
        # A direct generate() (the speed lab, tools) as the process's first reply shares the compiled step's
        # scratch page as its sequence and frees it on release, which makes the graph stale: taken here so the
        # graphs are measured, and reported.
        info["findings"].append(
            f"DirectSink's first sequence id is {probe.id}, the compiled step's scratch sequence (SCRATCH_SEQ): a "
            "direct generate() run first in a process writes into the scratch page and frees it, so a ready graph "
            "goes stale and compiles again (taken by this check before any reply)"
        )
    device = "cuda" if cuda else "cpu"
    config = tiny_config() if args.dry_run else big_config()
    folder = work / ("tiny-8b-shaped" if args.dry_run else "llama-3-8b-shaped")
    tokenizer = write_folder(folder, config)
    ctx = Ctx(
        report=report,
        device=device,
        cuda=cuda,
        dry=args.dry_run,
        work=work,
        sizes=Sizes.dry() if args.dry_run else Sizes.gpu(),
        config=config,
        folder=folder,
        tokenizer=tokenizer,
        device_name=info["device"],
        gap_ms=args.gap_ms,
    )
    try:
        from redline.inference.hardware.bandwidth import bandwidth

        ctx.bandwidth = bandwidth(device)
        info["bandwidth_gb_s"] = round(ctx.bandwidth / 1e9, 1)
    except Exception as exc:  # the roofline columns stay empty; the run goes on
        info["bandwidth_error"] = f"{type(exc).__name__}: {exc}"
    return ctx


def extra_md() -> list[str]:
    lines = [
        "## What only this run checks",
        "",
        "The fake-CUDA tests (`make test`, tests/test_fake_cuda.py) run "
        + "; ".join(f"{path} in {', '.join(p)}" for path, p in FAKE_CUDA_COVERED.items())
        + " without a GPU. Fake tensors cannot reach these paths:",
        "",
    ]
    lines += [f"- **{row['path']}**: {row['why']} (where: {row['cells']})" for row in PLAN]
    lines += [
        "",
        "Not in this check yet: a GGUF file's own layouts on the GPU (Q4_K → int4 groups, Q6_K/Q8_0 → int8), whose "
        "error against the file is a CPU test's (issue 46, item 4).",
    ]
    return lines


def entry() -> None:
    code = main()
    if any(t is not threading.main_thread() and t.is_alive() for t in threading.enumerate()):
        # A cut call (a compile that cannot be interrupted) still runs: the interpreter's teardown under it ended
        # the process with "terminate called without an active exception" (SIGABRT) after the report was
        # written, so the run's exit code was lost. The report and the log are on disk: leave at once. Any thread,
        # not only the check's own calls: a decoder's background compile (section 6's, cut with a 2 s budget under
        # a loaded machine) ended `make test`'s run of test_gpu_check.py the same way.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
