"""Speed-lab results as CSV, JSON and Markdown — the same table the panel and `redline bench` show."""

from __future__ import annotations

import csv
import io
import json
from typing import Callable, Optional

from ..units import MB, format_bytes
from .concurrency import schedule_ceiling
from .results import BenchReport, ConfigResult, SweepRow


# (header, field, formatter) — one list drives the CLI table, the Markdown and the panel's columns.
def _ms(v):
    return "" if v is None else f"{v:.1f}"


def _rate(v):
    return "" if v is None else f"{v:.1f}"


def _mb(v):
    return "" if v is None else f"{v / MB:.0f}"


def _pct(v):
    return "" if v is None else f"{v * 100:.0f}%"


def _x(v):
    return "" if v is None else f"{v:.2f}×"


def _spread(r: ConfigResult) -> str:
    if r.tokens_per_s_min is None:
        return ""
    return f"{r.tokens_per_s_min:.1f}–{r.tokens_per_s_max:.1f}"


def _match(r: ConfigResult) -> str:
    if r.baseline:
        return "baseline"
    if r.matches_baseline is None:
        return ""
    return "yes" if r.matches_baseline else f"no (from token {r.diverges_at})"


def _status(r: ConfigResult) -> str:
    return r.status if not r.error else f"{r.status}: {r.error}"


def _kv_agrees(r: ConfigResult) -> str:
    """A q8-KV row's agreement with the same row in bf16 KV; nothing where there is no such row."""
    if r.kv_agreement is None:
        return ""
    forced = "" if r.kv_forced_agreement is None else f"next token {r.kv_forced_agreement * 100:.1f}%; output "
    if r.kv_first_diff is None:
        return f"{forced}{r.kv_agreement * 100:.0f}% (identical)"
    return f"{forced}{r.kv_agreement * 100:.0f}% (first differs at token {r.kv_first_diff})"


def _answered(r: ConfigResult) -> str:
    """The time to first answer, with how many samples reached their answer where some did not."""
    if r.ttfat_ms is None:
        return "no answer" if r.answered == 0 and r.thinking != "off" else ""
    some = r.answered is not None and r.answered < r.samples
    return _ms(r.ttfat_ms) + (f" ({r.answered}/{r.samples})" if some else "")


COLUMNS: list[tuple[str, Callable[[ConfigResult], str]]] = [
    ("config", lambda r: r.config),
    ("TTFT p50 ms", lambda r: _ms(r.ttft_ms)),
    # A reasoning model's row (``bench/thinking.py``): its thinking setting, the time to its first answer token (TTFA)
    # measured and predicted, its thinking tokens, the thinking's and the answer's own tokens/s.
    ("thinking", lambda r: r.thinking or ""),
    ("TTFA p50 ms", _answered),
    ("pred. TTFA ms", lambda r: _ms(r.predicted_ttfat_ms) if r.reasoning_format else ""),
    ("think tokens", lambda r: "" if r.thinking_tokens is None else f"{r.thinking_tokens:.0f}"),
    ("think tok/s", lambda r: _rate(r.thinking_tokens_per_s)),
    ("answer tok/s", lambda r: _rate(r.answer_tokens_per_s)),
    ("tok p50 ms", lambda r: _ms(r.p50_ms)),
    ("tok p95 ms", lambda r: _ms(r.p95_ms)),
    ("tok/s", lambda r: _rate(r.tokens_per_s)),
    ("tok/s range", _spread),
    ("pred. tok/s", lambda r: _rate(r.predicted_tokens_per_s)),
    ("pred. error", lambda r: "" if r.prediction_error_pct is None else f"{r.prediction_error_pct:+.0f}%"),
    ("total s", lambda r: "" if r.total_s is None else f"{r.total_s:.2f}"),
    ("load s", lambda r: "" if r.load_s is None else f"{r.load_s:.1f}" + (" (reused)" if r.reused_model else "")),
    ("peak MB", lambda r: _mb(r.peak_memory_bytes)),
    ("accept", lambda r: _pct(r.acceptance_rate)),
    ("acc. len", lambda r: "" if r.mean_accepted_length is None else f"{r.mean_accepted_length:.2f}"),
    ("MB/token", lambda r: "" if r.bytes_per_token is None else f"{r.bytes_per_token / 1e6:.0f}"),
    ("% roofline", lambda r: "" if r.roofline_pct is None else f"{r.roofline_pct:.0f}%"),
    ("speedup", lambda r: _x(r.speedup)),
    ("matches", _match),
    # The fast path's KV form, and a q8 row's quality against the same row in bf16 (``bench/kv_quality.py``).
    ("KV", lambda r: r.kv or ""),
    ("q8 KV agrees", _kv_agrees),
    ("q8 KV ppl", lambda r: "" if r.kv_ppl_change is None else f"{r.kv_ppl_change * 100:+.2f}%"),
    ("status", _status),
]

