"""Reasoning models' tokenizers and templates for the tests, without a hub: the starter's tokenizer with each family's
markers added and a chat template in that family's style (Qwen3's from ``tools/accuracy/make_thinking_model.py``, a
harmony one in gpt-oss's shape, a Magistral one, a DeepSeek-R1 one), and a logits processor that makes a tiny random
model write a scripted reply, so the real decode loop streams exactly the tokens a test needs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_thinking_model", ROOT / "tools/accuracy/make_thinking_model.py")
make_thinking_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_thinking_model)

QWEN3_TEMPLATE = make_thinking_model.QWEN3_TEMPLATE
QWEN3_PREFILL_TEMPLATE = make_thinking_model.QWEN3_PREFILL_TEMPLATE
thinking_tokenizer = make_thinking_model.thinking_tokenizer

# DeepSeek-R1's shape: no switch in the template; the generation prompt pre-fills "<think>\n".
DEEPSEEK_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '<|im_start|>user\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)

# gpt-oss's harmony shape: the system message carries "Reasoning: <effort>" (the template's ``reasoning_effort``), an
# earlier assistant turn keeps only its final message, the generation prompt is "<|start|>assistant".
HARMONY_TEMPLATE = (
    "{{- '<|start|>system<|message|>You are a helpful assistant.\\nReasoning: ' "
    "+ (reasoning_effort | default('medium'))"
    " + '\\n\\n# Valid channels: analysis, commentary, final.<|end|>' }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{{- '<|start|>developer<|message|># Instructions\\n\\n' + message['content'] + '<|end|>' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}"
    "{%- else %}{{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)
# The same without the variable: an effort reaches such a template only as the system message's own line.
HARMONY_NO_EFFORT_TEMPLATE = HARMONY_TEMPLATE.replace("(reasoning_effort | default('medium'))", "'medium'")

MAGISTRAL_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- message['content'].split('[/THINK]')[-1] + '</s>' }}{%- endif %}"
    "{%- endfor %}"
)
HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")


def starter_tokenizer(starter_dir: Path, template: str):
    """The starter's tokenizer with ``template`` as its chat template (no reasoning markers added)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(starter_dir)
    tok.chat_template = template
    return tok


def harmony_tokenizer(starter_dir: Path, template: str = HARMONY_TEMPLATE):
    """The starter's tokenizer with harmony's markers as special tokens (as gpt-oss's are), ``<|return|>`` its end."""
    tok = starter_tokenizer(starter_dir, template)
    tok.add_special_tokens({"additional_special_tokens": list(HARMONY_MARKERS)})
    tok.eos_token = "<|return|>"
    return tok


def magistral_tokenizer(starter_dir: Path):
    from tokenizers import AddedToken

    tok = starter_tokenizer(starter_dir, MAGISTRAL_TEMPLATE)
    tok.add_tokens([AddedToken("[THINK]", special=True), AddedToken("[/THINK]", special=True)], special_tokens=True)
    return tok


class Script:
    """A logits processor that makes the model write ``ids`` (one per step), then whatever it wants: a tiny random
    model then streams a reply with exactly the tokens a test needs. Steps count from ``prompt_len`` or, without
    it, from the first step it sees; ``inner`` (the request's own processor, e.g. a grammar) sees each step first,
    so its state still advances."""

    def __init__(self, ids, inner=None, prompt_len=None):
        self.ids, self.inner, self.start = list(ids), inner, prompt_len

    def __call__(self, input_ids, scores):
        import torch

        if self.inner is not None:
            scores = self.inner(input_ids, scores)
        if self.start is None:
            self.start = input_ids.shape[-1]
        step = input_ids.shape[-1] - self.start
        if 0 <= step < len(self.ids):
            forced = torch.full_like(scores, -float("inf"))
            forced[..., self.ids[step]] = 0.0
            return forced
        return scores


def split_tokens(tok, text: str) -> list[int]:
    """``text``'s ids with every marker as its own token, as the model writes them."""
    return list(tok(text, add_special_tokens=False)["input_ids"])
