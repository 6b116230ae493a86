"""Prefix-cache pages on disk, so a conversation stays warm across restarts (issue 27, item 3).

When the prefix cache evicts a page, and when the model is unloaded or Redline quits (``PagedKV.persist``), the
page's keys and values for every layer are written to a file of their own under
``<cache dir>/kv-pages/<namespace>/<key>.kvp`` (``inference/paths.kv_pages_dir``). When a new sequence's prompt
walks past the pages in memory, the walk goes on here: each next page's file is read into a fresh page of the pool.

A file is never trusted. It holds a header (magic, format version, the namespace, the previous page's key, the
page's own key and token ids, the KV form (``bf16``/``float32``…: the dtype; ``q8``: 8-bit rows, each head's
D int8 and an fp16 scale, ``kernels/kv_quant.py``), the tensors' dtype and shape, a blake2b checksum of the payload)
and the payload (K then V, ``[layers, kv_heads, page, row]`` each: row = head_dim, or head_dim + 2 for q8). A page of
another form than the cache's is refused by its form before anything is read as numbers (a file written before the
form was recorded holds its dtype's form). On load every field must equal what the walk expects,
the key recomputed from the previous key and the stored token ids must be the stored key, and the payload's
checksum must match; anything else (a corrupt or truncated file, another model's page, a renamed file, another
format) is deleted and the page is computed as if it had never been there.

Files are written atomically (a temporary name in the same folder, then renamed) on a background thread, from a
copy taken on the engine's thread, so eviction costs the engine a copy of one page. The store keeps at most
``limit_bytes`` over all namespaces, least recently used (file modification time, touched on every load) out
first.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import struct
import threading
import time
from array import array
from pathlib import Path
from typing import Optional, Sequence

import torch

MAGIC = b"RLKVPAGE"
FORMAT_VERSION = 1
SUFFIX = ".kvp"
DEFAULT_LIMIT_BYTES = 1_000_000_000  # 1 GB: ~340 pages of the starter in bf16 (~22k tokens of conversations)
_PREFIX = struct.Struct("<8sII")  # magic, format version, header length
_STALE_TMP_S = 60.0  # a temporary file this old is a write that died with its process


def page_key(prev: bytes, tokens: Sequence[int]) -> bytes:
    """The content key of one page: its token ids hashed after the previous page's key (``kv_cache.chain_keys``)."""

    h = hashlib.blake2b(prev, digest_size=16)
    h.update(array("q", tokens).tobytes())
    return h.digest()


