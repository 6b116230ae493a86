"""Every CUDA path of Redline in one run, with the figures to judge it: ``make gpu-check`` (or ``--dry-run``).

    python tools/gpu_check.py [--out DIR] [--tokens 64] [--budget 420] [--no-big] [--dry-run]

On a CUDA machine: a starter-shaped model (SmolLM2-135M's config, random weights) in each precision (fp32 as
the reference, fp16, bf16, int8, nf4, q8, q4) × strategy (kv, static compiled, fast, fast with CUDA graphs,
speculative), and a Llama-3-8B-shaped model with random weights in bf16 and q4 where memory allows. For each
cell: decode tokens/s, % of the card's bandwidth roofline (bytes read per token ÷ measured bandwidth), TTFT,
predicted vs measured memory (the estimator's CUDA terms), NVML's reading of this process, device memory left
after unloading, and greedy agreement with the fp32 reference (the first new token where they differ).
Random weights are enough: speed, memory, graph capture and agreement between paths do not need trained ones.

``--dry-run`` exercises the same code on the CPU with a tiny model and a few tokens (CUDA-only cells are
reported as skipped): ``make test`` runs it, so the script cannot rot between GPU sessions.

Writes ``gpu-check.md``, ``gpu-check.json`` and ``gpu-check.log`` to ``--out`` ($OUT on the device machine).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

STRATEGIES = ("kv", "static", "fast", "fast+graphs", "speculative")
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "nf4", "q8", "q4")
BIG_CONFIG = Path(__file__).resolve().parents[1] / "tests" / "data" / "llama-3-8b-config.json"

# What `make test` checks of the CUDA path without a GPU (tests/test_fake_cuda.py, under torch's fake tensors on a
# fake cuda device: every tensor of the weights, KV cache and sampling on the device, every operator's tensors on
# one device): a path and the precisions it runs in there. The compiled step's eager fallback is the eager decode
# step (decode_graph), run in every precision by the other two rows; its row checks CompiledStep's switching.
FAKE_CUDA_COVERED = {
    "fast-eager": ("fp32", "fp16", "bf16", "q8", "q4"),  # FastDecoder: a prefill, a second chunk, decode steps
    "fast-batched": ("fp32", "fp16", "bf16", "q8", "q4"),  # the Batcher: 3 sequences, penalties, sampling, prefix
    "fast-compiled-fallback": ("bf16",),  # compiling (not ready yet), then ready but needing a recompile
}

# What fake tensors cannot reach, so only this script on a GPU checks it: each path, why, and the cells of the
# table above that run it.
PLAN = (
    {
        "path": "cuda-graphs",
        "why": "compiling the fast step (Inductor's CUDA code, mode reduce-overhead's graph capture) needs the device",
        "cells": "fast+graphs in fp32, fp16, bf16, q8, q4",
    },
    {
        "path": "static-compiled",
        "why": "transformers' static cache compiled for CUDA (CompileConfig) needs the device",
        "cells": "static in every precision",
    },
    {
        "path": "seeded-sampling",
        "why": "a seeded request's own generator, torch.Generator(device='cuda'), initialises the CUDA runtime",
        "cells": "none yet: run a seeded fast reply by hand (redline chat --seed 1 --temperature 0.8)",
    },
    {
        "path": "bitsandbytes",
        "why": "int8/nf4 layers run bitsandbytes' CUDA kernels, and its loader quantises on the device",
        "cells": "kv and speculative in int8 and nf4",
    },
    {
        "path": "speculative",
        "why": "assisted generation's shapes follow how many draft tokens were accepted (values, which fake tensors "
        "lack); it runs on transformers' generate(), not the fast path",
        "cells": "speculative in every precision",
    },
    {
        "path": "int4-packing",
        "why": "torch's int4 tiles (_convert_weight_to_int4pack, _weight_int4pack_mm) need an sm80+ GPU; fake "
        "tensors check their shapes and devices only",
        "cells": "q4 in every strategy",
    },
    {
        "path": "loading",
        "why": "from_pretrained with device_map='cuda' and its memory warm-up query the device (the fake-CUDA tests "
        "move a host load onto the fake device instead)",
        "cells": "every cell (each loads through Engine.load)",
    },
    {
        "path": "memory-figures",
        "why": "torch.cuda's memory statistics, mem_get_info and NVML read the device (answered with zeros there)",
        "cells": "every cell's predicted / measured / NVML / after-unload columns",
    },
)


def log(out: Path, text: str) -> None:
    print(text, flush=True)
    with (out / "gpu-check.log").open("a", encoding="utf-8") as fh:
        fh.write(text + "\n")


def word_tokenizer(vocab: int):
    """A tokenizer that can spell every id of a ``vocab``-row model (random weights emit any of them)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t2", pad_token="t2", unk_token="t0")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return fast


