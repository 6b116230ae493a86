"""One generation of the tool loop on the engine service (``ServiceGenerator``, the ``generate`` that
``run_tool_loop`` takes), for the CLI and the window.

A model loaded here is shown the tools as Redline's fallback does for a template without tool support (the tools
listed in the system message, past calls as ``<tool_call>`` blocks, results as ``<tool_response>`` blocks:
``decoding.tool_calls.conversation``), whatever its template, so the prompt needs nothing the engine's ordinary
chat path does not do (the engine passes ``tools=`` to a template only for the server's strict requests); its reply
is constrained by the same grammar the server uses: lazily (a call, once opened, must parse and name an offered
tool), or from its first token where a call is forced (``tool_choice``: ``required`` or a tool's name, in the first
round only — after a call the model answers or calls again as it chooses). A model on another server is sent the
tools as they are and sends its calls apart; ``tool_choice`` is not sent to it.

The text a reply streams is passed on with what may be a call held back (``CallStream``), so a terminal or the
window shows the answer, never the call's raw syntax."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Optional

from ..decoding.tool_calls import FAMILIES, CallStream, ToolError, conversation, tool_grammar
from ..errors import RedlineError
from ..events import FINAL, GenerationResult, TokenEvent
from .registry import definition_tokens

FALLBACK = FAMILIES["hermes"]
REMOTE_CHOICE = "tool_choice is not sent to a model on another server; it chooses for itself."


class ServiceGenerator:
    """``generate(messages, round) -> GenerationResult`` on ``service`` with ``tools`` offered. ``request(messages)``
    makes the GenerationRequest (sampling, options, context, client) for a message list; ``on_event`` gets each
    TokenEvent with calls held back from its text; ``on_progress`` each of the round's other events but its final one
    (StatsEvent, Queued, Started, PrefillProgress, Notice: what a window shows of a reply as it runs);
    ``tool_choice``: None/"auto", "none", "required" or a tool's name (the first round only)."""

    def __init__(
        self,
        service,
        tools: list[dict],
        request: Callable[[list[dict]], Any],
        tool_choice: Optional[str] = None,
        on_event: Optional[Callable[[Any], None]] = None,
        parallel: bool = True,
        on_progress: Optional[Callable[[Any], None]] = None,
    ):
        self.service = service
        self.on_progress = on_progress
        self.tools = list(tools)
        self.request = request
        self.tool_choice = tool_choice or "auto"
        self.on_event = on_event
        self.parallel = parallel
        self.notes: list[str] = []  # what the user should know (a choice the model's server is not sent)
        self.handle = None  # the generation running now
        self.cancelled = False
        self._grammar_source: Any = None  # (tokenizer, llguidance's tokenizer) of a local model; False: remote
        if self.tool_choice == "required" and not self.tools:
            raise RedlineError("tool_choice is required, but no tools are offered.", "Offer a tool, or choose auto.")
        if self.tool_choice not in ("auto", "none", "required") and self.tool_choice not in self.names:
            offered = ", ".join(self.names) or "none"
            raise RedlineError(
                f"--tool-choice names {self.tool_choice!r}, which is not offered; the tools are: {offered}."
            )

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def cancel(self) -> None:
        """Stop the generation running now (the loop's ``should_cancel`` should say so too)."""
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()

    def __call__(self, messages: list[dict], round_: int) -> GenerationResult:
        choice = self.tool_choice if round_ == 0 else ("auto" if self.tool_choice != "none" else "none")
        shown = self.tools if choice != "none" else []
        source = self._source()
        request_messages = list(messages)
        processor = None
        forced = False
        if source:  # a model loaded here: the fallback's prompt, the grammar
            tokenizer, lltok = source
            request_messages = fallback_messages(messages, shown)
            if shown:
                processor = self._grammar(lltok, tokenizer, shown, choice)
                forced = choice != "auto"
        request = self.request(request_messages)
        if source is False:  # a model on a server
            request.tools = shown or None
            if choice not in ("auto", "none") and REMOTE_CHOICE not in self.notes:
                self.notes.append(REMOTE_CHOICE)
        if processor is not None:
            request.logits_processor = processor
        return self._run(request, shown if source else [], forced)

    def _grammar(self, lltok, tokenizer, shown: list[dict], choice: str):
        wanted: Any = choice if choice in ("auto", "required") else {"type": "function", "function": {"name": choice}}
        try:
            return tool_grammar(lltok, tokenizer, FALLBACK, shown, wanted, self.parallel)
        except ToolError:
            if choice != "auto":
                raise
        except Exception as exc:  # the grammar library's refusal of a schema
            if choice != "auto":
                raise RedlineError(
                    f"The tools' parameters cannot be enforced: {exc}", "Simplify the tool's schema."
                ) from None
        self.notes.append("The tools' calls are not constrained: their schemas could not be made a grammar.")
        return None

    def _source(self):
        """(tokenizer, llguidance tokenizer) of the loaded model, made once on the engine's thread; False for a model
        on a server."""
        if self._grammar_source is None:
            self._grammar_source = self.service.call(_grammar_source_job, "the tools' grammar").result() or False
        return self._grammar_source

    def _run(self, request, shown: list[dict], forced: bool) -> GenerationResult:
        handle = self.service.submit(request)
        self.handle = handle
        stream = CallStream(FALLBACK, {t["function"]["name"] for t in shown}, forced) if shown else None
        last: Optional[TokenEvent] = None
        try:
            for ev in handle.events():
                if isinstance(ev, TokenEvent) and self.on_event is not None:
                    last = ev
                    if stream is not None:
                        ev = dataclasses.replace(ev, text=stream.feed(ev.text))
                    if ev.text or ev.reasoning:
                        self.on_event(ev)
                elif self.on_progress is not None and not isinstance(ev, (TokenEvent, *FINAL)):
                    self.on_progress(ev)
        except KeyboardInterrupt:
            handle.cancel()  # stops this reply within one decode step
            handle.wait(30)
            raise
        finally:
            self.handle = None
        result = handle.result()
        if stream is not None and last is not None and self.on_event is not None:
            rest, _ = stream.finish(cut=result.finish_reason == "length")
            if rest:
                # Text, not a token: marked as the engine marks its own last held-back delta (token_id -1, the next
                # index), so a reader counting tokens or their times does not count the last one twice.
                self.on_event(
                    dataclasses.replace(last, index=last.index + 1, token_id=-1, text=rest, reasoning="", logprobs=None)
                )
        return result


