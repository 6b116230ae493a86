"""The one streaming parser: a reasoning model's reply, as its text deltas arrive, split into its reasoning and
its answer.

Every consumer reads the split from here (the engine runs it on each reply, ``split.py``): the window, the CLI, the
server and the speed lab see the same two strings. What it handles:

- a tag split over several deltas (``</th`` + ``ink>``): the start of a possible marker is held back until the
  next delta says what it is, so neither part ever shows half a tag;
- a template that pre-fills the opening tag (Qwen3, DeepSeek-R1): the reply starts inside the thinking and holds
  only the closing tag (``ReasoningStream(fmt, thinking=True)``; ``prompt_state`` reads it off the prompt);
- a reply cut off while still thinking: everything is reasoning, the answer empty, ``thinking`` stays True;
- a tool call after the thinking goes to the answer (where the tool-call parser reads it); one opened inside the
  thinking (``<tool_call>`` before ``</think>``) ends the thinking, as the call is not a thought;
- gpt-oss's harmony messages: ``analysis`` is reasoning, ``final`` and ``commentary`` preambles the answer, a
  ``commentary`` message to ``functions.NAME`` a tool call, written into the answer as a Hermes block
  (``<tool_call>{"name": …, "arguments": …}</tool_call>``) that the tool-call parser reads;
- whitespace: the reasoning's leading and trailing whitespace and the answer's leading whitespace (the blank line
  after ``</think>``) are dropped, so each part reads as it is shown.

The answer never holds a think tag or a channel marker: a stray closing tag in the answer is dropped.

Tokens are counted per part (``feed(text, tokens)``): a token is the reasoning's if the reply was thinking before
or after its text (the closing tag is thinking's), the answer's otherwise; a harmony header's tokens belong to the
message they open. So the two counts add up to the reply's tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

from .formats import ReasoningFormat

HEADER_LIMIT = 256  # characters of a harmony header without <|message|>: past this it is text, not a header


@dataclass
class Split:
    """What one delta added to each part."""

    reasoning: str = ""
    answer: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.answer)


def _find(buf: str, markers) -> tuple[int, str]:
    """The earliest complete marker in ``buf``: (its index, the marker), or (-1, "")."""
    best, which = -1, ""
    for m in markers:
        i = buf.find(m)
        if i != -1 and (best == -1 or i < best or (i == best and len(m) > len(which))):
            best, which = i, m
    return best, which


def _held(buf: str, markers) -> int:
    """How many characters at the end of ``buf`` could be the start of a marker (held back until known). Only the
    last ``len(marker) - 1`` characters can be, and only from an occurrence of the marker's first character: most
    deltas have none there, and cost two ``find``s."""
    hold = 0
    for m in markers:
        start = buf.find(m[0], max(0, len(buf) - len(m) + 1))
        while start != -1:
            if m.startswith(buf[start:]):
                hold = max(hold, len(buf) - start)
                break
            start = buf.find(m[0], start + 1)
    return hold


class ReasoningStream:
    """Feed it the reply's text deltas; each ``feed`` returns what it added to the reasoning and to the answer."""

    def __init__(self, fmt: ReasoningFormat, thinking: bool = False):
        self.fmt = fmt
        self.reasoning = ""
        self.answer = ""
        self.reasoning_tokens = 0
        self.answer_tokens = 0
        self.closed = False  # a thinking block ended (its closing tag, a call, a forced close)
        self._undecided = 0  # tokens whose part is not known yet (before the opening tag, inside a header)
        self._buf = ""
        self._lead = True  # drop the leading whitespace of the part being written
        self._ws = ""  # the reasoning's trailing whitespace, held (shown only if more reasoning follows)
        self._call: Optional[str] = None  # harmony: the function a commentary message calls
        self._channel = ""
        self._pending_prefix = ""  # harmony: what goes before the next message's text (a call's opening, a gap)
        if fmt.kind == "harmony":
            self._state = "header"
        else:
            self._state = "reasoning" if thinking else "start"

    # -- what it is now --------------------------------------------------------------------------------
    @property
    def thinking(self) -> bool:
        """The reply is inside its thinking now (a budget counts these tokens; a cut-off reply stays True)."""
        return self._state == "reasoning"

    @property
    def undecided(self) -> bool:
        return self._state in ("start", "header", "between")

    # -- feeding -----------------------------------------------------------------------------------------
    def feed(self, text: str, tokens: int = 1) -> Split:
        before = self.thinking
        out = Split()
        self._buf += text
        if self.fmt.kind == "harmony":
            self._harmony(out)
        else:
            self._tags(out)
        self._count(tokens, before)
        return out

    def _count(self, tokens: int, before: bool) -> None:
        if before or self.thinking:
            self.reasoning_tokens += tokens + self._undecided
            self._undecided = 0
        elif self.undecided:
            self._undecided += tokens
        else:
            self.answer_tokens += tokens + self._undecided
            self._undecided = 0

    def finish(self) -> Split:
        """The reply ended: what was held back goes to its part (a partial tag at the very end is text)."""
        out = Split()
        buf, self._buf = self._buf, ""
        if self._state == "reasoning":
            self._reason(out, buf.rstrip())
        elif self._state == "header":
            if "<|" not in buf and buf.strip():  # a model that never wrote a header: its text is its answer
                self._say(out, buf)
        elif self._state == "start":
            if buf.strip():
                self._say(out, buf.lstrip())
        elif self._state in ("answer", "body"):
            self._say(out, buf if not self._lead else buf.lstrip())
            if self._call is not None:
                self._say(out, "}\n</tool_call>")
                self._call = None
        if self._undecided:
            if self.thinking:
                self.reasoning_tokens += self._undecided
            else:
                self.answer_tokens += self._undecided
            self._undecided = 0
        return out

    # -- the parts ------------------------------------------------------------------------------------
    def _reason(self, out: Split, text: str) -> None:
        """Append ``text`` to the reasoning: leading whitespace of a block dropped, trailing whitespace held."""
        if self._lead:
            text = text.lstrip()
            if not text:
                return
            self._lead = False
            if self.reasoning:  # a second thinking block: a blank line between them
                text = "\n\n" + text
        stripped = text.rstrip()
        if stripped:
            added = self._ws + stripped
            self._ws = text[len(stripped) :]
            out.reasoning += added
            self.reasoning += added
        else:
            self._ws += text

    def _say(self, out: Split, text: str) -> None:
        if self._lead:
            text = text.lstrip()
            if not text:
                return
            self._lead = False
        out.answer += text
        self.answer += text

    def _enter(self, state: str) -> None:
        if state == "reasoning":
            self._ws = ""
        if self._state == "reasoning" and state != "reasoning":
            self.closed = True
            self._ws = ""
        self._state = state
        self._lead = True

    # -- <think>…</think>, [THINK]…[/THINK] --------------------------------------------------------------
    def _tags(self, out: Split) -> None:
        fmt = self.fmt
        while self._buf:
            buf = self._buf
            if self._state == "start":
                body = buf.lstrip()
                for tag, to in ((fmt.open, "reasoning"), (fmt.close, "answer")):
                    if body.startswith(tag):
                        self._buf = body[len(tag) :]
                        self._enter(to)
                        break
                    if tag.startswith(body):  # the start of the tag, or only whitespace so far: wait
                        return
                else:
                    self._enter("answer")
                    self._buf = body
                continue
            if self._state == "reasoning":
                ends = (fmt.close, *fmt.calls_end_thinking)
                i, marker = _find(buf, ends)
                if i == -1:
                    keep = _held(buf, ends)
                    self._reason(out, buf[: len(buf) - keep])
                    self._buf = buf[len(buf) - keep :]
                    return
                self._reason(out, buf[:i])
                self._buf = buf[i + len(marker) :] if marker == fmt.close else buf[i:]
                self._enter("answer")
                if marker != fmt.close:
                    self._lead = False  # the call's text is the answer's from its first character
                continue
            # the answer: a second thinking block opens with the tag; a stray closing tag is dropped
            i, marker = _find(buf, (fmt.open, fmt.close))
            if i == -1:
                keep = _held(buf, (fmt.open, fmt.close))
                self._say(out, buf[: len(buf) - keep])
                self._buf = buf[len(buf) - keep :]
                return
            self._say(out, buf[:i])
            self._buf = buf[i + len(marker) :]
            if marker == fmt.open:
                self._enter("reasoning")

    # -- harmony ---------------------------------------------------------------------------------------
    _BODY_ENDS = ("<|end|>", "<|return|>", "<|call|>", "<|start|>", "<|channel|>")
    _RECIPIENT = re.compile(r"to=([^\s<]+)")

    def _harmony(self, out: Split) -> None:
        while self._buf:
            buf = self._buf
            if self._state in ("header", "between"):
                if self._state == "between":
                    i, marker = _find(buf, ("<|start|>", "<|channel|>"))
                    if i == -1:
                        keep = _held(buf, ("<|start|>", "<|channel|>"))
                        stray = buf[: len(buf) - keep]
                        if stray.strip():  # text outside any message: the answer's, never lost
                            self._enter("answer")
                            self._buf = buf
                            continue
                        self._buf = buf[len(buf) - keep :]
                        return
                    self._buf = buf[i:]
                    self._state = "header"
                    continue
                i = buf.find("<|message|>")
                if i == -1:
                    if len(buf) > HEADER_LIMIT and "<|" not in buf:  # not a header: the model writes plain text
                        self._enter("answer")
                        continue
                    return  # the header is not complete yet
                self._open_message(buf[:i])
                self._buf = buf[i + len("<|message|>") :]
                continue
            i, marker = _find(buf, self._BODY_ENDS)
            body_state = self._state
            if i == -1:
                keep = _held(buf, self._BODY_ENDS)
                self._body(out, buf[: len(buf) - keep], body_state)
                self._buf = buf[len(buf) - keep :]
                return
            self._body(out, buf[:i], body_state)
            if self._call is not None:
                self._say(out, "}\n</tool_call>")
                self._call = None
            if marker in ("<|start|>", "<|channel|>"):  # a new message without <|end|> first
                self._buf = buf[i:]
            else:
                self._buf = buf[i + len(marker) :]
            self._enter("between")

    def _open_message(self, header: str) -> None:
        channel = ""
        if "<|channel|>" in header:
            channel = header.split("<|channel|>", 1)[1].split("<|", 1)[0].strip().split(" ")[0]
        self._channel = channel
        found = self._RECIPIENT.search(header)
        recipient = found.group(1) if found else ""
        if channel == "analysis":
            self._enter("reasoning")
        elif recipient.startswith("functions."):
            self._enter("answer")
            name = recipient[len("functions.") :]
            self._call = name
            prefix = '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": '
            if self.answer:
                prefix = "\n" + prefix
            self._lead = False
            self._pending_prefix = prefix
        else:  # final, a commentary preamble, a channel this parser does not know: the answer
            self._enter("answer")
            if self.answer:
                self._pending_prefix = "\n\n"  # a second message: a blank line between them

    def _body(self, out: Split, text: str, state: str) -> None:
        if not text:
            return
        if state == "reasoning":
            self._reason(out, text)
            return
        prefix = self._pending_prefix
        if self._lead and self._call is None:
            text = text.lstrip()
            if not text:
                return
            self._lead = False
        if prefix:
            self._pending_prefix = ""
            text = prefix + text
        self._say(out, text)


def prompt_state(fmt: ReasoningFormat, prompt_tail: str) -> bool:
    """Whether the reply starts inside its thinking: the prompt (its last few hundred characters, as text with the
    format's markers kept) ends after an opening tag that no closing tag follows — Qwen3's and DeepSeek-R1's
    templates pre-fill ``<think>``, and Qwen3's with thinking off pre-fills ``<think>\\n\\n</think>\\n\\n``."""
    if fmt.kind != "tags":
        return False
    opened = prompt_tail.rfind(fmt.open)
    return opened != -1 and prompt_tail.find(fmt.close, opened) == -1
