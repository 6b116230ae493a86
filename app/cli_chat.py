"""`redline chat`: stream a reply to a prompt, or chat interactively in the terminal."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..inference import (
    ACCEPTED_FORMS,
    DEFAULT_PRIORITY,
    KV_FORMS,
    PRECISIONS,
    PRIORITIES,
    REASONING_EFFORTS,
    STRATEGIES,
    DecodeOptions,
    Document,
    EngineService,
    GenerationRequest,
    Progress,
    RedlineError,
    SamplingSettings,
    Thinking,
    TokenEvent,
    check_address_space,
    code_opt_in,
    default_device,
    is_server_url,
    kv_form_job,
    read_attachment,
    resolve_auto,
)
from .cli_args import SEED_MAX, above, at_least, whole_number
from .cli_tools import add_tool_arguments, close_tools, open_tools, run_with_tools, tool_record, uses_tools
from .server_keys import ServerKeys
from .terminal import TerminalProgress
from .trust_store import TrustStore, opt_in_from

REMOTE_KEY_ENV = "REDLINE_REMOTE_API_KEY"


def remote_key(args) -> str | None:
    """The API key for the server ``args.model`` names: --server-key-file, the environment, or the saved one."""
    path = getattr(args, "server_key_file", None)
    if path is not None:
        try:
            key = path.expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise RedlineError(f"Cannot read {path} ({exc.strerror or exc}).", "Check --server-key-file.") from None
        return key or None
    if os.environ.get(REMOTE_KEY_ENV, "").strip():
        return os.environ[REMOTE_KEY_ENV].strip()

    return ServerKeys().get(args.model)


def add_model_arguments(p: argparse.ArgumentParser, remote: bool = True) -> None:
    """Model, precision and strategy options shared by chat-like commands."""
    forms = ACCEPTED_FORMS + (", or a server's address, http://HOST:PORT/v1[#MODEL]" if remote else "")
    p.add_argument("--model", default="starter", help=f"the model: {forms}")
    if remote:
        p.add_argument(
            "--server-key-file",
            type=Path,
            help="a file holding the API key of the server --model names (default: the key saved for it in "
            f"the window, or ${REMOTE_KEY_ENV})",
        )
    p.add_argument(
        "--precision",
        default="auto",
        help="auto (default: the fastest that fits this machine for --priority), or one of "
        f"{', '.join(PRECISIONS)}; mixed: e.g. nf4+keep=lm_head",
    )
    p.add_argument(
        "--strategy",
        default="auto",
        choices=("auto", *STRATEGIES),
        help="decoding strategy (default auto: the fastest of kv and fast for the precision)",
    )
    p.add_argument(
        "--priority",
        default=DEFAULT_PRIORITY,
        choices=PRIORITIES,
        help="what auto favours: quality (highest precision that fits), balanced (default: the fastest with "
        "8-bit weights or more), speed (the fastest)",
    )
    p.add_argument("--draft", help="draft model for --strategy speculative (same forms as --model)")
    p.add_argument("--draft-precision", default="auto", help="precision of the draft model")
    p.add_argument(
        "--num-draft-tokens", default=5, help="tokens the draft proposes per step (default 5)", **whole_number(1)
    )
    p.add_argument("--draft-schedule", default="constant", choices=("constant", "heuristic"))
    p.add_argument("--lookup-tokens", default=10, help="tokens copied per prompt-lookup match", **whole_number(1))
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the decode step for --strategy static (default: on for CUDA, off for CPU)",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow this model's own Python code to run (only for models you trust)",
    )
    p.add_argument(
        "--allow-pickle", action="store_true", help="allow pickle-based .bin weights (loaded with weights_only=True)"
    )
    add_kv_argument(p)


def add_kv_argument(p: argparse.ArgumentParser) -> None:
    """``--kv bf16|q8``: the fast path's KV cache in its float dtype or in 8 bits (chat, serve, bench)."""
    p.add_argument(
        "--kv",
        default="bf16",
        choices=KV_FORMS,
        help="the fast path's KV cache: bf16 (default: the model's float dtype) or q8 (int8 with a scale per token "
        "and head: about half the memory and the bytes a step reads; see docs/performance.md for what it costs); in "
        "redline bench, the form of rows that name none (a row's +kv=q8|bf16 wins)",
    )


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", default=256, **whole_number(1))
    p.add_argument(
        "--temperature", default=None, help="0 = greedy; default: the model's own", **at_least(0.0, "0 is greedy")
    )
    p.add_argument("--top-p", default=None, **above(0.0, maximum=1.0))
    p.add_argument("--top-k", default=None, **whole_number(0, "0 turns it off"))
    p.add_argument("--repetition-penalty", default=None, **above(0.0, "1 changes nothing"))
    p.add_argument("--seed", default=None, **whole_number(0, maximum=SEED_MAX))
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--context", default=None, help="context length in tokens (default: the model's)", **whole_number(1))


def add_parser(sub) -> None:
    p = sub.add_parser(
        "chat",
        help="chat with a model in the terminal",
        description="Stream a reply to PROMPT, or chat interactively when no prompt is given "
        "(/exit quits, /reset starts over).",
    )
    p.add_argument("prompt", nargs="?", help="the message; omit for an interactive chat")
    p.add_argument("--system", help="system prompt")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON record instead of streaming text (a reasoning model's thinking in 'reasoning', apart "
        "from the answer in 'text')",
    )
    p.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="FILE",
        help="attach a document (PDF, DOCX, Markdown, text, source) or an image to the message (repeatable); in an "
        "interactive chat, to the first message",
    )
    add_thinking_arguments(p)
    add_model_arguments(p)
    add_sampling_arguments(p)
    add_tool_arguments(p)  # tools: --mcp, --builtin-tools, --allow-tool, --tool-choice… (app/cli_tools.py)
    p.set_defaults(func=run)


