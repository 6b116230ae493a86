"""The fast decode step, compiled: Inductor on a CPU, CUDA graphs on a GPU (``mode="reduce-overhead"``);
compiled once per machine and kept.

Why: with the native kernels a CPU step is a few operator calls per layer, but each still costs Python and
dispatcher time (about a tenth of a starter step); on a GPU a small model is launch-bound, which CUDA graphs
fix. The step compiled is ``FastDecoder.decode_graph`` for one batch bucket (1, 2, 4 or 8 rows; a smaller batch
is padded with rows that write and read a scratch page of their own): static shapes, the positions and a page
table as wide as the compiled context as its only inputs (well under 1 MB), attention that reads the blocks the
page table lists (``paged_torch.attend_static``), no recompile as a conversation grows.

**A graph that really replays.** CUDA graphs are skipped ("skipping cudagraphs due to mutated inputs") when a
graph mutates an input whose address torch cannot take as fixed, and a replay copies every input that is not
static into the graph's own buffers. So the graph is compiled against the real KV pools, and the pools, the
rotary tables and every weight the step reads (fused products' weights held in closures included) are marked
static (``torch._dynamo.mark_static_address``) before tracing; what is left as an ordinary input is the tokens,
the positions and the page table. ``tests/test_graph_ready.py`` checks this with a capture backend for bf16, q8
and q4 at every bucket. A pool that grew is a new tensor: the next step runs eagerly while the graph is
compiled again against it.

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

import dataclasses
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Optional

from ..estimate.estimator import context_limit
from ..paths import cache_dir

BUCKETS = (1, 2, 4, 8)  # batch sizes a graph is compiled for; a batch is padded up to the next
MIN_CONTEXT = 8192  # positions a compiled step covers at least (the page table's width; the model's limit caps it)
# The pool's sequence key for the scratch page (padding rows, warm-up calls): not an int, so no request's id (the
# service's count up from 0, DirectSink's down from -1) can ever be it.
SCRATCH_SEQ = "compiled-step scratch"


def bucket_for(batch: int) -> Optional[int]:
    return next((b for b in BUCKETS if b >= batch), None)


def held_tensors(obj, seen=None, depth: int = 0) -> list:
    """The tensors a decoder's layer, product or module reads: attributes, closures, bound methods' modules,
    lists, dataclasses (what must have a static address for a graph to replay without copying them)."""

    # lazy: torch loads on the engine's thread, never at import
    import torch

    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 8 or obj is None:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.numel() else []
    if isinstance(obj, torch.nn.Module):
        return [t for t in list(obj.parameters()) + list(obj.buffers()) if t.numel()] + held_tensors(
            getattr(obj, "blocks", None), seen, depth + 1
        )
    out = []
    if isinstance(obj, (list, tuple)):
        for v in obj:
            out += held_tensors(v, seen, depth + 1)
    elif hasattr(obj, "__self__") and hasattr(obj, "__func__"):  # a bound method: its object's tensors
        out += held_tensors(obj.__self__, seen, depth + 1)
    elif callable(obj) and getattr(obj, "__closure__", None):
        for cell in obj.__closure__:
            try:
                out += held_tensors(cell.cell_contents, seen, depth + 1)
            except ValueError:  # an empty cell
                pass
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out += held_tensors(getattr(obj, f.name), seen, depth + 1)
    return out


def cache_folder() -> Path:
    """Where compiled steps are kept (``REDLINE_COMPILED_DIR`` overrides, e.g. to keep a test's apart)."""
    override = os.environ.get("REDLINE_COMPILED_DIR")
    return Path(override) if override else cache_dir() / "compiled"


def compile_key(dec, batch: int) -> str:
    # lazy: torch loads on the engine's thread, never at import
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
        "batch": batch,
        "torch": torch.__version__,
        "device": str(dec.device),
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:20]


def step_context(dec) -> int:
    """The positions a compiled step covers: at least ``MIN_CONTEXT`` (or what the decoder holds already), capped at
    the model's own limit with its rope scaling (``estimate.estimator.context_limit``, as ``LoadedModel``)."""
    return min(context_limit(dec.model.config), max(MIN_CONTEXT, dec.max_context))


