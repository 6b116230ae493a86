"""Log-probabilities of the new tokens, for a request that asks for them (the API's ``logprobs``/``top_logprobs``).

Which numbers: the log-softmax of the model's raw logits at each position, in fp32, before anything Redline or
transformers does to them (temperature, top-k/top-p, repetition or frequency penalties, ``logit_bias``, a grammar's
mask). That is what vLLM returns by default (``logprobs_mode="raw_logprobs"``) and what llama.cpp's server returns
(``post_sampling_probs`` off): the model's own belief, comparable across requests whatever their sampling, and
never ``-inf`` for a token a grammar masked. The token itself is drawn from the processed distribution.

The cost is paid only by a request that asks: one log-softmax and one top-k over the vocabulary on the device
per token, packed with the chosen id into one small tensor so the token's one read on the host reads them too
(no extra synchronisation). A request that does not ask runs none of this.
"""

from __future__ import annotations

import re
from collections import deque
from functools import lru_cache
from typing import Optional

MAX_TOP = 20  # most alternatives per token (OpenAI's limit for chat's top_logprobs)


def pack(logprobs, next_id, top: int):
    """One 1-D fp32 tensor on the device: the chosen id, its log-probability, then the ``top`` best log-probabilities
    and their ids (ids as fp32: exact below 2**24, beyond any vocabulary), read on the host in one transfer."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    chosen = next_id.reshape(1).to(logprobs.device)  # generate() streams its ids from the host
    parts = [chosen.to(torch.float32), logprobs.gather(0, chosen)]
    if top:
        values, ids = torch.topk(logprobs, min(top, logprobs.shape[-1]))
        parts += [values, ids.to(torch.float32)]
    return torch.cat(parts)


def distribution(logits):
    """The model's log-probabilities over the vocabulary at one position (``logits``: [vocab] or [1, vocab])."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    return torch.log_softmax(logits.reshape(-1).to(torch.float32), dim=-1)


def unpack(row: list[float]) -> tuple[int, float, list[tuple[int, float]]]:
    """``pack``'s values read on the host: (the chosen id, its log-probability, [(id, log-probability)] best first)."""
    k = (len(row) - 2) // 2
    return int(row[0]), row[1], [(int(i), v) for v, i in zip(row[2 : 2 + k], row[2 + k :])]


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (each byte a printable character), reversed: what byte-level BPE vocabularies
    (GPT-2, Llama 3, Qwen, SmolLM) spell their tokens in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # SentencePiece's byte fallback


def piece_bytes(tokenizer, token_id: int) -> bytes:
    """A token's own bytes, alone: a byte-level BPE token's bytes, a SentencePiece byte-fallback token's byte, a
    SentencePiece piece with its '▁' as a space; a special token's name."""
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    if piece is None:
        return b""
    if token_id in set(getattr(tokenizer, "all_special_ids", ()) or ()):
        return piece.encode("utf-8")
    match = _BYTE_PIECE.match(piece)
    if match:
        return bytes([int(match.group(1), 16)])
    table = _byte_decoder()
    if "▁" not in piece and all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    return piece.replace("▁", " ").encode("utf-8")


class Pieces:
    """The text of alternative tokens, per generation (a top-20 list repeats the same few tokens: each is looked up
    once). A partial UTF-8 character shows as ``\\xNN``, as OpenAI's API shows it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        found = self._text.get(token_id)
        if found is None:
            found = piece_bytes(self.tokenizer, token_id).decode("utf-8", errors="backslashreplace")
            self._text[token_id] = found
        return found


class RawLogits:
    """For transformers' generate(): a forward hook on the model that keeps, per forward pass, the log-probabilities
    of its last position (what generate() picks the next token from, before its processors), in order, so the
    streamer scores each token as it arrives (on Apple GPUs generate() streams a token one forward late: hence a
    queue, not the last one). One forward per token (naive, kv, static); speculative decoding verifies several tokens
    in one forward and is refused instead (``solo.run_solo``)."""

    def __init__(self, model):

        self._kept: deque = deque(maxlen=4)
        self._handle = model.register_forward_hook(self._keep)

    def _keep(self, module, args, output) -> None:
        logits = getattr(output, "logits", None)
        if logits is not None:
            self._kept.append(distribution(logits[0, -1, :]))

    def clear(self) -> None:
        """Forget what passes before generate() kept (a long prompt read ahead in chunks)."""
        self._kept.clear()

    def take(self) -> Optional[object]:
        return self._kept.popleft() if self._kept else None

    def remove(self) -> None:
        self._handle.remove()
