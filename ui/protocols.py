"""What the widgets need from the application's objects. ``ui`` never imports ``app``:
the store and the settings are handed in, and these Protocols say what they must offer."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Protocol, Sequence


class ConversationLike(Protocol):
    id: int
    title: str
    system_prompt: str
    updated: float
    tools_on: bool  # its Tools switch: the model may call tools in it
    tools_unticked: list  # the tools (by the name they are offered as) not offered in it; the others are


class MessageLike(Protocol):
    id: int
    position: int
    role: str
    content: str
    partial: bool
    stats: dict
    reasoning: str  # a reasoning model's thinking before the reply ("" for any other message)
    attachments: list  # the Documents and Images attached to a user's message, in order ([] for most)


class ConversationStore(Protocol):
    def create_conversation(self, title: str = ..., system_prompt: str = ...) -> ConversationLike: ...
    def conversation(self, conversation_id: int) -> Optional[ConversationLike]: ...
    def conversations(self, search: str = "") -> list[ConversationLike]: ...
    def rename_conversation(self, conversation_id: int, title: str) -> None: ...
    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None: ...
    def set_tools_on(self, conversation_id: int, on: bool) -> None: ...
    def set_tools_unticked(self, conversation_id: int, names: Sequence[str]) -> None: ...
    def delete_conversation(self, conversation_id: int) -> None: ...
    def messages(
        self,
        conversation_id: int,
        limit: Optional[int] = None,
        before_position: Optional[int] = None,
        after_position: Optional[int] = None,
    ) -> list[MessageLike]: ...
    def message_count(self, conversation_id: int, before_position: Optional[int] = None) -> int: ...
    def message(self, message_id: int) -> Optional[MessageLike]: ...
    def add_message(
        self, conversation_id: int, role: str, content: str, partial: bool = False, stats: Optional[dict] = None
    ) -> MessageLike: ...
    def update_message(
        self,
        message_id: int,
        content: str,
        partial: bool,
        stats: Optional[dict] = None,
        reasoning: Optional[str] = None,
    ) -> None: ...
    def delete_from(self, message_id: int) -> None: ...
    def add_attachments(self, message_id: int, attachments: Sequence, sources: Sequence = ()) -> None: ...
    def attachments(self, message_id: int) -> list: ...
    def attachment_file(self, message_id: int, position: int) -> Optional[Path]: ...
    def export_markdown(self, conversation_id: int) -> str: ...
    def export_json(self, conversation_id: int) -> str: ...


class SettingsLike(Protocol):
    """A frozen dataclass: fields model, precision, strategy, priority, draft_model, draft_precision,
    num_draft_tokens, context_length, max_new_tokens, temperature, top_p, top_k,
    repetition_penalty, seed, server_host, server_port, server_cors. ``precision`` and ``strategy`` may be
    "auto" (resolved at load by ``priority``)."""

    model: Optional[str]
    precision: str
    strategy: str
    priority: str

    def needs_reload(self, other: Any) -> bool: ...


class PresetLike(Protocol):
    name: str
    values: dict  # settings fields: model, precision, context_length, strategy, draft…, sampling

    def describe(self) -> str: ...


class PresetStoreLike(Protocol):
    """Named configurations, one readable file each (``app.presets.PresetStore``)."""

    problems: list[str]  # files the last presets() skipped, with the reason

    def presets(self) -> list[PresetLike]: ...
    def get(self, name: str) -> Optional[PresetLike]: ...
    def save(self, name: str, values: dict) -> PresetLike: ...
    def rename(self, old: str, new: str) -> PresetLike: ...
    def delete(self, name: str) -> None: ...
    def recent_models(self) -> list[str]: ...
    def remember_model(self, model: Optional[str]) -> None: ...


class TrustDecisions(Protocol):
    """Remembered opt-ins to run a model's own code or unpickle its weights (``app.trust_store.TrustStore``)."""

    def is_trusted(self, folder, kind: str, fingerprint: str) -> bool: ...

    def remember(self, folder, kind: str, fingerprint: str, files: list[str]) -> None: ...


class ServerKeyStore(Protocol):
    """API keys: of remote servers, by address, and of Redline's own server (``app.server_keys.ServerKeys``).
    Kept in a private file; never in settings, presets or a log."""

    def get(self, url: str) -> Optional[str]: ...

    def set(self, url: str, key: Optional[str]) -> None: ...

    def own_key(self) -> Optional[str]: ...

    def set_own_key(self, key: Optional[str]) -> None: ...
