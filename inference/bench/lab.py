"""The speed lab: one model, several decoding configurations, measured fairly.

Qt-free; the GUI panel and ``redline bench`` both call ``run_bench``. Every
generation goes through ``inference.generation.run`` — the lifecycle chat uses —
so what the lab measures is what the chat runs.

Fairness (the textbook protocol): the same prompts, lengths, seed and greedy decoding for
every configuration; warm-up runs before the measured samples; one variable
changed at a time relative to a baseline the user marks. A configuration that
fails (out of memory, bitsandbytes missing, an incompatible draft) becomes that
row's result and the run goes on. Cancelling keeps the rows finished so far.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

from ..backends.remote import is_server_url, parse_server_spec
from ..decoding.options import SamplingSettings
from ..decoding.prompt import build_prompt
from ..engine import Engine
from ..errors import Cancelled, OutOfMemory, RedlineError, UnsupportedConfiguration
from ..events import GenerationResult, StatsEvent, TokenEvent
from ..generation.lifecycle import DirectSink
from ..generation.request import GenerationRequest
from ..hardware.bandwidth import bandwidth
from ..hardware.probe import probe
from ..kernels.cpu import library as native
from ..memory.oom import free_memory, is_oom
from ..sources.resolve import resolve
from ..speed.arithmetic import bytes_read_per_token
from ..speed.calibration import predict_generation
from ..stats import percentile
from . import kv_quality
from .concurrency import ConcurrencyRow, run_concurrency
from .configs import BenchConfig
from .prompts import PromptSet
from .results import (
    BenchConcurrencyRow,
    BenchLive,
    BenchPhase,
    BenchReport,
    BenchRow,
    BenchStarted,
    BenchSweepRow,
    BenchToken,
    ConfigResult,
    ProgressCallback,
    SweepRow,
)
from .sweep import run_sweep
from .thinking import THINKING_LABELS, aggregate_reasoning, predicted_thinking, reasoning_prompts, row_thinking

# The textbook measurement protocol (20 warm-up runs, 50 samples), offered as a preset; the defaults stay small
# for interactivity.
SEED_PRESET = {"warmup": 20, "samples": 50}
DEFAULT_WARMUP = 1
DEFAULT_SAMPLES = 3


# -- the run ------------------------------------------------------------------
@dataclass
class BenchSpec:
    model: str
    configs: list[BenchConfig]
    prompts: PromptSet
    new_tokens: int = 64
    prompt_tokens: Optional[int] = None  # cap on prompt length (keeps the end of a longer prompt)
    warmup: int = DEFAULT_WARMUP
    samples: int = DEFAULT_SAMPLES
    seed: int = 0
    baseline: int = 0  # index of the configuration every other is compared with
    temperature: float = 0.0  # greedy by default, so outputs are comparable
    fixed_length: bool = True  # every generation makes exactly new_tokens tokens (end-of-sequence suppressed)
    batch_sizes: list[int] = field(default_factory=list)  # non-empty: also run a batch sweep
    batch_mode: str = "auto"  # auto | continuous | padded
    batch_config: Optional[int] = None  # which configuration the sweep runs (default: the baseline)
    concurrency: list[int] = field(default_factory=list)  # non-empty: also run the concurrency sweep (fast path)
    arrival_gap_s: float = 0.5  # the concurrency sweep's requests arrive this far apart
    # API keys of the servers remote rows name (base URL → key); never saved with a report
    server_keys: dict = field(default_factory=dict, repr=False)
    record_speed: bool = True  # feed each row's measurement to this machine's speed correction

    def __post_init__(self):
        if not self.configs:
            raise UnsupportedConfiguration("No configurations to run.", "Add at least one, e.g. kv:bf16.")
        if not 0 <= self.baseline < len(self.configs):
            raise UnsupportedConfiguration(
                f"Baseline {self.baseline + 1} is not one of the {len(self.configs)} configurations."
            )
        if self.new_tokens < 1 or self.samples < 1 or self.warmup < 0:
            raise UnsupportedConfiguration("New tokens and samples must be at least 1, warm-up at least 0.")
        if any(b < 1 for b in self.batch_sizes) or any(c < 1 for c in self.concurrency):
            raise UnsupportedConfiguration("Batch sizes and concurrency levels must be at least 1.")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("server_keys", None)
        d["configs"] = [c.label for c in self.configs]
        d["baseline_config"] = self.configs[self.baseline].label
        d["prompts"] = {"name": self.prompts.name, "count": len(self.prompts.prompts), "source": self.prompts.source}
        return d


def cpu_kernels_state() -> str:
    """Whether Redline's native CPU kernels run the products ("on"), or why not."""

    kernels = native.status()
    return "on" if kernels.get("loaded") else f"off ({kernels.get('reason') or 'not built'})"


