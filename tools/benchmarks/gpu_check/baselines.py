"""Section 5: transformers' own paths on the same bf16 model in the same run, beside Redline's fast path at the
same prompt and length: dynamic-cache ``generate`` (the ``kv`` strategy), static cache + ``torch.compile`` (the
``static`` strategy), and ``generate_batch`` (continuous batching over paged attention) where the installed
transformers has it. A compile inside transformers cannot be interrupted: it runs on a thread of its own, waited
for until the section's deadline, and a call still running then is reported, with what it may slow after it."""

from __future__ import annotations

import time

from gpu_check.context import Ctx, in_thread, run_cell, skip
from gpu_check.measure import counting_graph_steps, eager_only, sync
from gpu_check.report import Section

BATCH_PROMPTS = 8


def section_baselines(ctx: Ctx, sec: Section) -> None:
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.generation.run import generate

    precision = "bf16"
    loaded = ctx.model(precision)
    dec = loaded.fast_decoder
    n = ctx.sizes.steps
    prompt = ctx.ids(ctx.sizes.batch_prompt, 77)
    greedy = SamplingSettings(max_new_tokens=n, temperature=0, min_new_tokens=n)

    def reply(strategy: str, compile_: bool = False) -> dict:
        r = generate(loaded, prompt, greedy, DecodeOptions(strategy=strategy, compile=compile_))
        if r.finish_reason == "error":
            raise RuntimeError(r.error)
        return {"tokens_per_s": r.tokens_per_s, "ttft_ms": r.ttft_ms, "ran": r.strategy, "new_tokens": r.new_tokens}

    def fast_eager() -> dict:
        with eager_only(dec):
            return reply("fast")

    run_cell(ctx, sec, "Redline fast, eager", fast_eager)

    def fast_graphed() -> dict:
        with counting_graph_steps(dec) as counts:
            out = reply("fast")
        out.update(counts)
        if counts["fell_back"] or not counts["graphed"]:
            out["status"] = f"fail: {counts['fell_back']} steps fell back to the eager step"
        return out

    if dec.compiled is not None and dec.compiled.ready() and dec.compiled.batch == 1:
        run_cell(ctx, sec, "Redline fast, graphed", fast_graphed)
    else:
        skip(ctx, sec, "Redline fast, graphed", "no ready bucket-1 graph from section 1")
    run_cell(ctx, sec, "transformers generate, dynamic cache (kv)", lambda: reply("kv"))
    run_cell(ctx, sec, "transformers static cache + torch.compile", lambda: _static(ctx, sec, reply))
    name = f"transformers generate_batch, {BATCH_PROMPTS} prompts"
    run_cell(ctx, sec, name, lambda: _generate_batch(ctx, sec, loaded))


def _static(ctx: Ctx, sec: Section, reply) -> dict:
    """The first call compiles (timed as such), the second is measured. Both on a thread, to the deadline."""
    started = time.perf_counter()
    done, _ = in_thread(lambda: reply("static", True), sec.left())
    first_s = time.perf_counter() - started
    if not done:
        ctx.background.append("transformers' static compile still running")
        return {"status": f"cut: the first (compiling) call was still running after {first_s:.0f} s ({sec.why_cut()})"}
    done, out = in_thread(lambda: reply("static", True), sec.left())
    if not done:
        ctx.background.append("transformers' static generate still running")
        return {"status": f"cut: the measured call did not end in time ({sec.why_cut()})", "compile_s": first_s}
    return {**out, "compile_s": first_s}


def _generate_batch(ctx: Ctx, sec: Section, loaded) -> dict:
    model = loaded.model
    if not hasattr(model, "generate_batch"):
        import transformers

        return {"status": f"skipped: transformers {transformers.__version__} has no generate_batch"}
    if ctx.dry:
        # Measured here: its scheduler thread took ~30 s for 2 prompts × 8 tokens of a 2-layer model on this CPU,
        # waiting on its own queue (cProfile: 27 of 30 s in Queue.get), half the dry run's whole budget.
        return {"status": "skipped: generate_batch waits ~30 s on its queue per call on a CPU; runs on the GPU"}
    from transformers import GenerationConfig

    n = ctx.sizes.steps
    prompts = [ctx.ids(ctx.sizes.batch_prompt, 600 + i) for i in range(BATCH_PROMPTS)]
    cfg = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=-1, pad_token_id=0)
    saved_impl = getattr(model.config, "_attn_implementation", None)
    switched: list = []  # the attention implementations generate_batch set (its paged cache runs under them)
    original_set = model.set_attn_implementation

    def recording_set(impl, *args, **kwargs):
        switched.append(str(impl))
        return original_set(impl, *args, **kwargs)

    model.set_attn_implementation = recording_set

    def call():
        sync(ctx.device)
        t0 = time.perf_counter()
        out = model.generate_batch(inputs=prompts, generation_config=cfg)
        sync(ctx.device)
        return time.perf_counter() - t0, out

    try:
        done, value = in_thread(call, sec.left())
    finally:
        del model.set_attn_implementation  # the method again
        if saved_impl is not None and getattr(model.config, "_attn_implementation", None) != saved_impl:
            model.set_attn_implementation(saved_impl)  # what generate_batch switched to, back
    if not done:
        ctx.background.append("transformers' generate_batch still running")
        return {"status": f"cut: generate_batch did not end in time ({sec.why_cut()})"}
    seconds, outputs = value
    tokens = sum(len(getattr(o, "generated_tokens", []) or []) for o in outputs.values())
    return {
        "tokens_per_s": tokens / seconds,
        "new_tokens": tokens,
        "batch": BATCH_PROMPTS,
        "seconds_total": seconds,
        "ran": f"attention {switched[0] if switched else saved_impl} over its paged cache",
        "note": "includes its prefill and warm-up (graph capture) in the time",
    }
