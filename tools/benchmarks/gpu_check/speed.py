"""Sections 1 and 2: the 8B-shaped model's decode step at batch 1 (eager against graphed, bf16 and q4, with the
figures a projection to a consumer card needs), then continuous batching at 1, 2, 4 and 8."""

from __future__ import annotations

import time

from gpu_check.context import Ctx, run_cell, skip
from gpu_check.measure import GraphWatch, counting_graph_steps, decode_at, eager_only, stream_while, sync
from gpu_check.report import Section

PRECISIONS = ("bf16", "q4")


def bytes_per_step(loaded, context: int) -> int:
    from redline.inference.speed.arithmetic import bytes_read_per_token

    return int(bytes_read_per_token(loaded, "fast", context))


def _speed_figures(ctx: Ctx, loaded, out: dict) -> dict:
    out["bytes_per_step"] = bytes_per_step(loaded, out["position"])
    out["gb_per_step"] = out["bytes_per_step"] / 1e9
    if ctx.bandwidth and out.get("tokens_per_s"):
        roof = ctx.bandwidth / out["bytes_per_step"]
        out["roofline_tok_s"] = roof
        out["roofline_pct"] = 100 * out["tokens_per_s"] / roof
    if out.get("kernel_ms"):
        out["kernel_gb_s"] = out["bytes_per_step"] / out["kernel_ms"] / 1e6
    return out


def reply_fn(ctx: Ctx, loaded, seed: int):
    """A greedy reply of the sizes' length through the engine's one path (``generation.run.generate``: the
    batcher, the fast step, whichever of eager or graphed is ready), its prompt fresh each time."""
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.generation.run import generate

    n = ctx.sizes.reply_tokens
    counter = iter(range(seed, seed + 10_000))

    def reply():
        return generate(
            loaded,
            ctx.ids(ctx.sizes.batch_prompt, next(counter)),
            SamplingSettings(max_new_tokens=n, temperature=0, min_new_tokens=n),
            DecodeOptions(strategy="fast", compile=False),
        )

    return reply


def section_batch1(ctx: Ctx, sec: Section) -> None:
    """Eager cells for both precisions first (cheap, and worth having if the compiles take the section), then
    each precision's compile and its graphed cells."""
    for precision in PRECISIONS:
        built = run_cell(ctx, sec, f"{precision} build on the device", lambda p=precision: _build(ctx, p))
        if built["status"] != "ok":
            continue
        for pos in ctx.sizes.positions:
            run_cell(ctx, sec, f"{precision} eager @{pos}", lambda p=precision, n=pos: _steps(ctx, sec, p, n, False))
    for precision in PRECISIONS:
        if precision not in ctx.held:
            continue
        watch = GraphWatch(ctx.cuda)
        try:
            done = run_cell(ctx, sec, f"{precision} compile (bucket 1)", lambda p=precision: _compile(ctx, sec, p))
            if done["status"] != "ok":
                for pos in ctx.sizes.positions:
                    skip(ctx, sec, f"{precision} graphed @{pos}", f"the compile did not finish ({done['status']})")
                continue
            for pos in ctx.sizes.positions:
                run_cell(
                    ctx,
                    sec,
                    f"{precision} graphed @{pos}",
                    lambda p=precision, n=pos, w=watch: _steps(ctx, sec, p, n, True, w),
                )
        finally:
            watch.close()
    _projection_notes(ctx, sec)


def _build(ctx: Ctx, precision: str) -> dict:
    loaded = ctx.model(precision)
    out = {"build_s": loaded.load_seconds, "weights_gb": _weights_gb(loaded)}
    if ctx.cuda:
        import torch

        out["allocated_gb"] = torch.cuda.memory_allocated() / 1e9
    return out


def _weights_gb(loaded) -> float:
    from redline.inference.speed.arithmetic import weight_bytes_read

    return weight_bytes_read(loaded.model) / 1e9


