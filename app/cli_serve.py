"""`redline serve`: the model behind an OpenAI-compatible server, headless.

It listens on 127.0.0.1 unless told otherwise; any other address needs an API key, read from a file
(``--api-key-file``) or the ``REDLINE_API_KEY`` environment variable, never from the command line (where
other users of the machine could read it in the process list) and never printed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

from ..inference import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ApiServer,
    RedlineError,
    ServerConfig,
    ServerConfigError,
    is_loopback,
)
from .cli_args import whole_number
from .cli_chat import add_model_arguments, start_engine

KEY_ENV = "REDLINE_API_KEY"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the model over an OpenAI-compatible API",
        description="Serve the model over an OpenAI-compatible HTTP API (/v1/models, /v1/chat/completions, "
        "/v1/completions; streamed or not; JSON-schema output). Listens on 127.0.0.1 by default; any other "
        "address needs an API key. Ctrl+C stops it. See docs/server.md.",
    )
    add_model_arguments(p, remote=False)
    p.set_defaults(strategy="fast")  # requests are decoded together (continuous batching)
    p.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST}: this machine only)"
    )
    p.add_argument(
        "--port",
        default=DEFAULT_PORT,
        help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one)",
        **whole_number(0, maximum=65535),
    )
    p.add_argument(
        "--api-key-file",
        type=Path,
        help=f"a file holding the API key clients must send as 'Authorization: Bearer …' (or set {KEY_ENV}); "
        "required for any address but 127.0.0.1",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow browser pages from ORIGIN (e.g. http://localhost:3000; repeatable). Default: no CORS",
    )
    p.add_argument(
        "--max-tokens", default=4096, help="most new tokens a request may ask for (default 4096)", **whole_number(1)
    )
    p.add_argument(
        "--allow-remote-media",
        action="store_true",
        help="fetch an image a request names by an http(s) URL (off: such a request is refused, since the server "
        "would reach out to an address a client names, on the client's behalf)",
    )
    p.add_argument(
        "--max-body-kb",
        default=32768,
        help="largest request body in KB (default 32768: room for images and files sent as data URLs)",
        **whole_number(1),
    )
    p.add_argument(
        "--parallel",
        default=None,
        help="replies decoded together at most (continuous batching; default 4); more wait in the queue",
        **whole_number(1, maximum=64),
    )
    p.add_argument(
        "--allow-model-load",
        action="store_true",
        help="a request naming another model loads it (default: it gets an error naming the loaded model)",
    )
    p.set_defaults(func=run)


def read_key(path: Optional[Path]) -> Optional[str]:
    """The API key from ``path`` or the environment; None if neither is given."""
    if path is not None:
        try:
            key = path.expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise RedlineError(
                f"Cannot read the API key file {path} ({exc.strerror or exc}).", "Check the path."
            ) from None
        if not key:
            raise RedlineError(f"The API key file {path} is empty.", "Write the key into it.")
        return key
    key = os.environ.get(KEY_ENV, "").strip()
    return key or None


def config_from_args(args) -> ServerConfig:
    return ServerConfig(
        host=args.host,
        port=args.port,
        api_key=read_key(args.api_key_file),
        cors_origins=list(args.cors_origin),
        max_body_bytes=args.max_body_kb * 1024,
        max_tokens_cap=args.max_tokens,
        strategy=args.strategy,
        load_on_request=args.allow_model_load,
        precision=args.precision,
        fetch_remote_media=args.allow_remote_media,
    )


def run(args) -> int:
    if args.model.startswith(("http://", "https://")):
        print(
            "error: redline serve serves a local model; --model names a server already. "
            "Connect clients to that server directly.",
            file=sys.stderr,
        )
        return 2
    service = None
    server = None
    try:
        config = config_from_args(args)
        config.validate()  # before the model spends time loading
        service = start_engine(args)
        config.strategy = args.strategy  # `auto` as start_engine resolved it (its note said which and why)
        server = ApiServer(service, config)
        address = server.start()
        target = service.target
        print(f"Serving {target.name} ({target.precision.label()}, {target.device}) at {address}", file=sys.stderr)
        if not is_loopback(config.host):
            print(
                f"note: listening on {config.host}: the model is reachable from the network; clients must send the "
                "API key.",
                file=sys.stderr,
            )
        print("Ctrl+C stops the server.", file=sys.stderr)
        sys.stderr.flush()
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(0.5) and server.running:
                pass
        except KeyboardInterrupt:
            pass
    except (RedlineError, ServerConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if server is not None:
            server.stop(reason="Redline is closing (redline serve was asked to stop)")
        if service is not None:
            service.shutdown()
    print("Server stopped.", file=sys.stderr)
    return 0
