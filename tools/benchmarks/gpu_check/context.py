"""What the sections share: the device, the sizes (a GPU's or the dry run's), the models built so far (kept for
the next section: building and compiling are the window's dearest minutes), and the cell runner."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from gpu_check.report import Cut, Report, Section


@dataclass
class Sizes:
    positions: tuple[int, ...]  # where section 1 measures a decode step
    steps: int  # decode steps timed per cell
    profile_steps: int  # steps under the profiler (kernel time)
    reply_tokens: int  # a streamed reply's length
    batches: tuple[int, ...]
    graphed_batches: tuple[int, ...]  # each past 1 is a compile of its own
    batch_prompt: int
    ttft_prompt: int  # section 3's long prompt
    turn_tokens: int  # the second turn's new user tokens
    logit_tokens: int  # section 4's teacher-forced sequence
    pool_tokens: int  # the KV pool made before compiling, so no later section grows it (a new pool is a new graph)
    caps_gb: tuple[int, ...]

    @classmethod
    def gpu(cls) -> "Sizes":
        return cls((64, 4096), 64, 8, 64, (1, 2, 4, 8), (1, 2, 4, 8), 64, 2048, 64, 128, 9216, (24, 12, 8))

    @classmethod
    def dry(cls) -> "Sizes":
        return cls((64, 320), 6, 2, 8, (1, 2, 4, 8), (1, 2), 16, 192, 16, 24, 4096, (24, 12, 8))


@dataclass
class Ctx:
    report: Report
    device: str
    cuda: bool
    dry: bool
    work: Path
    sizes: Sizes
    config: dict  # the 8B-shaped model's config (a tiny one of its proportions in a dry run)
    folder: Path  # its config.json and tokenizer (what resolve() and the estimator read)
    tokenizer: Any
    device_name: str
    gap_ms: float
    bandwidth: Optional[float] = None  # bytes/s, measured here
    held: dict = field(default_factory=dict)  # precision → LoadedModel with its fast decoder
    compile_s: dict = field(default_factory=dict)  # precision → seconds its bucket-1 compile took
    stream: Optional[dict] = None  # section 6's figures, when section 1 measured them beside its compile
    background: list = field(default_factory=list)  # work left running past a deadline (it may slow what follows)
    _seq: int = 100_000

    def seq(self) -> int:
        """A sequence id of its own for a direct decode (the engine's requests and the scratch page use others)."""
        self._seq += 1
        return self._seq

    def ids(self, n: int, seed: int) -> list[int]:
        """``n`` token ids drawn from ``seed``, clear of the first few (special) ids."""
        import torch

        g = torch.Generator().manual_seed(seed)
        vocab = self.config["vocab_size"]
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    def model(self, precision: str):
        """The 8B-shaped model in ``precision`` (built on first use, kept), with its fast decoder and a KV pool
        sized for every section."""
        if precision in self.held:
            return self.held[precision]
        from gpu_check.models import build_loaded
        from redline.inference.decoding.fastpath import get_decoder

        loaded = build_loaded(self.config, precision, self.device, self.folder, self.tokenizer)
        dec = get_decoder(loaded, max(self.sizes.positions) + self.sizes.steps + 64)
        dec.kv.make_room({-(10**9): self.sizes.pool_tokens})  # the pool grown once, now (no sequence takes it)
        self.held[precision] = loaded
        return loaded

    def drop(self) -> None:
        """Every model built so far, and what still holds them: torch.compile's caches guard on the compiled
        steps' tensors, and CUDA graph trees keep their memory pools."""
        import torch

        from gpu_check.models import free

        for loaded in self.held.values():
            loaded.release()
        self.held.clear()
        torch._dynamo.reset()
        if self.cuda:
            try:
                from torch._inductor.cudagraph_trees import reset_cudagraph_trees

                reset_cudagraph_trees()
            except Exception as exc:  # a torch without it: the memory section says what stayed allocated
                self.report.log(f"reset_cudagraph_trees: {type(exc).__name__}: {exc}")
        free(self.device)

    def note_background(self, row: dict) -> None:
        if self.background:
            row["background"] = "; ".join(self.background)


def run_cell(ctx: Ctx, sec: Section, name: str, fn: Callable[[], Optional[dict]], **fixed) -> dict:
    """One cell: ``fn``'s figures (its "status" if it sets one, else ok), an error in one cell reported and the
    section going on, a passed deadline ending the section (the cell says so). Written to the report at once."""
    started = time.perf_counter()
    row = {"name": name, **fixed}
    ctx.note_background(row)
    try:
        sec.check(f"starting {name}")
        row.update(fn() or {})
        row.setdefault("status", "ok")
    except Cut as cut:
        row["status"] = f"cut: {cut}"
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        row["status"] = f"error: {type(exc).__name__}: {first}"
        ctx.report.log(traceback.format_exc(limit=8))
    finally:
        row["seconds"] = round(time.perf_counter() - started, 2)
        ctx.report.add(sec, row)
    return row


def skip(ctx: Ctx, sec: Section, name: str, why: str, **fixed) -> dict:
    row = {"name": name, "status": f"skipped: {why}", **fixed}
    return ctx.report.add(sec, row)


def in_thread(fn: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
    """``fn()`` on a thread of its own, waited for up to ``timeout`` s: (finished, its result or exception). A call
    that cannot be interrupted (a compile inside transformers) then runs on past a deadline, and says so."""
    import threading

    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed back to the caller
            box["error"] = exc

    t = threading.Thread(target=target, name="gpu-check-call", daemon=True)
    t.start()
    t.join(max(0.0, timeout))
    if t.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box.get("value")
