"""The fast decode step, compiled: Inductor on a CPU, CUDA graphs on a GPU (``mode="reduce-overhead"``);
compiled once per machine and kept.

Why: with the native kernels a CPU step is a few operator calls per layer, but each still costs Python and
dispatcher time (about a tenth of a starter step); on a GPU a small model is launch-bound, which CUDA graphs
fix. The step compiled is ``FastDecoder.decode_graph``: static shapes, the position and the page table as
tensors, the KV pools updated in place, no per-layer Python closures left in the graph.

Compile once, not at every start: what Inductor produced is saved with ``torch.compiler.save_cache_artifacts``
in Redline's cache, in a file keyed by the model's shape and weights' layout, the precision, the batch size,
torch's version and the device; the next process loads it (``load_cache_artifacts``) before compiling, so
Inductor's own cache hits (its ``fxgraph_cache_hit`` counter) and only tracing remains. A corrupt or
mismatched file is set aside and the step compiled anew.

In the background: ``start()`` compiles on a thread of its own with scratch KV pools, while replies run the
eager step; the decoder switches at the next step once the compiled one is ready. A compile that fails leaves
the eager step with a note; a step that would need a recompile (the cache outgrew its shape) runs eagerly
while a new compile starts in the background — never a reply blocked on the compiler.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Optional

from redline.inference.paths import cache_dir


def cache_folder() -> Path:
    """Where compiled steps are kept (``REDLINE_COMPILED_DIR`` overrides, e.g. to keep a test's apart)."""
    override = os.environ.get("REDLINE_COMPILED_DIR")
    return Path(override) if override else cache_dir() / "compiled"


def compile_key(dec, batch: int) -> str:
    import torch

    cfg = dec.model.config
    shape = {
        "model_type": getattr(cfg, "model_type", "?"),
        "layers": len(dec.layers),
        "hidden": cfg.hidden_size,
        "heads": dec.n_heads,
        "kv_heads": dec.n_kv,
        "head_dim": dec.head_dim,
        "vocab": int(dec.embed.shape[0]),
        "weights": dec.weights_signature(),
        "act": str(dec.act_dtype),
        "cache": str(dec.kv.dtype),
        "paged": dec.kv.paged,
        "batch": batch,
        "torch": torch.__version__,
        "device": str(dec.device),
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:20]


class CompiledStep:
    def __init__(self, dec, batch: int = 1):
        self.dec, self.batch = dec, batch
        self.key = compile_key(dec, batch)
        self.state = "idle"  # idle | compiling | ready | failed
        self.note = ""
        self.compile_seconds: Optional[float] = None
        self.cache_hit: Optional[bool] = None
        self.set_aside = ""  # why a saved compile was not used
        self._fn = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    @property
    def artifact_path(self) -> Path:
        return cache_folder() / f"{self.key}.bin"

    def status(self) -> dict:
        return {"state": self.state, "note": self.note, "seconds": self.compile_seconds, "cache_hit": self.cache_hit}

    # -- compiling ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Compile in the background (once); the eager step serves until it is ready."""
        with self._lock:
            if self.state in ("compiling", "ready"):
                return
            self.state = "compiling"
            self._thread = threading.Thread(target=self._compile_guarded, name="redline-compile", daemon=True)
            self._thread.start()

    def wait(self, timeout: Optional[float] = None) -> bool:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.state == "ready"

    def _compile_guarded(self) -> None:
        try:
            self.compile_now()
        except Exception as exc:  # the eager step goes on; the user reads why
            self.state = "failed"
            self.note = (
                f"compiling the decode step failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                "replies use the eager step"
            )

    def compile_now(self) -> None:
        import torch
        from torch._dynamo.utils import counters

        started = time.perf_counter()
        self.cache_hit = self._load_artifacts()
        hits_before = counters["inductor"]["fxgraph_cache_hit"]
        mode = "reduce-overhead" if self.dec.device.type == "cuda" else None
        fn = torch.compile(self.dec.decode_graph, fullgraph=True, dynamic=False, mode=mode)
        inputs = self.dec.scratch_inputs(self.batch)
        # The cache's pages and the rotary tables grow with the conversation: those sizes stay symbolic, so a
        # longer chat does not need another compile.
        for tensor, dim in ((inputs[2], 1), (inputs[3], 1), (inputs[4], 1), (inputs[5], 0), (inputs[6], 0)):
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
        with torch.inference_mode():
            for _ in range(3 if mode else 1):  # CUDA graphs record on the second and later calls
                fn(*inputs)
        if self.dec.device.type == "cuda":
            torch.cuda.synchronize()
        if self.cache_hit:
            self.cache_hit = counters["inductor"]["fxgraph_cache_hit"] > hits_before
        self._save_artifacts()
        self._fn = fn
        self.compile_seconds = round(time.perf_counter() - started, 1)
        self.state = "ready"
        saved = "from the saved compile, " if self.cache_hit else ""
        self.note = f"decode step compiled ({saved}{self.compile_seconds:.0f} s)"
        if self.set_aside:
            self.note += f"; {self.set_aside}"

    def _load_artifacts(self) -> bool:
        import torch

        path = self.artifact_path
        if not path.is_file():
            return False
        try:
            info = torch.compiler.load_cache_artifacts(path.read_bytes())
            if info is None:  # torch logs a corrupt file and returns nothing
                raise ValueError("torch could not read it")
            return True
        except Exception as exc:  # corrupt or from another torch: set aside, compile anew
            bad = path.with_suffix(f".corrupt-{int(time.time())}")
            try:
                os.replace(path, bad)
            except OSError:
                pass
            self.set_aside = f"the saved compile could not be read ({exc}); it was set aside and compiled anew"
            return False

    def _save_artifacts(self) -> None:
        import torch

        saved = torch.compiler.save_cache_artifacts()
        if not saved:
            return
        data = saved[0]
        folder = cache_folder()
        folder.mkdir(parents=True, exist_ok=True)
        tmp = self.artifact_path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.artifact_path)

    # -- running --------------------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.state == "ready"

    def __call__(self, *inputs):
        """The compiled step on ``decode_graph``'s inputs, or None if it would need a recompile (the caller runs
        the eager step then)."""
        import torch

        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self._fn(*inputs)
        except Exception as exc:
            if "recompil" not in str(exc).lower():
                self.state, self.note = "failed", f"the compiled step failed ({type(exc).__name__}); eager from now"
                return None
            with self._lock:  # shapes outgrew the compiled graph (the cache grew): compile again, off this thread
                self.state = "idle"
            self.start()
            return None
