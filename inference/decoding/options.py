"""What a generation is asked to do: sampling settings and decode options, shared by every strategy."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from ..errors import UnsupportedConfiguration

STRATEGIES = ("naive", "kv", "static", "speculative", "prompt-lookup", "fast")
# Also accepted in a request: "auto" (the target's own choice: the fast path where it runs, a server's own
# decoding) and "remote" (what a model on a server runs); the target resolves them (backend.Backend).
REQUEST_STRATEGIES = STRATEGIES + ("auto", "remote")


@dataclass
class SamplingSettings:
    """User sampling settings, overlaid on the model's own generation_config.

    ``None`` keeps the model's default. ``temperature == 0`` means greedy.
    """

    max_new_tokens: int = 256
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    repetition_penalty: Optional[float] = None
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    min_new_tokens: Optional[int] = None  # the speed lab fixes the output length (end-of-sequence suppressed)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


@dataclass
class DecodeOptions:
    strategy: str = "kv"
    num_draft_tokens: int = 5  # speculative: tokens the draft proposes per step
    draft_schedule: str = "constant"  # or "heuristic" (transformers grows/shrinks k by acceptance)
    lookup_tokens: int = 10  # prompt-lookup: tokens copied per match
    compile: Optional[bool] = None  # static and fast: None = on for CUDA, off for CPU
    # fast: take the prompt's already-computed pages from the prefix cache, and leave this reply's for later
    # turns. The speed lab turns it off to measure a fresh prompt.
    reuse_prefix: bool = True

    def __post_init__(self):
        if self.strategy not in REQUEST_STRATEGIES:
            raise UnsupportedConfiguration(
                f"Unknown strategy {self.strategy!r}.", f"Choose one of: {', '.join(STRATEGIES)}."
            )
        if self.draft_schedule not in ("constant", "heuristic"):
            raise UnsupportedConfiguration(
                f"Unknown draft schedule {self.draft_schedule!r}.", "Choose constant or heuristic."
            )
        if self.num_draft_tokens < 1 or self.lookup_tokens < 1:
            raise UnsupportedConfiguration("The number of draft tokens must be at least 1.")


def eos_token_ids(generation_config) -> list[int]:
    """The end-of-sequence ids of a GenerationConfig (one id, a list, or none), as a sorted list."""
    eos = generation_config.eos_token_id
    if eos is None:
        return []
    return sorted({int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])})