# Shown only where a row is a reasoning model's (the CLI's table, the Markdown, the panel hide them otherwise).
REASONING_COLUMNS = frozenset(
    ("thinking", "TTFA p50 ms", "pred. TTFA ms", "think tokens", "think tok/s", "answer tok/s")
)


# Shown only where a row ran with the KV cache in 8 bits.
KV_COLUMNS = frozenset(("KV", "q8 KV agrees", "q8 KV ppl"))


def hidden_columns(rows) -> frozenset:
    """The headers of ``COLUMNS`` that ``rows`` leave empty by kind: the reasoning columns where no row is a reasoning
    model's, the KV columns where no row kept its KV cache in 8 bits."""
    hidden = set()
    if not any(getattr(r, "reasoning_format", None) for r in rows):
        hidden |= REASONING_COLUMNS
    if not any(getattr(r, "kv", None) == "q8" for r in rows):
        hidden |= KV_COLUMNS
    return frozenset(hidden)


def shown_columns(rows) -> list[tuple[str, Callable[[ConfigResult], str]]]:
    """``COLUMNS`` for ``rows``, without those ``hidden_columns`` names."""
    hidden = hidden_columns(rows)
    return [c for c in COLUMNS if c[0] not in hidden]


CONCURRENCY_COLUMNS: list[tuple[str, Callable]] = [
    ("requests", lambda c: str(c.concurrency)),
    ("mode", lambda c: c.mode),
    ("TTFT p50 ms", lambda c: _ms(c.ttft_ms_p50)),
    ("TTFT p95 ms", lambda c: _ms(c.ttft_ms_p95)),
    ("latency p50 ms", lambda c: _ms(c.latency_ms_p50)),
    ("latency p95 ms", lambda c: _ms(c.latency_ms_p95)),
    ("total tok/s", lambda c: _rate(c.throughput_tokens_per_s)),
    ("KV peak ÷ needed", lambda c: "" if c.kv_overhead is None else f"{c.kv_overhead:.2f}×"),
    # On a one-at-a-time row: the most any batching could gain at these arrivals (bench.concurrency).
    ("batching gains at most", lambda c: _x(schedule_ceiling(c)) if c.mode == "one-at-a-time" else ""),
    ("status", lambda c: c.status if not c.error else f"{c.status}: {c.error}"),
]

SWEEP_COLUMNS: list[tuple[str, Callable[[SweepRow], str]]] = [
    ("batch", lambda s: str(s.batch_size)),
    ("mode", lambda s: s.mode),
    ("latency p50 ms", lambda s: _ms(s.latency_ms_p50)),
    ("latency p95 ms", lambda s: _ms(s.latency_ms_p95)),
    ("TTFT p50 ms", lambda s: _ms(s.ttft_ms_p50)),
    ("throughput tok/s", lambda s: _rate(s.throughput_tokens_per_s)),
    ("peak MB", lambda s: _mb(s.peak_memory_bytes)),
    ("status", lambda s: s.status if not s.error else f"{s.status}: {s.error}"),
]

# Machine-readable per-row fields (JSON "results" and CSV columns), raw numbers, no units in values.
RESULT_FIELDS = [
    "config",
    "strategy",
    "precision",
    "status",
    "error",
    "baseline",
    "samples",
    "prompt_tokens",
    "new_tokens",
    "ttft_ms",
    "p50_ms",
    "p95_ms",
    "tokens_per_s",
    "tokens_per_s_min",
    "tokens_per_s_max",
    "tokens_per_s_stdev",
    "total_s",
    "wall_s",
    "load_s",
    "reused_model",
    "peak_memory_bytes",
    "model_memory_bytes",
    "acceptance_rate",
    "mean_accepted_length",
    "speedup",
    "matches_baseline",
    "diverges_at",
    "bytes_per_token",
    "bandwidth_bytes_per_s",
    "roofline_pct",
    "predicted_tokens_per_s",
    "predicted_ttft_ms",
    "prediction_error_pct",
    "prediction_calibration",
    "thinking",
    "reasoning_format",
    "ttfat_ms",
    "answered",
    "thinking_tokens",
    "thinking_tokens_per_s",
    "answer_tokens_per_s",
    "predicted_ttfat_ms",
    "kv",
    "kv_reference",
    "kv_agreement",
    "kv_first_diff",
    "kv_compared_tokens",
    "kv_ppl_change",
    "kv_forced_agreement",
    "device",
]


def result_record(r: ConfigResult, full: bool = False) -> dict:
    d = r.to_dict()
    if full:
        return d
    rec = {k: d[k] for k in RESULT_FIELDS}
    rec["outputs"] = d["outputs"]
    rec["notes"] = d["notes"]
    return rec


