"""Tool calls: how each model family writes a call, read back from its reply, and enforced while decoding.

A family is found from the model's chat template (the text it renders an assistant's past calls with):

=========  ===================================================  =======================================
family     the call as the model writes it                      templates that use it
=========  ===================================================  =======================================
hermes     ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``  Qwen 2.5/3, Hermes 2/3, SmolLM3, and
           (one block per call)                                 Redline's fallback for templates
                                                                without tool support
llama3     ``{"name": …, "parameters": {…}}`` (the whole reply;  Llama 3.1/3.2/3.3 JSON tool calling
           ``<|python_tag|>`` before it is allowed)
mistral    ``[TOOL_CALLS][{"name": …, "arguments": {…}}, …]``    Mistral 7B v0.3, Mixtral, Nemo
=========  ===================================================  =======================================

A template without tools support (no ``tools`` in it) gets Redline's one fallback: the tools listed in a system
message in the Hermes format, past calls written as ``<tool_call>`` blocks and tool results as ``<tool_response>``
blocks in a user turn; the reply is read as Hermes.

Constrained calls (llguidance): with ``tool_choice`` ``required`` or a named function the whole reply is the
family's call syntax, its name one of the tools (or the named one) and its arguments that tool's JSON schema. With
``auto`` the grammar is lazy: nothing is masked until the model opens a call (``<tool_call>``, ``[TOOL_CALLS]``, a
reply starting with ``{`` for llama3); from there the call must parse, and the reply ends after the calls.
A reply whose call names an unknown tool or whose arguments do not parse is returned as text, never as a call.
The grammar lets the model end after any complete call, a newline after it included (a Hermes model writes
``</tool_call>`` and a newline before its end of turn; a grammar that then wanted another call made the starter
start one it could not finish). A reply cut by ``max_tokens`` in the middle of a call after complete ones
(``parse(..., cut=True)``) keeps the complete calls: the unfinished one is dropped, never returned half written.

The window reads a chat reply with the same parsers (``read_calls``), without a list of tools: any function-like
name, every family's syntax; and it stores a remote server's ``tool_calls`` in the reply's text in one canonical
form, the Hermes blocks (``calls_text``), which ``read_calls`` reads back.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import RedlineError


class ToolError(RedlineError):
    """A tools / tool_choice request that cannot be run as asked."""


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Family:
    name: str
    trigger: str  # the text that opens a call (lazy grammar); "" for llama3 (the reply's first "{")
    args_key: str  # "arguments" or "parameters"

    def render_call(self, name: str, arguments: dict) -> str:
        """One call as the model writes it (the fallback's way of showing a past call)."""
        body = json.dumps({"name": name, self.args_key: arguments}, ensure_ascii=False)
        if self.name == "hermes":
            return f"<tool_call>\n{body}\n</tool_call>"
        if self.name == "mistral":
            return f"[TOOL_CALLS][{body}]"
        return body


FAMILIES = {
    "hermes": Family("hermes", "<tool_call>", "arguments"),
    "llama3": Family("llama3", "", "parameters"),
    "mistral": Family("mistral", "[TOOL_CALLS]", "arguments"),
}


def template_text(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates: the tool-use one, else the default
        template = template.get("tool_use") or template.get("default") or ""
    return template if isinstance(template, str) else ""


def family_of(tokenizer) -> tuple[Family, bool]:
    """(the family whose call format the model writes, whether its own template takes ``tools``)."""
    text = template_text(tokenizer)
    native = "tools" in text
    if "[TOOL_CALLS]" in text:
        return FAMILIES["mistral"], native
    if "<tool_call>" in text:
        return FAMILIES["hermes"], native
    if native and ("<|python_tag|>" in text or '"parameters"' in text or "ipython" in text):
        return FAMILIES["llama3"], native
    return FAMILIES["hermes"], native


# -- reading a reply --------------------------------------------------------------------------------------
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


# A call's name when no list of tools says which are offered (the window): a function's name, as OpenAI allows.
_ANY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
_CALL_KEYS = ({"name", "arguments"}, {"name", "parameters"})


def _one(obj: Any, names: Optional[set[str]], strict: bool = False) -> Optional[ToolCall]:
    """One call from a decoded JSON value, or None. ``names`` None: any function-like name. ``strict``: the object
    is exactly a name and its arguments (a bare JSON reply, with no tag saying it is a call, must be that)."""
    if not isinstance(obj, dict):
        return None
    if "function" in obj and isinstance(obj["function"], dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    if strict and set(obj) not in _CALL_KEYS:
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(name, str) or not isinstance(args, dict):
        return None
    offered = name in names if names is not None else bool(_ANY_NAME.fullmatch(name))
    if not offered:
        return None
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


def _scan_json(text: str, i: int = 0) -> tuple[list[tuple[Any, int]], Optional[int]]:
    """The JSON values in ``text`` from ``i`` on, one after another (separated by whitespace, ``;`` or ``,``), each
    with where it ends; and where the first that does not parse starts (None: all of the text parsed)."""
    decoder = json.JSONDecoder()
    found: list[tuple[Any, int]] = []
    while True:
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i >= len(text):
            return found, None
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            return found, i
        found.append((value, end))
        i = end


def _json_values(text: str) -> Optional[list]:
    """Every JSON value in ``text`` one after another, or None where any part of it is not JSON."""
    found, stopped = _scan_json(text)
    return None if stopped is not None else [value for value, _ in found]


def parse(family: Family, text: str, names: Optional[set[str]], cut: bool = False) -> tuple[str, list[ToolCall]]:
    """(the reply's text before its calls, its calls) — or (the whole text, []) when the reply holds no call, or a
    call that does not parse or names a tool not offered: such a reply is text, never a broken call. ``names``
    None: no tools were offered to check against (the window); a llama3 reply must then be exactly
    ``{"name": …, "parameters": {…}}`` objects, so a reply that is JSON with a "name" is not taken for a call.
    ``cut``: the reply was stopped by its token limit, so its end may be a call begun and not finished: that call is
    dropped and the complete ones before it are the calls."""
    if cut:
        content, calls = parse(family, text, names)
        if calls:
            return content, calls
        trimmed = _before_unfinished(family, text)
        return parse(family, trimmed, names) if trimmed is not None else (text, [])
    whole = (text, [])
    if family.name == "hermes":
        start = text.find("<tool_call>")
        if start < 0:
            return whole
        blocks = _HERMES.findall(text, start)
        rest = _HERMES.sub("", text[start:]).strip()
        if not blocks or rest:  # an unclosed block, or text between or after the calls
            return whole
        calls = [_one(_loads(b), names) for b in blocks]
        return (text[:start].rstrip(), calls) if all(calls) else whole
    if family.name == "mistral":
        start = text.find("[TOOL_CALLS]")
        if start < 0:
            return whole
        body = text[start + len("[TOOL_CALLS]") :].strip()
        calls = _mistral(body, names)
        return (text[:start].rstrip(), calls) if calls else whole
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :].strip()
    if not body.startswith("{"):
        return whole
    values = _json_values(body)
    if not values:
        return whole
    calls = [_one(v, names, strict=names is None) for v in values]
    return ("", calls) if all(calls) else whole


def _before_unfinished(family: Family, text: str) -> Optional[str]:
    """``text`` up to the end of its last complete call, where what follows is the start of another call cut short;
    None where it is not (no complete call before it, or text that is no call at all)."""
    if family.name == "hermes":
        end = text.rfind("</tool_call>")
        if end < 0:
            return None
        end += len("</tool_call>")
        tail = text[end:].strip()
        opening = "<tool_call>"
        return text[:end] if tail.startswith(opening) or opening.startswith(tail) else None
    if family.name == "mistral":
        start = text.find("[TOOL_CALLS]")
        if start < 0:
            return None
        at = text.find("[", start + len("[TOOL_CALLS]"))
        if at < 0:
            return None
        ends = _complete_values(text, at + 1)
        return text[: ends[-1]] + "]" if ends else None
    at = text.find("{")
    if at < 0 or text[:at].strip() not in ("", "<|python_tag|>"):
        return None
    ends = _complete_values(text, at)
    return text[: ends[-1]] if ends else None


def _complete_values(text: str, i: int) -> list[int]:
    """Where each JSON value that parses whole ends, from ``i`` on (separated as ``_json_values`` allows), up to the
    first that does not; [] where the first does not, or where what follows the last is not the start of another
    (a cut call opens with "{"; anything else means the text is not calls)."""
    found, stopped = _scan_json(text, i)
    ends = [end for _, end in found]
    return ends if stopped is None or text[stopped] == "{" else []


def read_calls(text: str) -> tuple[str, list[ToolCall]]:
    """A chat reply read as tool calls in any family's syntax (Hermes, Mistral, then llama3's bare JSON), with no
    list of tools to check the names against: (the text before the calls, the calls), or (``text``, []) when it
    is not wholly calls after its text — a malformed call, or one in the middle of prose, stays text."""
    for family in (FAMILIES["hermes"], FAMILIES["mistral"], FAMILIES["llama3"]):
        before, calls = parse(family, text, None)
        if calls:
            return before, calls
    return text, []


def calls_text(calls: list[dict]) -> str:
    """OpenAI-shaped calls (a remote server's ``tool_calls``) in the canonical form a stored reply keeps them in:
    one Hermes ``<tool_call>`` block each, which ``read_calls`` reads back. Arguments that are not a JSON object
    are kept as the string they came as, so the stored reply reads back as the text it was, never a half call."""
    blocks = []
    for call in calls:
        fn = call.get("function") or {}
        raw = fn.get("arguments")
        args: Any = raw if isinstance(raw, dict) else _loads(raw or "{}") if isinstance(raw, str) else None
        if not isinstance(args, dict):
            args = raw
        body = json.dumps({"name": fn.get("name", ""), "arguments": args}, ensure_ascii=False)
        blocks.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(blocks)


def _mistral(body: str, names: Optional[set[str]]) -> list[ToolCall]:
    values = _json_values(body)
    if values and len(values) == 1 and isinstance(values[0], list):
        calls = [_one(v, names) for v in values[0]]
        return calls if calls and all(calls) else []
    # Mistral's newer tokenizers: [TOOL_CALLS]name[ARGS]{...}, repeated
    parts = re.findall(r"\s*([A-Za-z0-9_.\-]+)\[ARGS\](.*?)(?=\[TOOL_CALLS\]|$)", body, re.S)
    calls = [_one({"name": n, "arguments": _loads(a)}, names) for n, a in parts]
    return calls if calls and all(calls) else []


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# -- the prompt ---------------------------------------------------------------------------------------------
def fallback_system(tools: list[dict]) -> str:
    """The tools for a template without tool support, in the Hermes form (Qwen's, NousResearch's): each
    function's JSON on a line of its own within <tools></tools>. Only the ``function`` object, without the
    ``{"type": "function", ...}`` around it, and compact (no space after ``,`` and ``:``): every turn's prompt
    holds them and every new token attends over them, and 20 tools of a name, a sentence and two parameters took
    1,693 tokens of the starter's the old way, 1,266 this way (tools_turn_cost.py's tools)."""
    listed = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False, separators=(",", ":")) for t in tools)
    return (
        "You may call one or more of these functions, given within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n"
        "To call one, reply with a JSON object holding its name and arguments within <tool_call></tool_call> "
        'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-dict>}\n</tool_call>'
    )


