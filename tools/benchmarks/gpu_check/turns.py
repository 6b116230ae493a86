"""Sections 3 and 6: a long prompt's time to first token and the next turn's through the prefix cache; a reply
streaming while the graphed step is captured."""

from __future__ import annotations

import time

from gpu_check.context import Ctx, run_cell
from gpu_check.measure import stream_while
from gpu_check.report import Section
from gpu_check.speed import PRECISIONS, reply_fn


def _model(ctx: Ctx):
    precision = next((p for p in PRECISIONS if p in ctx.held), "bf16")
    return precision, ctx.model(precision)


def section_turns(ctx: Ctx, sec: Section) -> None:
    """Turn 1: a fresh prompt of ``ttft_prompt`` tokens (nothing cached); turn 2: turn 1's prompt, its reply and
    ``turn_tokens`` new ones, through the engine's prefix cache at its default size; then, where that cache could
    not hold turn 1, again with room for it, so both what a user gets today and what the mechanism does show."""
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.generation.run import generate

    precision, loaded = _model(ctx)
    s = ctx.sizes
    options = DecodeOptions(strategy="fast", compile=False)
    greedy = SamplingSettings(max_new_tokens=32, temperature=0, min_new_tokens=32)
    batcher = loaded.batcher()
    per_token = batcher.kv_bytes_per_token()
    default_bytes = loaded.limits.prefix_cache_bytes

    replies: dict = {}  # a turn's reply ids, for the next turn's prompt (kept out of the report)

    def turn(ids, reuse: bool, key: str = "") -> dict:
        r = generate(loaded, ids, greedy, options, reuse_prefix=reuse)
        if r.finish_reason == "error":
            raise RuntimeError(r.error)
        replies[key] = r.token_ids
        return {
            "ttft_ms": r.ttft_ms,
            "prompt_tokens": len(ids),
            "cached_tokens": r.cached_tokens,
            "tokens_per_s": r.tokens_per_s,
        }

    def conversation(tag: str, seed: int) -> None:
        first = ctx.ids(s.ttft_prompt, seed)
        t1 = run_cell(ctx, sec, f"{precision} turn 1{tag}: {s.ttft_prompt} new tokens", lambda: turn(first, True, tag))
        reply = replies.get(tag)
        if t1["status"] != "ok" or reply is None:
            return
        second = first + reply + ctx.ids(s.turn_tokens, seed + 1)

        def turn2() -> dict:
            out = turn(second, True)
            if t1.get("ttft_ms") and out.get("ttft_ms"):
                out["vs_turn_1"] = out["ttft_ms"] / t1["ttft_ms"]
            cacheable = (len(first) + len(reply) - 1) // 64 * 64  # whole pages written by turn 1
            if out["cached_tokens"] < cacheable:
                out["status"] = f"fail: {out['cached_tokens']} of ~{cacheable} cacheable tokens came from the cache"
            return out

        run_cell(ctx, sec, f"{precision} turn 2{tag}: +{len(reply)} reply +{s.turn_tokens} new", turn2)

    try:
        run_cell(ctx, sec, "warm-up (a fresh prompt, not cached)", lambda: turn(ctx.ids(s.ttft_prompt, 900), False))
        conversation("", 901)
        needed = (s.ttft_prompt + 32 + s.turn_tokens + 64) * per_token
        sec.notes.append(
            f"The prefix cache's default size {default_bytes / 1e6:,.0f} MB holds {default_bytes // per_token:,} "
            f"tokens of this model ({per_token / 1e3:,.0f} KB of K/V a token); turn 1 writes "
            f"{needed / 1e6:,.0f} MB."
        )
        if needed > default_bytes:
            loaded.set_prefix_cache(int(2 * needed))
            try:
                conversation(f" (prefix cache {2 * needed / 1e6:,.0f} MB)", 951)
            finally:
                loaded.set_prefix_cache(default_bytes)
    finally:
        loaded.fast_decoder.kv.forget_cache()  # its pages free again: no later section grows the pool


def section_streaming(ctx: Ctx, sec: Section) -> None:
    """Section 1 streamed replies beside its first compile; its figures are reported here. Without them (section
    1 cut or failed first), a compile of its own is started with replies streaming beside it."""
    if ctx.stream is not None:
        row = dict(ctx.stream)
        ctx.report.add(sec, row)
        return
    precision, loaded = _model(ctx)
    dec = loaded.fast_decoder

    def own() -> dict:
        saved = dec.compiled
        dec.compiled = None
        started = time.perf_counter()
        compiled = dec.compile_in_background(1)
        try:
            out = stream_while(lambda: compiled.state == "compiling", reply_fn(ctx, loaded, 8000), sec, ctx.gap_ms)
        finally:
            if compiled.state != "ready" and saved is not None:
                compiled.wait(sec.left())
        out["compile_s"] = time.perf_counter() - started
        out["compile"] = compiled.status()
        if compiled.state == "compiling":
            ctx.background.append(f"section {sec.number}'s compile still running")
        return out

    run_cell(ctx, sec, f"{precision} replies during a bucket-1 compile", own)
