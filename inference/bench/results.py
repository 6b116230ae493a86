"""What a speed-lab run produces: one result per configuration, the batch sweep's rows, the report, and
the events the speed lab sends while it runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Union

from .concurrency import ConcurrencyRow


@dataclass
class ConfigResult:
    """One configuration's measurements, aggregated over its samples."""

    index: int
    config: str
    strategy: str
    precision: str = ""
    status: str = "pending"  # ok | error | oom | cancelled | skipped
    error: Optional[str] = None
    baseline: bool = False
    samples: int = 0
    prompt_tokens: Optional[float] = None  # median over samples
    new_tokens: Optional[float] = None
    ttft_ms: Optional[float] = None  # p50 over samples
    p50_ms: Optional[float] = None  # per-token latency over all measured tokens
    p95_ms: Optional[float] = None
    tokens_per_s: Optional[float] = None  # decode tokens/s, median over samples
    tokens_per_s_min: Optional[float] = None
    tokens_per_s_max: Optional[float] = None
    tokens_per_s_stdev: Optional[float] = None
    total_s: Optional[float] = None  # one generation, median
    wall_s: Optional[float] = None  # the whole row: loads, warm-up and samples
    load_s: Optional[float] = None  # target (+ draft) load time, from LoadedModel.load_seconds
    reused_model: bool = False  # the model was already loaded for an earlier row
    peak_memory_bytes: Optional[int] = None  # max over samples: device reserved on CUDA, RSS on CPU
    model_memory_bytes: Optional[int] = None
    acceptance_rate: Optional[float] = None
    mean_accepted_length: Optional[float] = None
    speedup: Optional[float] = None  # decode tokens/s ÷ the baseline's
    matches_baseline: Optional[bool] = None
    diverges_at: Optional[int] = None  # first new-token index that differs from the baseline
    bytes_per_token: Optional[int] = None  # weights + KV cache one decode step reads (bandwidth.py)
    bandwidth_bytes_per_s: Optional[float] = None  # measured once on this machine, cached
    roofline_pct: Optional[float] = None  # decode tokens/s × bytes per token ÷ bandwidth
    # The speed model's prediction for this row (inference/speed), made before its measurement fed this
    # machine's speed correction; the error is (predicted − measured) ÷ measured.
    predicted_tokens_per_s: Optional[float] = None
    predicted_ttft_ms: Optional[float] = None
    prediction_error_pct: Optional[float] = None
    prediction_calibration: Optional[str] = None  # "class", "device" (other configurations measured) or "none"
    # A reasoning model's row (docs/speed-lab.md#reasoning-models): its thinking ("on", "off", "default"), the format
    # its replies were split by, the time to the first answer token (p50 over the samples that reached their answer,
    # and how many did), the thinking tokens (median), the thinking's and the answer's own tokens/s (medians), and
    # the speed model's time to first answer (None: no thinking length learned yet for this model).
    thinking: Optional[str] = None
    reasoning_format: Optional[str] = None
    ttfat_ms: Optional[float] = None
    answered: Optional[int] = None
    thinking_tokens: Optional[float] = None
    thinking_tokens_per_s: Optional[float] = None
    answer_tokens_per_s: Optional[float] = None
    predicted_ttfat_ms: Optional[float] = None
    # The fast path's KV form for a row that ran it ("bf16", "q8"; None for other strategies), and for a q8 row
    # beside the same row in bf16 (``bench/kv_quality.py``): that row's label, the share of its output's tokens
    # this row's holds at the same positions, the first that differs (None: identical), the tokens compared, and the
    # perplexity of that row's replies under q8 KV against bf16 KV (ppl_q8 ÷ ppl_bf16 − 1).
    kv: Optional[str] = None
    kv_reference: Optional[str] = None
    kv_agreement: Optional[float] = None
    kv_first_diff: Optional[int] = None
    kv_compared_tokens: Optional[int] = None
    kv_ppl_change: Optional[float] = None
    kv_forced_agreement: Optional[float] = None  # that row's replies teacher-forced: q8's greedy token is theirs
    per_token_ms_by_position: list[float] = field(default_factory=list)  # median over samples
    outputs: list[str] = field(default_factory=list)  # per prompt, the first measured sample
    token_ids: list[list[int]] = field(default_factory=list)
    device: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SweepRow:
    batch_size: int
    mode: str  # "transformers" (its continuous batching, generate_batch) or "padded" (batched generate, left padding)
    status: str = "ok"
    error: Optional[str] = None
    samples: int = 0
    latency_ms_p50: Optional[float] = None  # per request, start of the batch to its last token
    latency_ms_p95: Optional[float] = None
    ttft_ms_p50: Optional[float] = None  # continuous mode only (per-token timestamps)
    throughput_tokens_per_s: Optional[float] = None  # all new tokens ÷ batch wall time, median
    new_tokens: Optional[int] = None  # per batch
    wall_s: Optional[float] = None  # one batch, median
    peak_memory_bytes: Optional[int] = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class BenchReport:
    spec: dict
    machine: dict
    model: str
    device: str
    started_at: str
    results: list[ConfigResult] = field(default_factory=list)
    sweep: list[SweepRow] = field(default_factory=list)
    sweep_config: Optional[str] = None
    concurrency: list = field(default_factory=list)  # bench.concurrency.ConcurrencyRow
    concurrency_config: Optional[str] = None
    finished_at: Optional[str] = None
    cancelled: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "device": self.device,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "seconds": self.seconds,
            "cancelled": self.cancelled,
            "machine": self.machine,
            "spec": self.spec,
            "results": [r.to_dict() for r in self.results],
            "sweep_config": self.sweep_config,
            "sweep": [s.to_dict() for s in self.sweep],
            "concurrency_config": self.concurrency_config,
            "concurrency": [c.to_dict() for c in self.concurrency],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "BenchReport":
        rep = cls(
            spec=d.get("spec", {}),
            machine=d.get("machine", {}),
            model=d.get("model", ""),
            device=d.get("device", ""),
            started_at=d.get("started_at", ""),
            finished_at=d.get("finished_at"),
            cancelled=bool(d.get("cancelled")),
            seconds=float(d.get("seconds") or 0.0),
            sweep_config=d.get("sweep_config"),
            concurrency_config=d.get("concurrency_config"),
        )
        known = ConfigResult.__dataclass_fields__
        rep.results = [ConfigResult(**{k: v for k, v in r.items() if k in known}) for r in d.get("results", [])]
        known_s = SweepRow.__dataclass_fields__
        rep.sweep = [SweepRow(**{k: v for k, v in s.items() if k in known_s}) for s in d.get("sweep", [])]

        known_c = ConcurrencyRow.__dataclass_fields__
        rep.concurrency = [
            ConcurrencyRow(**{k: v for k, v in c.items() if k in known_c}) for c in d.get("concurrency", [])
        ]
        return rep


# -- what the runner reports while it runs -------------------------------------
@dataclass
class BenchStarted:
    configs: list[str]
    baseline: int


@dataclass
class BenchPhase:
    fraction: float  # of the whole run, 0..1
    index: Optional[int]  # configuration index, None for the sweep
    phase: str


@dataclass
class BenchToken:
    """Output text of a configuration as it streams (its first measured sample, first prompt)."""

    index: int
    text: str
    time_s: Optional[float] = None  # seconds since that generation started


@dataclass
class BenchLive:
    """The live speed of the generation running now (every warm-up and sample), about twice a second."""

    index: int
    tokens_per_s_1s: float  # rolling over the last second
    ttft_ms: Optional[float]
    new_tokens: int


@dataclass
class BenchRow:
    result: ConfigResult


@dataclass
class BenchConcurrencyRow:
    row: object  # bench.concurrency.ConcurrencyRow


@dataclass
class BenchSweepRow:
    row: SweepRow


BenchEvent = Union[BenchStarted, BenchPhase, BenchToken, BenchLive, BenchRow, BenchSweepRow, BenchConcurrencyRow]
ProgressCallback = Callable[[BenchEvent], None]
