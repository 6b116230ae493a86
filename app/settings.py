"""User settings: one dataclass, one JSON file in the platform config directory.

A settings file that cannot be read is moved aside (``settings.json.corrupt-<time>``)
rather than overwritten, so nothing the user typed is lost; defaults are used and
the caller is told, so the window can say so.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Optional

from ..inference import DEFAULT_PRIORITY, KV_FORMS, PRIORITIES, REASONING_EFFORTS, STRATEGIES, Thinking
from .private_files import config_dir, write_private

# Changing any of these means the model (or draft) has to be loaded again.
RELOAD_FIELDS = ("model", "precision", "draft_model", "draft_precision", "kv_cache")
THEMES = ("system", "light", "dark")  # the window's theme: follow the desktop, or one of its two
AUTO = "auto"  # precision and strategy: chosen when the model loads (inference.resolve_auto), by ``priority``


@dataclass(frozen=True)
class Settings:
    model: Optional[str] = None  # None: first start, offer the starter
    precision: str = AUTO  # auto: the fastest that fits for ``priority``, resolved at load
    strategy: str = AUTO  # auto: the fastest for the precision (kv, fast, or static on CUDA), resolved at load
    priority: str = DEFAULT_PRIORITY  # what auto favours: quality, balanced (≥ 8-bit weights) or speed
    draft_model: Optional[str] = None
    draft_precision: str = "auto"
    num_draft_tokens: int = 5
    context_length: Optional[int] = None  # None: the model's own
    max_new_tokens: int = 512
    temperature: Optional[float] = None  # None: the model's generation config; 0 = greedy
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    repetition_penalty: Optional[float] = None
    seed: Optional[int] = None
    # A reasoning model's thinking (docs/chat.md#reasoning-models): "auto" (the model's own default), "on" or "off";
    # its effort where the model has levels ("auto" or one of REASONING_EFFORTS); at most this many thinking tokens
    # before the answer is forced (0: no limit). A model that does not reason ignores them.
    thinking: str = AUTO
    reasoning_effort: str = AUTO
    thinking_budget: int = 0
    # The engine service (read at start): replies decoded together at most, and requests that may wait.
    max_active_replies: int = 4
    max_queued_requests: int = 32
    # What the prefix cache may keep of a conversation's earlier turns (bytes of KV cache no reply uses, within the
    # KV budget), so the next turn reads only its new message; 0 turns it off. Applied at once, and at each load.
    prefix_cache_bytes: int = 256_000_000
    # The fast path's KV cache: "bf16" (the model's float dtype) or "q8" (8 bits, a scale per token and head: about
    # half the memory; docs/performance.md). Taken at each load (a change reloads the model).
    kv_cache: str = "bf16"
    # The window's server (Server → Serve the model): where it listens and which browser origins may call it.
    # Its API key is kept apart, in a private file (app/server_keys.py), never here.
    server_host: str = "127.0.0.1"
    server_port: int = 8642
    server_cors: tuple[str, ...] = ()
    # The window's colours: "system" follows the desktop's light or dark scheme (ui/style.py); "light" or "dark".
    theme: str = "system"
    # Tools a model may call (docs/chat.md, "Tools and MCP servers"; Settings → Tools): Redline's calculator offered,
    # the files and folders its read_file tool may read (none: the tool is not offered), and at most this many replies
    # with tool calls in a row before the loop stops. MCP servers are listed in mcp.json, each one's trust in the
    # approvals file, both beside this file.
    tools_calculator: bool = True
    tools_read_paths: tuple[str, ...] = ()
    tools_max_rounds: int = 8

    def needs_reload(self, other: "Settings") -> bool:
        """Would going from self to other need the model or draft loaded again?"""
        if any(getattr(self, f) != getattr(other, f) for f in RELOAD_FIELDS):
            return True
        # An auto precision is resolved when the model loads, by the priority: a new priority resolves it again.
        if self.priority != other.priority and AUTO in (self.precision, other.precision):
            return True
        # The draft is only loaded for the speculative strategy.
        return (self.strategy == "speculative") != (other.strategy == "speculative")

    def thinking_setting(self) -> Optional[Thinking]:
        """What the replies ask of a reasoning model (None: its own defaults)."""
        if (self.thinking, self.reasoning_effort, self.thinking_budget) == (AUTO, AUTO, 0):
            return None
        return Thinking(
            enabled=None if self.thinking == AUTO else self.thinking == "on",
            effort=None if self.reasoning_effort == AUTO else self.reasoning_effort,
            budget=self.thinking_budget or None,
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["server_cors"] = list(self.server_cors)
        d["tools_read_paths"] = list(self.tools_read_paths)
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "Settings":
        """Build from JSON; unknown keys are ignored, wrong types rejected with ValueError."""
        if not isinstance(data, dict):
            raise ValueError("the file does not hold a JSON object")
        known = {f.name: f for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("server_cors", "tools_read_paths"):
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        settings = replace(cls(), **values)
        settings.validate()
        return settings

    def validate(self) -> None:
        def num(name, kind=(int, float), allow_none=True):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, kind):
                raise ValueError(f"{name} must be a number, not {v!r}")

        for name in ("model", "draft_model"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"{name} must be text, not {v!r}")
        for name in ("precision", "draft_precision"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be text")
        if self.strategy != AUTO and self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be auto or one of {', '.join(STRATEGIES)}, not {self.strategy!r}")
        if self.priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, not {self.priority!r}")
        num("num_draft_tokens", int, False)
        num("max_new_tokens", int, False)
        num("max_active_replies", int, False)
        num("max_queued_requests", int, False)
        num("prefix_cache_bytes", int, False)
        if self.prefix_cache_bytes < 0:
            raise ValueError("prefix_cache_bytes must be 0 (off) or more")
        if self.kv_cache not in KV_FORMS:
            raise ValueError(f"kv_cache must be one of {', '.join(KV_FORMS)}, not {self.kv_cache!r}")
        num("context_length", int)
        if self.thinking not in (AUTO, "on", "off"):
            raise ValueError(f"thinking must be auto, on or off, not {self.thinking!r}")
        if self.reasoning_effort != AUTO and self.reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning_effort must be auto or one of {', '.join(REASONING_EFFORTS)}")
        num("thinking_budget", int, False)
        if self.thinking_budget < 0:
            raise ValueError("thinking_budget must be 0 (no limit) or more")
        num("top_k", int)
        num("seed", int)
        for name in ("temperature", "top_p", "repetition_penalty"):
            num(name)
        if self.theme not in THEMES:
            raise ValueError(f"theme must be one of {', '.join(THEMES)}, not {self.theme!r}")
        if not isinstance(self.server_host, str) or not self.server_host.strip():
            raise ValueError("server_host must be an address such as 127.0.0.1")
        num("server_port", int, False)
        if not 0 <= self.server_port <= 65535:
            raise ValueError(f"server_port must be from 0 to 65535, not {self.server_port}")
        if not isinstance(self.server_cors, tuple) or not all(isinstance(o, str) for o in self.server_cors):
            raise ValueError("server_cors must be a list of origins")
        if not isinstance(self.tools_calculator, bool):
            raise ValueError("tools_calculator must be true or false")
        if not isinstance(self.tools_read_paths, tuple) or not all(isinstance(p, str) for p in self.tools_read_paths):
            raise ValueError("tools_read_paths must be a list of paths")
        num("tools_max_rounds", int, False)
        if not 1 <= self.tools_max_rounds <= 100:
            raise ValueError(f"tools_max_rounds must be from 1 to 100, not {self.tools_max_rounds}")
        if self.num_draft_tokens < 1 or self.max_new_tokens < 1:
            raise ValueError("num_draft_tokens and max_new_tokens must be at least 1")
        if self.max_active_replies < 1 or self.max_queued_requests < 1:
            raise ValueError("max_active_replies and max_queued_requests must be at least 1")


def settings_path() -> Path:
    return config_dir(create=False) / "settings.json"


def load_settings(path: Optional[Path] = None) -> tuple[Settings, Optional[str]]:
    """Return (settings, warning). The warning is None unless the file was unusable."""
    path = path or settings_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Settings(), None
    except OSError as exc:
        return Settings(), f"Could not read the settings file {path} ({exc}); using defaults."
    try:
        return Settings.from_dict(json.loads(text)), None
    except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
        backup = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(path, backup)
            kept = f"It was kept as {backup}."
        except OSError:
            kept = "It could not be moved aside."
        return Settings(), f"The settings file was unusable ({exc}); defaults are in use. {kept}"


def save_settings(settings: Settings, path: Optional[Path] = None) -> None:
    """Write atomically and privately (0600 in a 0700 folder): a crash mid-write leaves the old file."""
    write_private(path or settings_path(), json.dumps(settings.to_dict(), indent=2) + "\n")