def _steps(ctx: Ctx, sec: Section, precision: str, position: int, graphed: bool, watch=None) -> dict:
    loaded = ctx.model(precision)
    dec = loaded.fast_decoder
    prompt = ctx.ids(position, seed=position)
    s = ctx.sizes
    if not graphed:
        with eager_only(dec):
            out = decode_at(dec, prompt, s.steps, ctx.seq(), sec, ctx.device, s.profile_steps)
        return _speed_figures(ctx, loaded, out)
    with counting_graph_steps(dec) as counts:
        out = decode_at(dec, prompt, s.steps, ctx.seq(), sec, ctx.device, s.profile_steps)
    out = _speed_figures(ctx, loaded, out)
    out.update(counts)
    out.update(watch.reading())
    verdict = watch.verdict()
    if verdict:
        out["status"] = verdict
    elif counts["fell_back"] or not counts["graphed"]:
        out["status"] = (
            f"fail: {counts['fell_back']} of {counts['graphed'] + counts['fell_back']} steps fell back to the eager "
            f"step (compile state: {dec.compiled.state if dec.compiled else 'none'})"
        )
    return out


def _compile(ctx: Ctx, sec: Section, precision: str) -> dict:
    """Compile the bucket-1 graphed step in the background, as the engine does after a load; for the first one,
    stream replies beside it the while (section 6's figures: replies must not stall while graphs are captured)."""
    loaded = ctx.model(precision)
    dec = loaded.fast_decoder
    started = time.perf_counter()
    compiled = dec.compile_in_background(1)
    out: dict = {}
    if ctx.stream is None:
        stream = stream_while(lambda: compiled.state == "compiling", reply_fn(ctx, loaded, 7000), sec, ctx.gap_ms)
        ctx.stream = {"name": f"{precision} replies during its bucket-1 compile (section 1)", **stream}
        out["replies_beside"] = stream["replies"]
    ready = compiled.wait(sec.left())
    sync(ctx.device)
    out.update(compile_s=time.perf_counter() - started, compile=compiled.status())
    if compiled.state == "compiling":
        ctx.background.append(f"{precision} compile still running after section {sec.number}'s deadline")
        out["status"] = f"cut: still compiling after {out['compile_s']:.0f} s ({sec.why_cut()})"
    elif not ready:
        out["status"] = f"fail: {compiled.note}"
    else:
        ctx.compile_s[precision] = out["compile_s"]
    return out


def _projection_notes(ctx: Ctx, sec: Section) -> None:
    """Each measured cell carried to an RTX 4090 and a 4070 by bandwidth (project.py says how), with the sum."""
    from gpu_check.project import TARGETS, fits, here_gb_s, project
    from redline.inference.hardware.gpus import find_gpu

    here, what = here_gb_s(ctx.device_name, ctx.bandwidth)
    if not ctx.cuda:
        sec.notes.append(
            "Projection to consumer cards: n/a on the CPU (the dry run's figures are a tiny model's; the arithmetic "
            "runs on the GPU's cells: kernel time × bandwidth here ÷ the card's, plus the time outside kernels)"
        )
        return
    sec.notes.append(f"Projections scale the kernel time from {what} (tools/benchmarks/gpu_check/project.py).")
    for name in TARGETS:
        card = find_gpu(name)
        for precision in PRECISIONS:
            ok, need = fits(ctx.config, precision, card)
            if not ok:
                sec.notes.append(f"{card.name}, {precision}: does not fit ({need}, 4,096-token chat)")
                continue
            for cell in sec.cells:
                if cell["name"].startswith(precision + " ") and "@" in cell["name"] and cell.get("wall_ms"):
                    p = project(cell, here, card)
                    if p:
                        key = "rtx4090_tok_s" if "4090" in card.name else "rtx4070_tok_s"
                        cell[key] = p["tokens_per_s"]
                        sec.notes.append(f"{cell['name']} → {p['text']}")
    ctx.report.write()


# -- section 2 ----------------------------------------------------------------------------------------------------
def section_batches(ctx: Ctx, sec: Section) -> None:
    precision = next((p for p in PRECISIONS if p in ctx.held), "bf16")
    loaded = ctx.model(precision)
    dec = loaded.fast_decoder
    bucket1 = dec.compiled if dec.compiled is not None and dec.compiled.ready() else None
    try:
        for b in ctx.sizes.batches:
            run_cell(ctx, sec, f"{precision} eager, batch {b}", lambda b=b: _batch(ctx, sec, loaded, b, False))
        for b in ctx.sizes.graphed_batches:
            if b == 1:
                if bucket1 is None:
                    skip(ctx, sec, f"{precision} graphed, batch 1", "section 1's bucket-1 graph is not ready")
                    continue
                dec.compiled = bucket1
            else:
                need = ctx.compile_s.get(precision)
                if need is None:
                    skip(ctx, sec, f"{precision} graphed, batch {b}", "no compile of this model finished in section 1")
                    continue
                if sec.left() < 1.5 * need + 5:
                    skip(
                        ctx,
                        sec,
                        f"{precision} graphed, batch {b}",
                        f"compiling bucket {b} takes ~{need:.0f} s (bucket 1's); {sec.left():.0f} s left",
                    )
                    continue
            run_cell(ctx, sec, f"{precision} graphed, batch {b}", lambda b=b: _batch(ctx, sec, loaded, b, True))
    finally:
        dec.compiled = bucket1  # section 4 reads bucket 1's graph


