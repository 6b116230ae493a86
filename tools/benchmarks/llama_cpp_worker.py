"""Runs llama.cpp (through llama-cpp-python) for tools/benchmarks/llama_cpp_compare.py, in the interpreter that has it.

A measuring tool, never a dependency of Redline: started as a subprocess with another Python, it reads one
JSON request per line on stdin and answers one JSON line on stdout:
  {"model": "/path/x.gguf", "tokens": [...], "new_tokens": 64}  →  {"ttft_ms": …, "decode_tokens_per_s": …, "ids": […]}
Models stay loaded between requests. Greedy decoding, 2 threads unless REDLINE_LLAMA_THREADS says otherwise.
"""

import json
import os
import sys
import time


def main() -> int:
    from llama_cpp import Llama

    threads = int(os.environ.get("REDLINE_LLAMA_THREADS", "2"))
    models = {}
    for line in sys.stdin:
        req = json.loads(line)
        path = req["model"]
        if path not in models:
            models[path] = Llama(
                model_path=path,
                n_ctx=4096,
                n_threads=threads,
                n_threads_batch=threads,
                n_batch=512,
                verbose=False,
                seed=0,
            )
        llm = models[path]
        llm.reset()
        stamps, ids = [], []
        start = time.perf_counter()
        for tok in llm.generate(req["tokens"], temp=0.0, top_k=1, reset=True):
            stamps.append(time.perf_counter())
            ids.append(int(tok))
            if len(ids) >= req["new_tokens"]:
                break
        decode = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else None
        print(
            json.dumps({"ttft_ms": (stamps[0] - start) * 1000, "decode_tokens_per_s": decode, "ids": ids}), flush=True
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
