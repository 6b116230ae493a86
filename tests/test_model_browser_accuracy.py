"""The model browser's prediction before download against the measurement after, on the starter's variants served
by the stand-in hub (tests/model_browser_accuracy.py; docs/models.md reports a full run): within the estimator's
10 % / 300 MB, and the same as the engine's own prediction once loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.starter
@pytest.mark.slow
def test_prediction_before_download_is_within_the_margin_of_the_measurement(starter_dir, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["REDLINE_DATA_DIR"] = str(tmp_path / "data")  # no learned memory correction: the defaults alone
    proc = subprocess.run(
        [sys.executable, "-m", "tests.model_browser_accuracy", "--precisions", "bf16", "--quants", "Q8_0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    measured = [r for r in rows if "measured_bytes" in r]
    assert {(r["repo"], r["variant"]) for r in measured} == {
        ("starter/SmolLM2-135M", "bf16"),
        ("starter/SmolLM2-135M-GGUF", "Q8_0"),
    }, rows
    for r in measured:
        assert r["within_margin"], r
        # The same estimate as the engine's once loaded, apart from the baseline: the browser's is a fresh process
        # with what a load imports, the engine's is taken inside its load before the architecture's module.
        browser = r["predicted_bytes"] - r["baseline_bytes"]
        engine = r["engine_predicted_bytes"] - r["engine_baseline_bytes"]
        assert abs(browser - engine) <= 0.02 * r["engine_predicted_bytes"], r
        if r["header_bytes_read"]:
            assert r["header_bytes_read"] <= 8_000_000 < r["download_bytes"] or r["download_bytes"] <= 8_000_000
    shapes = [r for r in rows if r["repo"].startswith("shapes/")]
    assert len(shapes) == 3 and all(r["predicted_bytes"] for r in shapes)
