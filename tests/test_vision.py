"""Vision models through transformers: Gemma 3, Qwen2.5-VL and Idefics3 (SmolVLM), tiny and random, built here
(tests/vision_models.py). Each loads through Redline's engine with its processor, says it sees, answers a message
with an image attachment with the very tokens transformers' own processor and generate() give, keeps its vision
tower out of quantisation, and is estimated with that tower's weights; a text model refuses an image."""

from __future__ import annotations

import io

import pytest
import torch
import vision_models as vm

from redline.inference.backends.local import VISION_ON_GENERATE
from redline.inference.cost import weights_bytes, weights_read_bytes
from redline.inference.decoding.options import DecodeOptions, SamplingSettings
from redline.inference.engine import Engine
from redline.inference.errors import UnsupportedConfiguration
from redline.inference.estimate.model_shapes import shape_for_folder
from redline.inference.estimate.vision import image_settings, image_tokens
from redline.inference.generation.request import GenerationRequest, prepare
from redline.inference.precision import PrecisionSpec, parse_precision

NEW = 8
GREEDY = SamplingSettings(max_new_tokens=NEW, temperature=0)
QUESTION = "What is in this picture?"
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")),
]
SIZES = [(48, 40), (20, 90), (300, 30), (64, 64), (500, 400), (7, 7)]


@pytest.fixture(scope="session")
def vision_dirs(tmp_path_factory):
    """Each family's folder, built once a session when first asked for (about 0.2 s each)."""
    root = tmp_path_factory.mktemp("vision")
    built = {}

    def get(family):
        if family not in built:
            built[family] = vm.build(family, root / f"tiny-{family}")
        return built[family]

    return get


@pytest.fixture(scope="module")
def engines():
    """One engine per (folder, device, precision), loaded once a module."""
    held = {}

    def get(folder, device="cpu", precision="fp32"):
        key = (str(folder), device, precision)
        if key not in held:
            eng = Engine(device=device)
            eng.load(str(folder), parse_precision(precision))
            held[key] = eng
        return held[key]

    yield get
    for eng in held.values():
        eng.unload()


def message(*images, text=QUESTION):
    return {"role": "user", "content": text, "attachments": list(images)}


def direct(folder, family, device, image_data, text=QUESTION):
    """The same question answered by transformers alone: the family's processor (built as the test folder's was),
    its chat template, the image decoded by PIL, and greedy generate(). Its prompt ids and new tokens."""
    from PIL import Image as PILImage
    from transformers import AutoModelForImageTextToText

    _, processor = vm.BUILDERS[family](vm.build_tokenizer(family))
    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32).to(device).eval()
    content = ([{"type": "image"}] if image_data is not None else []) + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    images = [PILImage.open(io.BytesIO(image_data)).convert("RGB")] if image_data is not None else None
    inputs = processor(text=prompt, images=images, return_tensors="pt").to(device)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    ids = inputs["input_ids"][0].tolist()
    return ids, out[0, len(ids) :].tolist()


def image_token_id(target) -> int:
    config = target.model.config
    return getattr(config, "image_token_id", None) or config.image_token_index


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", vm.FAMILIES)
def test_an_image_gets_the_same_reply_as_transformers_gives(family, device, vision_dirs, engines):
    folder = vision_dirs(family)
    eng = engines(folder, device)
    target = eng.target
    assert target.capabilities.vision and target.processor is not None
    assert target.resolve_strategy("auto") == "kv" and target.fast_path_reason() == VISION_ON_GENERATE

    image = vm.attachment(48, 40, seed=0)
    request = GenerationRequest(messages=[message(image)], sampling=GREEDY)
    prepared = prepare(target.tokenizer, target.context_limit, request, processor=target.processor, model=target.name)
    want_prompt, want_reply = direct(folder, family, device, image.data)
    assert prepared.prompt == want_prompt  # the processor's template, its image tokens expanded
    assert prepared.prompt.count(image_token_id(target)) == target.image_tokens(48, 40) > 0
    assert "pixel_values" in prepared.extra_inputs

    result = eng.chat([message(image)], GREEDY, DecodeOptions(strategy="auto"))
    assert result.finish_reason in ("length", "eos") and result.token_ids == want_reply
    assert result.prompt_tokens == len(want_prompt)
    # The fast path takes no images: asked for, it says why and runs on generate(), with the same tokens.
    fast = eng.chat([message(image)], GREEDY, DecodeOptions(strategy="fast"))
    assert fast.token_ids == want_reply and any(VISION_ON_GENERATE in n for n in fast.notes)


@pytest.mark.parametrize("family", vm.FAMILIES)
def test_the_image_reaches_the_model(family, vision_dirs, engines):
    """Another image, another reply (the pixels are read, not only the tokens that stand for them); the same
    image, the same reply, whatever strategy on generate() runs it."""
    eng = engines(vision_dirs(family))
    first, second = vm.attachment(48, 40, seed=0), vm.attachment(48, 40, seed=1)
    replies = {}
    for strategy in ("kv", "naive", "static"):
        replies[strategy] = eng.chat([message(first)], GREEDY, DecodeOptions(strategy=strategy)).token_ids
    assert replies["kv"] == replies["naive"] == replies["static"]
    other = eng.chat([message(second)], GREEDY, DecodeOptions(strategy="kv")).token_ids
    assert other != replies["kv"]


@pytest.mark.parametrize("family", vm.FAMILIES)
def test_a_message_without_an_image_goes_through_the_processor_too(family, vision_dirs, engines):
    folder = vision_dirs(family)
    eng = engines(folder)
    want_prompt, want_reply = direct(folder, family, "cpu", None, text="Paris is the capital of")
    result = eng.chat([{"role": "user", "content": "Paris is the capital of"}], GREEDY, DecodeOptions())
    assert result.prompt_tokens == len(want_prompt) and result.token_ids == want_reply


