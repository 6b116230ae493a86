"""What the measuring scripts share (tools/README.md): a model loaded the way the app loads it, the standard
prompts, greedy requests of an exact length, the load average, and interleaved rounds summed up as the median
of per-round ratios. Percentiles are the engine's one definition (``redline.inference.percentile``), so a
tool's p95 is the window's and the speed lab's.

tools/ is not a package: a script in tools/<kind>/ puts tools/ on its path first::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for harness
    import harness  # noqa: E402

Importing this module does not import torch (the engine loads it when a model loads), so ``--help`` stays quick.
"""

from __future__ import annotations

import os
import statistics
from typing import Any, Optional, Sequence

from redline.inference import percentile

__all__ = [
    "LoadAverage",
    "greedy",
    "load",
    "median_ratio",
    "new_engine",
    "order",
    "percentile",
    "prompt_ids",
    "random_ids",
    "ratio_text",
    "ratios",
    "reply",
    "request",
]


# -- loading ----------------------------------------------------------------------------------------------------


def new_engine(device: Optional[str] = None):
    """An Engine whose loads and replies do not teach this machine's memory estimator (a benchmark's loads are
    not the user's); the speed calibration still learns, as in the app, unless the script points
    ``REDLINE_DATA_DIR`` elsewhere."""
    from redline.inference import Engine

    engine = Engine() if device is None else Engine(device)
    engine.record_memory = False
    return engine


def load(model: str = "starter", precision: str = "auto", device: Optional[str] = None, engine=None):
    """``model`` (a name, folder, GGUF file) at ``precision``, loaded by the engine's one load job,
    ``Engine.load_all`` — what the engine service runs for the window, the wizard, the CLI and the server — into
    ``engine`` (else a new one, ``new_engine``). Returns the engine; the loaded model is ``engine.target``."""
    from redline.inference import LoadRequest

    engine = engine if engine is not None else new_engine(device)
    engine.load_all(LoadRequest(model, precision), lambda _progress: None)
    return engine


# -- prompts and requests ---------------------------------------------------------------------------------------


def prompt_ids(
    tokenizer, prompt_set: str = "short", index: int = 0, context: int = 4096, new_tokens: int = 64
) -> list[int]:
    """The token ids of a built-in prompt set's prompt (``redline bench``'s sets: short, long, …), through the
    model's chat template as a reply's prompt is built, leaving room for ``new_tokens`` in ``context``."""
    from redline.inference import load_prompt_set
    from redline.inference.decoding.prompt import build_prompt

    messages = load_prompt_set(prompt_set).prompts[index].messages
    return build_prompt(tokenizer, messages, context, new_tokens).input_ids


def random_ids(tokenizer, n: int, generator) -> list[int]:
    """``n`` token ids drawn from ``generator`` (a seeded ``torch.Generator``), above the special tokens: a prompt
    that shares no prefix with any other, of an exact length."""
    import torch

    return torch.randint(100, tokenizer.vocab_size, (n,), generator=generator).tolist()


def greedy(new_tokens: int):
    """Greedy sampling of exactly ``new_tokens`` tokens (no early end): every round does the same work."""
    from redline.inference import SamplingSettings

    return SamplingSettings(max_new_tokens=new_tokens, temperature=0, min_new_tokens=new_tokens)


def request(ids: Sequence[int], new_tokens: int, reuse_prefix: bool = False):
    """A greedy request of exactly ``new_tokens`` tokens on the fast path, for the batcher (``Batcher.add``,
    ``run_one``): not recorded in the memory history and, unless ``reuse_prefix``, sharing no cached prefix."""
    from redline.inference import DecodeOptions, GenerationRequest

    return GenerationRequest(
        input_ids=list(ids),
        sampling=greedy(new_tokens),
        options=DecodeOptions(strategy="fast", reuse_prefix=reuse_prefix),
        record=False,
    )


def reply(target, ids: Sequence[int], new_tokens: int, strategy: str = "fast", sampling=None):
    """One reply of the loaded model ``target`` (``engine.target``) to ``ids``: greedy, exactly ``new_tokens``
    tokens unless ``sampling`` says otherwise. The GenerationResult (tokens/s, TTFT, token ids)."""
    from redline.inference import DecodeOptions
    from redline.inference.generation.run import generate

    return generate(target, list(ids), sampling or greedy(new_tokens), DecodeOptions(strategy=strategy))


# -- rounds and what they add up to -----------------------------------------------------------------------------


def order(arms: Sequence[Any], round_index: int) -> list[Any]:
    """The arms in the order round ``round_index`` runs them: A B …, then … B A, so that no arm always runs
    first (a shared machine's drift, a warm cache, falls on each in turn)."""
    return list(arms) if round_index % 2 == 0 else list(arms)[::-1]


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round ratios a ÷ b (rounds where b is 0 or missing are left out)."""
    return [x / y for x, y in zip(a, b) if x is not None and y]


def median_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The median of the per-round ratios a ÷ b: what a same-run A/B quotes (a ratio of medians would pair one
    round's A with another round's B). NaN without a round to compare."""
    each = ratios(a, b)
    return statistics.median(each) if each else float("nan")


def ratio_text(a: Sequence[float], b: Sequence[float]) -> str:
    """``1.02× (1.01, 0.99, 1.04)``: the median of the per-round ratios a ÷ b, then each round's."""
    each = ratios(a, b)
    if not each:
        return "–"
    return f"{statistics.median(each):.2f}× ({', '.join(f'{x:.2f}' for x in each)})"


class LoadAverage:
    """The 1-minute load average when made, and ``str()`` of it against the load average now (``0.52 → 1.74``):
    every figure from a shared machine comes with it."""

    def __init__(self):
        self.before = _load()

    def now(self) -> Optional[float]:
        return _load()

    def __str__(self) -> str:
        return f"{_text(self.before)} → {_text(_load())}"


def _load() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return None


def _text(value: Optional[float]) -> str:
    return "unknown" if value is None else f"{value:.2f}"
