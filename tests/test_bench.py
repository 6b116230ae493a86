"""Speed lab runner: config syntax, prompt sets, real runs on tiny models, errors per row, cancel, exports, CLI."""

import csv
import io
import json
import threading

import pytest

from redline.inference.bench.concurrency import ConcurrencyRow, schedule_ceiling
from redline.inference.bench.configs import parse_config, parse_configs
from redline.inference.bench.export import to_csv, to_json, to_markdown, to_text
from redline.inference.bench.lab import BenchSpec, run_bench
from redline.inference.bench.prompts import assets_dir, builtin_prompt_sets, load_prompt_set, prompt_set_from_dict
from redline.inference.bench.results import BenchRow, BenchToken
from redline.inference.bench.saving import load_report, save_report
from redline.inference.engine import Engine
from redline.inference.errors import UnsupportedConfiguration

ONE_PROMPT = prompt_set_from_dict(
    {
        "name": "one",
        "prompts": [{"id": "fox", "prompt": "The quick brown fox jumps over the lazy dog. The quick brown fox"}],
    }
)
TWO_PROMPTS = prompt_set_from_dict(
    {"name": "two", "prompts": ["Paris is the capital of France.", "def add(a, b):\n    return a + b\n"]}
)


# -- syntax -------------------------------------------------------------------
def test_issue_example_parses():
    configs = parse_configs(
        "naive:fp32,kv:bf16,kv:int8,kv:nf4,speculative:bf16+draft=starter@int8/k=5,prompt-lookup:bf16"
    )
    assert [(c.strategy, c.precision) for c in configs] == [
        ("naive", "fp32"),
        ("kv", "bf16"),
        ("kv", "int8"),
        ("kv", "nf4"),
        ("speculative", "bf16"),
        ("prompt-lookup", "bf16"),
    ]
    spec = configs[4]
    assert (spec.draft, spec.draft_precision, spec.k) == ("starter", "int8", 5)
    assert spec.options().num_draft_tokens == 5
    assert [c.label for c in configs][4] == "speculative:bf16+draft=starter@int8/k=5"


def test_commas_and_slashes_stay_inside_their_configuration():
    configs = parse_configs(
        "kv:nf4+keep=lm_head,model.embed_tokens,static:fp32+compile, "
        "speculative:fp16+draft=HuggingFaceTB/SmolLM2-135M-Instruct/k=3+schedule=heuristic"
    )
    assert len(configs) == 3
    assert configs[0].precision == "nf4+keep=lm_head,model.embed_tokens"
    assert configs[0].precision_spec("cpu").skip_modules == ("lm_head", "model.embed_tokens")
    assert configs[1].compile is True
    assert configs[2].draft == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (configs[2].k, configs[2].schedule, configs[2].draft_precision) == (3, "heuristic", "auto")
    keep, bare = parse_configs("kv:nf4+keep=lm_head,embed_tokens,naive")
    assert keep.precision == "nf4+keep=lm_head,embed_tokens" and (bare.strategy, bare.precision) == ("naive", "auto")
    assert parse_config("kv").precision == "auto"
    assert parse_config("prompt-lookup:fp32+lookup=4").lookup == 4


@pytest.mark.parametrize(
    "text, words",
    [
        ("turbo:fp32", "Unknown strategy"),
        ("kv:fp32,turbo:fp8", "Unknown strategy"),
        ("kv:fp8", "Unknown precision"),
        ("speculative:bf16", "needs a draft"),
        ("speculative:bf16+draft=starter/k=many", "whole number"),
        ("speculative:bf16+draft=starter/k=0", "at least 1"),
        ("kv:bf16+colour=red", "Unknown option"),
        ("", "No configurations"),
    ],
)
def test_bad_configurations_say_what_is_wrong(text, words):
    with pytest.raises(UnsupportedConfiguration, match=words):
        parse_configs(text)


