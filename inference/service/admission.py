"""Whether a request can run now, and how: the one place that says so (vLLM v1's scheduler in miniature).

It holds the limits (requests waiting, replies running together on this machine or in flight to a server) and
decides, from what the engine's target (a backend) reports, for the request at the head of the queue:
- **how** it runs: "batch" (with the running replies: the fast path's batch, or a server's replies in flight),
  or "exclusive" (the engine to itself: a load, the speed lab, a strategy that cannot batch). The strategy is
  resolved first (``auto`` becomes what the target runs), so the decision is about what will really run;
- **whether it can never run** (no new tokens; prompt ids that fill the context; more KV cache than the memory
  free holds): refused at once, with what to change;
- **whether it can join now**, and if not, why it waits (a full batch, memory for the KV cache).
The scheduler (``scheduler.py``) only acts on these answers.
"""

from __future__ import annotations

from typing import Any, Optional

from ..errors import Busy, RedlineError, Refused
from ..generation.request import GenerationRequest, prepare
from ..units import format_bytes

MAX_ACTIVE = 4  # replies decoded together on this machine
MAX_IN_FLIGHT = 16  # replies in flight to one server at once (the server batches them)
MAX_QUEUED = 32  # requests waiting beyond those


class Admission:
    def __init__(
        self,
        max_active: int = MAX_ACTIVE,
        max_queued: int = MAX_QUEUED,
        max_in_flight: int = MAX_IN_FLIGHT,
        kv_budget_tokens: Optional[int] = None,
    ):
        self.max_active, self.max_queued, self.max_in_flight = max_active, max_queued, max_in_flight
        # The KV positions the batch may hold (None: from the memory free when the model's batch starts). Handed
        # to each model loaded (``BatchLimits``), whose KV pool is sized by it; checked here.
        self.kv_budget_tokens = kv_budget_tokens

    # -- on submission ------------------------------------------------------------------------------
    def check_queue(self, waiting: int) -> None:
        if waiting >= self.max_queued:
            raise Busy(f"The engine is busy: {waiting} requests are waiting already.", "Try again in a moment.")

    @staticmethod
    def check_request(request: GenerationRequest, target: Any) -> None:
        """Refuse at once what can never run: no new tokens, or prompt ids that fill the model's context (a chat's
        messages are made ready on the engine's thread, where the tokenizer is)."""
        if request.sampling.max_new_tokens < 1:
            raise Refused("The request asks for no new tokens.", "Ask for at least one.")
        if target is None or request.input_ids is None or request.prepared is not None:
            return
        try:
            prepare(None, target.context_limit, request)
        except RedlineError as exc:
            raise Refused(exc.message, exc.hint) from None

    # -- at the head of the queue -------------------------------------------------------------------
    @staticmethod
    def how(request: Optional[GenerationRequest], target: Any) -> str:
        """ "batch" or "exclusive" for a job (``request`` None: not a generation), its strategy resolved."""
        if request is None or target is None:
            return "exclusive"
        return "batch" if target.batchable(request) else "exclusive"

    def limit(self, target: Any) -> int:
        """How many replies may run together on ``target``."""
        return self.max_in_flight if target.capabilities.concurrency == "threads" else self.max_active

    def has_room(self, target: Any) -> bool:
        return target.running() < self.limit(target)

    def full_reason(self, target: Any) -> str:
        if target.capabilities.concurrency == "threads":
            return f"waiting: {self.limit(target)} replies are in flight to the server (the most at once)"
        return f"waiting: {self.limit(target)} replies are being written (the most at once)"

    def admit(self, request: GenerationRequest, target: Any) -> Any:
        """The request's prompt and limits, worked out by the target; refused if its KV cache can never fit."""
        prepared = target.admit(request)
        room = target.kv_room()
        tokens = getattr(prepared, "tokens", 0)
        if room is not None and tokens > room.budget_tokens:
            raise Refused(
                f"This request needs up to {tokens:,} tokens of KV cache "
                f"({format_bytes(tokens * room.bytes_per_token)}); the memory free for it holds "
                f"{room.budget_tokens:,} ({format_bytes(room.budget_tokens * room.bytes_per_token)}).",
                "Ask for fewer new tokens, shorten the prompt, or free memory.",
            )
        return prepared

    def wait_reason(self, prepared: Any, target: Any) -> Optional[str]:
        """None if the admitted request can join the running ones now, else why it waits."""
        if not self.has_room(target):
            return self.full_reason(target)
        room = target.kv_room()
        tokens = getattr(prepared, "tokens", 0)
        if room is not None and room.reserved_tokens + tokens > room.budget_tokens:
            return "waiting for memory for the KV cache"  # the running requests' KV memory comes back as they end
        return None