class DiskPages:
    """One model's pages on disk (``folder`` = ``root/<namespace hex>``), within ``limit_bytes`` over ``root``."""

    def __init__(self, root: Path, namespace: bytes, limit_bytes: int = DEFAULT_LIMIT_BYTES):
        if limit_bytes <= 0:
            raise ValueError("the disk page store needs a size limit above 0 bytes")
        self.root, self.namespace, self.limit_bytes = Path(root), namespace, int(limit_bytes)
        self.folder = self.root / namespace.hex()
        self.loaded = self.rejected = self.written = 0  # pages read back, files refused (and deleted), files written
        self.last_error: Optional[str] = None  # the last write that failed (a full disk, say): pages stay in memory
        self._pending: set[bytes] = set()  # keys handed to the writer, not yet on disk
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._writer: Optional[threading.Thread] = None
        self._total = self._scan()

    # -- reading ------------------------------------------------------------------------------------
    def path(self, key: bytes) -> Path:
        return self.folder / f"{key.hex()}{SUFFIX}"

    def has(self, key: bytes) -> bool:
        with self._lock:
            if key in self._pending:
                return True
        return self.path(key).is_file()

    def load(
        self, key: bytes, prev: bytes, tokens: Sequence[int], dtype: torch.dtype, shape: tuple[int, ...]
    ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """The page ``key`` (after ``prev``, holding ``tokens``) as (K, V) of ``shape`` and ``dtype``, or None when
        there is no such file or it is not exactly that page (the file is then deleted)."""
        path = self.path(key)
        while True:  # a write of this very page may still be under way
            with self._lock:
                if key not in self._pending:
                    break
            time.sleep(0.002)
        try:
            with open(path, "rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)
                got = f.readinto(data)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._reject(path, f"unreadable ({exc})")
        why, payload_at = _check(data[:got], self.namespace, key, prev, tokens, dtype, shape)
        if why is not None:
            return self._reject(path, why)
        try:
            os.utime(path)  # recently used: the last to go when the store is over its size
        except OSError:
            pass
        n = _numel(shape) * torch.empty((), dtype=dtype).element_size()
        flat = torch.frombuffer(data, dtype=torch.uint8, offset=payload_at, count=2 * n)
        k = flat[:n].view(dtype).view(shape)
        v = flat[n:].view(dtype).view(shape)
        self.loaded += 1
        return k, v

    def _reject(self, path: Path, why: str) -> None:
        self.rejected += 1
        self.last_error = f"{path.name}: {why}"
        try:
            size = path.stat().st_size
            path.unlink()
            with self._lock:
                self._total -= size
        except OSError:
            pass
        return None

    # -- writing ------------------------------------------------------------------------------------
    def save(self, key: bytes, prev: bytes, tokens: Sequence[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the page ``key`` (a copy of ``k`` and ``v`` is taken now; the file is written on the writer's
        thread). A page already on disk is only marked recently used."""
        with self._lock:
            if key in self._pending:
                return
        path = self.path(key)
        if path.is_file():
            try:
                os.utime(path)
            except OSError:
                pass
            return
        k, v = k.detach().to("cpu", copy=True).contiguous(), v.detach().to("cpu", copy=True).contiguous()
        with self._lock:
            self._pending.add(key)
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_loop, name="redline-kv-pages", daemon=True)
                self._writer.start()
        self._queue.put((key, prev, list(tokens), k, v))

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait for the writes handed over so far; True if they are done within ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._pending:
                    return True
            if end is not None and time.monotonic() > end:
                return False
            time.sleep(0.005)

    def _write_loop(self) -> None:
        while True:
            key, prev, tokens, k, v = self._queue.get()
            try:
                self._write(key, prev, tokens, k, v)
            except Exception as exc:  # a full or read-only disk, say: the page is simply not kept
                self.last_error = f"could not write a KV page to {self.folder}: {exc}"
            finally:
                with self._lock:
                    self._pending.discard(key)

    def _write(self, key: bytes, prev: bytes, tokens: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        kb, vb = (t.reshape(-1).view(torch.uint8).numpy().data for t in (k, v))  # flat: len() is bytes
        check = hashlib.blake2b(kb, digest_size=16)
        check.update(vb)
        header = json.dumps(
            {
                "namespace": self.namespace.hex(),
                "prev": prev.hex(),
                "key": key.hex(),
                "tokens": tokens,
                "form": kv_form(k.dtype),
                "dtype": str(k.dtype).removeprefix("torch."),
                "shape": list(k.shape),
                "payload_bytes": len(kb) + len(vb),
                "blake2b": check.hexdigest(),
            },
            separators=(",", ":"),
        ).encode()
        # Padded with spaces (JSON ignores them) so the payload starts 64-byte aligned in the file and in the
        # buffer it is read into: the tensors viewed over it are then aligned for any dtype.
        header += b" " * (-(_PREFIX.size + len(header)) % 64)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as f:
            f.write(_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)))
            f.write(header)
            f.write(kb)
            f.write(vb)
        os.replace(tmp, path)  # atomic: a reader sees the whole file or none
        size = _PREFIX.size + len(header) + len(kb) + len(vb)
        with self._lock:
            self._total += size
        self.written += 1
        self._trim()

    # -- size -----------------------------------------------------------------------------------------
    def total_bytes(self) -> int:
        return self._total

    def _scan(self) -> int:
        """Bytes held under ``root`` (every namespace); deletes temporary files that a dead process left."""
        total, now = 0, time.time()
        if not self.root.is_dir():
            return 0
        for path in self.root.glob("*/*"):
            try:
                st = path.stat()
                if path.name.endswith(".tmp"):
                    if now - st.st_mtime > _STALE_TMP_S:
                        path.unlink()
                    continue
                if path.suffix == SUFFIX:
                    total += st.st_size
            except OSError:
                continue
        return total

    def _trim(self) -> None:
        """Least recently used files out until the store is within its limit (over every namespace: one limit for
        the disk, whichever models wrote the pages)."""
        if self._total <= self.limit_bytes:
            return
        files = []
        for path in self.root.glob(f"*/*{SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((st.st_mtime_ns, st.st_size, path))
        files.sort()
        total = sum(f[1] for f in files)
        for _, size, path in files:
            if total <= self.limit_bytes:
                break
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            try:
                path.parent.rmdir()  # an emptied namespace folder goes too (fails, harmlessly, while not empty)
            except OSError:
                pass
        with self._lock:
            self._total = total


def _check(
    data: bytes | bytearray,
    namespace: bytes,
    key: bytes,
    prev: bytes,
    tokens: Sequence[int],
    dtype: torch.dtype,
    shape: tuple[int, ...],
) -> tuple[Optional[str], int]:
    """Why ``data`` is not the page the walk expects (None: it is), and where its payload starts."""
    if len(data) < _PREFIX.size:
        return "shorter than its header", 0
    magic, version, hlen = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        return "not a Redline KV page", 0
    if version != FORMAT_VERSION:
        return f"format version {version}, this Redline reads {FORMAT_VERSION}", 0
    try:
        head = json.loads(bytes(data[_PREFIX.size : _PREFIX.size + hlen]))
        stored_tokens = [int(t) for t in head["tokens"]]
        stored_key, stored_prev = bytes.fromhex(head["key"]), bytes.fromhex(head["prev"])
        fields = (head["namespace"], head["dtype"], tuple(head["shape"]), int(head["payload_bytes"]), head["blake2b"])
        stored_form = str(head.get("form", head["dtype"]))
    except (ValueError, KeyError, TypeError):
        return "its header is not readable", 0
    stored_ns, stored_dtype, stored_shape, payload_bytes, checksum = fields
    if stored_ns != namespace.hex():
        return "another model's page (namespace differs)", 0
    if stored_key != key or stored_prev != prev or stored_tokens != list(tokens):
        return "another page (its key, previous key or token ids differ)", 0
    if page_key(stored_prev, stored_tokens) != stored_key:
        return "its key is not the hash of its token ids", 0
    if stored_form != kv_form(dtype):
        return f"a page of KV form {stored_form}, the cache holds {kv_form(dtype)}", 0
    if stored_dtype != str(dtype).removeprefix("torch.") or stored_shape != tuple(shape):
        return f"a page of {stored_dtype} {list(stored_shape)}, the cache holds {dtype} {list(shape)}", 0
    start = _PREFIX.size + hlen
    expected = 2 * _numel(shape) * torch.empty((), dtype=dtype).element_size()
    if payload_bytes != expected or len(data) - start != expected:
        return f"truncated or padded: {len(data) - start} payload bytes, {expected} expected", 0
    if hashlib.blake2b(memoryview(data)[start:], digest_size=16).hexdigest() != checksum:
        return "its payload does not match its checksum (corrupt)", 0
    return None, start


def kv_form(dtype: torch.dtype) -> str:
    """The form a page of ``dtype`` holds: ``q8`` for int8 (8-bit rows with their scales), else the dtype's name."""
    return "q8" if dtype == torch.int8 else str(dtype).removeprefix("torch.")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
