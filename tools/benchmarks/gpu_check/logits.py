"""Section 4: the fast step's logits, teacher-forced over a fixed token sequence, against an fp32 forward of the
same weights (transformers' own, the bf16 values upcast): max absolute and relative error. Greedy agreement is
not the measure: on random weights the top two logits are often within rounding of each other, and one flip
ends the agreement for every token after it. transformers' own bf16 forward is measured the same way, as the
scale of error bf16 arithmetic brings by itself."""

from __future__ import annotations

from gpu_check.context import Ctx, run_cell, skip
from gpu_check.measure import counting_graph_steps, eager_only, logit_error, teacher_forced
from gpu_check.models import build, free
from gpu_check.report import Section
from gpu_check.speed import PRECISIONS

# The fast path's bf16 error may be this many times transformers' own bf16 forward's before it reads as a fault
# (both round the same weights; the fast path fuses products and orders its sums differently).
BF16_ERROR_FACTOR = 4.0


def _fp32_fits(ctx: Ctx) -> tuple[bool, str]:
    if not ctx.cuda:
        return True, ""
    import torch

    from redline.inference.speed.arithmetic import weight_bytes_read

    free_bytes, _ = torch.cuda.mem_get_info()
    held = ctx.held.get("bf16")
    need = 2.3 * (weight_bytes_read(held.model) if held is not None else 16e9)  # fp32 = 2× bf16, + activations
    return free_bytes > need, f"an fp32 copy needs ~{need / 1e9:.0f} GB, {free_bytes / 1e9:.0f} GB free"


def section_logits(ctx: Ctx, sec: Section) -> None:
    import torch

    tokens = ctx.ids(ctx.sizes.logit_tokens, 4242)
    ok, why = _fp32_fits(ctx)
    if not ok:
        skip(ctx, sec, "fp32 reference", why)
        return
    ref: dict = {}

    def reference() -> dict:
        model = build(ctx.config, "fp32", ctx.device)
        with torch.inference_mode():
            ref["logits"] = model(torch.tensor([tokens], device=ctx.device)).logits[0].float()
        del model
        free(ctx.device)
        return {"positions": len(tokens), "ref_max_abs": float(ref["logits"].abs().max())}

    row = run_cell(ctx, sec, "fp32 reference (transformers' forward)", reference)
    if row["status"] != "ok":
        return
    hf_bf16: dict = {}

    def transformers_bf16() -> dict:
        model = ctx.model("bf16").model
        with torch.inference_mode():
            got = model(torch.tensor([tokens], device=ctx.device)).logits[0].float()
        out = logit_error(got, ref["logits"])
        hf_bf16.update(out)
        return out

    run_cell(ctx, sec, "transformers bf16 forward (scale of bf16 rounding)", transformers_bf16)
    for precision in PRECISIONS:
        for graphed in (False, True):
            name = f"fast {precision} {'graphed' if graphed else 'eager'}"
            if precision not in ctx.held and graphed:
                skip(ctx, sec, name, f"no {precision} model was built in section 1")
                continue
            run_cell(ctx, sec, name, lambda p=precision, g=graphed: _fast(ctx, sec, p, g, tokens, ref, hf_bf16))
    ref.clear()
    free(ctx.device)


def _fast(ctx: Ctx, sec: Section, precision: str, graphed: bool, tokens, ref: dict, hf_bf16: dict) -> dict:
    dec = ctx.model(precision).fast_decoder
    if graphed:
        if dec.compiled is None or not dec.compiled.ready() or dec.compiled.batch != 1:
            return {"status": "skipped: no ready bucket-1 graph (section 1's compile did not finish)"}
        with counting_graph_steps(dec) as counts:
            got = teacher_forced(dec, tokens, ctx.seq(), ctx.device, sec)
    else:
        counts = {}
        with eager_only(dec):
            got = teacher_forced(dec, tokens, ctx.seq(), ctx.device, sec)
    out = {**logit_error(got, ref["logits"]), **counts}
    if out["max_abs_err"] != out["max_abs_err"] or out["max_abs_err"] == float("inf"):
        out["status"] = "fail: non-finite logits"
    elif graphed and (counts.get("fell_back") or not counts.get("graphed")):
        out["status"] = f"fail: {counts.get('fell_back')} steps fell back to the eager step"
    elif precision == "bf16" and hf_bf16.get("max_rel_err"):
        ratio = out["max_rel_err"] / hf_bf16["max_rel_err"]
        out["vs_transformers_bf16"] = ratio
        if ratio > BF16_ERROR_FACTOR:
            out["status"] = f"fail: {ratio:.1f}× transformers' own bf16 error (limit {BF16_ERROR_FACTOR:.0f}×)"
    return out
