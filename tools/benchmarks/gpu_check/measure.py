"""How the cells measure: decode steps at a position (eager or graphed, with a count of the steps the graph
really ran), kernel time per step from torch's profiler, CUDA-graph skips as Inductor counts them, a reply's
gaps while a compile runs beside it, and logits teacher-forced through the fast step."""

from __future__ import annotations

import logging
import statistics
import time
from contextlib import contextmanager
from typing import Optional

NO_CUDA = "n/a: no CUDA"


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class _Reasons(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record) -> None:
        text = record.getMessage()
        if "cudagraph" in text.lower() and "skip" in text.lower() and text not in self.messages:
            self.messages.append(text.splitlines()[0][:300])


# Where Inductor says why it skipped CUDA graphs (torch/_inductor/cudagraph_utils.py logs to an artifact logger
# that does not propagate unless TORCH_LOGS names it; the others propagate to torch._inductor).
SKIP_LOGGERS = ("torch._inductor.cudagraph_utils.__cudagraphs", "torch._inductor")


class GraphWatch:
    """``torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]`` from its creation (before a compile) to
    ``reading()`` (after the graphed steps), with the reasons torch logged. A skip means the compiled step runs
    without graphs: every replay a launch per kernel, what graphs exist to remove."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.handler = _Reasons()
        self.before = 0
        if cuda:
            from torch._dynamo.utils import counters

            self.before = counters["inductor"]["cudagraph_skips"]
            for name in SKIP_LOGGERS:
                logging.getLogger(name).addHandler(self.handler)

    def skips(self):
        if not self.cuda:
            return NO_CUDA
        from torch._dynamo.utils import counters

        return counters["inductor"]["cudagraph_skips"] - self.before

    def reading(self) -> dict:
        out = {"cudagraph_skips": self.skips()}
        if self.cuda:
            from torch._dynamo.utils import counters

            out["skip_reasons"] = list(self.handler.messages[:3])
            out["inductor_cudagraph_counters"] = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
        return out

    def verdict(self) -> Optional[str]:
        """None when graphs were not skipped (or there is no CUDA to skip them on), else the failure."""
        n = self.skips()
        if n == NO_CUDA or n == 0:
            return None
        why = f" ({self.handler.messages[0]})" if self.handler.messages else ""
        return f"fail: cudagraph_skips = {n}, the compiled step ran without CUDA graphs{why}"

    def close(self) -> None:
        for name in SKIP_LOGGERS:
            logging.getLogger(name).removeHandler(self.handler)


@contextmanager
def eager_only(dec):
    """The decoder's eager step: its compiled step set aside for the block (put back after)."""
    saved, dec.compiled = dec.compiled, None
    try:
        yield
    finally:
        dec.compiled = saved


@contextmanager
def counting_graph_steps(dec):
    """Counts, over the block, the steps the compiled step ran and those it handed back to the eager step
    (``CompiledStep.run`` returning None: another bucket, a grown pool, a recompile)."""
    counts = {"graphed": 0, "fell_back": 0}
    compiled = dec.compiled
    if compiled is None:
        yield counts
        return
    original = compiled.run

    def run(*args, **kwargs):
        out = original(*args, **kwargs)
        counts["graphed" if out is not None else "fell_back"] += 1
        return out

    compiled.run = run
    try:
        yield counts
    finally:
        del compiled.run  # the method again


def decode_at(dec, prompt: list[int], steps: int, seq: int, sec, device: str, profile_steps: int = 0) -> dict:
    """Prefill ``prompt`` as sequence ``seq``, then ``steps`` greedy decode steps from position len(prompt), each
    token read back to the host as the engine does (one read a step): wall time per step, the GPU's span per
    step (CUDA events), and, over ``profile_steps`` more, the kernels' own time per step (torch's profiler)."""
    import torch

    with torch.inference_mode():
        dec.kv.release(seq)  # only this sequence: the compiled step's scratch page must stay where it is
        logits = dec.prefill(torch.tensor(prompt, dtype=torch.long, device=device), 0, seq)
        tok = logits.argmax().view(1)
        pos = len(prompt)

        def run(n: int) -> None:
            nonlocal tok, pos
            for i in range(n):
                tok = dec.step(tok, [pos], [seq])[0].argmax().view(1)
                int(tok)  # the engine's one host read per token
                pos += 1
                if i % 4 == 3:
                    sec.check(f"decoding at position {pos}")

        run(3)  # warm-up: the first steps at a new length allocate
        sync(device)
        cuda = str(device).startswith("cuda")
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        run(steps)
        if cuda:
            end.record()
        sync(device)
        wall = time.perf_counter() - t0
        out = {
            "position": len(prompt),
            "steps": steps,
            "wall_ms": 1000 * wall / steps,
            "tokens_per_s": steps / wall,
            "gpu_span_ms": start.elapsed_time(end) / steps if cuda else None,
        }
        if profile_steps:
            out.update(kernel_time(run, profile_steps, cuda))
        dec.kv.release(seq)
    return out


