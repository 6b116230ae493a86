"""A real reasoning model for the tests, made here without a hub: the starter (SmolLM2-135M-Instruct), cut to its
first four layers and fine-tuned on CPU to answer in Qwen3's format — ``<think>`` and ``</think>`` added as tokens, a
Qwen3-style chat template that reads ``enable_thinking`` — and cached beside the starter (``models_dir()``), built
once per machine.

With thinking on it writes ``<think>\\n…\\n</think>\\n\\n`` and then its answer; with thinking off (the template
pre-fills an empty ``<think>\\n\\n</think>\\n\\n``, as Qwen3's does) it answers at once. What it thinks is formulaic
and its arithmetic is wrong (four layers, 40 steps): the tests need the format, written by a real model through a
real template with real tags as single tokens, not its answers. Four layers, because the whole starter took 60-100 s
a training step on this project's shared 2-core machine (load average 9-10); cut, a step took 9-23 s, the 40 steps
9.4 minutes, and the format was learned by step 30 (loss 14.2 -> 1.0).

    python tools/accuracy/make_thinking_model.py            # build (or find) it; prints its folder
    python tools/accuracy/make_thinking_model.py --force    # build it again
    python tools/accuracy/make_thinking_model.py --check    # and print a few greedy replies
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

FOLDER = "redline-thinking-starter-v1"
COMPLETE = ".redline-complete"
LAYERS = 4  # of the starter's 30, kept
STEPS = 40
BATCH = 8

# A Qwen3-style template: system, user and assistant turns in ChatML; an earlier assistant turn keeps only its answer
# (the text after ``</think>``, as Qwen3's template drops earlier thinking); the generation prompt opens the assistant
# turn and, with ``enable_thinking`` false, pre-fills a closed, empty thinking block.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# The same, as the later Qwen3 "thinking" templates (and DeepSeek-R1's) write it: the generation prompt pre-fills
# ``<think>\n``, so the reply holds only ``</think>``.
QWEN3_PREFILL_TEMPLATE = QWEN3_TEMPLATE.replace(
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}",
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}",
)


def thinking_tokenizer(starter: Path, template: str = QWEN3_TEMPLATE):
    """The starter's tokenizer with ``<think>`` and ``</think>`` added as single tokens (not special: Qwen3's are
    not, so a decode keeps them) and ``template`` as its chat template."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(starter)
    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    tok.chat_template = template
    return tok


# -- the training data: arithmetic and facts, each with a short thinking that restates and works it ---------------
FACTS = [
    ("What is the capital of France?", "the capital of France", "Paris is the capital of France.", "Paris."),
    ("What is the capital of Japan?", "the capital of Japan", "Tokyo is the capital of Japan.", "Tokyo."),
    ("What is the capital of Italy?", "the capital of Italy", "Rome is the capital of Italy.", "Rome."),
    ("What colour is the sky on a clear day?", "the colour of a clear sky", "A clear sky is blue.", "Blue."),
    ("How many legs does a spider have?", "a spider's legs", "A spider has eight legs.", "Eight."),
    ("What is the largest planet?", "the largest planet", "Jupiter is the largest planet.", "Jupiter."),
    ("Which animal says moo?", "the animal that says moo", "A cow says moo.", "A cow."),
    ("What do bees make?", "what bees make", "Bees make honey.", "Honey."),
]


