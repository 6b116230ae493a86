"""The server's own copy of the loaded model's tokenizer: the engine's belongs to its thread alone, and the server
builds prompts, counts them and gives the grammar its vocabulary on its own threads."""

from __future__ import annotations

import threading
from typing import Any

from ..generation.request import GenerationRequest, Prepared, prepare


class ServerTokenizers:
    """The server's own copy of the loaded model's tokenizer (the engine's is its thread's alone), used under a
    lock from the request threads: chat templates, prompt lengths, the grammar's vocabulary."""

    def __init__(self):
        self._lock = threading.Lock()
        self._for: Any = None
        self._tok: Any = None

    def get(self, target):
        with self._lock:
            if self._for is not target:
                # lazy: transformers loads on the engine's thread, never at import
                from transformers import AutoTokenizer

                self._tok = AutoTokenizer.from_pretrained(str(target.folder))
                self._for = target
            return self._tok

    def prepare(self, target, request: GenerationRequest, new_tokens_asked: bool) -> Prepared:
        """The request made ready as the engine would (``generation.request.prepare``), strictly: a conversation
        that does not fit is refused, not shortened."""
        tok = self.get(target)
        with self._lock:
            return prepare(tok, target.context_limit, request, strict=True, new_tokens_asked=new_tokens_asked)

    def encode(self, target, text: str) -> list[int]:
        tok = self.get(target)
        with self._lock:
            return list(tok(text, add_special_tokens=True)["input_ids"])
