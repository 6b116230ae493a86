"""``make gpu-check``'s script runs its whole path on the CPU (--dry-run), so it cannot rot between GPU sessions."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run_writes_its_table(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = (tmp_path / "gpu-check.md").read_text()
    assert "| starter-shaped | fp32 | kv | ok |" in table
    assert "| starter-shaped | q4 | fast | ok |" in table
    assert "skipped: CUDA graphs need a GPU" in table
    assert (tmp_path / "gpu-check.json").is_file() and (tmp_path / "gpu-check.log").is_file()
    # the plan: what the fake-CUDA tests cannot reach, so only a GPU run checks
    assert "## What only this run checks" in table and "fast-batched in fp32, fp16, bf16, q8, q4" in table
    assert "- **cuda-graphs**:" in table and "- **seeded-sampling**:" in table