def examples(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """(question, thinking, answer) triples."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.6:
            a, b = rng.randint(2, 49), rng.randint(2, 49)
            op = rng.choice(["+", "-"])
            value = a + b if op == "+" else a - b
            word = "plus" if op == "+" else "minus"
            q = rng.choice([f"What is {a} {op} {b}?", f"Compute {a} {word} {b}.", f"What is {a} {word} {b}?"])
            think = f"The user asks for {a} {word} {b}. {a} {op} {b} = {value}. So the answer is {value}."
            out.append((q, think, f"{a} {op} {b} = {value}."))
        else:
            q, topic, fact, answer = rng.choice(FACTS)
            out.append((q, f"The user asks about {topic}. {fact} I will answer briefly.", answer))
    return out


def encode(tok, question: str, thinking: str, answer: str, think_on: bool) -> tuple[list[int], list[int]]:
    """(ids, labels): the prompt rendered by the template (labels -100), then the reply the model must learn."""
    messages = [{"role": "user", "content": question}]
    prompt = tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, enable_thinking=think_on
    )["input_ids"]
    reply = f"<think>\n{thinking}\n</think>\n\n{answer}" if think_on else answer
    reply_ids = tok(reply, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    return list(prompt) + reply_ids, [-100] * len(prompt) + reply_ids


def build(dest: Path, starter: Path, steps: int = STEPS, seed: int = 0, log=print) -> Path:
    """Fine-tune the cut starter into ``dest`` (written to a temporary folder, moved into place when complete)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    tok = thinking_tokenizer(starter)
    model = AutoModelForCausalLM.from_pretrained(starter, dtype=torch.float32)
    model.model.layers = model.model.layers[:LAYERS]
    model.config.num_hidden_layers = LAYERS
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():  # the new tags start as the mean of the angle-bracket tokens' embeddings, not at random
        emb = model.get_input_embeddings().weight
        base = emb[tok("<", add_special_tokens=False)["input_ids"] + tok(">", add_special_tokens=False)["input_ids"]]
        for t in ("<think>", "</think>"):
            emb[tok.convert_tokens_to_ids(t)] = base.mean(0)
    model.train()
    data = examples(steps * BATCH, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
    start = time.perf_counter()
    for step in range(steps):
        chunk = data[step * BATCH : (step + 1) * BATCH]
        rows = [encode(tok, *ex, think_on=(i % 4 != 0)) for i, ex in enumerate(chunk)]
        width = max(len(ids) for ids, _ in rows)
        pad = tok.pad_token_id
        ids = torch.tensor([r[0] + [pad] * (width - len(r[0])) for r in rows])
        labels = torch.tensor([r[1] + [-100] * (width - len(r[1])) for r in rows])
        # Right-padded, so no mask is needed for the reply's positions; the output layer (49k tokens wide) only where
        # a reply's token is learned: most of a step's cost otherwise.
        hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
        target = labels[:, 1:]
        learned = target != -100
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[learned]).float(), target[learned])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % 10 == 0 or step == steps - 1:
            log(f"step {step + 1}/{steps}  loss {loss.item():.3f}  {time.perf_counter() - start:.0f} s")
    model.eval()
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".thinking-", dir=dest.parent))
    try:
        model.to(torch.bfloat16).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / COMPLETE).write_text(json.dumps({"from": "the starter", "steps": steps, "seed": seed}) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def thinking_model_folder() -> Path:
    from redline.inference.paths import models_dir

    return models_dir() / FOLDER


def ensure_thinking_model(steps: int = STEPS, force: bool = False, log=print) -> Path:
    """The cached thinking model's folder, built first if it is not there (the starter is fetched first if needed)."""
    from redline.inference.sources.starter import ensure_starter

    dest = thinking_model_folder()
    if (dest / COMPLETE).exists() and not force:
        return dest
    return build(dest, ensure_starter(), steps, log=log)


def check(folder: Path) -> None:
    """Greedy answers with thinking on and off, printed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    for think in (True, False):
        for q in ("What is 12 + 30?", "What is the capital of Japan?"):
            ids = tok.apply_chat_template(
                [{"role": "user", "content": q}],
                add_generation_prompt=True,
                return_tensors="pt",
                return_dict=True,
                enable_thinking=think,
            )
            out = model.generate(**ids, max_new_tokens=60, do_sample=False)
            text = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=False)
            print(f"thinking {'on ' if think else 'off'} {q!r} -> {text!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=STEPS, help=f"training steps of {BATCH} examples (default {STEPS})")
    ap.add_argument("--force", action="store_true", help="build it again even if it is cached")
    ap.add_argument("--check", action="store_true", help="print a few greedy answers afterwards")
    args = ap.parse_args(argv)
    folder = ensure_thinking_model(args.steps, args.force)
    print(folder)
    if args.check:
        check(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
