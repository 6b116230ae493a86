"""File → Export: the open conversation as Markdown or JSON (the store writes the text; this picks the file)."""

from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QFileDialog


def safe_file_name(title: str) -> str:
    """A file name from a conversation's title: letters, digits, spaces, - and _ kept, the rest as _."""
    return "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "conversation"


def export(parent, store, conversation_id: Optional[int], banner, status, kind: str) -> None:
    """Ask where to save the open conversation, then save it there."""
    if conversation_id is None:
        banner.show_message("Open a conversation to export it.", "info")
        return
    conv = store.conversation(conversation_id)
    flt = "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
    path, _ = QFileDialog.getSaveFileName(parent, "Export conversation", f"{safe_file_name(conv.title)}.{kind}", flt)
    if path:
        export_to(store, conversation_id, banner, status, path, kind)


def export_to(store, conversation_id: int, banner, status, path: str, kind: str) -> None:
    text = (store.export_markdown if kind == "md" else store.export_json)(conversation_id)
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        banner.show_message(f"Could not write {path}: {exc}. Choose another folder.", "error")
        return
    status.say(f"Exported to {path}", 5000)
