"""The OpenAI API as the server reads it: request bodies (strict: an unknown field or a wrong type is a 400
naming it), and the error objects it answers with.

Fields OpenAI defines but Redline does not do (``echo``, ``suffix``, ``best_of`` above 1) are accepted at their
neutral value and refused otherwise, with a sentence saying so, rather than ignored. ``user`` and ``metadata`` are
accepted and ignored.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

STRICT = ConfigDict(extra="forbid", strict=True)


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


MAX_STOP = 16  # stop strings a request may give
MAX_CHOICES = 8  # n: choices one request may ask for (decoded together by the batcher)
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs (OpenAI's limit)
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' logprobs (OpenAI's limit)
MEDIA_PARTS = {"image_url", "input_image", "image", "input_audio", "audio", "file", "input_file", "video_url"}
ATTACHED_PARTS = {"image_url", "input_image", "image", "file", "input_file"}  # read by parts.py into attachments
TEXT_ONLY = "Redline's models read text and images, not audio or video"


class FunctionCallIn(BaseModel):
    model_config = STRICT
    name: str = Field(min_length=1)
    arguments: str = ""


class ToolCallIn(BaseModel):
    model_config = STRICT
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCallIn


class FunctionSpec(BaseModel):
    model_config = STRICT
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionSpec

    def as_dict(self) -> dict:
        fn: dict = {"name": self.function.name}
        if self.function.description is not None:
            fn["description"] = self.function.description
        fn["parameters"] = self.function.parameters or {"type": "object", "properties": {}}
        return {"type": "function", "function": fn}


class Message(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[dict[str, Any]], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCallIn]] = None
    tool_call_id: Optional[str] = None
    refusal: Optional[str] = None
    # An earlier reply's thinking, as this server and vLLM return it: accepted and not sent to the model (reasoning
    # templates drop earlier thinking; kept in the history it breaks agents, issue 47).
    reasoning_content: Optional[str] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", "")) for part in self.content)

    def problem(self, where: str) -> Optional[tuple[str, str]]:
        """(field, sentence) for a message Redline cannot read, or None."""
        for i, part in enumerate(self.content if isinstance(self.content, list) else []):
            kind = part.get("type")
            if kind in ATTACHED_PARTS and self.role == "user":
                continue  # read (and refused where it cannot be) by parts.read_content, off the event loop
            if kind in MEDIA_PARTS:
                if kind in ATTACHED_PARTS:
                    return f"{where}.content[{i}]", (
                        f"'{where}.content[{i}]' is an {kind} part; only user messages carry images and files."
                    )
                return f"{where}.content[{i}]", (
                    f"'{where}.content[{i}]' is an {kind} part; Redline's models read text and images, not {kind}."
                )
            if kind != "text" or not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
                return f"{where}.content[{i}]", (
                    f'\'{where}.content[{i}]\' is not a text part; a content part is {{"type": "text", "text": "…"}}.'
                )
        if self.role == "tool" and not self.tool_call_id:
            return f"{where}.tool_call_id", f"'{where}' is a tool message without the tool_call_id it answers."
        if self.tool_calls and self.role != "assistant":
            return f"{where}.tool_calls", f"'{where}' has tool_calls, which only assistant messages carry."
        return None

    def attached(self) -> bool:
        """Whether the message holds images or files (read into attachments by ``parts.read_content``)."""
        return isinstance(self.content, list) and any(p.get("type") in ATTACHED_PARTS for p in self.content)

    def as_dict(self) -> dict:
        role = "system" if self.role == "developer" else self.role
        out: dict = {"role": role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class JsonSchemaSpec(BaseModel):
    model_config = STRICT
    name: str = Field(min_length=1, max_length=64)
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaSpec] = None

    def as_dict(self) -> dict:
        out: dict = {"type": self.type}
        if self.json_schema is not None:
            out["json_schema"] = {"name": self.json_schema.name, "schema": self.json_schema.schema_}
        return out


Stop = Union[str, list[str], None]


class _Sampling(BaseModel):
    model_config = STRICT
    model: str = Field(min_length=1)
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    top_k: Optional[int] = Field(default=None, ge=0)  # not OpenAI's; vLLM and llama.cpp take it
    repetition_penalty: Optional[float] = Field(default=None, gt=0)
    seed: Optional[int] = Field(default=None, ge=0, le=2**63 - 1)
    stop: Stop = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    logprobs: Optional[bool] = None
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None  # accepted, ignored
    metadata: Optional[dict[str, Any]] = None  # accepted, ignored

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return tuple(s for s in stops if s)

    def unsupported(self) -> Optional[tuple[str, str]]:
        """(field, sentence) for the first field asked at a value Redline does not do."""
        if self.n is not None and not 1 <= self.n <= MAX_CHOICES:
            return "n", f"n must be between 1 and {MAX_CHOICES} (got {self.n})."
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if value is not None and not -2 <= value <= 2:
                return name, f"{name} must be between -2 and 2 (got {value})."
        for key, bias in (self.logit_bias or {}).items():
            if not key.isdigit():
                return "logit_bias", f"logit_bias keys are token ids (got {key!r})."
            if not -100 <= bias <= 100:
                return "logit_bias", f"logit_bias values must be between -100 and 100 (got {bias} for token {key})."
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP:
            return "stop", f"stop takes at most {MAX_STOP} strings (got {len(self.stop)})."
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed with stream: true."
        return None


# What transformers' apply_chat_template takes itself: not template variables (chat_template_kwargs cannot set them).
TEMPLATE_ARGUMENTS = {
    "conversation",
    "messages",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
}


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    top_logprobs: Optional[int] = None
    # Reasoning models (docs/server.md#reasoning-models): OpenAI's effort ("none" turns thinking off), mapped to the
    # model's own switch, and extra chat-template variables as vLLM and llama.cpp take them ({"enable_thinking":
    # false}), which win over the effort's mapping.
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high"]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None

    def wanted_logprobs(self) -> Optional[int]:
        """The alternatives per token a request asks log-probabilities with (None: it asks for none)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def choice(self) -> Union[str, dict]:
        """ "none", "auto", "required" or {"type": "function", "function": {"name": …}} (OpenAI's default: "auto"
        with tools, "none" without)."""
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        return self.tool_choice

    def unsupported(self) -> Optional[tuple[str, str]]:
        reserved = sorted(set(self.chat_template_kwargs or {}) & TEMPLATE_ARGUMENTS)
        if reserved:
            return "chat_template_kwargs", (
                f"chat_template_kwargs cannot set {reserved[0]!r}: the server sets it; send template variables only."
            )
        top = self.top_logprobs
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            return "top_logprobs", f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS} (got {top})."
        if top is not None and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs: true."
        for i, m in enumerate(self.messages):
            problem = m.problem(f"messages[{i}]")
            if problem is not None:
                return problem
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) < len(names):
            return "tools", "Two tools have the same name; give each tool its own name."
        choice = self.tool_choice
        if isinstance(choice, dict):
            fn = choice.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if choice.get("type") != "function" or not isinstance(name, str):
                return "tool_choice", (
                    'tool_choice names a function as {"type": "function", "function": {"name": "…"}}.'
                )
            if name not in names:
                return "tool_choice", f"tool_choice names the function {name!r}, which is not among the tools."
        elif choice == "required" and not names:
            return "tool_choice", "tool_choice is 'required' but the request has no tools."
        rf = self.response_format
        if names and self.choice() != "none" and rf is not None and rf.type != "text":
            return "response_format", (
                "response_format and tools cannot both constrain one reply; send tool_choice 'none' with "
                "response_format, or leave response_format out."
            )
        if rf is not None and rf.type == "json_schema" and (rf.json_schema is None or rf.json_schema.schema_ is None):
            return "response_format", (
                "response_format json_schema needs json_schema.schema: "
                '{"type": "json_schema", "json_schema": {"name": "…", "schema": {…}}}.'
            )
        return super().unsupported()

    def wanted_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int]]
    echo: Optional[bool] = None
    suffix: Optional[str] = None
    best_of: Optional[int] = None
    logprobs: Optional[int] = None  # the legacy API's: the alternatives per token, 0 to 5 (chat's is a bool)

    def wanted_logprobs(self) -> Optional[int]:
        return self.logprobs

    def unsupported(self) -> Optional[tuple[str, str]]:
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_COMPLETION_LOGPROBS:
            return "logprobs", f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS} (got {self.logprobs})."
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) > 1:
            return "prompt", "Send one prompt per request (a list of several is not supported)."
        if self.echo:
            return "echo", "echo is not supported; leave it out or false."
        if self.suffix:
            return "suffix", "suffix (fill-in-the-middle) is not supported."
        if self.best_of not in (None, 1):
            return "best_of", "best_of must be 1."
        return super().unsupported()

    def wanted_tokens(self) -> Optional[int]:
        return self.max_tokens


