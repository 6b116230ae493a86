"""Load a model (e.g. a .gguf, converted once into the cache) in this fresh process and print its memory as JSON.

    python tools/accuracy/gguf_load_memory.py FILE.gguf auto|bf16|gguf|q8|q4

model_tensor_bytes: its parameters plus each PackedLinear.weight_bytes; load_rss_growth and load_peak_rss:
LoadedModel.memory_bytes and .peak_memory_bytes (RSS on CPU); predicted_*: the estimator at 512 tokens.
"""

import json
import sys
import time

from redline.inference.engine import Engine
from redline.inference.estimate.estimator import estimate
from redline.inference.estimate.model_shapes import read_shape
from redline.inference.loading.weight_only import PackedLinear
from redline.inference.memory.measured import process_rss
from redline.inference.precision import resolve_precision

spec, prec = sys.argv[1], sys.argv[2]
eng = Engine(device="cpu")
eng.record_memory = False
before = process_rss()
t = time.perf_counter()
lm = eng.load(spec, resolve_precision(prec, "cpu"))
secs = time.perf_counter() - t
m = lm.model
held = sum(p.numel() * p.element_size() for p in m.parameters()) + sum(
    x.weight_bytes for x in m.modules() if isinstance(x, PackedLinear)
)
shape = read_shape(spec)
e = estimate(shape, lm.precision, 512)
print(
    json.dumps(
        {
            "spec": spec.rsplit("/", 1)[-1],
            "precision": lm.precision.label(),
            "load_s": round(secs, 1),
            "model_tensor_bytes": held,
            "rss_before": before,
            "rss_after_load": process_rss(),
            "load_rss_growth": lm.memory_bytes,
            "load_peak_rss": lm.peak_memory_bytes,
            "predicted_weights": e.weights_bytes,
            "predicted_total_512": e.total_bytes,
            "file_bytes": shape.file_bytes,
        }
    )
)
