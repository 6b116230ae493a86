"""``make gpu-check``: what a lent GPU can tell in one short window, most valuable first, written as it goes.

    python tools/benchmarks/gpu_check [--out DIR] [--budget 480] [--dry-run]

Sections, in order of value, each with its own deadline (a share of ``--budget``, checked inside its loops, not
only between cells; time a section leaves unused passes to the next):

1. an 8B-shaped model (Llama-3-8B's config, random weights built on the device) in bf16 and q4 at batch 1, the
   eager fast step against the graphed one (``decoding/compiled.py``, CUDA graphs), ``cudagraph_skips == 0``
   asserted, tokens/s at positions 64 and 4,096, kernel time and bytes per step, projected to an RTX 4090 and
   an RTX 4070 by memory bandwidth;
2. continuous batching at 1, 2, 4 and 8 sequences (the engine's ``Batcher``);
3. a 2,048-token prompt's time to first token, and the next turn's through the prefix cache;
4. teacher-forced logits against an fp32 reference (max absolute and relative error over fixed tokens);
5. transformers' own paths in the same run: dynamic-cache ``generate``, static cache + ``torch.compile``,
   ``generate_batch`` (continuous batching, paged attention);
6. a reply streaming while the graphs are captured: its longest gap between tokens;
7. memory predicted against measured under 24, 12 and 8 GB caps (``set_per_process_memory_fraction``), and
   what a load past the cap is told;
8. the starter-shaped precision × strategy matrix (bitsandbytes, speculative, static), only if time remains.

The report (``gpu-check.json``, ``gpu-check.md``) is rewritten after every cell, so a run killed at its limit
still brings back everything measured until then, with the section it was in. ``--dry-run`` runs every section
on the CPU with a tiny model (the GPU's branch of the fast path: ``REDLINE_NATIVE_KERNELS=0``); ``make test``
runs it (tests/test_gpu_check.py). On the lent machine (docs/performance.md, "The GPU check")::

    python3 -m pip install --no-index --no-deps wheels/*.whl && python3 tools/benchmarks/gpu_check --out $OUT

This module imports nothing heavy: tests/test_fake_cuda.py reads the two lists below.
"""

from __future__ import annotations

# What `make test` checks of the CUDA path without a GPU (tests/test_fake_cuda.py, under torch's fake tensors on a
# fake cuda device: every tensor of the weights, KV cache and sampling on the device, every operator's tensors on
# one device): a path and the precisions it runs in there. The compiled step's eager fallback is the eager decode
# step (decode_graph), run in every precision by the other two rows; its row checks CompiledStep's switching.
FAKE_CUDA_COVERED = {
    "fast-eager": ("fp32", "fp16", "bf16", "q8", "q4"),  # FastDecoder: a prefill, a second chunk, decode steps
    "fast-batched": ("fp32", "fp16", "bf16", "q8", "q4"),  # the Batcher: 3 sequences, penalties, sampling, prefix
    "fast-compiled-fallback": ("bf16",),  # compiling (not ready yet), then ready but needing a recompile
}

# What fake tensors cannot reach, so only this script on a GPU checks it: each path, why, and where in the report.
PLAN = (
    {
        "path": "cuda-graphs",
        "why": "compiling the fast step (Inductor's CUDA code, mode reduce-overhead's graph capture) needs the device",
        "cells": "section 1 (graphed, cudagraph_skips asserted 0), 2 (graphed buckets), 4 (graphed logits), 6",
    },
    {
        "path": "static-compiled",
        "why": "transformers' static cache compiled for CUDA (CompileConfig) needs the device",
        "cells": "section 5 (static + torch.compile); section 8's static column",
    },
    {
        "path": "seeded-sampling",
        "why": "a seeded request's own generator, torch.Generator(device='cuda'), initialises the CUDA runtime",
        "cells": "section 8's seeded row (a seeded fast reply at temperature 0.8)",
    },
    {
        "path": "bitsandbytes",
        "why": "int8/nf4 layers run bitsandbytes' CUDA kernels, and its loader quantises on the device",
        "cells": "section 8: kv and speculative in int8 and nf4",
    },
    {
        "path": "speculative",
        "why": "assisted generation's shapes follow how many draft tokens were accepted (values, which fake tensors "
        "lack); it runs on transformers' generate(), not the fast path",
        "cells": "section 8: speculative in every precision",
    },
    {
        "path": "int4-packing",
        "why": "torch's int4 tiles (_convert_weight_to_int4pack, _weight_int4pack_mm) need an sm80+ GPU; fake "
        "tensors check their shapes and devices only",
        "cells": "every q4 cell (sections 1, 2, 4, 7, 8)",
    },
    {
        "path": "loading",
        "why": "from_pretrained with device_map='cuda' and its memory warm-up query the device (the fake-CUDA tests "
        "move a host load onto the fake device instead)",
        "cells": "section 8 (each cell loads through Engine.load); sections 1-7 build on the device instead",
    },
    {
        "path": "memory-figures",
        "why": "torch.cuda's memory statistics, mem_get_info and NVML read the device (answered with zeros there)",
        "cells": "section 7 (predicted vs measured under caps, the out-of-memory message); section 8's columns",
    },
)