def build_model(folder: Path, config: dict, device: str, save_weights: bool):
    """A random-weight model of ``config``: saved whole (so the real loader runs), or kept in memory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures", "transformers_version")})
    folder.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(folder)
    word_tokenizer(cfg.vocab_size).save_pretrained(folder)
    torch.manual_seed(0)
    with torch.device(device if not save_weights else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.eval()
    if save_weights:
        model.save_pretrained(folder, safe_serialization=True)
        del model
        return None
    return model


def wrap_in_memory(model, folder: Path, precision: str, device: str):
    """A LoadedModel around a model built in memory (the 8B shape: too big to write to disk and read back)."""
    import torch

    from redline.inference.loading.loader import LoadedModel
    from redline.inference.loading.precision import parse_precision
    from redline.inference.loading.weight_only import quantize_model
    from redline.inference.sources.resolve import resolve

    spec = parse_precision(precision)
    started = time.perf_counter()
    if precision in ("q8", "q4"):
        quantize_model(model, 8 if precision == "q8" else 4, torch.bfloat16, device=device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    mem = torch.cuda.memory_allocated() if device.startswith("cuda") else 0
    tok = word_tokenizer(model.config.vocab_size)
    return LoadedModel(model, tok, resolve(str(folder)), spec, device, folder, time.perf_counter() - started, mem, mem)


def device_memory(device: str) -> dict:
    from redline.inference.memory.measured import snapshot

    out = {}
    try:
        snap = snapshot(device)
        out = {k: v for k, v in vars(snap).items() if isinstance(v, (int, float, str)) or v is None}
    except Exception as exc:  # NVML missing or failing: say so, never guess
        out["error"] = f"{type(exc).__name__}: {exc}"
    if device.startswith("cuda"):
        import torch

        out["torch_reserved"] = int(torch.cuda.memory_reserved())
        out["torch_allocated"] = int(torch.cuda.memory_allocated())
    return out


def run_cell(engine, prompt: list[int], strategy: str, tokens: int, reference) -> dict:
    import torch

    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.hardware.bandwidth import bandwidth, bytes_read_per_token

    options = DecodeOptions(
        strategy="fast" if strategy.startswith("fast") else strategy,
        compile=True if strategy in ("static", "fast+graphs") else (False if strategy == "fast" else None),
        num_draft_tokens=4,
    )
    sampling = SamplingSettings(max_new_tokens=tokens, temperature=0, min_new_tokens=tokens)
    if strategy == "fast+graphs":  # compile first (in its background thread), then measure the compiled step
        engine.generate_ids(prompt, SamplingSettings(max_new_tokens=2, temperature=0), options)
        dec = engine.target.fast_decoder
        if dec is not None and dec.compiled is not None and not dec.compiled.wait(400):
            raise RuntimeError(f"the compiled step did not become ready: {dec.compiled.status()}")
    engine.generate_ids(prompt, SamplingSettings(max_new_tokens=4, temperature=0), options)  # warm-up
    if engine.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    result = engine.generate_ids(prompt, sampling, options)
    if result.finish_reason == "error":
        raise RuntimeError(result.error)
    per_token = bytes_read_per_token(engine.target, options.strategy, len(prompt) + tokens // 2)
    bw = bandwidth(engine.device)
    cell = {
        "tokens_per_s": result.tokens_per_s,
        "ttft_ms": result.ttft_ms,
        "p50_ms": result.p50_ms,
        "roofline_pct": 100 * result.tokens_per_s * per_token / bw if result.tokens_per_s and bw else None,
        "bytes_per_token": per_token,
        "bandwidth": bw,
        "strategy_ran": result.strategy,
        "notes": [n for n in result.notes if not n.startswith("Traceback")],
        "predicted_bytes": result.predicted_memory_bytes,
        "measured_bytes": result.measured_memory_bytes,
        "memory_error_pct": result.memory_error_pct,
        "memory": device_memory(engine.device),
        "token_ids": result.token_ids,
    }
    if strategy == "fast+graphs":
        dec = engine.target.fast_decoder
        cell["compile"] = dec.compiled.status() if dec is not None and dec.compiled is not None else None
    if reference is not None:
        diff = next((i for i, (a, b) in enumerate(zip(reference, result.token_ids)) if a != b), None)
        cell["agrees_with_fp32"] = diff is None and len(reference) == len(result.token_ids)
        cell["first_difference"] = diff
    return cell


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--budget", type=float, default=420, help="seconds for the cells (the whole run stays under 8 min)")
    ap.add_argument("--no-big", action="store_true", help="skip the Llama-3-8B-shaped model")
    ap.add_argument("--dry-run", action="store_true", help="the same code on the CPU, tiny model, few tokens")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-check.log").write_text("")
    started = time.perf_counter()

    import torch

    from redline.inference.engine import Engine
    from redline.inference.loading.precision import parse_precision
    from redline.inference.memory.model_shapes import STARTER_CONFIG

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        log(args.out, "No CUDA device: nothing to check here (use --dry-run to exercise the script on the CPU).")
        return 2
    device = "cuda" if cuda else "cpu"
    info = {
        "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dry_run": args.dry_run,
        "python": platform.python_version(),
    }
    log(
        args.out, f"gpu-check on {info['device']} (torch {info['torch']}, CUDA {info['cuda']}), dry run: {args.dry_run}"
    )
    tokens = 8 if args.dry_run else args.tokens
    work = Path(tempfile.mkdtemp(prefix="redline-gpu-check-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # the built models; the report goes to --out
    shapes = []
    starter = dict(STARTER_CONFIG)
    if args.dry_run:  # a few layers of the starter's shape: the same code, in seconds
        starter.update(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=512,
        )
    shapes.append(("starter-shaped", starter, True))
    if not args.no_big and not args.dry_run:
        shapes.append(("llama-3-8b-shaped", json.loads(BIG_CONFIG.read_text()), False))
    rows = []
    precisions = PRECISIONS if not args.dry_run else ("fp32", "q4")
    for label, config, on_disk in shapes:
        folder = work / label
        model = build_model(folder, config, device, on_disk)
        prompt = list(range(3, 3 + 24))
        reference = None
        cells_here = precisions if on_disk else ("bf16", "q4")
        for precision in cells_here:
            for strategy in STRATEGIES if on_disk else ("kv", "fast", "fast+graphs"):
                if time.perf_counter() - started > args.budget:
                    rows.append(
                        {"model": label, "precision": precision, "strategy": strategy, "status": "skipped: time budget"}
                    )
                    continue
                if strategy == "fast+graphs" and not cuda:
                    rows.append(
                        {
                            "model": label,
                            "precision": precision,
                            "strategy": strategy,
                            "status": "skipped: CUDA graphs need a GPU",
                        }
                    )
                    continue
                if precision in ("int8", "nf4") and strategy.startswith("fast"):
                    continue  # bitsandbytes layers run through transformers; the kv row covers them
                row = {"model": label, "precision": precision, "strategy": strategy}
                engine = Engine(device)
                engine.record_memory = False
                try:
                    t0 = time.perf_counter()
                    if on_disk:
                        engine.load(str(folder), parse_precision(precision))
                    else:
                        engine.target = wrap_in_memory(model, folder, precision, device)
                    if strategy == "speculative":
                        engine.load_draft(str(folder), parse_precision(precision))
                    row["load_s"] = round(time.perf_counter() - t0, 2)
                    row.update(run_cell(engine, prompt, strategy, tokens, reference))
                    row["status"] = "ok"
                    if precision == "fp32" and strategy == "kv":
                        reference = row["token_ids"]
                except Exception as exc:
                    row["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    log(args.out, traceback.format_exc(limit=6))
                finally:
                    if on_disk:
                        engine.unload()
                    else:
                        engine.target = None
                    row["after_unload"] = device_memory(device)
                    row.pop("token_ids", None)
                rows.append(row)
                log(
                    args.out,
                    f"{label} {precision} {strategy}: {row['status']}"
                    + (f", {row['tokens_per_s']:.1f} tok/s" if row.get("tokens_per_s") else ""),
                )
        if not on_disk and model is not None:
            del model
            if cuda:
                torch.cuda.empty_cache()
    write_report(args.out, info, rows, time.perf_counter() - started)
    ok = all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows)
    return 0 if ok else 1


def _num(v, fmt: str = "{:.1f}") -> str:
    return "" if v is None else fmt.format(v)


def _mb(v) -> str:
    return _num(None if v is None else v / 1e6, "{:,.0f}")


def write_report(out: Path, info: dict, rows: list[dict], seconds: float) -> None:
    (out / "gpu-check.json").write_text(
        json.dumps({"info": info, "rows": rows, "seconds": seconds}, indent=1, default=str)
    )
    lines = [
        f"# gpu-check: {info['device']}",
        "",
        f"torch {info['torch']}, CUDA {info['cuda']}, Python {info['python']}; {seconds:.0f} s"
        + ("; dry run on the CPU" if info["dry_run"] else ""),
        "",
        "| model | precision | strategy | status | tok/s | % roofline | TTFT ms | predicted MB | measured MB | "
        "NVML process MB | reserved after unload MB | agrees with fp32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mem, after = r.get("memory", {}), r.get("after_unload", {})
        agree = r.get("agrees_with_fp32")
        agree_text = "" if agree is None else ("yes" if agree else f"from token {r.get('first_difference')}")
        cells = [
            r["model"],
            r["precision"],
            r["strategy"],
            r["status"],
            _num(r.get("tokens_per_s")),
            _num(r.get("roofline_pct"), "{:.0f}"),
            _num(r.get("ttft_ms"), "{:.0f}"),
            _mb(r.get("predicted_bytes")),
            _mb(r.get("measured_bytes")),
            _mb(mem.get("process_bytes")),
            _mb(after.get("torch_reserved")),
            agree_text,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## What only this run checks",
        "",
        "The fake-CUDA tests (`make test`, tests/test_fake_cuda.py) run "
        + "; ".join(f"{path} in {', '.join(p)}" for path, p in FAKE_CUDA_COVERED.items())
        + " without a GPU. Fake tensors cannot reach these paths:",
        "",
    ]
    lines += [f"- **{row['path']}**: {row['why']} (cells: {row['cells']})" for row in PLAN]
    (out / "gpu-check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