def test_builtin_prompt_sets_and_custom_files(tmp_path):
    assert {"short", "long", "code", "grounded"} <= set(builtin_prompt_sets())
    for name in builtin_prompt_sets():
        s = load_prompt_set(name)
        assert s.prompts and all(m["content"] for p in s.prompts for m in p.messages)
    assert len(load_prompt_set("long").prompts[0].messages[0]["content"]) > 5000  # ≈1.5k tokens
    assert (assets_dir() / "prompts" / "short.json").is_file()
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"prompts": ["hello", {"messages": [{"role": "user", "content": "hi"}]}]}))
    assert [p.messages[-1]["content"] for p in load_prompt_set(str(mine)).prompts] == ["hello", "hi"]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UnsupportedConfiguration, match="not valid JSON"):
        load_prompt_set(str(bad))
    with pytest.raises(UnsupportedConfiguration, match="No prompt set"):
        load_prompt_set("no-such-set")
    with pytest.raises(UnsupportedConfiguration, match="no usable messages"):
        prompt_set_from_dict({"prompts": [{"id": 1}]})


# -- real runs on tiny models ----------------------------------------------------
@pytest.fixture(scope="module")
def ladder(tiny_model_dir, tiny_draft_dir):
    """All five strategies in fp32 (greedy equivalence holds there), one warm-up, two samples."""
    configs = parse_configs(
        f"naive:fp32,kv:fp32,static:fp32,prompt-lookup:fp32+lookup=3,speculative:fp32+draft={tiny_draft_dir}@fp32/k=3"
    )
    spec = BenchSpec(
        model=str(tiny_model_dir), configs=configs, prompts=TWO_PROMPTS, new_tokens=12, warmup=1, samples=2, seed=0
    )
    events = []
    report = run_bench(Engine("cpu"), spec, events.append)
    return report, events


def test_ladder_reports_every_field(ladder):
    report, _ = ladder
    assert [r.status for r in report.results] == ["ok"] * 5, [r.error for r in report.results]
    for r in report.results:
        assert r.samples == 4  # two samples × two prompts
        assert r.ttft_ms > 0 and r.p50_ms > 0 and r.p95_ms >= r.p50_ms
        assert r.tokens_per_s_min <= r.tokens_per_s <= r.tokens_per_s_max
        assert r.peak_memory_bytes > 0 and r.load_s > 0 and r.total_s > 0
        assert len(r.outputs) == 2 and len(r.token_ids) == 2
        assert r.new_tokens == 12 and len(r.per_token_ms_by_position) == 11
    naive, kv, static, lookup, spec = report.results
    assert naive.baseline and naive.speedup == pytest.approx(1.0) and naive.matches_baseline is True
    assert kv.reused_model and static.reused_model and not naive.reused_model and not spec.reused_model
    for r in (naive, kv, static):
        assert r.acceptance_rate is None and r.mean_accepted_length is None
    for r in (lookup, spec):
        assert r.acceptance_rate is not None and 0 <= r.acceptance_rate <= 1
    assert spec.speedup == pytest.approx(spec.tokens_per_s / naive.tokens_per_s)


def test_greedy_fp32_outputs_match_the_baseline(ladder):
    report, _ = ladder
    base = report.results[0]
    for r in report.results[1:]:
        assert r.token_ids == base.token_ids, r.config
        assert r.matches_baseline is True and r.diverges_at is None


def test_streamed_text_is_the_shown_output(ladder):
    report, events = ladder
    for r in report.results:
        streamed = "".join(e.text for e in events if isinstance(e, BenchToken) and e.index == r.index)
        assert streamed == r.outputs[0]
    assert [e.result.index for e in events if isinstance(e, BenchRow)] == [0, 1, 2, 3, 4]


def test_exports(ladder, tmp_path):
    report, _ = ladder
    data = json.loads(to_json(report))
    assert {"cpu", "gpus", "ram_total_bytes", "versions"} <= set(data["machine"])
    assert {"torch", "transformers", "bitsandbytes"} <= set(data["machine"]["versions"])
    for rec in data["results"]:
        assert {
            "config",
            "ttft_ms",
            "p50_ms",
            "p95_ms",
            "tokens_per_s",
            "peak_memory_bytes",
            "acceptance_rate",
            "speedup",
            "matches_baseline",
        } <= set(rec)
    assert data["results"][1]["acceptance_rate"] is None and data["results"][4]["acceptance_rate"] is not None
    rows = list(csv.DictReader(io.StringIO(to_csv(report))))
    assert [r["config"] for r in rows] == [r.config for r in report.results]
    assert float(rows[1]["tokens_per_s"]) == pytest.approx(report.results[1].tokens_per_s)
    md = to_markdown(report, "redline bench --model tiny")
    assert "| config | TTFT p50 ms |" in md and "redline bench --model tiny" in md and "transformers" in md
    assert md.count("\n| ") == 1 + 5
    assert "speculative:fp32" in to_text(report)
    again = load_report(save_report(report, tmp_path))
    assert [r.to_dict() for r in again.results] == [r.to_dict() for r in report.results]