def kernel_time(run, steps: int, cuda: bool) -> dict:
    """The device's kernel time per step over ``steps`` steps (on a CPU: torch's operators' own time, which is
    what the dry run can exercise). Kernels inside CUDA graphs are traced by CUPTI like any other."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        run(steps)
        if cuda:
            import torch

            torch.cuda.synchronize()
    total_us, kernels = 0.0, 0
    for e in prof.key_averages():
        if cuda and e.device_type == DeviceType.CUDA:
            total_us += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            kernels += e.count
        elif not cuda:
            total_us += e.self_cpu_time_total
            kernels += e.count
    return {
        "kernel_ms": total_us / 1000 / steps,
        "kernels_per_step": kernels / steps,
        "kernel_source": "CUDA kernels (profiler)" if cuda else "CPU operators (profiler; dry run)",
    }


def stream_while(busy, generate_reply, sec, gap_ms: float) -> dict:
    """Replies streamed back to back while ``busy()`` holds (a compile in the background): every gap between
    two tokens of a reply, the longest against ``gap_ms``."""
    gaps: list[float] = []
    replies = tokens = 0
    started = time.perf_counter()
    still_busy_after_first = None
    while replies == 0 or busy():  # one reply at least, even if the compile is quick
        sec.check("streaming replies while the graphs are captured")
        result = generate_reply()
        if result.finish_reason == "error":
            raise RuntimeError(f"a reply streamed beside the compile failed: {result.error}")
        gaps += list(result.per_token_ms)
        replies += 1
        tokens += result.new_tokens
        if still_busy_after_first is None:
            still_busy_after_first = bool(busy())
    out = {
        "replies": replies,
        "tokens": tokens,
        "streamed_s": time.perf_counter() - started,
        "longest_gap_ms": max(gaps) if gaps else None,
        "median_gap_ms": statistics.median(gaps) if gaps else None,
        "gaps_over_limit": sum(g > gap_ms for g in gaps),
        "gap_limit_ms": gap_ms,
        "compiling_after_first_reply": still_busy_after_first,
    }
    out["status"] = (
        "ok" if not gaps or out["longest_gap_ms"] <= gap_ms else f"fail: a gap of {max(gaps):.0f} ms > {gap_ms:.0f}"
    )
    return out


def teacher_forced(dec, tokens: list[int], seq: int, device: str, sec) -> "object":
    """The fast step's fp32 logits [T, vocab] for ``tokens`` fed one at a time (position 0 by a prefill, the rest
    by decode steps), whatever it would have chosen: the same inputs as a reference forward over all of them."""
    import torch

    rows = []
    with torch.inference_mode():
        dec.kv.release(seq)
        ids = torch.tensor(tokens, dtype=torch.long, device=device)
        rows.append(dec.prefill(ids[:1], 0, seq).float())
        for i in range(1, len(tokens)):
            rows.append(dec.step(ids[i : i + 1], [i], [seq])[0].float())
            if i % 8 == 0:
                sec.check(f"teacher-forcing position {i}")
        dec.kv.release(seq)
    return torch.stack(rows)


def logit_error(got, ref) -> dict:
    """Max absolute and relative error of logits against a reference; top-1 agreement counted only where the
    reference's top two are further apart than the error (near-ties on random weights say nothing)."""

    err = (got.float() - ref.float()).abs()
    scale = ref.abs().max().clamp(min=1e-12)
    top2 = ref.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    decided = margin > 2 * err.max(dim=-1).values
    agree = (got.argmax(-1) == ref.argmax(-1)) & decided
    return {
        "max_abs_err": float(err.max()),
        "mean_abs_err": float(err.mean()),
        "max_rel_err": float(err.max() / scale),
        "ref_max_abs": float(scale),
        "top1_decided": int(decided.sum()),
        "top1_agree_where_decided": int(agree.sum()),
        "positions": int(ref.shape[0]),
    }
