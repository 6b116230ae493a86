"""What the window's status bar shows of the server: requests in flight, tokens/s over the last seconds, and the
ends of recent requests (for tests and the log)."""

from __future__ import annotations

import threading
import time
from collections import deque


class ServerStats:
    """What the window's status bar shows: requests in flight, tokens/s over the last seconds, and the
    ends of recent requests (for tests and the log). Thread-safe."""

    WINDOW_S = 2.0

    def __init__(self):
        self._lock = threading.Lock()
        self.active = 0
        self.requests = 0
        self.errors = 0
        self._tokens: deque = deque()
        self.recent: deque = deque(maxlen=256)  # (finish_reason, new_tokens, streamed)

    def begin(self) -> None:
        with self._lock:
            self.active += 1
            self.requests += 1

    def end(self, finish_reason: str, new_tokens: int, streamed: bool) -> None:
        with self._lock:
            self.active -= 1
            if finish_reason == "error":
                self.errors += 1
            self.recent.append((finish_reason, new_tokens, streamed))

    def token(self, n: int = 1) -> None:
        now = time.monotonic()
        with self._lock:
            self._tokens.append((now, n))
            while self._tokens and now - self._tokens[0][0] > self.WINDOW_S:
                self._tokens.popleft()

    def tokens_per_s(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._tokens and now - self._tokens[0][0] > self.WINDOW_S:
                self._tokens.popleft()
            return sum(n for _, n in self._tokens) / self.WINDOW_S