def read_attachments(paths: list[str]) -> list:
    """The files given with ``--attach``, read before the model loads, so a file that cannot be attached fails
    at once (AttachmentError, a RedlineError) instead of after a load."""
    return [read_attachment(path) for path in paths]


def user_message(text: str, attachments: list) -> dict:
    message: dict = {"role": "user", "content": text}
    if attachments:
        message["attachments"] = attachments
    return message


def attachment_records(attachments: list) -> list[dict]:
    """What ``--json`` says of each attachment: its name, kind and size (not its text or bytes)."""
    out = []
    for a in attachments:
        if isinstance(a, Document):
            out.append({"name": a.name, "kind": a.kind, "pages": a.page_count, "sha256": a.sha256})
        else:
            out.append(
                {"name": a.name, "kind": "image", "mime": a.mime, "size": [a.width, a.height], "sha256": a.sha256}
            )
    return out


def add_thinking_arguments(p: argparse.ArgumentParser) -> None:
    """A reasoning model's switch (docs/chat.md#reasoning-models); a model that does not reason ignores them."""
    p.add_argument(
        "--thinking",
        choices=("on", "off"),
        default=None,
        help="a reasoning model thinks before it answers (default: the model's own choice)",
    )
    p.add_argument(
        "--reasoning-effort", choices=REASONING_EFFORTS, help="how hard it thinks, where the model has levels"
    )
    p.add_argument(
        "--thinking-budget",
        default=None,
        help="at most this many thinking tokens; then the thinking is closed and the answer follows",
        **whole_number(1),
    )
    p.add_argument(
        "--hide-thinking",
        action="store_true",
        help="do not print a reasoning model's thinking (shown dimmed otherwise; on stderr when stdout is not a "
        "terminal, so a redirect keeps the answer alone)",
    )


def thinking_from_args(args) -> Thinking | None:
    thinking = getattr(args, "thinking", None)
    effort = getattr(args, "reasoning_effort", None)
    budget = getattr(args, "thinking_budget", None)
    if thinking is None and effort is None and budget is None:
        return None
    return Thinking(enabled=None if thinking is None else thinking == "on", effort=effort, budget=budget)