def _batch(ctx: Ctx, sec: Section, loaded, b: int, graphed: bool) -> dict:
    dec = loaded.fast_decoder
    out: dict = {"batch": b}
    watch = None
    if graphed and (dec.compiled is None or dec.compiled.batch != b or not dec.compiled.ready()):
        watch = GraphWatch(ctx.cuda)
        started = time.perf_counter()
        compiled = dec.compile_in_background(b)
        compiled.wait(sec.left())
        out["compile_s"] = time.perf_counter() - started
        if not compiled.ready():
            if compiled.state == "compiling":
                ctx.background.append(f"bucket-{b} compile still running after section {sec.number}'s deadline")
            watch.close()
            return {**out, "status": f"fail: bucket {b} not compiled ({compiled.state}: {compiled.note})"}
    try:
        if graphed:
            out.update(batch_steps(ctx, sec, loaded, b, count_graphed=True))
            if out["fell_back"] or not out["graphed"]:
                out["status"] = f"fail: {out['fell_back']} of the timed steps fell back to the eager step"
        else:
            with eager_only(dec):
                out.update(batch_steps(ctx, sec, loaded, b))
        if watch is not None:
            out.update(watch.reading())
            out["status"] = watch.verdict() or out.get("status", "ok")
    finally:
        if watch is not None:
            watch.close()
    return out


def batch_steps(ctx: Ctx, sec: Section, loaded, b: int, count_graphed: bool = False) -> dict:
    """``b`` replies added to the engine's batcher together, stepped until all decode, then timed over the sizes'
    steps: tokens/s of the batch (every token read back to the host each step, as the engine does). With
    ``count_graphed``, how many of the timed steps the compiled step ran (while the prompts are read, fewer rows
    decode than the graph's bucket, and the eager step runs them, as it should)."""
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.generation.lifecycle import DirectSink
    from redline.inference.generation.request import GenerationRequest

    batcher = loaded.batcher()
    # Enough tokens that none ends before the timed steps do: beside streaming replies a prompt is read in paced
    # chunks (as few as one token a step), one prompt at a time, while the replies already reading decode.
    n = ctx.sizes.steps + 8 + b * ctx.sizes.batch_prompt
    try:
        for i in range(b):
            request = GenerationRequest(
                input_ids=ctx.ids(ctx.sizes.batch_prompt, 500 + i),
                sampling=SamplingSettings(max_new_tokens=n, temperature=0, min_new_tokens=n),
                options=DecodeOptions(strategy="fast", compile=False, reuse_prefix=False),
                record=False,
            )
            batcher.add(DirectSink(), request, time.perf_counter())
        while any(a.seq.prefilling for a in batcher.active):
            sec.check(f"reading {b} prompts")
            batcher.step()
        for _ in range(3):
            batcher.step()
        sync(ctx.device)
        with counting_graph_steps(loaded.fast_decoder) as counts:
            t0 = time.perf_counter()
            for i in range(ctx.sizes.steps):
                batcher.step()
                if i % 4 == 3:
                    sec.check(f"decoding a batch of {b}")
            sync(ctx.device)
            dt = time.perf_counter() - t0
        running = len(batcher.active)
    finally:
        batcher.fail_all(RuntimeError("gpu-check: measured"))  # frees their pages at once
    if running != b:
        return {"status": f"fail: {b - running} of {b} replies ended before the timed steps did"}
    steps = ctx.sizes.steps
    out = {"tokens_per_s": b * steps / dt, "per_reply_tok_s": steps / dt, "step_ms": 1000 * dt / steps}
    return {**out, **counts} if count_graphed else out
