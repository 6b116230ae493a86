"""`redline` command line: with no subcommand it opens the desktop app.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``;
the module sets ``func`` on its parser to the function that runs it.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__, cli_bench, cli_chat, cli_estimate, cli_models, cli_serve, launch

SUBCOMMANDS = [cli_chat, cli_models, cli_estimate, cli_bench, cli_serve]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="redline",
        description="Redline: chat with local LLMs, and see, measured, why it is fast. "
        "With no subcommand, opens the desktop app.",
    )
    parser.add_argument("--version", action="version", version=f"redline {__version__}")
    parser.add_argument("--model", help="open the app with this model loading (same forms as `redline chat`)")
    # Maintenance: start the real window without a model, check it, exit (used by the packaging tests).
    parser.add_argument("--smoke-test", action="store_true", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(title="subcommands", dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def no_telemetry() -> None:
    """Nothing leaves the machine that the user did not start: no library telemetry."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")


def main(argv: list[str] | None = None) -> int:
    no_telemetry()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # `redline bench --markdown` quotes it
    if args.smoke_test:
        # lazy: the smoke test opens the window; Qt loads for it, never for the command line's other commands
        from .smoke import run_smoke_test

        return run_smoke_test()
    if args.command is None:
        return open_gui(args)
    return int(args.func(args) or 0)


def open_gui(args) -> int:
    return launch.open_gui(args.model, cli_chat.run_interactive_default)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