def fallback_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """``messages`` as a template without tool support reads them (``conversation``), each user message keeping its
    attachments (``conversation`` keeps a message's role and text alone)."""
    out = conversation(messages, tools, FALLBACK, native=False)
    attached = [m for m in messages if m.get("role") == "user"]
    plain = [m for m in out if m["role"] == "user" and not str(m["content"]).startswith("<tool_response>")]
    if len(attached) == len(plain):
        for source, made in zip(attached, plain):
            if source.get("attachments"):
                made["attachments"] = source["attachments"]
    return out


_sources: dict = {}  # the last model's (target, tokenizer, llguidance's tokenizer): about a second to make for 50k


def _grammar_source_job(engine, report):
    """On the engine's thread: the loaded model's tokenizer and llguidance's view of it, made once per model (None for
    a model on a server, which has no tokenizer here)."""
    target = getattr(engine, "target", None)
    tokenizer = target.text_tokenizer() if target is not None else None
    if tokenizer is None:
        return None
    hit = _sources.get("last")
    if hit is not None and hit[0]() is target and hit[1] is tokenizer:
        return hit[1], hit[2]
    # lazy: the grammar library loads only when tools are offered to a local model
    import llguidance.hf

    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=target.vocab_size())
    # One model at a time (the previous one's dropped), and never keeping a model alive after its unload.
    _sources["last"] = (weakref.ref(target), tokenizer, lltok)
    return tokenizer, lltok


def tool_tokens_job(tools: list[dict]):
    """A job for ``EngineService.call``: how many prompt tokens ``tools``'s definitions take for the loaded model, as
    the tool loop shows them to it (None for a model on a server, whose tokenizer is not here)."""

    def job(engine, report):
        target = getattr(engine, "target", None)
        tokenizer = target.text_tokenizer() if target is not None else None
        return None if tokenizer is None else definition_tokens(tools, tokenizer)

    return job
