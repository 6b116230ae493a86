"""Section 8, only with the time left: a starter-shaped model (SmolLM2-135M's config, random weights) saved and
loaded through ``Engine.load`` in each precision × strategy — the paths sections 1-7 do not take: the real
``from_pretrained`` load on the device, bitsandbytes' int8/nf4, speculative decoding, transformers' static
cache compiled, a seeded sampled reply — most valuable first, each cell against the section's deadline. Greedy
agreement with the fp32 row is given as the first token that differs, for what it is worth on random weights
(near-ties flip; section 4's logit error is the measure)."""

from __future__ import annotations

import time

from gpu_check.context import Ctx, run_cell, skip
from gpu_check.measure import sync
from gpu_check.report import Section

# Most valuable first: the reference, the fast path in the precisions users pick, then what only this section runs.
CELLS = (
    ("fp32", "kv"),
    ("bf16", "fast+graphs"),
    ("q4", "fast+graphs"),
    ("bf16", "fast"),
    ("q8", "fast"),
    ("q4", "fast"),
    ("bf16", "seeded"),
    ("int8", "kv"),
    ("nf4", "kv"),
    ("bf16", "static"),
    ("bf16", "speculative"),
    ("q8", "fast+graphs"),
    ("fp16", "fast"),
    ("fp16", "kv"),
    ("q4", "speculative"),
    ("nf4", "speculative"),
)
DRY_CELLS = (("fp32", "kv"), ("q4", "fast"), ("bf16", "fast+graphs"), ("bf16", "seeded"))


def starter_config(dry: bool) -> dict:
    from redline.inference.estimate.model_shapes import STARTER_CONFIG

    config = dict(STARTER_CONFIG)
    if dry:  # a few layers of the starter's shape: the same code, in seconds
        config.update(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=512,
        )
    return config


def section_matrix(ctx: Ctx, sec: Section) -> None:
    import torch
    from transformers import LlamaForCausalLM

    from gpu_check.models import llama_config, write_folder

    ctx.drop()
    folder = ctx.work / "starter-shaped"
    config = starter_config(ctx.dry)
    write_folder(folder, config)
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(config)).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    prompt = list(range(3, 3 + 24))
    reference: dict = {}
    for precision, strategy in DRY_CELLS if ctx.dry else CELLS:
        name = f"{precision} {strategy}"
        if strategy == "fast+graphs" and not ctx.cuda:
            skip(ctx, sec, name, "CUDA graphs need a GPU (the dry run compiles in section 1, with an eager backend)")
            continue
        run_cell(ctx, sec, name, lambda p=precision, s=strategy: _cell(ctx, sec, folder, prompt, p, s, reference))


def _cell(ctx: Ctx, sec: Section, folder, prompt, precision: str, strategy: str, reference: dict) -> dict:
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.engine import Engine
    from redline.inference.generation.run import generate
    from redline.inference.precision import parse_precision

    tokens = 8 if ctx.dry else 64
    engine = Engine(ctx.device)
    engine.record_memory = False
    out: dict = {}
    try:
        t0 = time.perf_counter()
        engine.load(str(folder), parse_precision(precision))
        if strategy == "speculative":
            engine.load_draft(str(folder), parse_precision(precision))
        out["load_s"] = time.perf_counter() - t0
        target = engine.target
        base = "fast" if strategy in ("fast", "fast+graphs", "seeded") else strategy
        compile_ = {"static": True, "fast+graphs": True, "fast": False, "seeded": False}.get(strategy)
        options = DecodeOptions(strategy=base, compile=compile_)
        if strategy == "seeded":
            sampling = SamplingSettings(max_new_tokens=tokens, temperature=0.8, seed=1, min_new_tokens=tokens)
        else:
            sampling = SamplingSettings(max_new_tokens=tokens, temperature=0, min_new_tokens=tokens)
        if strategy == "fast+graphs":  # compile first (in its background thread), then measure the compiled step
            generate(target, prompt, SamplingSettings(max_new_tokens=2, temperature=0), options)
            dec = target.fast_decoder
            if dec is not None and dec.compiled is not None and not dec.compiled.wait(sec.left()):
                return {"status": f"cut: the compiled step was not ready in time ({dec.compiled.status()})"}
        sec.check(f"warming up {precision} {strategy}")
        generate(target, prompt, SamplingSettings(max_new_tokens=4, temperature=0), options)
        sync(ctx.device)
        result = generate(target, prompt, sampling, options)
        if result.finish_reason == "error":
            raise RuntimeError(result.error)
        out.update(
            tokens_per_s=result.tokens_per_s,
            ttft_ms=result.ttft_ms,
            ran=result.strategy,
            predicted_mb=None if result.predicted_memory_bytes is None else result.predicted_memory_bytes / 1e6,
            measured_mb=None if result.measured_memory_bytes is None else result.measured_memory_bytes / 1e6,
        )
        if strategy == "fast+graphs":
            dec = target.fast_decoder
            out["compile"] = dec.compiled.status() if dec is not None and dec.compiled is not None else None
        if precision == "fp32" and strategy == "kv":
            reference["ids"] = result.token_ids
        elif "ids" in reference and strategy != "seeded":
            ref = reference["ids"]
            diff = next((i for i, (a, b) in enumerate(zip(ref, result.token_ids)) if a != b), None)
            out["greedy_same_as_fp32_until"] = "all" if diff is None else diff
        return out
    finally:
        engine.unload()