class ReplyPrinter:
    """Writes a reply as it streams: a reasoning model's thinking dimmed (on a terminal; plain on stderr when stdout is
    not one, so a redirect holds the answer alone), a blank line, then the answer; the thinking left out with
    ``hide``."""

    DIM, RESET = "\x1b[2m", "\x1b[0m"

    def __init__(self, out=None, err=None, hide: bool = False):
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.hide = hide
        tty = getattr(self.out, "isatty", lambda: False)()
        self.color = tty and not os.environ.get("NO_COLOR")
        self.thought = self.out if tty else self.err
        self.thinking = False  # thinking text written, the answer not begun

    def __call__(self, event: TokenEvent) -> None:
        if event.reasoning and not self.hide:
            if not self.thinking and self.color:
                self.thought.write(self.DIM)
            self.thinking = True
            self.thought.write(event.reasoning)
            self.thought.flush()
        if event.text:
            self._close()
            self.out.write(event.text)
            self.out.flush()

    def _close(self) -> None:
        if self.thinking:
            self.thought.write((self.RESET if self.color else "") + "\n\n")
            self.thought.flush()
            self.thinking = False

    def end(self) -> None:
        """The reply ended (a reply cut off while thinking leaves the colour reset)."""
        self._close()


def sampling_from_args(args) -> SamplingSettings:
    return SamplingSettings(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
    )


def options_from_args(args) -> DecodeOptions:
    return DecodeOptions(
        strategy=args.strategy,
        num_draft_tokens=args.num_draft_tokens,
        draft_schedule=args.draft_schedule,
        lookup_tokens=args.lookup_tokens,
        compile=args.compile,
    )


def start_engine(args, quiet: bool = False) -> EngineService:
    """The engine service with the model (and draft) of ``args`` loaded, progress on the terminal."""
    if args.strategy == "speculative" and not args.draft:  # said before the target spends time loading
        raise RedlineError(
            "--strategy speculative needs --draft.", "Pass a small model of the same family, e.g. --draft starter."
        )
    remote = is_server_url(args.model)
    opt_in = None if remote else opt_in_from(TrustStore(), args.trust_remote_code, args.allow_pickle)
    if not remote:
        # Before torch starts its threads: under too tight a ulimit -v they could not, and libgomp would end the
        # process without a word of Redline's.
        check_address_space(args.model, args.precision)
        # Trust first: an untrusted model's custom config may lack what the estimate for ``auto`` reads, and the
        # reason to give is the code it needs, not the field it lacks.
        needs = code_opt_in(args.model)
        if needs is not None and not opt_in(needs):
            raise needs
        resolve_auto_args(default_device(), args, quiet)
    parallel = getattr(args, "parallel", None)
    service = EngineService(max_active=parallel) if parallel else EngineService()
    progress = TerminalProgress()
    speculative = args.strategy == "speculative"
    try:
        service.call(kv_form_job(getattr(args, "kv", "bf16")), "the KV cache's form").result()  # for the load below
        handle = service.load(
            args.model,
            args.precision,
            draft=args.draft if speculative else None,
            draft_precision=args.draft_precision,
            opt_in=opt_in,
            api_key=remote_key(args) if remote else None,
            draft_required=True,  # --strategy speculative without its draft would only fail later
            context=getattr(args, "context", None),  # what a load that runs out of memory names
        )
        for ev in handle.events():
            if isinstance(ev, Progress):
                progress(ev.fraction, ev.phase)
        progress.done()
        report = handle.result()
    except BaseException:
        service.shutdown()
        raise
    if args.draft and not speculative and not quiet:
        print("note: --draft is only used with --strategy speculative", file=sys.stderr)
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    strategies = service.target.capabilities.strategies
    if args.strategy not in strategies and args.strategy != "auto" and not quiet:
        print(
            f"note: --strategy {args.strategy} is not sent: {report.name} decodes as its server chooses",
            file=sys.stderr,
        )
    return service


def resolve_auto_args(device: str, args, quiet: bool = False):
    """``--precision auto`` / ``--strategy auto``: the configuration the chat window would choose
    (``resolve_auto``); args are updated in place and the reason goes to stderr."""
    if "auto" not in (args.precision, args.strategy):
        return None
    choice = resolve_auto(
        args.model,
        device,
        args.precision,
        args.strategy,
        getattr(args, "priority", DEFAULT_PRIORITY),
        getattr(args, "context", None),
        kv=getattr(args, "kv", "bf16"),
    )
    if args.precision == "auto" and choice.precision:
        args.precision = choice.precision
    if args.strategy == "auto":
        args.strategy = choice.strategy
    if hasattr(args, "kv"):
        args.kv = choice.kv  # 8 bits where only that makes the context fit (the reason says so)
    if not quiet:
        print(f"note: {choice.reason}", file=sys.stderr)
    return choice