def test_oom_and_errors_are_rows_and_the_run_goes_on(tiny_model_dir, monkeypatch):
    import torch
    from transformers import LlamaForCausalLM

    original = LlamaForCausalLM.generate

    def generate(self, *args, **kwargs):  # bf16 stands in for a configuration that does not fit
        if self.dtype == torch.bfloat16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LlamaForCausalLM, "generate", generate)
    configs = parse_configs("kv:fp32,kv:bf16,speculative:fp32+draft=/no/such/draft/k=2,naive:fp32")
    spec = BenchSpec(model=str(tiny_model_dir), configs=configs, prompts=ONE_PROMPT, new_tokens=6, warmup=0, samples=1)
    report = run_bench(Engine("cpu"), spec)
    kv, bf16, spec_row, naive = report.results
    assert kv.status == "ok" and naive.status == "ok"
    assert bf16.status == "oom" and "Out of memory" in bf16.error and bf16.tokens_per_s is None
    assert spec_row.status == "error" and "no/such/draft" in spec_row.error
    assert naive.matches_baseline is True and bf16.matches_baseline is None


def test_cancel_keeps_finished_rows(tiny_model_dir):
    engine = Engine("cpu")
    cancel = threading.Event()

    def progress(ev):
        if isinstance(ev, BenchRow) and ev.result.index == 0:
            cancel.set()  # what the panel's Cancel does: the run's own cancel handle

    configs = parse_configs("kv:fp32,naive:fp32,static:fp32")
    spec = BenchSpec(model=str(tiny_model_dir), configs=configs, prompts=ONE_PROMPT, new_tokens=6, warmup=0, samples=1)
    report = run_bench(engine, spec, progress, cancel.is_set)
    assert report.cancelled
    assert [r.status for r in report.results] == ["ok", "cancelled", "cancelled"]
    assert report.results[0].tokens_per_s is not None


@pytest.mark.parametrize("mode", ["padded", "transformers"])
def test_batch_sweep(tiny_model_dir, mode):
    spec = BenchSpec(
        model=str(tiny_model_dir),
        configs=parse_configs("kv:fp32"),
        prompts=TWO_PROMPTS,
        new_tokens=8,
        warmup=0,
        samples=1,
        batch_sizes=[1, 3],
        batch_mode=mode,
    )
    report = run_bench(Engine("cpu"), spec)
    assert report.sweep_config == "kv:fp32"
    assert [(s.batch_size, s.mode, s.status) for s in report.sweep] == [(1, mode, "ok"), (3, mode, "ok")]
    for s in report.sweep:
        assert s.throughput_tokens_per_s > 0 and s.latency_ms_p50 > 0 and s.peak_memory_bytes > 0
        assert 0 < s.new_tokens <= 8 * s.batch_size


def test_batch_sweep_refuses_speculative(tiny_model_dir):
    spec = BenchSpec(
        model=str(tiny_model_dir),
        configs=parse_configs("prompt-lookup:fp32"),
        prompts=ONE_PROMPT,
        new_tokens=4,
        warmup=0,
        samples=1,
        batch_sizes=[2],
    )
    report = run_bench(Engine("cpu"), spec)
    assert report.sweep[0].status == "error" and "one sequence at a time" in report.sweep[0].error


