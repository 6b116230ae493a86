"""A stand-in for the Hugging Face hub on 127.0.0.1: the few endpoints huggingface_hub calls to download a
model (repo info, the file tree, ``resolve/<revision>/<file>`` with HEAD and ranged GET, ``bytes=a-`` and
``bytes=a-b``), the search (``/api/models?search=…&pipeline_tag=…&sort=…&limit=…``, answering with each
repository's ``info``), plus gated and private repositories, a connection that drops part-way through a file,
a slow mode for cancelling and a slow link (``delay`` before every answer).

Started and stopped by the test (``with FakeHub(...) as hub``); every request is recorded, and the bytes of
each file's body sent are counted (``sent``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Repo:
    files: dict[str, bytes]
    sha: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    private: bool = False
    lfs: set[str] = field(default_factory=set)  # files served as LFS (their etag is the sha256)
    info: dict = field(default_factory=dict)  # what the search answers for it (downloads, tags, gguf, …)
    # As the real hub does for gated models: the repository's metadata is public, its files are refused.
    gated_files_only: bool = False
    sizes: dict[str, int] = field(default_factory=dict)  # sizes the listings declare (files never downloaded)

    def size(self, path: str) -> int:
        return self.sizes.get(path, len(self.files[path]))

    def etag(self, path: str) -> str:
        data = self.files[path]
        if path in self.lfs:
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Range header)
        self.drop_after: dict[str, int] = {}  # file → bytes sent before the connection drops (once)
        self.chunk_delay = 0.0  # seconds between 64 KiB chunks (to cancel a download part-way)
        self.delay = 0.0  # seconds before every answer (a slow link)
        self.sent: dict[str, int] = {}  # file → bytes of its body sent
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    # ------------------------------------------------------------------ handling
    def _json(self, h, status: int, body, headers: dict | None = None, head: bool = False) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if not head:
            h.wfile.write(data)

    def _refuse(self, h, repo: Repo, head: bool, metadata: bool = False) -> bool:
        if metadata and repo.gated_files_only:
            return False
        if repo.gated and "authorization" not in {k.lower() for k in h.headers.keys()}:
            self._json(h, 403, {"error": "Access to this model is restricted."}, {"X-Error-Code": "GatedRepo"}, head)
            return True
        if repo.private and "authorization" not in {k.lower() for k in h.headers.keys()}:
            self._json(h, 401, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head)
            return True
        return False

    def _handle(self, h, head: bool) -> None:
        path = h.path.split("?", 1)[0]
        self.requests.append((h.command, path, h.headers.get("Range", "")))
        if self.delay:
            time.sleep(self.delay)
        if path == "/api/models":
            return self._search(h, h.path.partition("?")[2], head)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        if m:
            repo = self.repos.get(m.group(1))
            if repo is None:
                return self._json(h, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head)
            if self._refuse(h, repo, head, metadata=True):
                return None
            siblings = []
            for name in repo.files:
                sib = {"rfilename": name, "size": repo.size(name), "blobId": repo.etag(name)}
                if name in repo.lfs:
                    sib["lfs"] = {"sha256": repo.etag(name), "size": repo.size(name), "pointerSize": 130}
                siblings.append(sib)
            gated = repo.info.get("gated", "manual" if repo.gated else False)
            return self._json(
                h, 200, {"id": m.group(1), "sha": repo.sha, "gated": gated, "siblings": siblings}, head=head
            )
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/.*)?", path)
        if m:
            repo = self.repos.get(m.group(1))
            if repo is None:
                return self._json(h, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head)
            if self._refuse(h, repo, head, metadata=True):
                return None
            entries = []
            for name in repo.files:
                entry = {"type": "file", "path": name, "size": repo.size(name), "oid": repo.etag(name)}
                if name in repo.lfs:
                    entry["oid"] = hashlib.sha1(name.encode()).hexdigest()
                    entry["lfs"] = {"oid": repo.etag(name), "size": repo.size(name), "pointerSize": 130}
                entries.append(entry)
            return self._json(h, 200, entries, head=head)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            repo = self.repos.get(m.group(1))
            if repo is None:
                return self._json(h, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head)
            if self._refuse(h, repo, head):
                return None
            name = m.group(3)
            if name not in repo.files:
                return self._json(h, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"}, head)
            return self._file(h, repo, name, head)
        return self._json(h, 404, {"error": f"no such endpoint {path}"}, head=head)

    def _search(self, h, query: str, head: bool) -> None:
        from urllib.parse import parse_qs

        q = parse_qs(query)
        text = (q.get("search") or [""])[0].lower()
        pipeline = (q.get("pipeline_tag") or [None])[0]
        sort = (q.get("sort") or [None])[0]
        limit = int((q.get("limit") or ["1000"])[0])
        rows = []
        for repo_id, repo in self.repos.items():
            if repo.private or text not in repo_id.lower():
                continue
            if pipeline and repo.info.get("pipeline_tag") != pipeline:
                continue
            row = {"id": repo_id, "_id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False}
            row.update({"gated": "manual" if repo.gated else False})
            row.update(repo.info)
            rows.append(row)
        if sort:
            key = {"trending_score": "trendingScore"}.get(sort, sort)
            rows.sort(key=lambda r: r.get(key, 0), reverse=True)
        return self._json(h, 200, rows[:limit], head=head)

    def _file(self, h, repo: Repo, name: str, head: bool) -> None:
        data = repo.files[name]
        start, end = 0, len(data) - 1
        rng = h.headers.get("Range")
        if rng:
            m = re.match(r"bytes=(\d+)-(\d*)", rng)
            start = int(m.group(1))
            if m.group(2):
                end = min(end, int(m.group(2)))
        body = data[start : end + 1]
        h.send_response(206 if rng else 200)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("ETag", f'"{repo.etag(name)}"')
        h.send_header("X-Repo-Commit", repo.sha)
        if name in repo.lfs:
            h.send_header("X-Linked-Etag", f'"{repo.etag(name)}"')
            h.send_header("X-Linked-Size", str(len(data)))
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        h.end_headers()
        if head:
            return
        limit = self.drop_after.pop(name, None)
        sent = 0
        for i in range(0, len(body), 65536):
            chunk = body[i : i + 65536]
            if limit is not None and sent + len(chunk) > limit:
                # Counted before the write: the client may read the bytes and the test assert on
                # ``sent`` before this thread runs its next line.
                self.sent[name] = self.sent.get(name, 0) + max(0, limit - sent)
                h.wfile.write(chunk[: max(0, limit - sent)])
                h.wfile.flush()
                h.close_connection = True
                try:
                    h.connection.shutdown(2)  # the network went away mid-file
                except OSError:
                    pass
                return
            sent += len(chunk)
            self.sent[name] = self.sent.get(name, 0) + len(chunk)  # before the write, as above
            h.wfile.write(chunk)
            if self.chunk_delay:
                h.wfile.flush()
                time.sleep(self.chunk_delay)
