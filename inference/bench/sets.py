"""Ready-made sets of speed-lab configurations: the ladder of decoding optimisations, every precision, and
the user's presets. Each is a list of ``BenchConfig`` rows; the panel and ``redline bench --set`` use them.
``for_model`` keeps the rows the lab's model can run, as its backend's capabilities say (a model on a server runs
only as the server decodes: its own ``remote:URL`` row)."""

from __future__ import annotations

from typing import Iterable, Optional

from ..backends.local import LOCAL_STRATEGIES
from ..backends.remote import REMOTE_CAPABILITIES, is_server_url
from ..decoding.options import STRATEGIES
from ..precision import PRECISIONS
from .configs import BenchConfig, format_config, parse_config

READY_SETS = ("ladder", "every precision", "kv forms", "my presets")


def _row(text: str) -> BenchConfig:
    config = parse_config(text)
    return BenchConfig(**{**config.to_dict(), "text": ""})  # labels come from format_config, as the form writes


def ladder(
    device: str = "cpu", model: str = "starter", draft: Optional[str] = None, draft_precision: Optional[str] = None
) -> list[BenchConfig]:
    """naive → KV cache → quantised → speculative → static/compiled: one optimisation per step.

    On a CPU: fp32 is the exact reference (and torch's fastest dense kernel there), bf16 the usual default,
    then Redline's weight-only q8/q4 on the fast path, speculative decoding, and the static cache (not
    compiled: compiling on a CPU takes minutes). On CUDA the ladder is in bf16 and the static cache compiles
    (CUDA graphs). ``draft``: the draft for the speculative row (default: ``model`` itself, which shows what
    a draft that is not cheaper costs)."""
    draft = draft or model
    if device.startswith("cuda"):
        dprec = draft_precision or "q4"
        texts = [
            "naive:bf16",
            "kv:bf16",
            "kv:q8",
            "fast:bf16",
            "fast:q4",
            f"speculative:bf16+draft={draft}@{dprec}/k=5",
            "static:bf16+compile",
        ]
    else:
        dprec = draft_precision or "q8"
        texts = [
            "naive:fp32",
            "kv:fp32",
            "kv:bf16",
            "kv:q8",
            "fast:q8",
            "fast:q4",
            f"speculative:fp32+draft={draft}@{dprec}/k=5",
            "static:fp32",
        ]
    return [_row(t) for t in texts]


def every_precision(strategy: str = "kv") -> list[BenchConfig]:
    """One strategy in every precision Redline loads (bitsandbytes rows fail clearly where it is missing)."""
    if strategy not in STRATEGIES or strategy == "speculative":
        strategy = "kv"
    return [BenchConfig(strategy=strategy, precision=p) for p in PRECISIONS]


def kv_forms(device: str = "cpu") -> list[BenchConfig]:
    """The fast path with its KV cache in 16 bits and in 8 bits, side by side: what the 8 bits buy in speed and
    cost in quality (the q8 row's "q8 KV agrees" and "q8 KV ppl" columns compare it with the row above it). On a
    CPU in q8 and bf16 weights; on CUDA in bf16."""
    weights = ("bf16",) if device.startswith("cuda") else ("q8", "bf16")
    return [_row(f"fast:{w}+kv={kv}") for w in weights for kv in ("bf16", "q8")]


def from_presets(presets: Iterable) -> list[BenchConfig]:
    """One row per saved preset (``values``: the settings a preset keeps). ``auto`` stays ``auto`` (the
    device's default dtype); a preset's strategy ``auto`` runs as ``kv``."""
    rows = []
    for p in presets:
        v = getattr(p, "values", p)
        strategy = v.get("strategy") or "kv"
        if strategy not in STRATEGIES:
            strategy = "kv"
        draft = v.get("draft_model") if strategy == "speculative" else None
        if strategy == "speculative" and not draft:
            strategy = "kv"
        rows.append(
            BenchConfig(
                strategy=strategy,
                precision=v.get("precision") or "auto",
                draft=draft,
                draft_precision=(v.get("draft_precision") or "auto") if draft else "auto",
                k=int(v.get("num_draft_tokens") or 5),
            )
        )
    return rows


def strategies_for(model: str) -> tuple[str, ...]:
    """The strategies the backend that would run ``model`` (a ``--model`` text) takes, its
    ``Capabilities.strategies``, known from the text alone: nothing loads or connects."""
    return REMOTE_CAPABILITIES.strategies if is_server_url(model) else LOCAL_STRATEGIES


def for_model(configs: Iterable[BenchConfig], model: str) -> list[BenchConfig]:
    """The rows of ``configs`` the lab can run with ``model`` as its model: a ``remote:URL`` row runs on its own
    server whatever the model; any other row runs on the model, so only if its backend takes the row's strategy.
    When none is left and the model is on a server, the one row it runs: ``remote:MODEL``."""
    strategies = strategies_for(model)
    kept = [c for c in configs if c.remote or c.strategy in strategies]
    if not kept and is_server_url(model):
        kept = [_row(f"remote:{model}")]
    return kept


def configs_text(configs: list[BenchConfig]) -> str:
    """The advanced field's text for a list of rows."""
    return ",".join(c.label for c in configs)


__all__ = [
    "READY_SETS",
    "configs_text",
    "every_precision",
    "for_model",
    "format_config",
    "from_presets",
    "kv_forms",
    "ladder",
    "strategies_for",
]