def conversation(messages: list[dict], tools: Optional[list[dict]], family: Family, native: bool) -> list[dict]:
    """OpenAI messages (assistant ``tool_calls``, ``tool`` messages) as the chat template reads them: natively
    (``tool_calls`` with ``arguments`` as objects, a tool message with the function's ``name``), or, for a template
    without tools support, as plain text turns in the fallback's format."""
    names: dict[str, str] = {}
    out: list[dict] = []
    for m in messages:
        calls = m.get("tool_calls") or []
        for c in calls:
            names[c["id"]] = c["function"]["name"]
        if native:
            if calls:
                converted = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["function"]["name"], "arguments": _arguments(c)},
                    }
                    for c in calls
                ]
                out.append({"role": "assistant", "content": m.get("content") or "", "tool_calls": converted})
            elif m["role"] == "tool":
                call_id = m.get("tool_call_id") or ""
                out.append(
                    {"role": "tool", "content": m["content"], "tool_call_id": call_id, "name": names.get(call_id, "")}
                )
            else:
                out.append({"role": m["role"], "content": m["content"]})
            continue
        if calls:
            shown = "\n".join(family.render_call(c["function"]["name"], _arguments(c)) for c in calls)
            text = ((m.get("content") or "") + "\n" + shown).strip()
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            name = names.get(m.get("tool_call_id") or "", "")
            response = json.dumps({"name": name, "content": m["content"]}, ensure_ascii=False)
            turn = f"<tool_response>\n{response}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1]["content"].startswith("<tool_response>"):
                out[-1]["content"] += "\n" + turn  # parallel calls' results: one user turn
            else:
                out.append({"role": "user", "content": turn})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools and not native:
        system = fallback_system(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def _arguments(call: dict) -> dict:
    args = call["function"].get("arguments") or "{}"
    if isinstance(args, dict):
        return args
    try:
        value = json.loads(args)
    except ValueError:
        raise ToolError(
            f"The arguments of the earlier tool call {call['function']['name']!r} are not valid JSON ({args[:60]!r}).",
            "Send each tool call's arguments as a JSON object string.",
        ) from None
    if not isinstance(value, dict):
        raise ToolError(
            f"The arguments of the earlier tool call {call['function']['name']!r} are not a JSON object.",
            "Send each tool call's arguments as a JSON object string.",
        )
    return value


# -- the grammar ----------------------------------------------------------------------------------------------
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def call_schema(family: Family, tools: list[dict]) -> dict:
    """One call's JSON schema: its name one of ``tools``'s, its arguments that tool's parameters."""
    options = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, family.args_key: params},
                "required": ["name", family.args_key],
                "additionalProperties": False,
            }
        )
    schema: dict = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": _JSON_STYLE}


