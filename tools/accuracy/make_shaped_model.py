"""A model of a given shape with random weights and the starter's tokenizer and chat template: a transformers
folder and its GGUF files (F16 written with the ``gguf`` package the way llama.cpp's converter lays them out,
then Q8_0 and Q4_0 requantised by llama.cpp itself where llama-cpp-python is given). For same-run comparisons
with llama.cpp, and for the estimator's and the speed model's accuracy on models of the size users have.

    python tools/accuracy/make_shaped_model.py OUT_DIR [--shape llama-1b] [--llama-python PATH/TO/venv/bin/python]

Shapes: ``llama-1b`` (Llama-3.2-1B's: 16 layers, hidden 2048, MLP 8192, 32 heads, 8 KV heads, head 64; the
starter's 49,152-token vocabulary, a tied head), ``starter`` (the starter's own shape, random weights).
Speed, memory and agreement between code paths do not need trained weights; answers do.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SHAPES = {
    "llama-1b": dict(
        num_hidden_layers=16,
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "starter": {},
}
QUANTISE = """
import sys, llama_cpp
src, dst, kind = sys.argv[1:4]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + kind)
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
sys.exit(rc)
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="llama-1b", choices=sorted(SHAPES))
    ap.add_argument("--llama-python", help="an interpreter with llama-cpp-python, to requantise to Q8_0 and Q4_0")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from redline.inference import starter_folder

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from gguf_helpers import write_llama_gguf

    starter = starter_folder()
    if starter is None:
        raise SystemExit("The starter is not fetched yet: run `redline models pull starter` first.")
    base = json.loads((Path(starter) / "config.json").read_text())
    base.update(SHAPES[args.shape])
    for key in ("architectures", "torch_dtype", "dtype", "transformers_version"):
        base.pop(key, None)
    cfg = LlamaConfig(**base)
    folder = args.out / f"{args.shape}-random"
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg).to(torch.float16)  # numpy (the GGUF writer) reads fp16, not bf16
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(starter).save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    f16 = write_llama_gguf(folder, args.out / f"{args.shape}.F16.gguf", {})
    print(f"{folder} ({params / 1e9:.2f} B parameters)\n{f16}")
    if args.llama_python:
        for kind in ("Q8_0", "Q4_0"):
            dst = args.out / f"{args.shape}.{kind}.gguf"
            subprocess.run([args.llama_python, "-c", QUANTISE, str(f16), str(dst), kind], check=True)
            print(dst)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
