"""What a user attaches to a message: documents (PDF, DOCX, Markdown, plain text, source files) read to text,
and images for a model that can see. Free of torch and Qt: the window reads an attachment on its own thread to
show its chip before anything is sent; the engine's prompt builder places it in the prompt."""

from .types import AttachmentError, Document, Image, Page

__all__ = ["AttachmentError", "Document", "Image", "Page"]
