"""Prediction before download vs measurement after, for the model browser (docs/models.md reports the numbers).

    python -m tests.model_browser_accuracy [--context 256] [--precisions bf16,fp32,q8,q4] [--quants F16,Q8_0,Q4_0]
        [--calibrate 3] [--replies 3]

Serves from the stand-in hub (tests/hub_server.py, on 127.0.0.1): the starter's folder as a safetensors
repository, GGUF files of the starter written with the ``gguf`` package (tests/gguf_helpers.py), and generated
configs of 7B/8B/14B shapes (memory only: their weights are never served). For each variant it predicts, as the
Find page does (this machine's target and speed model), downloads it, then loads it in the predicted
configuration in a fresh process (tests/memory_probe.py: load, a short greedy reply, peak RSS over both) and
prints one JSON line per variant: predicted and measured bytes, the error and the estimator's margin, the
predicted and measured decode tok/s. The starter's folder must be fetched (``redline models pull starter``).
``--calibrate N``: first N short replies of the starter at each of ``--precisions`` (in fresh processes, as a
user's first chats would), so the speed model's per-machine factors and the memory estimate's per-machine
correction (what the runtime of this install holds beyond the estimator's defaults) are learned before anything
is predicted
(``REDLINE_DATA_DIR`` holds them: point it at an empty folder for a run from the defaults). ``--strategy
predicted`` measures each variant in the strategy the Find page predicted (the fast path, as the app runs it)
rather than DecodeOptions' default (kv). ``--replies N``: each measured variant makes N replies in its process and
reports their median decode rate (one 32-token reply is a few hundred ms of a machine that drifts). ``--rounds N``:
every variant is measured once per round, the rounds one after another over all variants (A B C, A B C, …), and
each reports the median of its rounds (``measured_tok_s_each``): a slow minute of a shared machine then touches one
round of a variant, not its only measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {  # (layers, hidden, intermediate, heads, kv heads, vocab, parameters)
    "shapes/llama-2-7b": (32, 4096, 11008, 32, 32, 32000, 6_738_415_616),
    "shapes/llama-3-8b": (32, 4096, 14336, 32, 8, 128256, 8_030_261_248),
    "shapes/qwen-2.5-14b": (48, 5120, 13824, 40, 8, 152064, 14_770_033_664),
}


def config(layers, hidden, intermediate, heads, kv_heads, vocab) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def float32_copy(folder: Path, dest: Path) -> Path:
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).save_pretrained(str(dest))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (folder / name).is_file():
            shutil.copy(folder / name, dest / name)
    return dest


# What the probe's process holds when its weights start to load: the engine, and what a load imports before them
# (the architecture's module and safetensors' torch side: 177 MB more than the engine alone here, with torch
# 2.14.1's CUDA build), as the engine's own baseline is taken inside the load. Without them the browser's
# prediction was 224-267 MB under for the starter (bf16, Q8_0), near the 300 MB margin.
BASELINE = """
import psutil, torch, transformers, tokenizers
from redline.inference.engine import Engine
from redline.inference.loading import loader
import safetensors.torch, transformers.models.llama.modeling_llama
Engine("cpu")
print(psutil.Process().memory_info().rss)
"""


def fresh_process_rss(env: dict) -> int:
    """What a fresh process that has imported the engine holds before it loads anything."""
    out = subprocess.run(
        [sys.executable, "-c", BASELINE],
        cwd=ROOT,
        env=dict(env, PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")),
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--precisions", default="bf16,fp32,q8,q4")
    ap.add_argument("--quants", default="F16,Q8_0,Q4_0")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--calibrate", type=int, default=0, help="starter replies per precision before predicting")
    ap.add_argument(
        "--replies", type=int, default=1, help="replies per measured variant, in its one process: their median rate"
    )
    ap.add_argument("--rounds", type=int, default=1, help="measurements of each variant, interleaved: their median")
    ap.add_argument(
        "--strategy",
        choices=("kv", "predicted"),
        default="kv",
        help="the strategy each variant is measured in: kv (DecodeOptions' default, what the memory test has always "
        "checked) or predicted (what the Find page predicted, as the app would run it: usually fast)",
    )
    ap.add_argument(
        "--extra-gguf",
        action="append",
        default=[],
        help="a GGUF file to serve too, in the repository local/extra-GGUF (e.g. "
        "tools/accuracy/make_shaped_model.py's)",
    )
    args = ap.parse_args()

    from redline.inference.sources.starter import starter_folder

    starter = starter_folder()
    if not (starter / "config.json").is_file():
        print("The starter is not fetched: run `redline models pull starter` first.", file=sys.stderr)
        return 2
    probe_env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    probe_env["REDLINE_PROBE_RECORDS"] = "1"  # the calibration replies teach the memory correction, as a user's do
    for _ in range(args.calibrate):
        for precision in args.precisions.split(","):
            cmd = [sys.executable, "-m", "tests.memory_probe", str(starter), precision, str(args.new_tokens)]
            cmd += ["auto"] if args.strategy == "predicted" else []
            subprocess.run(cmd, cwd=ROOT, env=probe_env, capture_output=True, text=True, timeout=1200, check=True)
    work = Path(tempfile.mkdtemp(prefix="redline-browse-accuracy-"))
    try:
        return _run(args, starter, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the served copies, the hub cache and the converted GGUFs


def _run(args, starter: Path, work: Path) -> int:
    from gguf_helpers import write_llama_gguf
    from hub_server import FakeHub, Repo

    files = {p.name: p.read_bytes() for p in starter.iterdir() if p.is_file() and not p.name.startswith(".")}
    repos = {"starter/SmolLM2-135M": Repo(files=files, lfs={n for n in files if n.endswith(".safetensors")})}
    ggufs = {}
    f32 = float32_copy(starter, work / "starter-f32")  # the gguf package's writer reads numpy (no bfloat16)
    for q in args.quants.split(","):
        kinds = {"attn": q, "ffn": q} if q != "F16" else {}
        path = write_llama_gguf(f32, work / f"SmolLM2-135M.{q}.gguf", kinds)
        ggufs[path.name] = path.read_bytes()
    repos["starter/SmolLM2-135M-GGUF"] = Repo(files=ggufs, lfs=set(ggufs), sha="2" * 40)
    if args.extra_gguf:
        extra = {Path(f).name: Path(f).read_bytes() for f in args.extra_gguf}
        repos["local/extra-GGUF"] = Repo(files=extra, lfs=set(extra), sha="4" * 40)
    for rid, (*shape, params) in SHAPES.items():
        repos[rid] = Repo(
            files={"config.json": json.dumps(config(*shape)).encode(), "model.safetensors": b"\0"},
            sizes={"model.safetensors": 2 * params},
            sha="3" * 40,
        )
    with FakeHub(repos) as hub:
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(work / "hf"), HF_HUB_DISABLE_IMPLICIT_TOKEN="1")
        # What the probes convert (a GGUF's blocks, 0.1-2 GB each) goes to the work folder, not the user's models
        # folder: five runs had left 26 GB there. The rest of the cache (kernels, measurements) is the user's.
        env["REDLINE_MODELS_DIR"] = str(work / "models")
        env.pop("HF_HUB_OFFLINE", None)  # the stand-in hub is on 127.0.0.1 (a test run sets it offline)
        os.environ.update(env)
        os.environ.pop("HF_HUB_OFFLINE", None)
        from huggingface_hub import constants  # imported already: point the running process at the stand-in

        constants.ENDPOINT = hub.url
        constants.HUGGINGFACE_CO_URL_TEMPLATE = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
        constants.HF_HUB_CACHE = str(work / "hf")
        constants.HF_HUB_DISABLE_IMPLICIT_TOKEN = True
        constants.HF_HUB_OFFLINE = False
        from redline.inference import fetch_variant, machine_target, predict_repo, repo_variants

        target, speed, correction = machine_target("cpu")
        # The load runs in a fresh process (as `redline chat` would): its resident memory before the load is
        # the CPU baseline, as the window's own process is for the Find page.
        baseline = fresh_process_rss(env)
        measured = []  # (row, fetched variant, prediction): measured after all are fetched, in rounds
        for rid in repos:
            rv = repo_variants(rid, target.device, use_cache=False)
            preds = predict_repo(rv, args.context, "balanced", target, speed, correction, baseline)
            wanted = set(args.precisions.split(",")) if rv.kind == "safetensors" else set(args.quants.split(","))
            for v, p in zip(rv.variants, preds):
                if v.name not in wanted:
                    continue
                row = {
                    "repo": rid,
                    "variant": v.name,
                    "precision": p.precision,
                    "strategy": p.strategy,
                    "context": p.context,
                    "download_bytes": v.download_bytes,
                    "predicted_bytes": p.total_bytes,
                    "margin_bytes": p.margin_bytes,
                    "fit": p.fit,
                    "predicted_tok_s": round(p.tokens_per_s or 0, 1),
                    "header_bytes_read": v.header_bytes_read,
                    "baseline_bytes": baseline,
                }
                if rid.startswith("shapes/"):
                    print(json.dumps(row), flush=True)
                    continue
                got = fetch_variant(rv, v, p)
                measured.append((row, got, p))
        for _round in range(max(1, args.rounds)):
            for row, got, p in measured:
                row.setdefault("probes", []).append(_probe(args, env, got, p))
        for row, _got, p in measured:
            _summarise(row, p)
            print(json.dumps(row), flush=True)
    return 0


def _probe(args, env: dict, got, p) -> dict:
    """One measurement of a fetched variant in a fresh process (tests/memory_probe.py)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.memory_probe", got.model, got.precision, str(args.new_tokens)]
        + ([p.strategy] if args.strategy == "predicted" else []),
        cwd=ROOT,
        env=dict(
            env, PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), REDLINE_PROBE_REPLIES=str(args.replies)
        ),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if proc.returncode != 0:
        return {"probe_failed": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _summarise(row: dict, p) -> None:
    """The row's measured figures: memory from the first round (a fresh process each time: the same load), the
    decode rate the median of the rounds'."""
    probes = row.pop("probes")
    good = [m for m in probes if "probe_failed" not in m]  # (a probe's own "error" is its reply's, None if fine)
    if not good:
        row["error"] = probes[0]["probe_failed"]
        return
    m = good[0]
    row["measured_bytes"] = m["measured_bytes"]
    row["error_bytes"] = p.total_bytes - m["measured_bytes"]
    row["within_margin"] = abs(row["error_bytes"]) <= max(0.1 * m["measured_bytes"], 300e6)
    row["engine_predicted_bytes"] = m["predicted_bytes"]
    row["engine_baseline_bytes"] = m["baseline_bytes"]
    row["measured_strategy"] = m["strategy"]
    rates = [g["tokens_per_s"] for g in good if g["tokens_per_s"]]
    row["measured_tok_s_each"] = [round(r, 1) for r in rates]
    rate = statistics.median(rates) if rates else None
    row["measured_tok_s"] = round(rate or 0, 1)
    if rate:
        row["tok_s_error_pct"] = round(100 * (row["predicted_tok_s"] / rate - 1), 1)


if __name__ == "__main__":
    sys.exit(main())
