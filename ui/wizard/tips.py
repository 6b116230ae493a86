"""The wizard's tooltips: one sentence per term, for people who do not know the terms yet."""

from __future__ import annotations

# One sentence per term, shown as tooltips: the wizard is for people who do not know them yet.
TIPS = {
    "starter": "SmolLM2-135M-Instruct, a small real chat model that runs on any CPU (about 100 MB to fetch once).",
    "recent": "A model you loaded before.",
    "folder": "A folder holding a Hugging Face model: config.json, *.safetensors weights and the tokenizer.",
    "gguf": "A .gguf file from llama.cpp, LM Studio or Ollama; Redline converts it once and caches the result.",
    "as_file": "As the file is: the GGUF's quantised layers kept at their own 4 or 8 bits (the smallest load).",
    "hub": "A Hugging Face hub id such as HuggingFaceTB/SmolLM2-360M-Instruct: the local cache first, else a download.",
    "browse_folder": "Choose the folder that holds config.json.",
    "browse_gguf": "Choose a .gguf file.",
    "this_machine": "Plan with the memory free on this machine right now (other programs' use subtracted).",
    "other_gpu": "Plan for a card you do not have (yet): its whole memory, as if nothing else used it.",
    "gpu_list": "Consumer GPUs with their memory; half precision is fp16 on cards without bf16.",
    "context": "How many tokens (roughly ¾ of a word each) the model sees at once; the KV cache grows with it.",
    "batch": "Replies generated at once; chat uses 1, and memory for the KV cache grows with each.",
    "table": (
        "The predicted peak memory per precision: weights, the KV cache (what the model remembers of the "
        "conversation), activations, runtime overhead and the load's temporary copies."
    ),
    "bf16": "bf16: 2 bytes per weight, the precision most models are trained in; the default where supported.",
    "fp16": "fp16: 2 bytes per weight; for GPUs without bf16 (slow on most CPUs).",
    "fp32": "fp32: 4 bytes per weight; exact, but twice the memory of bf16 for no gain in chat.",
    "int8": "int8 (bitsandbytes LLM.int8): 1 byte per weight, half of bf16; usually slower than bf16 at batch 1.",
    "nf4": (
        "nf4 (bitsandbytes 4-bit NormalFloat): about half a byte per weight, a quarter of bf16, "
        "at a small cost in quality."
    ),
    "fp4": "fp4 (bitsandbytes 4-bit float): the memory of nf4 at lower quality; nf4 is the better 4-bit choice.",
    "q8": "q8: weights in int8, blocks of 32 with a scale each (about 1.06 bytes per weight), fast at batch 1.",
    "q4": "q4: weights in int4, blocks of 32 with a scale and minimum (about 0.63 bytes per weight), the fastest.",
    "fix": "Apply the one change that makes the model fit.",
    "kv": (
        "How the KV cache (what the model keeps of the conversation) is stored: 16-bit, or 8-bit at about half "
        "the memory a token and a faster read at long contexts, for a very small change in the replies (the fast "
        "path keeps it; other strategies keep 16 bits)."
    ),
    "priority": (
        "What the suggested row favours. Quality first: the highest precision that fits. Balanced: the fastest "
        "that fits with 8-bit weights or more. Speed first: the fastest that fits, 4-bit included. Speeds are "
        "predicted from this machine's measured bandwidth and corrected by what it measured before."
    ),
    "measure_acceptance": (
        "Load the model and the draft (if not loaded yet) and run a few dozen tokens through speculative "
        "decoding, to measure how many draft tokens the model accepts here."
    ),
    "none": "One token per step with the KV cache, in the strategy the previous page found fastest (kv or fast).",
    "speculative": (
        "A small draft model proposes several tokens and the big model checks them all in one step; "
        "the reply is the same, often faster."
    ),
    "lookup": (
        "Prompt lookup: candidate tokens copied from text already in the conversation, checked like a "
        "draft's; no second model, fast when the reply quotes the input."
    ),
    "draft_picker": "The draft model: a much smaller model, ideally of the same family (same tokenizer).",
    "draft_precision": "The draft's precision; its weights and KV cache add to the memory total.",
    "draft_tokens": "Tokens the draft proposes per step: 5 is a good start; 4–6 is usually best.",
    "cancel": "Stop loading (Esc); nothing stays half-loaded.",
    "retry": "Try loading again.",
    "preset_name": "The preset's name, as listed under Model → Presets and in Settings.",
    "save_preset": (
        "Save model, precision, context, strategy, draft and sampling as a preset, a small JSON file in "
        "Redline's config folder."
    ),
}


def with_tip(widget, key: str):
    widget.setToolTip(TIPS[key])
    return widget
