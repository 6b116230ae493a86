"""What a generation is asked for, and the one place that makes it ready to run: the prompt built from chat
messages with the model's template (``decoding/prompt.py``), the one context check, the new-token cap."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..decoding.options import DecodeOptions, SamplingSettings
from ..decoding.prompt import build_prompt, images_in
from ..errors import ContextExceeded, RedlineError, UnsupportedConfiguration
from ..reasoning import formats, switch
from ..reasoning.switch import Thinking
from .attached import has_documents, place_documents


@dataclass
class Prepared:
    """A request made ready: its prompt ids, the context it runs in, its new-token cap, and what the user should
    know about what did not fit (said before the reply starts)."""

    prompt: list[int]
    context: int
    max_new: int
    notes: list[str] = field(default_factory=list)
    dropped_messages: int = 0
    # What the reply was given to cite when a document too large for the context was sent as excerpts
    # (``attachments.compose.Citation``: its document, page and text, in the order numbered in the prompt).
    citations: list = field(default_factory=list)
    # A vision model's other inputs to generate(), made by its processor with the prompt (``pixel_values``,
    # ``image_grid_thw``, ``pixel_attention_mask``, ``token_type_ids``…); None for a prompt of text alone.
    extra_inputs: Optional[dict] = None

    @property
    def tokens(self) -> int:
        """The most KV-cache positions it can take (its prompt and every new token it may make)."""
        return len(self.prompt) + self.max_new


@dataclass
class GenerationRequest:
    """A generation: chat ``messages`` (rendered with the model's chat template) or prompt ``input_ids``."""

    messages: Optional[Sequence[dict]] = None
    input_ids: Optional[Sequence[int]] = None
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    options: DecodeOptions = field(default_factory=DecodeOptions)
    context: Optional[int] = None  # cap on the context (the model's own limit otherwise)
    # An extra logits processor for this request alone (transformers' interface: (input_ids, scores) →
    # scores), e.g. a grammar that constrains the output to a JSON schema.
    logits_processor: Any = None
    # OpenAI function tools, rendered by the model's chat template (``tools=``); the server reads the calls back.
    tools: Optional[Sequence[dict]] = None
    client: str = ""  # who asked: "chat", "lab", "api", "cli" (shown in status and queue notes)
    # A reply that runs alone is compared with the speed model's and the estimator's predictions, and feeds this
    # machine's corrections; the speed lab's samples do not (it records each row once, from all its samples).
    record: bool = True
    # Made ready already (the HTTP server prepares with its own copy of the tokenizer, to answer 400 before
    # queueing): the engine runs it as it is instead of preparing it again.
    prepared: Optional[Prepared] = None
    # Log-probabilities of the new tokens, with this many most likely alternatives per token (0 to 20); None: not
    # computed at all (no log-softmax, no extra transfer from the device).
    logprobs: Optional[int] = None
    # A reasoning model's thinking: on or off, its effort, its budget in tokens (None: the model's defaults), mapped
    # to the model's own mechanism by ``prepare`` (``inference/reasoning/switch.py``); a model that does not reason
    # ignores it. ``template_kwargs``: extra chat-template variables (the server's ``chat_template_kwargs``), passed
    # as they are and winning over what the thinking setting maps to.
    thinking: Optional[Thinking] = None
    template_kwargs: Optional[dict] = None

    def __post_init__(self):
        if (self.messages is None) == (self.input_ids is None):
            raise RedlineError("A generation request needs either messages or input ids, not both.")


def new_tokens_allowed(prompt_tokens: int, limit: int, wanted: int, notes: list[str], strict: bool = False) -> int:
    """How many new tokens fit after the prompt in a context of ``limit``: ``wanted``, capped (with a note) unless
    ``strict``, where asking for more than fits is refused. Raises when none fit."""
    if not prompt_tokens:
        raise UnsupportedConfiguration("The prompt is empty.", "Type a message first.")
    room = limit - prompt_tokens
    if room <= 0:
        raise ContextExceeded(
            f"The prompt has {prompt_tokens} tokens, which fills the context of {limit}.",
            "Shorten the prompt or raise the context length.",
            "prompt",
            prompt_tokens,
            limit,
            room,
        )
    if wanted < 1:
        raise UnsupportedConfiguration("The request asks for no new tokens.", "Ask for at least one.")
    if wanted > room and strict:
        raise ContextExceeded(
            f"{wanted} new tokens plus the prompt's {prompt_tokens} exceed the context of {limit}; "
            f"ask for at most {room}.",
            "",
            "max_new_tokens",
            prompt_tokens,
            limit,
            room,
        )
    allowed = min(wanted, room)
    if allowed < wanted:
        notes.append(f"max new tokens capped at {allowed} by the context length {limit}.")
    return allowed


def prepare(
    tokenizer,
    context_limit: int,
    request: GenerationRequest,
    strict: bool = False,
    new_tokens_asked: bool = True,
    processor: Any = None,
    model: str = "",
) -> Prepared:
    """The request's prompt and limits, or an error that says why it cannot run (before anything runs).

    ``strict`` (the HTTP API): a conversation that does not fit is refused rather than shortened, and more new
    tokens than fit are refused rather than capped (unless ``new_tokens_asked`` is False: the number is a default,
    capped to what fits) — what OpenAI-compatible clients expect.

    ``processor``: a vision model's (``LoadedModel.processor``), which builds the prompt with the images of the
    messages' ``attachments`` and the tensors that go with it (``Prepared.extra_inputs``); without one, a message
    with an image is refused (before anything runs), naming ``model``."""

    if request.prepared is not None:
        return request.prepared
    context = min(request.context or context_limit, context_limit)
    wanted = request.sampling.max_new_tokens
    notes: list[str] = []
    dropped = 0
    citations: list = []
    extra = None
    if request.input_ids is not None:
        prompt = [int(t) for t in request.input_ids]
    else:
        # The thinking setting as this model's template and format take it (none of it for a model that does not
        # reason; a request's own template variables pass either way).
        fmt = formats.detect(tokenizer)
        plan = switch.plan(fmt, formats.template_text(tokenizer), request.thinking, request.template_kwargs)
        notes.extend(plan.notes)
        messages = request.messages
        if images_in(messages) and processor is None:  # images stay attached, for a vision model's processor
            raise UnsupportedConfiguration(
                f"{model or 'This model'} cannot see images: it is a text-only model.",
                "Load a vision model (Gemma 3, Qwen2.5-VL, SmolVLM) or remove the image.",
            )
        if has_documents(messages):  # each document before its message's question: whole, or excerpts
            placed = place_documents(tokenizer, messages, context, wanted)
            messages, citations = placed.messages, placed.citations
            notes.extend(placed.notes)
        built = build_prompt(
            tokenizer,
            plan.messages(messages),
            context,
            1 if strict else wanted,
            strict=strict,
            tools=request.tools,
            template_kwargs=plan.template_kwargs,
            extend=switch.extender(tokenizer, fmt, plan),
            processor=processor,
        )
        prompt, dropped, extra = built.input_ids, built.dropped_messages, built.inputs
        if dropped:
            notes.append(
                f"{dropped} earlier message(s) did not fit the context of {context} tokens and were left out "
                "of the prompt."
            )
        if built.truncated_last:
            notes.append(built.cut)
        if not built.used_template:
            notes.append("This model has no chat template; a plain 'User:/Assistant:' format was used.")
    max_new = new_tokens_allowed(len(prompt), context, wanted, notes if not strict else [], strict and new_tokens_asked)
    return Prepared(prompt, context, max_new, notes, dropped, citations, extra_inputs=extra)
