"""Images and files in a request's content parts (chat's ``image_url`` and ``file``, the Responses API's
``input_image`` and ``input_file``), read into the attachments the prompt builder places: a document's text before
the question, an image for a model that can see.

Only data URLs are read. A remote URL is refused rather than fetched: the server runs on the user's machine, and
fetching an address a client names would make it reach out on the client's behalf (issue 50: privacy). Audio and
video parts are refused: Redline's models read text and images."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Optional

from ..attachments import AttachmentError
from ..attachments.read import read_bytes
from .protocol import FieldError

IMAGE_PARTS = {"image_url", "input_image", "image"}
FILE_PARTS = {"file", "input_file"}
REFUSED_PARTS = {"input_audio", "audio", "video_url"}
TEXT_PARTS = {"text", "input_text", "output_text"}
REMOTE_REFUSED = (
    "remote URLs are not fetched (the server does not reach out on a client's behalf unless started with "
    "--allow-remote-media); send the image or file inline as a data URL (data:<type>;base64,…)"
)


FETCH_TIMEOUT_S = 15.0
FETCH_MAX_BYTES = 32 * 1024 * 1024


def fetch(url: str, where: str) -> tuple[bytes, Optional[str]]:
    """The bytes and media type at an http(s) URL (only where the user allowed it: ``fetch_remote_media``), bounded
    in time and size; a failure is the part's FieldError."""
    # lazy: httpx loads only when a remote image is fetched
    import httpx

    try:
        with httpx.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=True) as http:
            with http.stream("GET", url) as response:
                if response.status_code != 200:
                    raise FieldError(where, f"'{where}': {url} answered {response.status_code}; send the image inline.")
                data = bytearray()  # grown in place: += on bytes copies the whole download at every chunk
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) > FETCH_MAX_BYTES:
                        raise FieldError(where, f"'{where}': {url} is larger than {FETCH_MAX_BYTES // 2**20} MB.")
                return bytes(data), response.headers.get("content-type", "").split(";")[0] or None
    except httpx.HTTPError as exc:
        raise FieldError(where, f"'{where}': {url} could not be fetched ({type(exc).__name__}).") from None


def data_url(url: Any, where: str, remote: bool = False) -> tuple[bytes, Optional[str]]:
    """The bytes and media type of a ``data:`` URL (or, with ``remote``, of an http(s) URL, fetched)."""
    if not isinstance(url, str) or not url:
        raise FieldError(where, f"'{where}' must be a data URL (data:<type>;base64,…).")
    if remote and url.startswith(("http://", "https://")):
        return fetch(url, where)
    if not url.startswith("data:"):
        raise FieldError(where, f"'{where}' is not a data URL: {REMOTE_REFUSED}.")
    head, sep, payload = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        raise FieldError(where, f"'{where}' must be a base64 data URL (data:<type>;base64,…).")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise FieldError(where, f"'{where}' is not valid base64.") from None
    return data, head[: -len(";base64")] or None


def _image(part: dict, where: str, remote: bool = False):
    kind = part.get("type")
    url = part.get("image_url")
    if isinstance(url, dict):  # chat: {"type": "image_url", "image_url": {"url": "…", "detail": "auto"}}
        url, where = url.get("url"), f"{where}.image_url.url"
    elif kind == "image_url" or kind == "input_image":  # the Responses API: {"type": "input_image", "image_url": "…"}
        where = f"{where}.image_url"
    if kind == "input_image" and part.get("file_id"):
        raise FieldError(f"{where}", f"'{where}': file ids are not kept by this server; send the image as a data URL.")
    data, mime = data_url(url, where, remote)
    return data, mime, "image"


def _file(part: dict, where: str):
    inner = part.get("file") if part.get("type") == "file" else part  # chat nests it; the Responses API does not
    if not isinstance(inner, dict):
        raise FieldError(f"{where}.file", f"'{where}.file' must be an object with file_data and filename.")
    base = f"{where}.file" if part.get("type") == "file" else where
    if inner.get("file_id"):
        raise FieldError(f"{base}.file_id", f"'{base}': file ids are not kept by this server; send file_data.")
    if inner.get("file_url"):
        raise FieldError(f"{base}.file_url", f"'{base}.file_url': {REMOTE_REFUSED}.")
    data, mime = data_url(inner.get("file_data"), f"{base}.file_data")
    name = inner.get("filename") if isinstance(inner.get("filename"), str) else "attachment"
    return data, mime, name


def read_content(content: Any, where: str, remote: bool = False) -> tuple[str, list]:
    """A message's text and its attachments from its content (a string, or a list of parts); ``remote``: an image's
    http(s) URL is fetched. Raises FieldError."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise FieldError(f"{where}.content", f"'{where}.content' must be a string or a list of content parts.")
    text: list[str] = []
    attachments: list = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            text.append(part["text"])
            continue
        if kind in REFUSED_PARTS:
            raise FieldError(at, f"'{at}' is an {kind} part; Redline's models read text and images, not {kind}.")
        if kind in IMAGE_PARTS:
            data, mime, name = _image(part, at, remote)
            name = f"image {len(attachments) + 1}"
        elif kind in FILE_PARTS:
            data, mime, name = _file(part, at)
        else:
            raise FieldError(
                at,
                f'\'{at}\' is not a content part this server reads; send {{"type": "text", "text": "…"}}, an '
                "image_url or a file part.",
            )
        try:
            attachments.append(read_bytes(data, name, mime))
        except AttachmentError as exc:
            raise FieldError(at, f"'{at}': {exc}") from None
    return "".join(text), attachments


def attach(messages, dicts: list[dict], remote: bool = False) -> list[dict]:
    """The chat messages (``dicts``, from ``Message.as_dict``) with each user message's images and files read into
    its ``attachments``, as the prompt builder takes them (``remote``: images at http(s) URLs fetched). Raises
    FieldError naming the part."""
    out = []
    for i, (m, d) in enumerate(zip(messages, dicts)):
        if m.attached():
            text, attachments = read_content(m.content, f"messages[{i}]", remote)
            d = {**d, "content": text, "attachments": attachments}
        out.append(d)
    return out
