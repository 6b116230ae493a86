"""Convert one GGUF in a fresh process and report its memory as JSON (tests/test_gguf.py; docs/models.md).

    python tests/convert_probe.py FILE.gguf OUT_FOLDER [keep|dequantise] [OTHER_GGUF_PY]

``OTHER_GGUF_PY``: convert with that copy of ``inference/sources/gguf.py`` instead (its ``convert_gguf(path,
dest, progress)``), e.g. the old whole-model converter: ``git show 086b0c1:inference/sources/gguf.py > old.py``.

- ``runtime_rss``: resident memory once torch, transformers and gguf are imported (before anything is read);
- ``tensor_phase_baseline_rss``: resident memory when the tensor phase starts (metadata and tokenizer done);
  the kernel's peak counter (VmHWM, which ru_maxrss also reads) is reset there (``/proc/self/clear_refs``), so
- ``tensor_phase_peak_rss`` is the peak over the tensor phase alone, ``metadata_phase_peak_rss`` the peak
  before it, and ``peak_rss`` the larger of the two: the peak of the whole process;
- ``largest_tensor_f32_bytes``: the largest tensor as float32 (what ``gguf.quants.dequantize`` returns).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path


def status(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) * 1024


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    keep = (sys.argv[3] if len(sys.argv) > 3 else "keep") == "keep"
    started = time.perf_counter()
    import gguf
    import torch  # noqa: F401
    import transformers  # noqa: F401

    if len(sys.argv) > 4:
        import importlib.util

        spec = importlib.util.spec_from_file_location("other_gguf", sys.argv[4])
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)

        def convert_gguf(src, out, progress, keep_quantised):
            return other.convert_gguf(src, out, progress)
    else:
        from redline.inference.sources.gguf import convert_gguf

    runtime = status("VmRSS")
    marks: dict = {}

    def progress(fraction: float, phase: str) -> None:
        if phase.startswith("Converting GGUF") and "tensor_phase_baseline_rss" not in marks:
            marks["tensor_phase_baseline_rss"] = status("VmRSS")
            marks["metadata_phase_peak_rss"] = status("VmHWM")
            marks["metadata_seconds"] = time.perf_counter() - t0
            try:
                Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
                marks["hwm_reset"] = True
            except OSError:
                marks["hwm_reset"] = False

    reader = gguf.GGUFReader(str(src))
    largest = max(int(t.n_elements) for t in reader.tensors) * 4
    del reader
    t0 = time.perf_counter()
    convert_gguf(src, out, progress, keep_quantised=keep)
    seconds = time.perf_counter() - t0
    tensor_peak = status("VmHWM")
    weights = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(
        json.dumps(
            {
                "runtime_rss": runtime,
                "tensor_phase_peak_rss": tensor_peak,
                "peak_rss": max(tensor_peak, marks.get("metadata_phase_peak_rss", 0)),
                "largest_tensor_f32_bytes": largest,
                "convert_seconds": round(seconds, 2),
                "process_seconds": round(time.perf_counter() - started, 2),
                "folder_bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file()),
                "weights_bytes": weights,
                **marks,
            }
        )
    )


if __name__ == "__main__":
    main()