def grammar(family: Family, tools: list[dict], parallel: bool) -> str:
    """The llguidance (Lark) grammar of a reply that is one call (or, with ``parallel``, one or more calls) in
    ``family``'s syntax, from its opening text on."""
    schema = json.dumps(call_schema(family, tools))
    if family.name == "hermes":
        block = '"<tool_call>" NL call NL "</tool_call>"'
        body = block + (f" (NL {block})*" if parallel else "")
    elif family.name == "mistral":
        body = '"[TOOL_CALLS]" "[" call ' + ('(", " call)* ' if parallel else "") + '"]"'
    else:
        body = "call" + (' ("; " call)*' if parallel else "")
    # The reply may end after its last call's newline: a Hermes model writes one before its end of turn, and where
    # the newline was only allowed as the start of another call, the model was made to begin one after it.
    return f"start: {body} NL\nNL: /\\n?/\ncall: %json {schema}\n"


class ToolGrammar:
    """A logits processor (``(input_ids, scores) -> scores``) holding one reply to the call grammar: from the first
    step (``lazy=False``: required / a named function), or from where the model opens a call (``lazy=True``: auto).
    Until then it masks nothing. After the calls only end-of-sequence is allowed."""

    WINDOW = 16  # tokens decoded to look for the opening text

    def __init__(self, lltok, tokenizer, family: Family, grammar_text: str, lazy: bool):
        # lazy: the grammar library loads only for structured output
        import llguidance

        self._llg = llguidance
        self.lltok, self.tokenizer, self.family, self.grammar_text = lltok, tokenizer, family, grammar_text
        self.vocab = lltok.vocab_size
        self.eos = lltok.eos_token
        self.lazy = lazy
        self.start: Optional[int] = None  # history length when the first call was made
        self.generated: list[int] = []
        self.matcher = None if lazy else self._matcher()
        self.dead = False  # the opening text could not start the grammar: the reply stays free (and is text)
        self.bitmask = None

    def _matcher(self):
        matcher = self._llg.LLMatcher(self.lltok, self.grammar_text)
        if matcher.is_error():
            raise ToolError(f"The tools cannot be enforced: {matcher.get_error()}", "Simplify the tool's schema.")
        return matcher

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher is not None and self.matcher.is_error() else ""

    def _opened(self) -> Optional[str]:
        """The text from the opening of a call on, once the model has opened one (lazy)."""
        if self.family.trigger:
            tail = self.tokenizer.decode(self.generated[-self.WINDOW :], skip_special_tokens=False)
            at = tail.find(self.family.trigger)
            return tail[at:] if at >= 0 else None
        if len(self.generated) > 4:
            return None
        text = self.tokenizer.decode(self.generated, skip_special_tokens=False).lstrip()
        text = text[len("<|python_tag|>") :].lstrip() if text.startswith("<|python_tag|>") else text
        return text if text.startswith("{") else None

    def __call__(self, input_ids, scores):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        length = int(input_ids.shape[-1])
        if self.start is None:
            self.start = length
        new = [int(t) for t in input_ids[0, self.start + len(self.generated) : length].tolist()]
        self.generated.extend(new)
        if self.dead:
            return scores
        if self.matcher is None:
            opened = self._opened() if new else None
            if opened is None:
                return scores  # free text: nothing masked
            self.matcher = self._matcher()
            ids = self.tokenizer.encode(opened, add_special_tokens=False)
            for tok in ids:
                if not self.matcher.consume_token(tok):
                    break
            if self.matcher.is_error():
                self.dead = True
                return scores
        else:
            for tok in new:
                if self.matcher.is_stopped():
                    break
                self.matcher.consume_token(tok)
        if self.matcher.is_error() or self.matcher.is_stopped():
            only_eos = torch.full_like(scores, -float("inf"))
            only_eos[..., self.eos] = 0.0
            return scores + only_eos
        if self.bitmask is None:
            self.bitmask = self._llg.torch.allocate_token_bitmask(1, self.vocab)
        self._llg.torch.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        device = scores.device
        bitmask = self.bitmask if device.type == "cpu" else self.bitmask.to(device)
        if scores.shape[-1] > self.vocab:
            scores[..., self.vocab :] = -float("inf")
        self._llg.torch.apply_token_bitmask_inplace(
            scores[..., : self.vocab] if scores.shape[-1] > self.vocab else scores, bitmask
        )
        return scores


