"""A GGUF file's header and tensor table, read from the hub by HTTP range requests, never its weights.

A GGUF starts with its metadata (the architecture's sizes, the tokenizer) and a table of its tensors (name,
shape, type, offset); the weights follow. ``header_length`` walks that layout over the bytes read so far and
says when it needs more; ``read_header`` asks for the first 2 MB, then for more as the walk needs it, at most
``MAX_HEADER_BYTES`` in all (a Llama 3 header, with its 128k-token vocabulary and merges, is about 7.7 MB).

What was read is written at the start of a *sparse* file as long as the real one, so that ``gguf.GGUFReader``
(through Redline's own ``plan_gguf``) reads the metadata and the tensor table exactly as from the whole
file; the weights' pages are holes that nothing reads and that take no disk.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ModelSourceError
from ..units import MB, format_bytes

MAX_HEADER_BYTES = 8 * MB
FIRST_READ = 2 * MB
# The GGUF value types' sizes (gguf.GGUFValueType: 8 is a string, 9 an array).
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class NeedMore(Exception):
    def __init__(self, upto: int):
        self.upto = upto


def header_length(data: bytes) -> int:
    """The bytes the metadata and the tensor table take, from ``data``, the file's first bytes. Raises
    ``NeedMore(position)`` when they go past ``data``; ``ValueError`` when it is not a GGUF file."""
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise NeedMore(pos + n)
        out = data[pos : pos + n]
        pos += n
        return out

    def u32() -> int:
        return struct.unpack("<I", take(4))[0]

    def u64() -> int:
        return struct.unpack("<Q", take(8))[0]

    def skip_string() -> None:
        n = u64()
        if n > 1 << 32:
            raise ValueError("a string longer than 4 GB: not a GGUF header")
        take(n)

    def skip_value(vtype: int) -> None:
        if vtype in _FIXED:
            take(_FIXED[vtype])
        elif vtype == _STRING:
            skip_string()
        elif vtype == _ARRAY:
            itype, count = u32(), u64()
            if itype in _FIXED:
                take(_FIXED[itype] * count)
            else:
                for _ in range(count):
                    skip_value(itype)
        else:
            raise ValueError(f"unknown GGUF value type {vtype}")

    if take(4) != b"GGUF":
        raise ValueError("no GGUF magic")
    version = u32()
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}")
    n_tensors, n_kv = u64(), u64()
    for _ in range(n_kv):
        skip_string()
        skip_value(u32())
    for _ in range(n_tensors):
        skip_string()
        dims = u32()
        take(8 * dims + 4 + 8)  # the dimensions, the type, the offset
    return pos


@dataclass
class HeaderRead:
    path: Path  # the sparse file: the header at its start, holes after
    header_bytes: int  # what the metadata and tensor table take
    bytes_read: int  # what the range requests received
    requests: int


def _range(url: str, start: int, end: int, headers: dict) -> bytes:
    """Bytes ``start``..``end`` (inclusive) of ``url``."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub.utils import get_session, hf_raise_for_status

    r = get_session().get(url, headers={**headers, "Range": f"bytes={start}-{end}"}, follow_redirects=True)
    hf_raise_for_status(r)
    body = r.content
    if r.status_code == 200 and start > 0:  # a server that ignores ranges: keep the part asked for
        body = body[start : end + 1]
    return body[: end - start + 1]


def read_header(
    repo_id: str, filename: str, commit: str, size: int, dest: Path, limit: int = MAX_HEADER_BYTES
) -> HeaderRead:
    """Read ``filename``'s header from the hub into ``dest`` (a sparse file of ``size`` bytes)."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import hf_hub_url

    # lazy: the hub client loads only when the hub is used
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(repo_id, filename, revision=commit)
    headers = build_hf_headers()
    data = b""
    requests = 0
    want = min(FIRST_READ, size, limit)
    length: Optional[int] = None
    while length is None:
        if want > len(data):
            data += _range(url, len(data), want - 1, headers)
            requests += 1
        try:
            length = header_length(data)
        except NeedMore as more:
            if len(data) >= min(size, limit) or more.upto > size:
                if more.upto > size:
                    raise ModelSourceError(
                        f"{repo_id}/{filename} ends inside its own header: the file is damaged or cut short.",
                        "Choose another file of the repository.",
                    ) from None
                raise ModelSourceError(
                    f"The header of {repo_id}/{filename} is larger than {format_bytes(limit)}, more than Redline "
                    "reads to estimate a file it has not downloaded.",
                    "Download the file to estimate it from disk.",
                ) from None
            want = min(size, limit, max(more.upto + MB, 2 * len(data)))
        except ValueError as exc:
            raise ModelSourceError(
                f"{repo_id}/{filename} is not a GGUF file Redline can read ({exc}).", "Choose another file."
            ) from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        out.write(data)
        out.truncate(size)  # the rest is a hole: the same length as the real file, no disk used
    return HeaderRead(dest, length, len(data), requests)
