"""Prompt sets for the speed lab: the built-in ones shipped as package data, or a JSON file of the same shape."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Union

from ..errors import UnsupportedConfiguration


def assets_dir() -> Path:
    """Where the built-in assets live: the installed ``redline.assets`` package (a folder on disk in a
    wheel, an editable install and the PyInstaller bundle alike)."""

    return Path(str(files("redline.assets")))


@dataclass
class BenchPrompt:
    id: str
    messages: list[dict]


@dataclass
class PromptSet:
    name: str
    description: str
    prompts: list[BenchPrompt]
    source: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def builtin_prompt_sets() -> list[str]:
    return sorted(p.stem for p in (assets_dir() / "prompts").glob("*.json"))


def load_prompt_set(name_or_path: Union[str, Path]) -> PromptSet:
    """A built-in set by name (``short``, ``long``, ``code``, ``grounded``) or a JSON file of the same shape:
    ``{"name": …, "description": …, "prompts": [{"id": …, "messages": [{"role": "user", "content": …}]}]}``
    (``"prompt": "text"`` is short for one user message)."""
    text = str(name_or_path)
    path = assets_dir() / "prompts" / f"{text}.json"
    if not path.is_file():
        path = Path(text).expanduser()
    if not path.is_file():
        raise UnsupportedConfiguration(
            f"No prompt set {text!r}.", f"Use a built-in set ({', '.join(builtin_prompt_sets())}) or a JSON file."
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UnsupportedConfiguration(
            f"{path} is not valid JSON ({exc}).", "A prompt set is a JSON object with a 'prompts' list."
        ) from exc
    return prompt_set_from_dict(data, source=str(path), default_name=path.stem)


def prompt_set_from_dict(data: dict, source: str = "", default_name: str = "custom") -> PromptSet:
    items = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise UnsupportedConfiguration(
            f"{source or 'The prompt set'} has no 'prompts' list.",
            'Give at least one prompt: {"prompts": [{"prompt": "…"}]}.',
        )
    prompts = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = {"prompt": item}
        messages = item.get("messages") if isinstance(item, dict) else None
        if messages is None and isinstance(item, dict) and isinstance(item.get("prompt"), str):
            messages = [{"role": "user", "content": item["prompt"]}]
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages)
        ):
            raise UnsupportedConfiguration(
                f"{source or 'The prompt set'}: prompt {i + 1} has no usable messages.",
                "Each prompt needs 'prompt' text or 'messages' with role and content.",
            )
        prompts.append(BenchPrompt(str(item.get("id", i + 1)), messages))
    return PromptSet(str(data.get("name", default_name)), str(data.get("description", "")), prompts, source)