def to_json(report: BenchReport, full: bool = False) -> str:
    """``machine`` + ``results`` (+ the run's settings and the sweep). ``full`` adds per-position latencies
    and token ids (what saved runs keep)."""
    data = {
        "model": report.model,
        "device": report.device,
        "started_at": report.started_at,
        "finished_at": report.finished_at,
        "seconds": report.seconds,
        "cancelled": report.cancelled,
        "machine": report.machine,
        "settings": report.spec,
        "results": [result_record(r, full) for r in report.results],
        "sweep_config": report.sweep_config,
        "sweep": [s.to_dict() for s in report.sweep],
        "concurrency_config": report.concurrency_config,
        "concurrency": [c.to_dict() for c in report.concurrency],
    }
    return json.dumps(data, indent=2, ensure_ascii=False)


def to_csv(report: BenchReport) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(RESULT_FIELDS + ["output"])
    for r in report.results:
        rec = result_record(r)
        w.writerow([_csv_value(rec[k]) for k in RESULT_FIELDS] + [r.outputs[0] if r.outputs else ""])
    if report.sweep:
        fields = [
            "batch_size",
            "mode",
            "status",
            "error",
            "samples",
            "latency_ms_p50",
            "latency_ms_p95",
            "ttft_ms_p50",
            "throughput_tokens_per_s",
            "new_tokens",
            "wall_s",
            "peak_memory_bytes",
        ]
        w.writerow([])
        w.writerow([f"batch sweep: {report.sweep_config}"])
        w.writerow(fields)
        for s in report.sweep:
            d = s.to_dict()
            w.writerow([_csv_value(d[k]) for k in fields])
    return buf.getvalue()


def _csv_value(v):
    return "" if v is None else v


def table_rows(report: BenchReport) -> tuple[list[str], list[list[str]]]:
    columns = shown_columns(report.results)
    return [h for h, _ in columns], [[f(r) for _, f in columns] for r in report.results]


def sweep_rows(report: BenchReport) -> tuple[list[str], list[list[str]]]:
    return [h for h, _ in SWEEP_COLUMNS], [[f(s) for _, f in SWEEP_COLUMNS] for s in report.sweep]


def concurrency_rows(report: BenchReport) -> tuple[list[str], list[list[str]]]:
    return [h for h, _ in CONCURRENCY_COLUMNS], [[f(c) for _, f in CONCURRENCY_COLUMNS] for c in report.concurrency]


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_summary(machine: dict) -> str:
    gpus = (
        ", ".join(
            f"{g['name']} ({format_bytes(g['total_bytes'])})" if g.get("total_bytes") else g["name"]
            for g in machine.get("gpus", [])
        )
        or "none"
    )
    v = machine.get("versions", {})
    ram = machine.get("ram_total_bytes")
    return (
        f"CPU: {machine.get('cpu')} ({machine.get('cpu_cores')} logical cores, torch uses "
        f"{machine.get('torch_threads')} threads; Redline's CPU kernels {machine.get('cpu_kernels', 'unknown')}); "
        f"RAM: {format_bytes(ram)}; GPU: {gpus}; "
        f"device: {machine.get('device')}. torch {v.get('torch')}, transformers {v.get('transformers')}, "
        f"bitsandbytes {v.get('bitsandbytes')}; Python {machine.get('python')}; {machine.get('os')}."
        if ram
        else ""
    )


def to_markdown(report: BenchReport, command: Optional[str] = None) -> str:
    s = report.spec
    out = [f"### Speed lab: {report.model} on {report.device}", ""]
    if command:
        out += ["```sh", command, "```", ""]
    out.append(
        f"Prompt set `{s.get('prompts', {}).get('name')}` ({s.get('prompts', {}).get('count')} prompts), "
        f"{s.get('new_tokens')} new tokens, {s.get('warmup')} warm-up, {s.get('samples')} sample(s) per "
        f"prompt, seed {s.get('seed')}, temperature {s.get('temperature')}; baseline "
        f"`{s.get('baseline_config')}`." + (" **Cancelled** — partial results." if report.cancelled else "")
    )
    out.append("")
    out.append(_md_table(*table_rows(report)))
    if report.sweep:
        out += ["", f"Batch sweep of `{report.sweep_config}`:", "", _md_table(*sweep_rows(report))]
    if report.concurrency:
        out += ["", f"Concurrency sweep of `{report.concurrency_config}`:", "", _md_table(*concurrency_rows(report))]
    out += ["", f"Machine: {machine_summary(report.machine)}", ""]
    return "\n".join(out)


def to_text(report: BenchReport) -> str:
    """A plain aligned table for the terminal."""

    def fmt(headers, rows):
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
        return "\n".join(line.rstrip() for line in lines)

    out = [fmt(*table_rows(report))]
    if report.sweep:
        out += ["", f"batch sweep: {report.sweep_config}", fmt(*sweep_rows(report))]
    if report.concurrency:
        out += ["", f"concurrency sweep: {report.concurrency_config}", fmt(*concurrency_rows(report))]
    return "\n".join(out)