def machine_info(device: Optional[str] = None) -> dict:
    hw = probe()
    versions = {}
    for pkg in ("torch", "transformers", "bitsandbytes", "accelerate", "redline"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        # lazy: torch loads on the engine's thread, never at import
        import torch

        versions["torch"] = torch.__version__
        cuda = torch.version.cuda
        threads = torch.get_num_threads()
    except Exception:  # pragma: no cover - torch is a dependency
        cuda, threads = None, None
    return {
        "cpu_kernels": cpu_kernels_state(),
        "cpu": hw.cpu,
        "cpu_cores": hw.cpu_cores,
        "torch_threads": threads,
        "ram_total_bytes": hw.ram_total_bytes,
        "gpus": [{"name": g.name, "total_bytes": g.total_bytes} for g in hw.gpus],
        "device": device or hw.device,
        "cuda": cuda,
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
    }


class _Latch:
    """Once the run is cancelled it stays cancelled (a cancel between two generations is not lost)."""

    def __init__(self, should_cancel: Optional[Callable[[], bool]]):
        self.should_cancel, self.seen = should_cancel, False

    def __call__(self) -> bool:
        if not self.seen and self.should_cancel is not None and self.should_cancel():
            self.seen = True
        return self.seen


def _render_prompts(tokenizer, spec: BenchSpec) -> list[list[int]]:
    context = (spec.prompt_tokens + spec.new_tokens) if spec.prompt_tokens else 1_000_000
    return [build_prompt(tokenizer, p.messages, context, spec.new_tokens).input_ids for p in spec.prompts.prompts]


def _divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """First index where the two token lists differ; None if identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class _Models:
    """Loads what a configuration needs, reusing the loaded target (and draft) when they match."""

    def __init__(self, engine: Engine, model: str, cancelled: Callable[[], bool], keys: Optional[dict] = None):
        self.engine, self.model, self.cancelled = engine, model, cancelled
        self.source = None if is_server_url(model) else resolve(model)
        self.keys = keys or {}
        self.kv_default = engine.limits.kv  # the run's KV form (--kv, the Settings), for rows that name none

    def ensure(self, config: BenchConfig, progress: Callable[[float, str], None]) -> tuple[float, bool]:
        eng = self.engine
        if config.remote:  # a model on a server: connect (nothing loads here), reusing the connection
            if eng.target is not None and eng.target.answers_to(config.server):
                return 0.0, True
            base, _ = parse_server_spec(config.server)
            eng.unload_draft()
            eng.load(config.server, None, progress, api_key=self.keys.get(base))
            return eng.target.load_seconds, False
        if self.source is None:
            raise UnsupportedConfiguration(
                f"The lab's model is a server ({self.model}), so {config.label} has no local model to run.",
                "Choose a local model for the lab, or make every row remote:URL.",
            )
        eng = self.engine
        spec = config.precision_spec(eng.device)
        reused = True
        load_s = 0.0
        form = eng.limits.kv = config.kv or self.kv_default  # what the next decoder is built with
        # A decoder keeps the form it was built with: a row of another form loads the model again.
        other_kv = config.strategy == "fast" and eng.target is not None and eng.target.kv_form() not in (None, form)
        if eng.target is None or eng.target.source != self.source or eng.target.precision != spec or other_kv:
            reused = False
            eng.load(self.model, spec, progress, should_cancel=self.cancelled)
        load_s += eng.target.load_seconds
        if config.strategy == "speculative":
            dspec = config.draft_precision_spec(eng.device)
            if eng.draft is None or eng.draft.source != resolve(config.draft) or eng.draft.precision != dspec:
                reused = False
                eng.load_draft(config.draft, dspec, progress, self.cancelled)
            load_s += eng.draft.load_seconds
        elif eng.draft is not None:
            eng.unload_draft()  # fair memory figures: a draft another row needed is not this row's
        return load_s, reused


def _aggregate(row: ConfigResult, measured: list[tuple[int, GenerationResult]]) -> None:
    results = [r for _, r in measured]
    row.samples = len(results)
    row.prompt_tokens = statistics.median(r.prompt_tokens for r in results)
    row.new_tokens = statistics.median(r.new_tokens for r in results)
    ttfts = [r.ttft_ms for r in results if r.ttft_ms is not None]
    row.ttft_ms = percentile(ttfts, 0.5)
    pooled = [ms for r in results for ms in r.per_token_ms]
    row.p50_ms, row.p95_ms = percentile(pooled, 0.5), percentile(pooled, 0.95)
    speeds = [r.tokens_per_s for r in results if r.tokens_per_s]
    if speeds:
        row.tokens_per_s = statistics.median(speeds)
        row.tokens_per_s_min, row.tokens_per_s_max = min(speeds), max(speeds)
        row.tokens_per_s_stdev = statistics.stdev(speeds) if len(speeds) > 1 else 0.0
    row.total_s = statistics.median(r.total_s for r in results)
    peaks = [r.peak_memory_bytes for r in results if r.peak_memory_bytes is not None]
    row.peak_memory_bytes = max(peaks) if peaks else None
    proposed = sum(r.draft_proposed or 0 for r in results)
    accepted = sum(r.draft_accepted or 0 for r in results)
    if any(r.draft_proposed is not None for r in results):
        row.acceptance_rate = accepted / proposed if proposed else None
        # steps = accepted ÷ mean accepted length, per sample; pooled so long replies weigh more
        steps = sum(
            r.draft_accepted / r.mean_accepted_length for r in results if r.mean_accepted_length and r.draft_accepted
        )
        row.mean_accepted_length = accepted / steps if steps else (0.0 if proposed else None)
    longest = max((len(r.per_token_ms) for r in results), default=0)
    row.per_token_ms_by_position = [
        statistics.median(r.per_token_ms[i] for r in results if i < len(r.per_token_ms)) for i in range(longest)
    ]
    for r in results:
        for note in r.notes:
            if not note.startswith("Traceback") and note not in row.notes:
                row.notes.append(note)
    aggregate_reasoning(row, results)


def _roofline(row: ConfigResult, target) -> None:
    """How close decoding came to the memory-bandwidth bound: tokens/s ≤ bandwidth ÷ bytes per token.
    With speculative decoding or prompt lookup one step can yield several tokens, so it may pass 100 %."""

    context = int((row.prompt_tokens or 0) + (row.new_tokens or 0) / 2)  # the cache read on an average step
    row.bytes_per_token = bytes_read_per_token(target, row.strategy, context)
    row.bandwidth_bytes_per_s = bandwidth(target.device)
    if row.tokens_per_s and row.bandwidth_bytes_per_s:
        row.roofline_pct = 100.0 * row.tokens_per_s * row.bytes_per_token / row.bandwidth_bytes_per_s


def _predict_speed(
    row: ConfigResult, config: BenchConfig, target, draft, record: bool = True, results: Sequence = ()
) -> None:
    """The speed model's prediction for the row, then the row's measurement fed to this machine's correction (with a
    reasoning row's thinking length, from ``results``, its samples)."""

    speculative = config.strategy == "speculative" and draft is not None
    prompt_tokens, new_tokens = int(row.prompt_tokens or 1), int(row.new_tokens or 1)
    thinking = predicted_thinking(row, config)  # a reasoning row's time to first answer
    try:
        shown, key, cal = predict_generation(
            target,
            config.strategy,
            prompt_tokens,
            new_tokens,
            draft=draft if speculative else None,
            k=config.k,
            compile=config.compile,
            config=config.label,
            thinking=thinking,
        )
        row.predicted_tokens_per_s = round(shown.tokens_per_s, 2)
        row.predicted_ttft_ms = round(shown.ttft_ms, 1)
        if thinking is not None and shown.ttfat_ms is not None:
            row.predicted_ttfat_ms = round(shown.ttfat_ms, 1)
        row.prediction_calibration = shown.calibration
        if row.tokens_per_s:
            row.prediction_error_pct = round(100.0 * (shown.tokens_per_s - row.tokens_per_s) / row.tokens_per_s, 1)
        if not record:
            return
        # The residual is taken against a prediction with this row's own acceptance, so the factor learns the
        # machine, not how well this prompt suited the draft.
        exact, _, _ = predict_generation(
            target,
            config.strategy,
            prompt_tokens,
            new_tokens,
            draft=draft if speculative else None,
            k=config.k,
            acceptance=row.acceptance_rate if speculative else None,
            compile=config.compile,
            calibration=cal,
        )
        cal.record(exact, key, target.name, row.tokens_per_s, row.ttft_ms, "lab", thinking=row_thinking(results))
        if speculative:
            cal.record_acceptance(target.name, draft.name, draft.precision.label(), config.k, row.acceptance_rate)
    except Exception as exc:  # a prediction is a report: it must never fail the row
        row.notes.append(f"speed prediction unavailable ({type(exc).__name__}: {exc})")


def _compare(rows: list[ConfigResult], baseline: int) -> None:
    base = rows[baseline] if baseline < len(rows) else None
    for row in rows:
        row.baseline = row.index == baseline
        if base is None or base.status != "ok" or row.status != "ok":
            continue
        if base.tokens_per_s and row.tokens_per_s:
            row.speedup = row.tokens_per_s / base.tokens_per_s
        if base.token_ids and len(base.token_ids) == len(row.token_ids):
            first = [_divergence(a, b) for a, b in zip(base.token_ids, row.token_ids)]
            diffs = [d for d in first if d is not None]
            row.matches_baseline = not diffs
            row.diverges_at = min(diffs) if diffs else None


def run_bench(
    engine: Engine,
    spec: BenchSpec,
    progress: Optional[ProgressCallback] = None,
    should_cancel: Optional[Callable[[], bool]] = None,
    restore_model: bool = False,
) -> BenchReport:
    """Run every configuration of ``spec`` on ``engine``, one after another; never raises for a row's failure.

    ``progress`` receives BenchStarted, BenchPhase, BenchToken, BenchRow and BenchSweepRow events on the
    calling thread. ``should_cancel`` (the run's own cancel handle) stops the run; finished rows are kept.
    ``restore_model`` reloads the model the engine had before the run (the GUI's chat model)."""
    emit = progress or (lambda ev: None)
    cancelled = _Latch(should_cancel)
    started = time.perf_counter()
    previous = _current(engine.target)
    previous_draft = (engine.draft.source.spec, engine.draft.precision) if engine.draft is not None else None
    models = _Models(engine, spec.model, cancelled, spec.server_keys)
    report = BenchReport(
        spec=spec.to_dict(),
        machine=machine_info(engine.device),
        model=models.source.name if models.source is not None else spec.model,
        device=engine.device,
        started_at=_dt.datetime.now().isoformat(timespec="seconds"),
    )
    rows = [
        ConfigResult(index=i, config=c.label, strategy=c.strategy, baseline=i == spec.baseline)
        for i, c in enumerate(spec.configs)
    ]
    report.results = rows
    per_config = spec.warmup + spec.samples * len(spec.prompts.prompts)
    sweep_units = len(spec.batch_sizes) * (spec.warmup + spec.samples) + 3 * len(spec.concurrency)
    total_units = max(1, per_config * len(spec.configs) + sweep_units)
    done_units = 0
    emit(BenchStarted([c.label for c in spec.configs], spec.baseline))
    sampling = SamplingSettings(
        max_new_tokens=spec.new_tokens,
        temperature=spec.temperature,
        seed=spec.seed,
        min_new_tokens=spec.new_tokens if spec.fixed_length else None,
    )

    try:
        for i, config in enumerate(spec.configs):
            row = rows[i]
            if cancelled():
                row.status = "cancelled"
                continue
            unit_base = done_units
            row_start = time.perf_counter()

            def load_progress(fraction: float, phase: str, _i=i, _base=unit_base, _label=config.label) -> None:
                emit(BenchPhase(_base / total_units, _i, f"{_label}: {phase}"))

            try:
                emit(BenchPhase(done_units / total_units, i, f"{config.label}: loading"))
                row.load_s, row.reused_model = models.ensure(config, load_progress)
                target = engine.target
                row.precision, row.device = target.precision.label(), target.device
                row.model_memory_bytes = target.memory_bytes + (engine.draft.memory_bytes if engine.draft else 0)
                if not target.capabilities.token_ids:  # the same prompts, as messages: the server tokenizes
                    prompts = [list(p.messages) for p in spec.prompts.prompts]
                    row.model_memory_bytes = None
                    row.notes.append(
                        f"on the server {target.server}: its memory is not measured here; TTFT and tokens/s are "
                        "measured on this client; the server decides where a reply ends"
                    )
                else:
                    # A reasoning model's prompts carry the row's thinking setting and its replies are split.
                    prompts = reasoning_prompts(target, spec, config) or _render_prompts(target.tokenizer, spec)
                    if isinstance(prompts[0], tuple):
                        row.thinking = THINKING_LABELS[config.thinking]
                options = config.options()
                measured: list[tuple[int, GenerationResult]] = []
                outputs: dict[int, GenerationResult] = {}
                failure: Optional[GenerationResult] = None
                runs = [("warm-up", n, 0) for n in range(spec.warmup)] + [
                    ("sample", s * len(prompts) + p, p) for s in range(spec.samples) for p in range(len(prompts))
                ]
                for kind, n, p in runs:
                    if cancelled():
                        break
                    label = (
                        f"warm-up {n + 1}/{spec.warmup}"
                        if kind == "warm-up"
                        else f"sample {n // len(prompts) + 1}/{spec.samples}, prompt {p + 1}/{len(prompts)}"
                    )
                    emit(BenchPhase(done_units / total_units, i, f"{config.label}: {label}"))
                    shown = kind == "sample" and n == 0

                    def on_event(ev, _shown=shown, _i=i):
                        if _shown and isinstance(ev, TokenEvent) and ev.text:
                            emit(BenchToken(_i, ev.text, ev.time_s))
                        elif isinstance(ev, StatsEvent):
                            emit(BenchLive(_i, ev.tokens_per_s_1s, ev.ttft_ms, ev.new_tokens))

                    if isinstance(prompts[p], tuple):  # a reasoning model's: messages, made ready once
                        prompt = {"messages": prompts[p][0], "prepared": prompts[p][1], "thinking": prompts[p][2]}
                    elif target.capabilities.token_ids:
                        prompt = {"input_ids": prompts[p]}
                    else:
                        prompt = {"messages": prompts[p]}
                    request = GenerationRequest(
                        **prompt, sampling=sampling, options=options, client="lab", record=False
                    )
                    result = engine.run(request, DirectSink(on_event, cancelled))
                    done_units += 1
                    if result.finish_reason == "error":
                        failure = result
                        break
                    if result.finish_reason == "cancelled":
                        break
                    if kind == "sample":
                        measured.append((p, result))
                        outputs.setdefault(p, result)
                row.wall_s = time.perf_counter() - row_start
                if failure is not None:
                    row.status = "oom" if (failure.error or "").startswith("Out of memory") else "error"
                    row.error = failure.error
                elif cancelled() and len(measured) < spec.samples * len(prompts):
                    row.status = "cancelled"
                    if measured:
                        _aggregate(row, measured)
                        row.notes.append(f"cancelled after {len(measured)} of {spec.samples * len(prompts)} samples")
                else:
                    row.status = "ok"
                    _aggregate(row, measured)
                    row.outputs = [outputs[p].text for p in sorted(outputs)]
                    if target.capabilities.measured_here:  # a server's speed is its own (and its network's)
                        _roofline(row, target)
                        # this machine's speed: a server's is its own (and its network's)
                        _predict_speed(row, config, target, engine.draft, spec.record_speed, [r for _, r in measured])
                        row.token_ids = [outputs[p].token_ids for p in sorted(outputs)]
                        row.kv = target.kv_form() if config.strategy == "fast" else None
                        for pair in kv_quality.completed_pairs(rows, spec.configs, i) if row.kv else ():
                            if not isinstance(prompts[0], tuple):  # the later row of a q8/bf16 pair scores it
                                kv_quality.score_pair(target, *pair, prompts)
            except Cancelled:
                row.status = "cancelled"
                row.wall_s = time.perf_counter() - row_start
            except OutOfMemory as exc:
                row.status, row.error = "oom", str(exc)
            except RedlineError as exc:
                row.status, row.error = "error", str(exc)
            except Exception as exc:  # one broken configuration must not lose the others' results
                if is_oom(exc):
                    row.status, row.error = "oom", f"Out of memory: {exc}"
                else:
                    row.status, row.error = "error", f"{type(exc).__name__}: {exc}"
                free_memory(engine.device)
            done_units = unit_base + per_config
            _compare(rows, spec.baseline)
            kv_quality.compare(rows, spec.configs)
            emit(BenchRow(row))

        if spec.batch_sizes and not cancelled():
            cfg = spec.configs[spec.batch_config if spec.batch_config is not None else spec.baseline]
            report.sweep_config = cfg.label

            def sweep_progress(fraction: float, phase: str) -> None:
                emit(BenchPhase((done_units + fraction * sweep_units) / total_units, None, phase))

            try:
                if cfg.remote:
                    raise UnsupportedConfiguration(
                        f"The batch sweep runs local configurations, not {cfg.label}.",
                        "Choose a local configuration for the sweep.",
                    )
                models.ensure(cfg, lambda f, ph: sweep_progress(0.0, ph))

                def on_sweep_row(srow: SweepRow) -> None:
                    report.sweep.append(srow)
                    emit(BenchSweepRow(srow))

                run_sweep(
                    engine.target,
                    cfg,
                    _render_prompts(engine.target.tokenizer, spec),
                    spec.batch_sizes,
                    spec.new_tokens,
                    spec.warmup,
                    spec.samples,
                    spec.seed,
                    spec.batch_mode,
                    sweep_progress,
                    cancelled,
                    on_sweep_row,
                    spec.fixed_length,
                )
            except RedlineError as exc:
                report.sweep.append(SweepRow(batch_size=0, mode="-", status="error", error=str(exc)))
                emit(BenchSweepRow(report.sweep[-1]))

        if spec.concurrency and not cancelled():
            cfg = spec.configs[spec.batch_config if spec.batch_config is not None else spec.baseline]
            report.concurrency_config = cfg.label

            def concurrency_progress(fraction: float, phase: str) -> None:
                emit(BenchPhase((done_units + fraction * sweep_units) / total_units, None, phase))

            def on_concurrency_row(crow) -> None:
                report.concurrency.append(crow)
                emit(BenchConcurrencyRow(crow))

            try:
                models.ensure(cfg, lambda f, ph: concurrency_progress(0.0, ph))
                run_concurrency(
                    engine.target,
                    _render_prompts(engine.target.tokenizer, spec),
                    spec.concurrency,
                    spec.new_tokens,
                    spec.arrival_gap_s,
                    progress=concurrency_progress,
                    should_cancel=cancelled,
                    on_row=on_concurrency_row,
                )
            except RedlineError as exc:
                on_concurrency_row(ConcurrencyRow(0, "-", status="error", error=str(exc)))
    finally:
        report.cancelled = cancelled()
        engine.limits.kv = models.kv_default
        if restore_model:
            _restore(engine, previous, previous_draft)
    report.seconds = time.perf_counter() - started
    report.machine["cpu_kernels"] = cpu_kernels_state()  # known once a model has loaded
    report.finished_at = _dt.datetime.now().isoformat(timespec="seconds")
    emit(BenchPhase(1.0, None, "cancelled" if report.cancelled else "done"))
    return report


def _current(target) -> Optional[tuple]:
    """What ``_restore`` needs to put ``target`` back: (spec, precision or None, a server's key or None)."""
    return None if target is None else target.reload_spec()


def _restore(engine: Engine, previous, previous_draft) -> None:
    """Put back the model the engine had before the run (best effort: a failure leaves none loaded)."""
    try:
        if previous is None:
            engine.unload()
            return
        spec_text, precision, key = previous
        target = engine.target
        if (
            target is None
            or not target.answers_to(spec_text)
            or (precision is not None and target.precision != precision)
            or target.kv_form() not in (None, engine.limits.kv)
        ):
            engine.load(spec_text, precision, api_key=key)
        if previous_draft is not None:
            dspec, dprec = previous_draft
            if engine.draft is None or engine.draft.source != resolve(dspec) or engine.draft.precision != dprec:
                engine.load_draft(dspec, dprec)
        else:
            engine.unload_draft()
    except RedlineError:
        pass
