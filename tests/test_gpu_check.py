"""``make gpu-check`` (tools/benchmarks/gpu_check/) on the CPU: every section runs its code with a tiny model
(``--dry-run``), so the script cannot rot between the rare sessions that have a GPU; the report is whole after
every cell (a run killed at its limit keeps what it measured); a budget too small cuts sections and says which
and why; and the parts a GPU run's truth rests on (deadlines inside loops, the CUDA-graph skip counter, the count
of steps the graph really ran, the projection's arithmetic) are checked directly."""

import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "benchmarks" / "gpu_check"
sys.path.insert(0, str(SCRIPT.parent))

from gpu_check.measure import GraphWatch, counting_graph_steps  # noqa: E402 - tools/ is not a package
from gpu_check.report import Clock, Cut, Report, Section  # noqa: E402


def run_check(out: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def statuses(data: dict) -> list[str]:
    return [c["status"] for s in data["sections"] for c in s["cells"]]


@pytest.mark.slow
def test_dry_run_runs_every_section_and_reports_it(tmp_path):
    out = run_check(tmp_path)
    data = json.loads((tmp_path / "gpu-check.json").read_text())
    assert out.returncode in (0, 1), out.stdout[-3000:] + out.stderr[-3000:]  # 1: a cell failed (it says which)
    assert data["state"] == "complete"
    # No section or cell crashed (a failure of what is measured reads "fail: ..." and is the report's to show).
    assert [s["status"] for s in data["sections"] if s["status"].startswith(("error", "not started", "cut"))] == []
    assert [s for s in statuses(data) if s.startswith("error")] == []
    assert all(s["cells"] for s in data["sections"]), [s["key"] for s in data["sections"] if not s["cells"]]
    cells = {c["name"]: c for s in data["sections"] for c in s["cells"]}
    # Section 1: eager and graphed in both precisions, at both positions, with the figures a projection needs.
    for name in ("bf16 eager @64", "bf16 eager @320", "q4 eager @64", "bf16 graphed @64", "q4 graphed @320"):
        assert name in cells
    eager = cells["bf16 eager @64"]
    assert eager["status"] == "ok" and eager["tokens_per_s"] > 0 and eager["kernel_ms"] > 0
    assert eager["bytes_per_step"] > 0
    # The CUDA-graph skip counter is read for every graphed cell; on the CPU there is nothing to read.
    assert cells["bf16 graphed @64"]["cudagraph_skips"] == "n/a: no CUDA"
    assert "graphed" in cells["bf16 graphed @64"]  # how many steps the compiled step really ran
    assert {"bf16 eager, batch 1", "bf16 eager, batch 8", "bf16 graphed, batch 2"} <= set(cells)
    turn2 = next(c for n, c in cells.items() if n.startswith("bf16 turn 2"))
    assert turn2["cached_tokens"] > 0 and turn2["ttft_ms"] > 0
    assert cells["fast bf16 eager"]["max_rel_err"] < 0.05  # bf16 rounding, against fp32 on the same weights
    assert cells["transformers generate, dynamic cache (kv)"]["status"] == "ok"
    assert cells["bf16 under a 8 GB cap"]["measured_gb"] == "n/a: no CUDA"
    assert cells["bf16 under a 8 GB cap"]["predicted_gb"] > 0
    assert cells["fp32 kv"]["status"] == "ok"
    table = (tmp_path / "gpu-check.md").read_text()
    for n in range(1, 9):
        assert f"\n## {n}. " in table
    assert (tmp_path / "gpu-check.log").is_file()
    # the plan: what the fake-CUDA tests cannot reach, so only a GPU run checks
    assert "## What only this run checks" in table and "fast-batched in fp32, fp16, bf16, q8, q4" in table
    assert "- **cuda-graphs**:" in table and "- **seeded-sampling**:" in table


@pytest.mark.slow
def test_a_small_budget_cuts_sections_and_says_which_and_why(tmp_path):
    out = run_check(tmp_path, "--budget", "2")
    assert out.returncode in (0, 1), out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "gpu-check.json").read_text())
    sections = data["sections"]
    assert sections[0]["status"].startswith("cut"), sections[0]["status"]
    assert "ran out" in sections[0]["status"]
    cut_cell = next(c for c in sections[0]["cells"] if c["status"].startswith("cut"))
    assert "ran out while starting" in cut_cell["status"] or "ran out while" in cut_cell["status"]
    skipped = [s for s in sections if s["status"].startswith("skipped: the run's budget (2 s) was spent")]
    assert skipped and skipped[-1]["key"] == "matrix"
    table = (tmp_path / "gpu-check.md").read_text()
    assert "Status: skipped: the run's budget (2 s) was spent before it started" in table
    assert "Status: cut" in table


