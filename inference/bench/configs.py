"""The speed lab's configurations: one row each, strategy × precision × draft/k × compile × thinking × the fast path's
KV form, and the text form ``kv:bf16, fast:q4, speculative:bf16+draft=starter@int8/k=5, fast:bf16+think=off,
fast:q8+kv=q8`` that the CLI and the panel's advanced field use."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Optional

from ..backends.remote import parse_server_spec
from ..cost import KV_FORMS
from ..decoding.options import STRATEGIES, DecodeOptions
from ..errors import UnsupportedConfiguration
from ..precision import PrecisionSpec, parse_precision, resolve_precision

_PRECISION_KEYS = ("keep", "skip", "compute", "dq", "threshold")
_OPTION_KEYS = ("draft", "k", "schedule", "lookup", "compile", "think", "kv")
THINK_VALUES = {"on": True, "off": False}  # a reasoning model's thinking; "default" is the model's own
# A list of configurations is split on commas that start a new "word:" or a bare strategy; other commas
# (``keep=lm_head,model.embed_tokens``) stay inside their configuration.
_CONFIG_SPLIT = re.compile(r",\s*(?=[A-Za-z][\w-]*:|(?:%s)(?:\+|,|$))" % "|".join(re.escape(s) for s in STRATEGIES))
# ``draft=starter@int8/k=5``: a slash starts an option only before a known key, so hub ids and paths
# (``HuggingFaceTB/SmolLM2-360M-Instruct``) keep their slashes.
_OPTION_SPLIT = re.compile(r"\+|/(?=(?:draft|k|schedule|lookup|think|kv)=|compile(?:=|\+|/|$))")


@dataclass(frozen=True)
class BenchConfig:
    """One row of the lab: strategy × precision × draft/k × compile × thinking."""

    strategy: str = "kv"
    precision: str = "auto"  # parse_precision text, or "auto" (bf16 where supported)
    draft: Optional[str] = None  # speculative: the draft model (same forms as --model)
    draft_precision: str = "auto"
    k: int = 5  # speculative: draft tokens per step
    schedule: str = "constant"
    lookup: int = 10  # prompt-lookup: tokens copied per match
    compile: Optional[bool] = None  # static: None = on for CUDA, off for CPU
    text: str = ""  # as the user wrote it; the row's label
    server: Optional[str] = None  # strategy "remote": the server's address, http://HOST:PORT/v1[#MODEL]
    # A reasoning model's thinking on (True) or off (False); None: the model's default. Rows that differ only here
    # compare the time to the first answer with thinking against without; a model that does not reason ignores it.
    thinking: Optional[bool] = None
    # The fast path's KV cache, "bf16" or "q8" (``cost.KV_FORMS``); None: the run's (``--kv``, the Settings). A
    # q8 row beside the same row in bf16 is compared with it for quality (``bench/kv_quality.py``).
    kv: Optional[str] = None

    @property
    def label(self) -> str:
        return self.text or format_config(self)

    @property
    def remote(self) -> bool:
        return self.strategy == "remote"

    def options(self) -> DecodeOptions:
        if self.remote:  # the server decodes as it does; nothing of ours to set
            return DecodeOptions(strategy="remote")
        return DecodeOptions(
            strategy=self.strategy,
            num_draft_tokens=self.k,
            draft_schedule=self.schedule,
            lookup_tokens=self.lookup,
            compile=self.compile,
            reuse_prefix=False,  # every sample reads its prompt: the lab measures a fresh prompt's TTFT
        )

    def precision_spec(self, device: str) -> PrecisionSpec:
        return resolve_precision(self.precision, device)

    def draft_precision_spec(self, device: str) -> PrecisionSpec:
        return resolve_precision(self.draft_precision, device)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_config(text: str) -> BenchConfig:
    """Parse ``strategy[:precision[+precision options]][+draft=M[@P]][/k=N][+schedule=S][+lookup=N][+compile]``."""
    raw = text.strip()
    if not raw:
        raise UnsupportedConfiguration("An empty configuration.", "Write e.g. kv:bf16.")
    if raw.lower().startswith("remote:"):  # a model on a server: remote:http://HOST:PORT/v1[#MODEL]
        server = raw.partition(":")[2].strip()
        parse_server_spec(server)  # raises with the form to use
        return BenchConfig(strategy="remote", precision="server", text=raw, server=server)
    strategy, colon, rest = raw.partition(":")
    if not colon:  # "kv" or "kv+compile"
        strategy, _, tail = raw.partition("+")
        rest = ("auto+" + tail) if tail else "auto"
    strategy = strategy.strip().lower()
    if strategy not in STRATEGIES:
        raise UnsupportedConfiguration(
            f"Unknown strategy {strategy!r} in {raw!r}.", f"Choose one of: {', '.join(STRATEGIES)}."
        )
    parts = [p.strip() for p in _OPTION_SPLIT.split(rest)]
    precision = parts[0].lower() or "auto"
    if "=" in precision:
        raise UnsupportedConfiguration(
            f"{raw!r}: the precision must come first after the colon.",
            "Write e.g. speculative:bf16+draft=starter@int8/k=5.",
        )
    prec_opts, kwargs = [], {}
    for part in parts[1:]:
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if key in _PRECISION_KEYS:
            prec_opts.append(part)
        elif key == "draft":
            model, _, dprec = value.partition("@")
            if not model:
                raise UnsupportedConfiguration(f"{raw!r}: draft= needs a model.", "Write e.g. draft=starter@int8.")
            kwargs["draft"] = model
            kwargs["draft_precision"] = dprec or "auto"
        elif key in ("k", "lookup"):
            try:
                kwargs[key] = int(value)
            except ValueError:
                raise UnsupportedConfiguration(f"{raw!r}: {key}= needs a whole number, not {value!r}.") from None
        elif key == "schedule":
            kwargs["schedule"] = value
        elif key == "compile":
            kwargs["compile"] = (value.lower() not in ("0", "false", "no", "off")) if eq else True
        elif key == "think":
            if value.strip().lower() not in THINK_VALUES:
                raise UnsupportedConfiguration(
                    f"{raw!r}: think= takes on or off, not {value!r}.", "Write e.g. fast:bf16+think=off."
                )
            kwargs["thinking"] = THINK_VALUES[value.strip().lower()]
        elif key == "kv":
            form = value.strip().lower()
            if form not in KV_FORMS:
                raise UnsupportedConfiguration(
                    f"{raw!r}: kv= takes {' or '.join(KV_FORMS)}, not {value!r}.", "Write e.g. fast:q8+kv=q8."
                )
            kwargs["kv"] = form
        else:
            raise UnsupportedConfiguration(
                f"Unknown option {key!r} in {raw!r}.",
                f"Known: {', '.join(_OPTION_KEYS)} and the precision options {', '.join(_PRECISION_KEYS)}.",
            )
    if prec_opts:
        precision = precision + "+" + "+".join(prec_opts)
    config = BenchConfig(strategy=strategy, precision=precision, text=raw, **kwargs)
    config.options()  # validates k, lookup and schedule now, with the same messages as chat
    if precision != "auto" and not precision.startswith("auto+"):
        parse_precision(precision)
    if config.draft and config.draft_precision != "auto":
        parse_precision(config.draft_precision)
    if config.kv is not None and strategy != "fast":
        raise UnsupportedConfiguration(
            f"{raw!r}: kv= sets the fast path's KV cache, which only fast rows use ({strategy} keeps transformers' "
            "cache).",
            "Write e.g. fast:q8+kv=q8.",
        )
    if strategy == "speculative" and not config.draft:
        raise UnsupportedConfiguration(
            f"{raw!r}: speculative decoding needs a draft model.",
            "Add +draft=MODEL, e.g. speculative:bf16+draft=starter@int8/k=5.",
        )
    return config


def parse_configs(text: str) -> list[BenchConfig]:
    configs = [parse_config(part) for part in _CONFIG_SPLIT.split(text.strip()) if part.strip()]
    if not configs:
        raise UnsupportedConfiguration("No configurations given.", "Write e.g. naive:fp32,kv:fp32.")
    return configs


def format_config(c: BenchConfig) -> str:
    if c.remote:
        return f"remote:{c.server}"
    text = f"{c.strategy}:{c.precision}"
    if c.draft:
        text += f"+draft={c.draft}@{c.draft_precision}/k={c.k}"
        if c.schedule != "constant":
            text += f"+schedule={c.schedule}"
    if c.strategy == "prompt-lookup" and c.lookup != 10:
        text += f"+lookup={c.lookup}"
    if c.compile is not None:
        text += "+compile" if c.compile else "+compile=0"
    if c.thinking is not None:
        text += "+think=on" if c.thinking else "+think=off"
    if c.kv is not None:
        text += f"+kv={c.kv}"
    return text