def tool_grammar(lltok, tokenizer, family: Family, tools: list[dict], choice, parallel: bool) -> Optional[ToolGrammar]:
    """The processor for ``choice`` ("none": None; "auto": lazy; "required" / a name: from the first token)."""
    import llguidance.torch  # noqa: F401  (loads the torch helpers)

    if choice == "none":
        return None
    chosen = tools
    if isinstance(choice, dict):
        chosen = [t for t in tools if t["function"]["name"] == choice["function"]["name"]]
    text = grammar(family, chosen, parallel and not isinstance(choice, dict))
    return ToolGrammar(lltok, tokenizer, family, text, lazy=choice == "auto")


FREE = Family("free", "", "")  # a streamed llama3 reply that began as text


class CallStream:
    """A streamed reply with tools: its text goes out as it comes, except what may be (or is) a call, held back
    until the reply ends; then it is read as calls, or sent as the text it was."""

    def __init__(self, family: Family, names: set[str], forced: bool):
        self.family, self.names, self.forced = family, names, forced
        self.text = ""
        self.sent = 0  # characters of ``text`` sent as content
        self.opened = forced

    def feed(self, piece: str) -> str:
        """The content that can go out now."""
        self.text += piece
        if self.opened:
            return ""
        trigger = self.family.trigger
        if trigger:
            at = self.text.find(trigger, self.sent)
            if at >= 0:
                self.opened = True
                return self._send(len(self.text[:at].rstrip()))
            keep = next(
                (k for k in range(min(len(trigger) - 1, len(self.text)), 0, -1) if self.text.endswith(trigger[:k])), 0
            )
            return self._send(len(self.text[: len(self.text) - keep].rstrip()))  # whitespace waits for what follows
        start = self.text.lstrip()
        if not start or "<|python_tag|>".startswith(start):
            return ""  # nothing yet, or maybe the tag that opens a call
        if start.startswith("{") or start.startswith("<|python_tag|>"):
            self.opened = True
            return ""
        self.family = FREE  # free text from here on: nothing more held back
        return self._send(len(self.text))

    def _send(self, upto: int) -> str:
        out = self.text[self.sent : upto]
        self.sent = max(self.sent, upto)
        return out

    def finish(self, cut: bool = False) -> tuple[str, list[ToolCall]]:
        """(the content still to send, the calls). ``cut``: the reply stopped at its token limit (``parse``)."""
        if self.family is FREE:
            return self._send(len(self.text)), []
        content, calls = parse(self.family, self.text, self.names, cut)
        if not calls:
            return self._send(len(self.text)), []
        return self._send(len(content)), calls


def argument_pieces(arguments: str, size: int = 24) -> list[str]:
    """A call's arguments in the pieces a streamed reply sends them in."""
    return [arguments[i : i + size] for i in range(0, len(arguments), size)] or [""]