@pytest.mark.slow
def test_the_report_is_whole_after_every_cell(tmp_path):
    """Killed right after its second cell (os._exit, as SIGKILL would: no clean-up runs), the run leaves both
    files with those two cells and the section it was in."""
    out = run_check(tmp_path, "--exit-after-cells", "2")
    assert out.returncode == 3, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "gpu-check.json").read_text())
    assert data["cells_written"] == 2
    assert [c["name"] for c in data["sections"][0]["cells"]] == ["bf16 build on the device", "bf16 eager @64"]
    assert data["state"] == "running section 1 (batch1)"
    table = (tmp_path / "gpu-check.md").read_text()
    assert "| bf16 eager @64 | ok |" in table and "Status: running" in table


def a_section(tmp_path, seconds: float) -> tuple[Section, Report]:
    sec = Section(1, "batch1", "a section", 1.0, ())
    report = Report(tmp_path, {}, [sec], lambda: [])
    clock = Clock(seconds)
    report.clock = clock
    sec.open(clock, clock.end)
    return sec, report


def test_a_deadline_is_checked_inside_a_cell_and_the_cell_says_so(tmp_path, monkeypatch):
    import time as real_time

    from gpu_check import context

    sec, rep = a_section(tmp_path, 0.05)
    monkeypatch.setattr(rep, "write", lambda: None)
    ctx = SimpleNamespace(report=rep, note_background=lambda row: None)
    steps = []

    def loop():
        for i in range(1000):
            steps.append(i)
            real_time.sleep(0.01)
            sec.check(f"step {i}")

    with pytest.raises(Cut, match=r"the run's budget \(0 s\) ran out while step \d+"):
        context.run_cell(ctx, sec, "a long cell", loop)
    assert 1 <= len(steps) < 100  # stopped inside the loop, not after it
    assert sec.cells[0]["status"].startswith("cut: the run's budget")


def test_cudagraph_skips_are_read_and_fail_a_graphed_cell(tmp_path):
    from torch._dynamo.utils import counters

    assert GraphWatch(False).reading() == {"cudagraph_skips": "n/a: no CUDA"}
    assert GraphWatch(False).verdict() is None
    watch = GraphWatch(True)  # the counter and the logger only: no device needed to read them
    try:
        assert watch.skips() == 0 and watch.verdict() is None
        # What torch/_inductor/cudagraph_utils.py does when it skips: log the reason, bump the counter.
        logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs").warning(
            "skipping cudagraphs due to mutated inputs (2 instances)"
        )
        counters["inductor"]["cudagraph_skips"] += 1
        assert watch.skips() == 1
        assert watch.verdict() == (
            "fail: cudagraph_skips = 1, the compiled step ran without CUDA graphs "
            "(skipping cudagraphs due to mutated inputs (2 instances))"
        )
        assert watch.reading()["skip_reasons"] == ["skipping cudagraphs due to mutated inputs (2 instances)"]
    finally:
        watch.close()
        counters["inductor"]["cudagraph_skips"] -= 1


def test_steps_the_graph_handed_back_are_counted():
    class Compiled:
        def __init__(self):
            self.calls = 0

        def run(self, tokens, positions, seqs):
            self.calls += 1
            return None if self.calls == 2 else "logits"

    dec = SimpleNamespace(compiled=Compiled())
    with counting_graph_steps(dec) as counts:
        for _ in range(3):
            dec.compiled.run(None, [0], [0])
    assert counts == {"graphed": 2, "fell_back": 1}
    assert "run" not in vars(dec.compiled)  # the method is the class's again


def test_projection_scales_kernel_time_by_bandwidth():
    from gpu_check.project import here_gb_s, project

    from redline.inference.hardware.gpus import find_gpu

    assert here_gb_s("NVIDIA H100 80GB HBM3", None)[0] == 3350
    assert here_gb_s("NVIDIA H100 PCIe", None)[0] == 2039
    assert here_gb_s("NVIDIA H200", 4.1e12)[0] == 4800
    assert here_gb_s("Some Card", 1.5e12)[0] == 1500  # unknown: the bandwidth measured here
    card = find_gpu("RTX 4090 24GB")
    p = project({"wall_ms": 10.0, "kernel_ms": 8.0, "bytes_per_step": 16e9}, 3350.0, card)
    # 8 ms × 3350 / 1008 = 26.59 ms of kernels, + 2 ms outside them = 28.59 ms a step
    assert p["tokens_per_s"] == pytest.approx(1000 / (8 * 3350 / 1008 + 2), rel=1e-6)
    assert "26.59 ms" in p["text"] and "+ 2.00 ms" in p["text"] and "→ 35.0 tok/s" in p["text"]
