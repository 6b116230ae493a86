"""Section 7: memory on a consumer-sized card, by capping this process (``torch.cuda.set_per_process_memory_fraction``)
at 24, 12 and 8 GB: the estimator's prediction (4,096-token chat, the fast path, batch 1) against the peak torch
allocated building the 8B-shaped model, its fast decoder, a 4,096-token prompt and a few steps; and, for a load
past the cap, torch's out-of-memory message and the sentence Redline's loader makes of it (``out_of_memory``).
The cap bounds torch's allocator only: the CUDA context (~0.5 GB) and other processes are outside it, as a real
card's memory is not, so a fit here is a little optimistic for a card of that size."""

from __future__ import annotations

import time

from gpu_check.context import Ctx, run_cell
from gpu_check.measure import NO_CUDA
from gpu_check.report import Section
from gpu_check.speed import PRECISIONS

GB = 1e9
CONTEXT = 4096


def predicted(ctx: Ctx, precision: str, cap: int) -> dict:
    from gpu_check.models import llama_config
    from redline.inference.estimate.estimator import estimate, shape_from_config
    from redline.inference.precision import parse_precision

    shape = shape_from_config(llama_config(ctx.config), "gpu-check")
    e = estimate(shape, parse_precision(precision), CONTEXT, 1, "cuda", available_bytes=cap, strategy="fast")
    return {
        "predicted_gb": e.total_bytes / GB,
        "predicted_weights_gb": e.weights_bytes / GB,
        "predicted_kv_gb": e.kv_cache_bytes / GB,
        "predicted_fits": bool(e.fits),
    }


def section_memory(ctx: Ctx, sec: Section) -> None:
    ctx.drop()  # every model built so far: the cap counts everything this process holds
    for cap_gb in ctx.sizes.caps_gb:
        for precision in PRECISIONS:
            name = f"{precision} under a {cap_gb} GB cap"
            run_cell(ctx, sec, name, lambda c=cap_gb, p=precision: _capped(ctx, sec, p, c))


def _capped(ctx: Ctx, sec: Section, precision: str, cap_gb: int) -> dict:
    cap = int(cap_gb * GB)
    out = {"cap_gb": cap_gb, **predicted(ctx, precision, cap)}
    if not ctx.cuda:
        return {**out, "measured_gb": NO_CUDA}
    import torch

    from gpu_check.models import build_loaded, free
    from redline.inference.loading.loader import out_of_memory
    from redline.inference.memory.oom import is_oom
    from redline.inference.precision import parse_precision
    from redline.inference.sources.resolve import resolve

    total = torch.cuda.get_device_properties(0).total_memory
    free(ctx.device)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out["held_before_gb"] = base / GB  # what earlier sections left allocated (the cap counts it too)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
    loaded = None
    try:
        started = time.perf_counter()
        loaded = build_loaded(ctx.config, precision, ctx.device, ctx.folder, ctx.tokenizer)
        from redline.inference.decoding.fastpath import get_decoder

        dec = get_decoder(loaded, CONTEXT + 16)
        seq = ctx.seq()
        with torch.inference_mode():
            logits = dec.prefill(torch.tensor(ctx.ids(CONTEXT, 31), device=ctx.device), 0, seq)
            tok = logits.argmax().view(1)
            for i in range(4):
                tok = dec.step(tok, [CONTEXT + i], [seq])[0].argmax().view(1)
        torch.cuda.synchronize()
        out["measured_gb"] = (torch.cuda.max_memory_allocated() - base) / GB
        out["reserved_peak_gb"] = torch.cuda.max_memory_reserved() / GB
        out["seconds_to_first_steps"] = time.perf_counter() - started
        out["measured_fits"] = True
        if out["predicted_fits"] is False:
            out["status"] = "fail: fitted, where the estimator said it would not"
        else:
            err = 100 * (out["predicted_gb"] - out["measured_gb"]) / out["measured_gb"]
            out["predicted_error_pct"] = err
    except Exception as exc:
        if not is_oom(exc):
            raise
        out["measured_fits"] = False
        out["measured_gb"] = f"> cap (peak {torch.cuda.max_memory_allocated() / GB:.1f} GB before the failure)"
        out["torch_message"] = (str(exc).strip().splitlines() or [""])[0][:240]
        folder = ctx.folder
        said = out_of_memory(resolve(str(folder)), parse_precision(precision), ctx.device, folder, exc, context=CONTEXT)
        out["redline_message"] = f"{said.message} {said.hint}".strip()
        if out["predicted_fits"]:
            out["status"] = "fail: out of memory, where the estimator said it would fit"
    finally:
        if loaded is not None:
            loaded.release()
        loaded = None
        free(ctx.device)
        torch.cuda.set_per_process_memory_fraction(1.0)
    return out