class StaticStep:
    """The decode step a graph holds, for one batch bucket: ``forward(tokens, pos, pages)`` reads the decoder's
    pools, rotary tables and weights, all marked static (at fixed addresses for CUDA graphs)."""

    def __init__(self, dec, batch: int):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        self.dec, self.batch = dec, batch
        kv = dec.kv
        self.context = step_context(dec)
        dec.ensure_context(self.context)  # the rotary tables never grow under the graph
        kv.grow_to_budget()  # the batcher's KV budget, allocated once: no growth under the graph
        if SCRATCH_SEQ not in kv.tables:
            kv.reserve(SCRATCH_SEQ, 1)  # padding rows and warm-up calls write here, never into a sequence's pages
        self.scratch = kv.tables[SCRATCH_SEQ][0]
        self.width = -(-self.context // kv.page)
        self.k, self.v, self.cos, self.sin = kv.k, kv.v, dec.cos, dec.sin
        for t in [self.k, self.v, self.cos, self.sin, *self.weights()]:
            torch._dynamo.mark_static_address(t)

    def weights(self) -> list:
        dec = self.dec
        return held_tensors([dec.embed, dec.norm_w, dec.lm_head, dec.layers])

    def current(self) -> bool:
        """Whether the decoder still holds the tensors this step was built on (a grown pool is a new tensor)."""
        d = self.dec
        same = d.kv.k is self.k and d.kv.v is self.v and d.cos is self.cos and d.sin is self.sin
        return same and d.kv.tables.get(SCRATCH_SEQ) == [self.scratch]

    def forward(self, tokens, pos, pages):
        return self.dec.decode_graph(tokens, pos, pages, self.k, self.v, self.cos, self.sin)

    def inputs(self, tokens, positions: list[int], seqs: list[int]):
        """The batch padded to the bucket: padding rows at position 0 of the scratch page."""
        # lazy: torch loads on the engine's thread, never at import
        import torch

        dec, pad = self.dec, self.batch - len(seqs)
        # Always a new tensor (made under inference mode, as the warm-up's were): the caller's own could be an
        # ordinary tensor, whose other dispatch keys fail the graph's guard and send the step to eager.
        tokens = torch.cat([tokens, tokens.new_zeros(pad)])
        pos = torch.tensor(list(positions) + [0] * pad, dtype=torch.long, device=dec.device)
        return tokens, pos, dec.kv.table(seqs, self.width, self.batch, self.scratch)

    def warmup_inputs(self):
        """Every row on the scratch page (compiling runs the step: it must not touch a sequence's pages)."""
        # lazy: torch loads on the engine's thread, never at import
        import torch

        return self.inputs(torch.zeros(0, dtype=torch.long, device=self.dec.device), [], [])


class CompiledStep:
    def __init__(self, dec, batch: int = 1, backend: str = "inductor"):
        self.dec, self.batch = dec, bucket_for(batch) or BUCKETS[-1]
        self.backend = backend  # "eager" in tests: the same graph capture and guards without Inductor's compile
        self.runs = 0  # steps the compiled step really ran (not the eager fallback)
        self.key = compile_key(dec, self.batch)
        self.static: Optional[StaticStep] = None
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
        """Compile in the background (once); the eager step serves until it is ready. The static step (its
        scratch page, the rotary tables at full size) is prepared here, on the thread that owns the cache."""
        with self._lock:
            if self.state in ("compiling", "ready"):
                return
            self.state = "compiling"
            try:
                self._prepared = self._prepare()
            except Exception as exc:
                self.state, self.note = "failed", f"preparing the compiled step failed ({type(exc).__name__}: {exc})"
                return
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

    _prepared: Optional[StaticStep] = None

    def _prepare(self) -> StaticStep:
        # lazy: torch loads on the engine's thread, never at import
        import torch

        with torch.inference_mode():
            return StaticStep(self.dec, self.batch)

    def compile_now(self) -> None:
        # lazy: torch loads on the engine's thread, never at import
        import torch

        # lazy: torch loads on the engine's thread, never at import
        from torch._dynamo.utils import counters

        started = time.perf_counter()
        self.cache_hit = self._load_artifacts()
        hits_before = counters["inductor"]["fxgraph_cache_hit"]
        mode = "reduce-overhead" if self.dec.device.type == "cuda" and self.backend == "inductor" else None
        static, self._prepared = self._prepared or self._prepare(), None
        fn = torch.compile(static.forward, fullgraph=True, dynamic=False, mode=mode, backend=self.backend)
        with torch.inference_mode():
            # Made under inference mode as a reply's inputs are: a warm-up on ordinary tensors left a guard on their
            # dispatch keys that every real step failed, so each fell back to eager.
            inputs = static.warmup_inputs()
            for _ in range(3 if mode else 1):  # CUDA graphs record on the second and later calls
                fn(*inputs)
        if self.dec.device.type == "cuda":
            torch.cuda.synchronize()
        if self.cache_hit:
            self.cache_hit = counters["inductor"]["fxgraph_cache_hit"] > hits_before
        self._save_artifacts()
        self._fn, self.static = fn, static
        self.compile_seconds = round(time.perf_counter() - started, 1)
        self.state = "ready"
        saved = "from the saved compile, " if self.cache_hit else ""
        self.note = f"decode step compiled ({saved}{self.compile_seconds:.0f} s)"
        if self.set_aside:
            self.note += f"; {self.set_aside}"

    def _load_artifacts(self) -> bool:
        # lazy: torch loads on the engine's thread, never at import
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
        # lazy: torch loads on the engine's thread, never at import
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

    def run(self, tokens, positions: list[int], seqs: list[int]):
        """The compiled step for these sequences (logits [B, vocab]), or None where it cannot run: another
        bucket, a position past the compiled context, or a pool that grew since (then compiled again, in the
        background); the caller runs the eager step."""
        static = self.static
        if static is None or bucket_for(len(seqs)) != self.batch or max(positions) >= static.context:
            return None
        if not static.current():
            with self._lock:
                self.state = "idle"
            self.start()
            return None
        out = self(*static.inputs(tokens, positions, seqs))
        if out is None:
            return None
        self.runs += 1
        return out[: len(seqs)]

    def __call__(self, *inputs):
        """The compiled step on ``StaticStep.forward``'s inputs, or None if it would need a recompile (the
        caller runs the eager step then)."""
        # lazy: torch loads on the engine's thread, never at import
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
