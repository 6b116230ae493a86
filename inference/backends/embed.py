"""Embeddings from a loaded model (the server's ``/v1/embeddings``): each input's last hidden states, mean-pooled
over its tokens and scaled to length 1, as OpenAI's embeddings are (so a dot product is the cosine similarity).
A causal language model is not an embedding model: these vectors are what the model has, no more, and the docs say so
(docs/server.md)."""

from __future__ import annotations

from typing import Sequence, Union

from ..errors import ContextExceeded, UnsupportedConfiguration

MAX_INPUTS = 256  # inputs one request may embed


def mean_pooled(model, tokenizer, inputs: Sequence[Union[str, Sequence[int]]], device: str, limit: int):
    """(vectors, tokens): each input's embedding as a list of floats, and the tokens read in all."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    if not inputs:
        raise UnsupportedConfiguration("There is nothing to embed.", "Send at least one input.")
    if len(inputs) > MAX_INPUTS:
        raise UnsupportedConfiguration(f"{len(inputs)} inputs in one request.", f"Send at most {MAX_INPUTS}.")
    vectors, total = [], 0
    for i, item in enumerate(inputs):
        ids = list(item) if not isinstance(item, str) else tokenizer(item, add_special_tokens=True)["input_ids"]
        if not ids:
            raise UnsupportedConfiguration(f"input[{i}] is empty.", "Send text (or token ids) to embed.")
        if len(ids) > limit:
            raise ContextExceeded(
                f"input[{i}] has {len(ids)} tokens, more than the model's context of {limit}.",
                "Split it.",
                "input",
                len(ids),
                limit,
                0,
            )
        total += len(ids)
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids], device=device), output_hidden_states=True, use_cache=False)
            hidden = out.hidden_states[-1][0].float()  # (tokens, hidden): the last layer, after its norm
            pooled = hidden.mean(dim=0)
            pooled = pooled / pooled.norm().clamp_min(1e-12)
        vectors.append(pooled.cpu().tolist())
    return vectors, total