# -- errors ---------------------------------------------------------------------------------------------
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class FieldError(Exception):
    """A part of a request body that cannot be read (a content part, an input item, a Messages block): the field it
    is in, and the sentence the 400 says."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


class ApiError(Exception):
    """A request answered with an error object: its status, one sentence, the field it names, OpenAI's code."""

    def __init__(
        self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None, headers=None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    return {
        "error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param, "code": code}
    }


def lone_surrogate(data: Any, loc: tuple = ()) -> Optional[tuple[str, str]]:
    """(the field, the code point) of the first string in a decoded JSON body holding a lone UTF-16 surrogate
    (``"\\ud800"`` is valid JSON but no character: no tokenizer can read it), or None."""
    if isinstance(data, str):
        if not data.isascii():
            try:
                data.encode("utf-8")
            except UnicodeEncodeError as exc:
                return _where(loc), f"\\u{ord(data[exc.start]):04x}"
        return None
    if isinstance(data, dict):
        for key, value in data.items():
            found = lone_surrogate(key, loc) or lone_surrogate(value, loc + (key,))
            if found is not None:
                return found
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found = lone_surrogate(value, loc + (i,))
            if found is not None:
                return found
    return None


def _where(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    # pydantic's union branches add the type's name to the location ("str", "list[TextPart]"): not a field
    parts = [p for p in parts if not (p[:1].islower() and ("[" in p or p in ("str", "int", "float", "bool")))]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


def describe_validation(errors: list[dict]) -> tuple[str, Optional[str]]:
    """One sentence for the first problem pydantic found in a request body, and the field it names."""
    if not errors:
        return "The request body is not valid.", None
    first = errors[0]
    kind, field = first.get("type", ""), _where(first.get("loc", ()))
    if kind in ("json_invalid", "json_type"):
        detail = (first.get("ctx") or {}).get("error", "")
        return f"The request body is not valid JSON{f' ({detail})' if detail else ''}.", None
    if not field:
        return "The request body must be a JSON object.", None
    if kind == "extra_forbidden":
        return f"Unknown field '{field}'. Remove it (see docs/server.md for the fields Redline reads).", field
    if kind == "missing":
        return f"'{field}' is required.", field
    given = first.get("input")
    shown = repr(given) if not isinstance(given, (dict, list)) else type(given).__name__
    msg = first.get("msg", "is not valid")
    return f"'{field}' is not valid: {msg[0].lower() + msg[1:]} (got {shown}).", field
