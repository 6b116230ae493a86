"""What the engine's target is: a model loaded here (``backends/local.py``: ``LoadedModel``) or a model on another
server (``backends/remote.py``: ``RemoteModel``). Both implement ``Backend``, so the engine, the service, the server,
the CLI and the speed lab ask the target what it can do (``capabilities``) and tell it what to run, instead of asking
which kind it is or reading its insides.

Two ways a generation runs on a backend:
- **with others** (``admit`` → ``add`` → ``step``): replies that run together, stepped by the service's one
  scheduler thread (the fast path's batch on a local model; on a server, each reply a request in flight). Whether
  one may join now is the service's admission object's call (``service/admission.py``), from what the backend
  reports: ``running()`` and ``kv_room()``;
- **alone** (``generate``): everything else, with the engine to itself.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import UnsupportedConfiguration


@dataclass(frozen=True)
class Capabilities:
    strategies: tuple[str, ...]  # what a request's ``options.strategy`` may be ("auto": resolve_strategy says which)
    token_ids: bool  # takes prompts as token ids (it has a tokenizer here), not only chat messages
    draft: bool  # takes a draft model loaded here (speculative decoding)
    measured_here: bool  # its memory and speed are this machine's: the per-machine corrections learn from it
    servable: bool  # `redline serve` can put it behind the OpenAI-compatible API
    # How several replies run at once: "batch" (decoded together in one step, on the engine's thread; requests
    # that cannot batch run alone) or "threads" (each reply is a request to a server, several in flight).
    concurrency: str
    # Sees images: a message's Image attachments reach the model (False: the window, the CLI and the server say
    # "this model cannot see images" before sending; the engine refuses such a request the same way).
    vision: bool = False


@dataclass(frozen=True)
class KvRoom:
    """The KV cache a backend's replies share: the positions it may hold across them (the budget, from the memory
    free when it started) and the positions the running replies may still take (each up to its limit)."""

    budget_tokens: int
    reserved_tokens: int
    bytes_per_token: int


@dataclass(frozen=True)
class KvCacheHeld:
    """What the prefix cache keeps now: computed pages no reply uses, for later prompts that start the same way."""

    cached_bytes: int
    cached_tokens: int
    limit_bytes: int  # what it may keep (the setting, within the KV budget); 0: off


class Backend(ABC):
    """A model replies can be asked of. Attributes both kinds have: ``name``, ``device``, ``context_limit``,
    ``precision`` (with ``label()``), ``notes``, ``load_seconds``, ``memory_bytes``, ``predicted_bytes``,
    ``draft`` (a LoadedModel or None)."""

    draft: Any = None
    predicted_bytes: Optional[int] = None

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    def resolve_strategy(self, strategy: str) -> str:
        """The strategy a request will run with: ``auto`` is this target's best; one it cannot run is refused."""
        strategies = self.capabilities.strategies
        if strategy == "auto":
            return strategies[0]
        if strategy not in strategies:
            raise UnsupportedConfiguration(
                f"{self.name} cannot run the {strategy!r} strategy.", f"Choose one of: {', '.join(strategies)}."
            )
        return strategy

    def resolved(self, request):
        """``request`` with the strategy it will run with (``resolve_strategy``), ready for admission or a run."""
        strategy = self.resolve_strategy(request.options.strategy)
        if strategy == request.options.strategy:
            return request
        return dataclasses.replace(request, options=dataclasses.replace(request.options, strategy=strategy))

    @abstractmethod
    def reload_spec(self) -> tuple[str, Any, Optional[str]]:
        """What loads this target again: (the ``--model`` text, its precision or None, an API key or None)."""

    def answers_to(self, spec: str) -> bool:
        """Whether ``spec`` (a ``--model`` text) names this target (at whatever precision)."""
        return False

    def names(self) -> set[str]:
        """The names a client may give this model by (the server's ``model`` field)."""
        return {self.name}

    @property
    def where(self) -> str:
        """Where its replies run, for a line under a reply ("sent to …"); empty for this machine."""
        return ""

    # -- replies that run together -------------------------------------------------------------------
    def batchable(self, request) -> bool:
        """Whether ``request`` (its strategy resolved) runs with others (``add``) rather than alone."""
        return False

    def admit(self, request) -> Any:
        """``request``'s prompt and limits, worked out now; raises (a RedlineError) if it can never run here."""
        raise UnsupportedConfiguration(f"{self.name} runs its replies one at a time.")

    def add(self, sink, request, submitted: float, prepared: Any) -> None:
        """Start ``request`` beside the running ones (admission said it fits)."""
        raise UnsupportedConfiguration(f"{self.name} runs its replies one at a time.")

    def step(self) -> None:
        """Advance the running replies by one step."""
        return None  # nothing runs together here

    def running(self) -> int:
        """How many replies run together now."""
        return 0

    def kv_room(self) -> Optional[KvRoom]:
        """The KV cache its running replies share, or None where this machine holds none for them."""
        return None

    def cancel_running(self, note: str) -> None:
        """Stop the running replies at their next step, each ending as cancelled with ``note``."""
        return None  # nothing runs together here

    def fail_running(self, error: BaseException) -> None:
        """End the running replies with ``error`` (a fault of the scheduler itself)."""
        return None  # nothing runs together here

    # -- alone ---------------------------------------------------------------------------------------
    @abstractmethod
    def generate(self, request, sink, submitted: Optional[float] = None) -> Any:
        """Run ``request`` to its end, reporting to ``sink`` (events; ``sink.cancelled``); returns its
        GenerationResult. A run-time failure ends the result with ``finish_reason="error"``."""

    # -- what it holds -------------------------------------------------------------------------------
    def cached_kv(self) -> Optional[KvCacheHeld]:
        """Its prefix cache now (read from any thread: a few integers), or None where it keeps none."""
        return None

    def kv_form(self) -> Optional[str]:
        """The form its fast path's KV cache was built in ("bf16" or "q8", ``cost.KV_FORMS``), or None where no
        such cache is built (a decoder keeps the form it was built with until the model is loaded again)."""
        return None

    def set_prefix_cache(self, nbytes: int) -> None:
        """Let its prefix cache keep up to ``nbytes`` (0: off); pages beyond go now."""
        return None  # it keeps none

    def persist_prefix_cache(self) -> int:
        """Write its prefix cache to disk (an unload, a quit): the pages written."""
        return 0

    def compile_status(self) -> Optional[dict]:
        """Its compiled step: compiling in the background, ready, or failed (with why); None without one."""
        return None

    def vocab_size(self) -> Optional[int]:
        """Its vocabulary's size where known here (a token id at or beyond it names no token)."""
        return None

    # -- what a prompt costs on it (an attachment's chip, before sending) ---------------------------------------
    def text_tokenizer(self) -> Any:
        """Its tokenizer for text where it is here (a vision model's processor's), or None (a server's model)."""
        return None

    def shape(self) -> Any:
        """Its ``estimate.estimator.ModelShape`` where read here (the speed model's and the KV cost's input)."""
        return None

    def embed(self, inputs) -> tuple[list[list[float]], int]:
        """Each input's embedding (its last hidden states mean-pooled, length 1) and the tokens read in all."""
        raise UnsupportedConfiguration(
            f"{self.name} cannot make embeddings here.", "Ask the server it runs on for its /v1/embeddings."
        )

    def image_tokens(self, width: int, height: int) -> Optional[int]:
        """The prompt tokens an image of this size becomes on it; None where it cannot see or it is not known."""
        return None

    @abstractmethod
    def release(self) -> None:
        """Let go of everything it holds (memory, connections)."""