def _stream_reply(service: EngineService, messages: list[dict], args) -> "object":
    request = GenerationRequest(
        messages=messages,
        sampling=sampling_from_args(args),
        options=options_from_args(args),
        context=args.context,
        client="cli",
        thinking=thinking_from_args(args),
    )
    handle = service.submit(request)
    printer = ReplyPrinter(hide=getattr(args, "hide_thinking", False))
    try:
        for ev in handle.events():
            if isinstance(ev, TokenEvent) and not args.json:
                printer(ev)
    except KeyboardInterrupt:
        handle.cancel()  # stops this reply within one decode step; what was written is kept
        handle.wait(30)
        raise
    finally:
        printer.end()
    return handle.result()


def result_record(service: EngineService, result) -> dict:
    record = result.to_dict()
    record["model"] = service.target.name
    record["answer_tokens"] = result.answer_tokens  # beside reasoning_tokens: they add up to new_tokens
    record["device"] = service.target.device
    return record


def run(args) -> int:
    service = None
    try:
        attachments = read_attachments(getattr(args, "attach", []))
        open_tools(args)  # tools: the mcp.json read and its servers started before the model loads (cli_tools.py)
        service = start_engine(args)
        if args.prompt is None:
            return interactive(service, args, attachments)
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append(user_message(args.prompt, attachments))
        result = (run_with_tools if uses_tools(args) else _stream_reply)(service, messages, args)  # tools: the loop
        if args.json:
            record = result_record(service, result)
            record["attachments"] = attachment_records(attachments)
            record.update(tool_record(result))  # tools: the calls and their results
            print(json.dumps(record, ensure_ascii=False))
    except RedlineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        close_tools(args)  # tools: the MCP servers stopped
        if service is not None:
            service.shutdown()
    if not args.json:
        print()
        for note in result.notes:
            if not note.startswith("Traceback"):
                print(f"note: {note}", file=sys.stderr)
        if result.tokens_per_s:
            print(f"[{summary(result)}]", file=sys.stderr)
    if result.finish_reason == "error":
        print(f"error: {result.error}", file=sys.stderr)
        return 1
    return 0


def summary(result) -> str:
    """The line after a reply: its tokens, speed, TTFT and end; a reasoning model's thinking and answer apart."""
    tokens = f"{result.new_tokens} tokens"
    first = ""
    if result.reasoning_format is not None:
        tokens += f" ({result.reasoning_tokens} thinking, {result.answer_tokens} answer)"
        if result.ttfat_ms is not None and result.reasoning_tokens:
            first = f", first answer token {result.ttfat_ms:.0f} ms"
    return f"{tokens}, {result.tokens_per_s:.1f} tok/s, TTFT {result.ttft_ms:.0f} ms{first}, {result.finish_reason}"


def interactive(service: EngineService, args, attachments: list | None = None) -> int:
    target = service.target
    print(
        f"Chatting with {target.name} ({target.precision.label()}, {target.device}). /exit quits, /reset starts over.",
        file=sys.stderr,
    )
    base = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(base)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if line.strip() == "/exit":
            return 0
        if line.strip() == "/reset":
            messages = list(base)
            print("(conversation reset)", file=sys.stderr)
            continue
        if not line.strip():
            continue
        first = not any(m["role"] == "user" for m in messages)
        messages.append(user_message(line, (attachments or []) if first else []))
        try:
            result = (run_with_tools if uses_tools(args) else _stream_reply)(service, messages, args)  # tools: the loop
        except KeyboardInterrupt:
            print("\n(stopped)", file=sys.stderr)
            continue
        except RedlineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            messages.pop()
            continue
        print()
        if result.finish_reason == "error":
            print(f"error: {result.error}", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": result.text})


def run_interactive_default(model: str) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    add_parser(sub)
    return run(parser.parse_args(["chat", "--model", model]))
