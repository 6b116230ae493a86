"""What does the KV cache in 8 bits (``--kv q8``) cost in quality against bf16 KV, on the same weights?

Two figures, both through the fast path's own decode step (``FastDecoder.step``: on a CPU with the native kernels the
whole-step kernel, which reads the 8-bit rows as they are), one token at a time, so every token attends over a cache
written in the form under test:

- **perplexity** on a fixed text: the built-in ``long`` prompt set's documents (assets/prompts/long.json) laid end to
  end and cut to ``--ppl-tokens`` tokens (2,000 by default), teacher-forced; the relative difference q8 vs bf16;
- **next-token agreement** over ``--new-tokens`` greedy tokens (256 by default) for each prompt of the ``short``
  set: bf16 KV writes the greedy reply, then q8 KV reads the same prompt and reply (teacher-forced) and the share of
  positions where its greedy choice is the same token is the agreement. The length of the identical prefix of a
  free-running q8 reply is reported beside it (one flipped near-tie changes everything after it).

The two caches are two pools of one decoder (the same fused weights; ``dec.kv`` swapped), so nothing but the KV
form differs.

    python tools/accuracy/kv_q8_quality.py [--model starter] [--precision bf16] [--ppl-tokens 2000]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness (tools/ is not a package)
import harness  # noqa: E402


def fixed_text_ids(tokenizer, n: int) -> list[int]:
    """The ``long`` set's documents end to end, tokenised, cut to ``n`` tokens (the BOS where the model has one)."""
    from redline.inference import load_prompt_set

    text = "\n\n".join(p.messages[-1]["content"] for p in load_prompt_set("long").prompts)
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    if len(ids) < n:
        raise SystemExit(f"the fixed text has {len(ids)} tokens, fewer than --ppl-tokens {n}")
    return ids[:n]


def pools(dec):
    """A bf16 pool and a q8 pool shaped like the decoder's own."""
    from redline.inference.decoding.kv_cache import PagedKV

    kv = dec.kv
    made = {}
    for form in ("bf16", "q8"):
        made[form] = PagedKV(
            kv.layers,
            kv.kv_heads,
            kv.head_dim,
            kv.dtype if kv.form != "q8" else dec.act_dtype,
            kv.device,
            cleared=kv.cleared,
            form=form,
        )
    return made


def step_logits(dec, token: int, position: int):
    import torch

    return dec.step(torch.tensor([token], device=dec.device), [position], [0])[0].float()


def perplexity(dec, kv, ids: list[int]) -> float:
    """exp(mean NLL) of ids[1:] given what precedes each, one decode step per position."""
    import torch

    dec.kv = kv
    kv.release(0)
    nll = 0.0
    for i in range(len(ids) - 1):
        logits = step_logits(dec, ids[i], i)
        nll -= torch.log_softmax(logits, -1)[ids[i + 1]].item()
    kv.release(0)
    return math.exp(nll / (len(ids) - 1))


def greedy(dec, kv, prompt: list[int], n: int) -> list[int]:
    import torch

    dec.kv = kv
    kv.release(0)
    logits = dec.prefill(torch.tensor(prompt, device=dec.device), 0, seq=0)
    out = []
    for i in range(n):
        out.append(int(logits.argmax()))
        if i + 1 < n:
            logits = step_logits(dec, out[-1], len(prompt) + i)
    kv.release(0)
    return out


def forced_agreement(dec, kv, prompt: list[int], reply: list[int]) -> int:
    """Positions of ``reply`` whose greedy choice under ``kv`` is reply's own token, given the reply so far."""
    import torch

    dec.kv = kv
    kv.release(0)
    logits = dec.prefill(torch.tensor(prompt, device=dec.device), 0, seq=0)
    same = 0
    for i, tok in enumerate(reply):
        same += int(int(logits.argmax()) == tok)
        if i + 1 < len(reply):
            logits = step_logits(dec, tok, len(prompt) + i)
    kv.release(0)
    return same


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--precision", default="bf16", help="the weights (the same for both caches); default bf16")
    ap.add_argument("--ppl-tokens", type=int, default=2000)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=3, help="prompts of the short set for the agreement")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from redline.inference.decoding.fastpath import get_decoder

    load = harness.LoadAverage()
    engine = harness.load(args.model, args.precision)
    target = engine.target
    dec = get_decoder(target, args.ppl_tokens + args.new_tokens + 512)
    own_kv = dec.kv
    kv = pools(dec)
    tok = target.tokenizer
    started = time.perf_counter()
    with torch.inference_mode():
        ids = fixed_text_ids(tok, args.ppl_tokens)
        ppl = {form: perplexity(dec, kv[form], ids) for form in ("bf16", "q8")}
        agree = total = 0
        prefixes = []
        for i in range(args.prompts):
            prompt = harness.prompt_ids(tok, "short", i, new_tokens=args.new_tokens)
            reply = greedy(dec, kv["bf16"], prompt, args.new_tokens)
            agree += forced_agreement(dec, kv["q8"], prompt, reply)
            total += len(reply)
            free = greedy(dec, kv["q8"], prompt, args.new_tokens)
            prefixes.append(next((j for j, (a, b) in enumerate(zip(reply, free)) if a != b), len(reply)))
    dec.kv = own_kv
    result = {
        "model": args.model,
        "precision": target.precision.label(),
        "kernels": "native whole step" if dec.whole_step else ("native operators" if dec.native else "torch"),
        "ppl_tokens": len(ids),
        "ppl_bf16": ppl["bf16"],
        "ppl_q8": ppl["q8"],
        "ppl_change": ppl["q8"] / ppl["bf16"] - 1.0,
        "agreement": agree / max(1, total),
        "agreement_tokens": total,
        "identical_prefix": prefixes,
        "seconds": round(time.perf_counter() - started, 1),
        "load_average": str(load),
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"{args.model} {result['precision']} ({result['kernels']}): perplexity on {len(ids)} tokens "
            f"bf16 KV {ppl['bf16']:.4f}, q8 KV {ppl['q8']:.4f} ({100 * result['ppl_change']:+.2f} %); "
            f"next-token agreement {100 * result['agreement']:.1f} % of {total} greedy tokens "
            f"(identical free-running prefix: {', '.join(map(str, prefixes))} of {args.new_tokens}); "
            f"load average {load}; {result['seconds']} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
