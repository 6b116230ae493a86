"""What the engine's target is: a model loaded here (``loading.loader.LoadedModel``) or a model on another
server (``remote.client.RemoteModel``). Both implement ``Backend``, so the engine, the service, the server,
the CLI and the speed lab ask the target what it can do (``capabilities``) and tell it to ``generate``,
instead of asking which kind it is."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Capabilities:
    strategies: tuple[str, ...]  # what a request's ``options.strategy`` may be ("auto": the first)
    token_ids: bool  # takes prompts as token ids (it has a tokenizer here), not only chat messages
    draft: bool  # takes a draft model loaded here (speculative decoding)
    measured_here: bool  # its memory and speed are this machine's: the per-machine corrections learn from it
    servable: bool  # `redline serve` can put it behind the OpenAI-compatible API
    # How several replies run at once: "batch" (the fast path's batcher decodes them together; others one at a
    # time on the engine's thread) or "threads" (each reply is a request to a server, several in flight).
    concurrency: str


class Backend(ABC):
    """A model replies can be asked of. Attributes both kinds have: ``name``, ``device``, ``context_limit``,
    ``precision`` (with ``label()``), ``notes``, ``load_seconds``, ``memory_bytes``, ``predicted_bytes``."""

    kind: str = "local"

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    def resolve_strategy(self, strategy: str) -> str:
        """The strategy a request will run with: ``auto`` is this target's first; one it cannot run is refused."""
        strategies = self.capabilities.strategies
        if strategy == "auto":
            return strategies[0]
        if strategy not in strategies:
            from redline.inference.errors import UnsupportedConfiguration

            raise UnsupportedConfiguration(
                f"{self.name} cannot run the {strategy!r} strategy.", f"Choose one of: {', '.join(strategies)}."
            )
        return strategy

    @abstractmethod
    def reload_spec(self) -> tuple[str, Any, Optional[str]]:
        """What loads this target again: (the ``--model`` text, its precision or None, an API key or None)."""

    def answers_to(self, spec: str) -> bool:
        """Whether ``spec`` (a ``--model`` text) names this target (at whatever precision)."""
        return False

    def batchable(self, request) -> bool:
        """Whether ``request`` joins the batch of replies decoded together (the fast path)."""
        return False

    @abstractmethod
    def generate(self, request, sink, submitted: Optional[float] = None) -> Any:
        """Run ``request`` to its end, reporting to ``sink`` (events; ``sink.cancelled``); returns its
        GenerationResult. A run-time failure ends the result with ``finish_reason="error"``."""

    @abstractmethod
    def release(self) -> None:
        """Let go of everything it holds (memory, connections)."""
