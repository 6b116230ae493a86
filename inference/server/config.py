"""What the OpenAI-compatible server is allowed to do: where it listens, who may call it, its limits."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Optional

from ..errors import RedlineError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8642
# A request body beyond this is refused (413) before it is read further. Room for images and documents sent inline
# as base64 data URLs (a phone's photo is 3–5 MB, a third more in base64); the attachment reader's own limit is higher.
MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_TOKENS_CAP = 4096  # new tokens a request may ask for (and gets when it names none), within the context


class ServerConfigError(RedlineError):
    """The server cannot start as configured."""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost': addresses no other machine reaches."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0: a free port, chosen when the server starts
    api_key: Optional[str] = None  # required (Bearer) when set; must be set for any non-loopback address
    cors_origins: list[str] = field(default_factory=list)  # none: no CORS headers at all
    max_body_bytes: int = MAX_BODY_BYTES
    max_tokens_cap: int = MAX_TOKENS_CAP
    strategy: str = "fast"  # how API requests decode (fast: batched with each other and with the chat)
    load_on_request: bool = False  # a request naming another model loads it (otherwise: a clear 404)
    precision: str = "auto"  # the precision such a load uses
    # An http(s) URL in an image part is fetched (otherwise refused): the server then reaches out to an address a
    # client names, on the client's behalf, which is why it is off unless the user turns it on (--allow-remote-media).
    fetch_remote_media: bool = False

    def validate(self) -> None:
        if not self.host:
            raise ServerConfigError("The server needs an address to listen on.", f"Use {DEFAULT_HOST}.")
        if not 0 <= int(self.port) <= 65535:
            raise ServerConfigError(f"Port {self.port} is not a TCP port.", "Choose one from 1 to 65535, or 0 for any.")
        if not is_loopback(self.host) and not self.api_key:
            raise ServerConfigError(
                f"Listening on {self.host} makes the model reachable from the network, so it needs an API key.",
                "Set one (--api-key-file, or the Server settings), or listen on 127.0.0.1.",
            )
        if self.api_key is not None and len(self.api_key.strip()) < 8:
            raise ServerConfigError("The API key is shorter than 8 characters.", "Choose a longer one.")
        if self.max_body_bytes < 1024:
            raise ServerConfigError("The body size limit is below 1 KB.", "Raise it.")
        if self.max_tokens_cap < 1:
            raise ServerConfigError("The max_tokens limit must be at least 1.", "Raise it.")
        for origin in self.cors_origins:
            if origin == "*" or not origin.startswith(("http://", "https://")):
                raise ServerConfigError(
                    f"CORS origin {origin!r} is not an origin.",
                    "List origins such as http://localhost:3000 (a wildcard is not accepted).",
                )

    @property
    def exposed(self) -> bool:
        """Reachable from other machines (anything but loopback)."""
        return not is_loopback(self.host)

    def __repr__(self) -> str:  # never the key, in a log or a traceback
        key = "set" if self.api_key else "none"
        return f"ServerConfig(host={self.host!r}, port={self.port}, api_key={key}, cors={self.cors_origins!r})"
