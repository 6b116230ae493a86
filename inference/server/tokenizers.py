"""The server's own copy of the loaded model's tokenizer: the engine's belongs to its thread alone, and the server
builds prompts, counts them and gives the grammar its vocabulary on its own threads."""

from __future__ import annotations

import threading
from typing import Any

from ..generation.request import GenerationRequest, Prepared, prepare
from ..loading.vision import load_processor


class ServerTokenizers:
    """The server's own copy of the loaded model's tokenizer (the engine's is its thread's alone), used under a
    lock from the request threads: chat templates, prompt lengths, the grammar's vocabulary."""

    def __init__(self):
        self._lock = threading.Lock()
        self._for: Any = None
        self._tok: Any = None
        self._processor: Any = None  # a vision model's own processor (its images and their tokens), else None

    def get(self, target):
        with self._lock:
            if self._for is not target:
                if target.capabilities.vision:  # the processor's tokenizer is the model's (as at load)
                    self._processor = load_processor(target.folder, target.model.config)
                    self._tok = self._processor.tokenizer
                else:
                    # lazy: transformers loads on the engine's thread, never at import
                    from transformers import AutoTokenizer

                    self._processor = None
                    self._tok = AutoTokenizer.from_pretrained(str(target.folder))
                self._for = target
            return self._tok

    def prepare(self, target, request: GenerationRequest, new_tokens_asked: bool) -> Prepared:
        """The request made ready as the engine would (``generation.request.prepare``), strictly: a conversation
        that does not fit is refused, not shortened. A vision model's images go through its processor."""
        tok = self.get(target)
        with self._lock:
            return prepare(
                tok,
                target.context_limit,
                request,
                strict=True,
                new_tokens_asked=new_tokens_asked,
                processor=self._processor,
                model=target.name,
            )

    def encode(self, target, text: str) -> list[int]:
        tok = self.get(target)
        with self._lock:
            return list(tok(text, add_special_tokens=True)["input_ids"])