def test_cli_bench_json(tiny_model_dir, capsys):
    from redline.app.cli import main

    rc = main(
        [
            "bench",
            "--model",
            str(tiny_model_dir),
            "--configs",
            "naive:fp32,kv:fp32",
            "--baseline",
            "kv:fp32",
            "--new-tokens",
            "6",
            "--warmup",
            "0",
            "--samples",
            "1",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out)
    assert [r["config"] for r in data["results"]] == ["naive:fp32", "kv:fp32"]
    assert data["results"][1]["speedup"] == pytest.approx(1.0) and data["results"][0]["matches_baseline"] is True
    assert data["machine"]["versions"]["transformers"]


def test_cli_bench_bad_input_is_a_clear_error(capsys):
    from redline.app.cli import main

    assert main(["bench", "--configs", "kv:fp32", "--baseline", "3"]) == 2
    assert "there are 1 configurations" in capsys.readouterr().err


@pytest.mark.starter
def test_starter_kv_matches_naive(starter_dir):
    spec = BenchSpec(
        model="starter",
        configs=parse_configs("naive:fp32,kv:fp32"),
        prompts=ONE_PROMPT,
        new_tokens=24,
        warmup=0,
        samples=1,
    )
    report = run_bench(Engine("cpu"), spec)
    naive, kv = report.results
    assert naive.status == kv.status == "ok"
    assert kv.matches_baseline is True and naive.outputs[0].strip()


def test_rows_report_bytes_per_token_and_roofline(tiny_model_dir):
    from redline.inference.bench.configs import parse_configs
    from redline.inference.bench.lab import BenchSpec, run_bench
    from redline.inference.bench.prompts import load_prompt_set
    from redline.inference.engine import Engine

    prompts = load_prompt_set("short")
    prompts.prompts = prompts.prompts[:1]
    spec = BenchSpec(
        model=str(tiny_model_dir),
        configs=parse_configs("kv:fp32,fast:fp32"),
        prompts=prompts,
        new_tokens=8,
        warmup=0,
        samples=1,
    )
    report = run_bench(Engine(device="cpu"), spec)
    for row in report.results:
        assert row.status == "ok", row.error
        assert row.bytes_per_token > 0 and row.bandwidth_bytes_per_s > 0
        assert 0 < row.roofline_pct
    assert report.results[1].matches_baseline  # fast gives kv's tokens


def test_concurrency_sweep_rows_for_each_level_and_mode(tiny_model_dir):
    """Requests arriving apart, decoded together, one at a time, and by transformers' continuous batching: each
    level × mode is a row with per-request TTFT and latency, total throughput and the KV cache's overhead."""
    spec = BenchSpec(
        model=str(tiny_model_dir),
        configs=parse_configs("fast:fp32"),
        prompts=TWO_PROMPTS,
        new_tokens=6,
        warmup=0,
        samples=1,
        concurrency=[1, 3],
        arrival_gap_s=0.05,
    )
    report = run_bench(Engine("cpu"), spec)
    rows = {(c.concurrency, c.mode): c for c in report.concurrency}
    assert set(rows) == {(n, m) for n in (1, 3) for m in ("continuous", "one-at-a-time", "transformers")}
    for c in rows.values():
        assert c.status == "ok", c.error
        assert c.throughput_tokens_per_s > 0 and len(c.ttft_ms) == c.concurrency and c.latency_ms_p95 > 0
    assert rows[(3, "continuous")].kv_overhead is not None
    assert schedule_ceiling(rows[(3, "one-at-a-time")]) >= 1 - 1e-6  # one at a time ends no earlier than its floor
    markdown = to_markdown(report)
    assert "Concurrency sweep" in markdown and "batching gains at most" in markdown
    assert json.loads(to_json(report))["concurrency"]


def test_the_arrivals_ceiling_bounds_what_batching_can_gain():
    """One at a time, four requests 0.5 s apart taking 2 s each end at 2, 4, 6, 8 s; no schedule ends the last
    before 1.5 + 2 s, so batching can gain at most 8 / 3.5. Requests shorter than the gap leave nothing to gain."""

    busy = ConcurrencyRow(4, "one-at-a-time", arrival_gap_s=0.5, latency_ms=[2000, 3500, 5000, 6500], wall_s=8.0)
    assert schedule_ceiling(busy) == pytest.approx(8 / 3.5)
    idle = ConcurrencyRow(4, "one-at-a-time", arrival_gap_s=0.5, latency_ms=[200] * 4, wall_s=1.7)
    assert schedule_ceiling(idle) == pytest.approx(1.0)
    assert schedule_ceiling(ConcurrencyRow(4, "one-at-a-time", status="error")) is None
