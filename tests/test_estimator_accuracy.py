"""The estimator against measurement: the starter on CPU, one fresh process per precision.

Each subprocess loads the starter, generates a short reply, and reports the
engine's prediction (made for the tokens it used) beside the peak RSS it
measured over the load and the generation. The accuracy target: within 10 %
or 300 MB, whichever is larger.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_probe(precision: str, data_dir: Path) -> dict:
    env = dict(
        os.environ, REDLINE_DATA_DIR=str(data_dir), PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.memory_probe", "starter", precision, "4"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.starter
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "int8", "nf4"])
def test_prediction_within_target_of_measured_rss(precision, starter_dir, tmp_path):
    from redline.inference.estimate.estimator import accuracy_margin

    r = run_probe(precision, tmp_path)  # a fresh data dir: no learned correction, the defaults alone
    assert r["finish_reason"] in ("length", "eos"), r
    assert r["new_tokens"] > 0
    predicted, measured = r["predicted_bytes"], r["measured_bytes"]
    assert measured >= max(r["load_peak_bytes"], r["generation_peak_bytes"])
    print(
        f"{precision}: predicted {predicted / 1e6:.0f} MB, measured {measured / 1e6:.0f} MB ({r['error_pct']:+.1f} %)"
    )
    assert abs(predicted - measured) <= accuracy_margin(measured), r


@pytest.mark.starter
@pytest.mark.slow
def test_cli_estimate_starter_offline(starter_dir, tmp_path):
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        REDLINE_DATA_DIR=str(tmp_path),
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "redline", "estimate", "starter", "--precision", "all", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["parameters"] == 134_515_008 and data["context"] == 8192
    by = {e["precision"]: e for e in data["estimates"]}
    assert by["bf16"]["weights_bytes"] == 2 * 134_515_008
    assert by["nf4"]["weights_bytes"] < by["int8"]["weights_bytes"] < by["bf16"]["weights_bytes"]
    assert data["suggestion"]["precision"] in ("bf16", "int8", "nf4") or data["suggestion"]["change"]