def test_a_turn_left_out_takes_its_image_with_it(vision_dirs, engines):
    target = engines(vision_dirs("qwen2_5_vl")).target
    messages = [
        message(vm.attachment(112, 112, seed=0), text="First picture. " * 20),
        {"role": "assistant", "content": "A picture."},
        message(vm.attachment(56, 56, seed=1), text="And this one?"),
    ]
    whole = prepare(target.tokenizer, 4096, GenerationRequest(messages=messages), processor=target.processor)
    assert whole.extra_inputs["image_grid_thw"].shape[0] == 2 and whole.dropped_messages == 0
    cut = prepare(
        target.tokenizer,
        len(whole.prompt) - 20,
        GenerationRequest(messages=messages, sampling=SamplingSettings(max_new_tokens=8)),
        processor=target.processor,
    )
    assert cut.dropped_messages == 2 and cut.extra_inputs["image_grid_thw"].shape[0] == 1
    assert cut.prompt.count(image_token_id(target)) == target.image_tokens(56, 56)


def test_a_text_model_refuses_an_image_before_anything_runs(tiny_model_dir, engines):
    eng = engines(tiny_model_dir)
    assert eng.target.capabilities.vision is False and eng.target.image_tokens(48, 40) is None
    with pytest.raises(UnsupportedConfiguration) as caught:
        eng.chat([message(vm.attachment())], GREEDY, DecodeOptions(strategy="auto"))
    assert caught.value.message == f"{eng.target.name} cannot see images: it is a text-only model."
    assert caught.value.hint == "Load a vision model (Gemma 3, Qwen2.5-VL, SmolVLM) or remove the image."
    # A document or anything else attached is not an image: not refused for that.
    assert eng.chat([{"role": "user", "content": "hi", "attachments": []}], GREEDY, DecodeOptions()).token_ids


def test_a_draft_does_not_see_images(vision_dirs, engines):
    eng = engines(vision_dirs("idefics3"))
    with pytest.raises(UnsupportedConfiguration, match="does not take images"):
        eng.chat([message(vm.attachment())], GREEDY, DecodeOptions(strategy="prompt-lookup"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["int8", "nf4"])
@pytest.mark.parametrize("family", vm.FAMILIES)
def test_bitsandbytes_keeps_the_vision_tower_unquantised(family, precision, device, vision_dirs, engines):
    import bitsandbytes as bnb

    target = engines(vision_dirs(family), device, precision).target
    towers = tuple(target.estimate_shape.vision_modules)
    assert towers
    quantised = (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)
    linears = [(n, m) for n, m in target.model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert all(not isinstance(m, quantised) for n, m in linears if n.startswith(towers))
    assert any(isinstance(m, quantised) for n, m in linears if not n.startswith(towers))
    eng = engines(vision_dirs(family), device, precision)
    result = eng.chat([message(vm.attachment())], GREEDY, DecodeOptions(strategy="auto"))
    assert result.finish_reason in ("length", "eos") and result.token_ids


@pytest.mark.parametrize("precision", ["q8", "q4"])
def test_redlines_own_quantisation_keeps_the_tower_too(precision, vision_dirs, engines):
    target = engines(vision_dirs("gemma3"), "cpu", precision).target
    towers = tuple(target.estimate_shape.vision_modules)
    names = {n: type(m).__name__ for n, m in target.model.named_modules()}
    assert {t for n, t in names.items() if n.startswith(towers) and "Linear" in t} == {"Linear"}
    assert "PackedLinear" in {t for n, t in names.items() if not n.startswith(towers)}


@pytest.mark.parametrize("family", vm.FAMILIES)
def test_the_estimate_counts_the_vision_tower(family, vision_dirs):
    from transformers import AutoModelForImageTextToText

    folder = vision_dirs(family)
    shape = shape_for_folder(folder, family)
    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.bfloat16)
    real = sum(p.numel() * p.element_size() for p in model.parameters())
    towers = tuple(shape.vision_modules)
    tower = sum(p.numel() for n, p in model.named_parameters() if n.startswith(towers))
    assert towers and shape.vision_parameters == tower > 0
    predicted = weights_bytes(shape, PrecisionSpec("bf16")).total
    assert abs(predicted - real) <= 0.03 * real
    # A decode step reads the language model alone; bitsandbytes leaves the tower in bf16.
    assert weights_read_bytes(shape, PrecisionSpec("bf16")) < predicted - tower * 2 + shape.vocab * shape.hidden * 2
    nf4 = weights_bytes(shape, PrecisionSpec("nf4", compute_dtype="bf16"))
    assert nf4.unquantised >= tower * 2


@pytest.mark.parametrize("family", vm.FAMILIES)
def test_image_tokens_are_what_the_processor_makes(family, vision_dirs, engines):
    from PIL import Image as PILImage

    folder = vision_dirs(family)
    target = engines(folder).target
    _, processor = vm.BUILDERS[family](vm.build_tokenizer(family))
    config, settings = target.model.config, image_settings(folder)
    conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    prompt = processor.apply_chat_template(conv, add_generation_prompt=True)
    for width, height in SIZES:
        image = PILImage.open(io.BytesIO(vm.image_bytes(width, height)))
        ids = processor(text=prompt, images=[image], return_tensors="pt")["input_ids"][0].tolist()
        made = ids.count(image_token_id(target))
        assert image_tokens(config, settings, width, height) == made, (width, height)
        assert image_tokens(config.to_dict(), settings, width, height) == made  # from config.json alone
        assert target.image_tokens(width, height) == made
