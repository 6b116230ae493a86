"""A request body made ready to run: the model it names, its JSON read and checked (``protocol``), its sampling, its
prompt made ready by ``generation.request.prepare`` with ``strict=True`` (the one prompt builder and the one context
check, on the server's own copy of the tokenizer, so a request that cannot fit is a 400 before it queues), and the
grammar its ``response_format`` asks for; with ``tools``, the conversation as the model's template reads it and the
grammar of its calls (``inference/decoding/tool_calls.py``)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Optional, Union

from ..decoding.options import DecodeOptions, SamplingSettings
from ..decoding.tool_calls import Family, ToolError, conversation, family_of, tool_grammar
from ..errors import ContextExceeded, RedlineError
from ..generation.request import GenerationRequest
from ..reasoning.switch import Thinking
from .config import ServerConfig
from .middleware import BodyTooLarge
from .parts import attach
from .protocol import ApiError, FieldError, describe_validation, lone_surrogate
from .structured import (
    Chain,
    GrammarProcessor,
    GrammarTokenizers,
    Penalties,
    SchemaError,
    grammar_for,
)
from .tokenizers import ServerTokenizers


@dataclass
class Tools:
    """What a request with tools needs to read its reply: the family's format, the tools' names, the choice."""

    family: Family
    names: set[str]
    choice: Union[str, dict]

    @property
    def forced(self) -> bool:
        """The whole reply is calls (required / a named function)."""
        return self.choice != "auto"


class Preparation:
    def __init__(self, service, config: ServerConfig):
        self.service = service
        self.config = config
        self.tokenizers = ServerTokenizers()
        self.grammars = GrammarTokenizers()
        self._switch = asyncio.Lock()

    # -- the model --------------------------------------------------------------------------------------
    def target(self):
        target = self.service.target
        if target is None:
            raise ApiError(
                503,
                "No model is loaded in Redline. Load one in the window, or start `redline serve --model …`.",
                code="model_not_loaded",
            )
        if not target.capabilities.servable:
            raise ApiError(
                503,
                f"Redline is connected to a remote server ({target.name}), which it does not pass on. "
                "Load a local model to serve it.",
                code="model_not_loaded",
            )
        return target

    async def model_for(self, wanted: str):
        target = self.service.target
        if target is not None and target.capabilities.servable and wanted in target.names():
            return target
        if not self.config.load_on_request:
            target = self.target()  # none loaded, or a remote one: the clear 503
            raise ApiError(
                404,
                f"The model '{wanted}' is not loaded; this server has '{target.name}'. Name that model, or start "
                "the server with --allow-model-load to load others on request.",
                "model",
                "model_not_found",
            )
        async with self._switch:  # one load at a time: two requests for the same model load it once
            target = self.service.target
            if target is not None and wanted in target.names():
                return target
            try:
                handle = self.service.load(wanted, self.config.precision, interrupt=False)
                await asyncio.to_thread(handle.result, 3600)
            except RedlineError as exc:
                raise ApiError(
                    404, f"The model '{wanted}' could not be loaded: {exc}", "model", "model_not_found"
                ) from None
            return self.target()

    # -- a request --------------------------------------------------------------------------------------
    async def read(self, request, kind):
        try:
            raw = await request.body()
        except BodyTooLarge:
            limit = self.config.max_body_bytes
            raise ApiError(
                413,
                f"The request body is larger than this server's limit of {limit:,} bytes. Send smaller images or "
                "files, or start the server with a higher limit.",
            ) from None
        try:
            data = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"The request body is not valid JSON ({exc}).") from None
        if not isinstance(data, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        bad = lone_surrogate(data)
        if bad is not None:
            field, code = bad
            raise ApiError(
                400,
                f"'{field or 'a key'}' holds a lone UTF-16 surrogate ({code}), which is not a character; "
                "send valid Unicode text.",
                field or None,
            )
        # lazy: pydantic loads only when this runs
        from pydantic import ValidationError

        try:
            body = kind.model_validate(data)
        except ValidationError as exc:
            message, param = describe_validation(exc.errors(include_url=False))
            raise ApiError(400, message, param) from None
        problem = body.unsupported()
        if problem is not None:
            raise ApiError(400, problem[1], problem[0], "unsupported_parameter")
        return body

    async def prepare(self, body, chat: bool, choice: int = 0) -> tuple[Any, GenerationRequest, Optional[Tools]]:
        """The request made ready; ``choice`` (of ``n``): the i-th choice's own request (its own grammar state, and
        with a ``seed``, the seed plus i, so the choices differ and each repeats)."""
        target = await self.model_for(body.model)
        where = "messages" if chat else "prompt"
        wanted = body.wanted_tokens()
        cap = self.config.max_tokens_cap
        field = "max_completion_tokens" if chat and body.max_completion_tokens is not None else "max_tokens"
        if wanted is not None and wanted > cap:
            raise ApiError(400, f"{field} {wanted} is above this server's limit of {cap}. Ask for fewer.", field)
        sampling = SamplingSettings(
            max_new_tokens=wanted if wanted is not None else (cap if chat else 16),  # completions' default is 16
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            repetition_penalty=body.repetition_penalty,
            seed=body.seed + choice if body.seed is not None else None,
            stop=body.stops(),
        )
        prompt: dict = {}
        tools: Optional[Tools] = None
        try:
            if chat:
                messages = [m.as_dict() for m in body.messages]
                if any(m.attached() for m in body.messages):  # images and files, read off the event loop
                    remote = self.config.fetch_remote_media
                    messages = await asyncio.to_thread(attach, body.messages, messages, remote)
                offered = [t.as_dict() for t in body.tools or []]
                choice = body.choice()
                if offered or any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
                    tok = await asyncio.to_thread(self.tokenizers.get, target)
                    family, native = family_of(tok)
                    shown = offered if choice != "none" else []
                    messages = conversation(messages, shown, family, native)
                    if shown and native:
                        prompt["tools"] = shown
                    if shown:
                        tools = Tools(family, {t["function"]["name"] for t in shown}, choice)
                prompt["messages"] = messages
            elif isinstance(body.prompt, list) and (not body.prompt or isinstance(body.prompt[0], int)):
                prompt["input_ids"] = [int(t) for t in body.prompt]
            else:
                text = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
                prompt["input_ids"] = await asyncio.to_thread(self.tokenizers.encode, target, text)
            request = GenerationRequest(
                **prompt,
                sampling=sampling,
                options=DecodeOptions(self.config.strategy),
                client="api",
                logprobs=self._logprobs(body),
            )
            if chat:  # a reasoning model's switch (a model that does not reason ignores it)
                effort = body.reasoning_effort
                request.thinking = Thinking.from_effort(effort) if effort is not None else None
                request.template_kwargs = body.chat_template_kwargs
            request.prepared = await asyncio.to_thread(self.tokenizers.prepare, target, request, wanted is not None)
        except ContextExceeded as exc:
            if exc.what == "max_new_tokens":
                raise ApiError(
                    400,
                    f"{field} {wanted} plus the prompt's {exc.prompt_tokens} tokens exceed the model's context of "
                    f"{exc.limit}; ask for at most {exc.room}.",
                    field,
                    "context_length_exceeded",
                ) from None
            raise ApiError(
                400,
                f"The prompt has {exc.prompt_tokens or 'too many'} tokens, which fills the model's context of "
                f"{exc.limit or target.context_limit}. Shorten it.",
                where,
                "context_length_exceeded",
            ) from None
        except FieldError as exc:
            raise ApiError(400, exc.message, exc.field) from None
        except ToolError as exc:
            raise ApiError(400, str(exc), where) from None
        except RedlineError as exc:
            raise ApiError(400, str(exc), where) from None
        except Exception as exc:  # the chat template refused the conversation (jinja's raise_exception)
            if type(exc).__name__ not in ("TemplateError", "TemplateSyntaxError", "UndefinedError"):
                raise
            raise ApiError(400, f"The model's chat template refused this conversation: {exc}", where) from None
        if chat and body.response_format is not None and body.response_format.type != "text":
            request.logits_processor = await asyncio.to_thread(self._grammar, target, body.response_format.as_dict())
        if tools is not None:
            parallel = body.parallel_tool_calls is not False
            request.logits_processor = await asyncio.to_thread(
                self._tool_grammar, target, tools, [t.as_dict() for t in body.tools or []], parallel
            )
        penalties = self._penalties(target, body)
        if penalties is not None:
            request.logits_processor = Chain(penalties, request.logits_processor)
        return target, request, tools

    def _logprobs(self, body) -> Optional[int]:
        """The alternatives per token the request's log-probabilities come with (None: none asked), or a 400 where
        this server's strategy cannot score its tokens."""
        top = body.wanted_logprobs()
        strategy = self.config.strategy
        if top is not None and strategy in ("speculative", "prompt-lookup"):
            raise ApiError(
                400,
                f"logprobs are not available with the {strategy} strategy this server runs (it checks several "
                "tokens in one pass); serve with --strategy fast, kv, static or naive.",
                "logprobs",
                "unsupported_parameter",
            )
        return top

    @staticmethod
    def _penalties(target, body) -> Optional[Penalties]:
        frequency, presence = body.frequency_penalty or 0.0, body.presence_penalty or 0.0
        bias = {int(k): float(v) for k, v in (body.logit_bias or {}).items()}
        if not (frequency or presence or bias):
            return None
        vocab = target.vocab_size()
        if vocab is not None:
            outside = [t for t in bias if t >= vocab]
            if outside:
                raise ApiError(
                    400,
                    f"logit_bias names token {outside[0]}, beyond this model's vocabulary of {vocab}.",
                    "logit_bias",
                )
        return Penalties(frequency, presence, bias)

    def _tool_grammar(self, target, tools: Tools, offered: list[dict], parallel: bool):
        tok = self.tokenizers.get(target)
        vocab = target.vocab_size()
        lltok = self.grammars.get(tok, vocab)
        try:
            return tool_grammar(lltok, tok, tools.family, offered, tools.choice, parallel)
        except ToolError as exc:
            raise ApiError(400, str(exc), "tools") from None
        except Exception as exc:  # the grammar library's own refusal of a tool's schema
            raise ApiError(400, f"The tools' parameters cannot be enforced: {exc}", "tools") from None

    def _grammar(self, target, response_format: dict):
        try:
            grammar = grammar_for(response_format)
        except SchemaError as exc:
            raise ApiError(400, str(exc), "response_format") from None
        except Exception as exc:  # the library's own refusal of the schema
            raise ApiError(400, f"The JSON schema cannot be enforced: {exc}", "response_format") from None
        if grammar is None:
            return None
        tok = self.tokenizers.get(target)
        vocab = target.vocab_size()
        lltok = self.grammars.get(tok, vocab)
        return GrammarProcessor(lltok, grammar)
