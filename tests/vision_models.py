"""Tiny random vision-language models for tests, built here from transformers' own config classes (no hub): Gemma 3,
Qwen2.5-VL and Idefics3 (SmolVLM), each with its processor (the family's image processor, a small byte-level BPE
tokenizer carrying the family's image tokens, and a chat template shaped like the family's own), saved as a folder
that ``AutoModelForImageTextToText`` and ``AutoProcessor`` load. Images are a few px and a handful of tokens, so a
folder builds in about a second."""

from __future__ import annotations

from pathlib import Path

FAMILIES = ("gemma3", "qwen2_5_vl", "idefics3")

CORPUS = [
    "What is in this picture? A red square on a blue background, and a cat asleep on the sofa.",
    "Describe the image in one sentence. The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France. Local models run on consumer GPUs.",
] * 20

# Each family's chat template, in the structure of the real one (content as a list of {"type": "image"} and
# {"type": "text"} items, the image marker where the processor expands it).
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
QWEN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}"
    "{% if line['type'] == 'text' %}{{ line['text'] }}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}"
    "{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

IDEFICS3_ROW_COL = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
SPECIALS = {
    "gemma3": ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"]
    + ["<image_soft_token>"],
    "qwen2_5_vl": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
    + ["<|image_pad|>", "<|video_pad|>"],
    "idefics3": ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>"]
    + ["<global-img>"]
    + IDEFICS3_ROW_COL,
}


def build_tokenizer(family: str, vocab_size: int = 320):
    """A byte-level BPE tokenizer with ``family``'s special tokens (its image tokens among them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = SPECIALS[family]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size + len(specials),
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    if family == "gemma3":
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<bos>",
            eos_token="<end_of_turn>",
            pad_token="<pad>",
            extra_special_tokens={
                "boi_token": "<start_of_image>",
                "eoi_token": "<end_of_image>",
                "image_token": "<image_soft_token>",
            },
        )
    if family == "qwen2_5_vl":
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            extra_special_tokens={
                "image_token": "<|image_pad|>",
                "video_token": "<|video_pad|>",
                "vision_bos_token": "<|vision_start|>",
                "vision_eos_token": "<|vision_end|>",
            },
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|endoftext|>",
    )


def _gemma3(tokenizer):
    from transformers import Gemma3Config, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    ids = tokenizer.convert_tokens_to_ids
    config = Gemma3Config(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": 32,
            "layer_types": ["sliding_attention", "full_attention"],
            "max_position_embeddings": 1024,
            "bos_token_id": ids("<bos>"),
            "eos_token_id": [ids("<end_of_turn>"), ids("<eos>")],
            "pad_token_id": ids("<pad>"),
        },
        vision_config={
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
            "vision_use_head": False,
        },
        mm_tokens_per_image=4,  # 4×4 patches pooled 2×2
        boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
    )
    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    processor = Gemma3Processor(images, tokenizer, chat_template=GEMMA3_TEMPLATE, image_seq_length=4)
    return config, processor


def _qwen2_5_vl(tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "bos_token_id": None,
            "eos_token_id": ids("<|im_end|>"),
            "pad_token_id": ids("<|endoftext|>"),
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [1],
        },
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    # Between 56×56 and 112×112 px: an image is 4 to 16 tokens (a 28-px cell of 2×2 patches each).
    images = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112}, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    # Without torchvision transformers cannot build Qwen's video processor, which the processor's class requires:
    # built as Redline's loader builds it then, for images alone (``images_only``).
    processor = images_only(Qwen2_5_VLProcessor)(images, tokenizer, chat_template=QWEN_TEMPLATE)
    return config, processor


def _idefics3(tokenizer):
    from transformers import Idefics3Config, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    ids = tokenizer.convert_tokens_to_ids
    config = Idefics3Config(
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
            "bos_token_id": ids("<|im_start|>"),
            "eos_token_id": ids("<end_of_utterance>"),
            "pad_token_id": ids("<|endoftext|>"),
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        scale_factor=2,  # 4×4 patches → 4 tokens a crop
        image_token_id=ids("<image>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    # An image up to 64 px a side is split into crops of 32 (and a global view), each 4 tokens.
    images = Idefics3ImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(images, tokenizer, image_seq_len=4, chat_template=IDEFICS3_TEMPLATE)
    return config, processor


def images_only(cls):
    """``cls`` (a processor class) without its video processor: the same class name, so a saved folder names the
    family's own processor. (tests build it themselves, not through Redline's copy, so the two are checked
    against each other.)"""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        cls.__init__(self, image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__})


# Gemma 3 scales its embeddings by √hidden: with the others' 0.2 every image got the same reply.
INIT_STD = {"gemma3": 0.1}
BUILDERS = {"gemma3": _gemma3, "qwen2_5_vl": _qwen2_5_vl, "idefics3": _idefics3}


def build(family: str, folder: Path, seed: int = 0) -> Path:
    """Write a loadable tiny ``family`` model (random weights, fp32) and its processor to ``folder``."""
    import torch
    from transformers import AutoModelForImageTextToText

    tokenizer = build_tokenizer(family)
    config, processor = BUILDERS[family](tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config)
    with torch.no_grad():  # larger weights than the default init make greedy outputs less repetitive
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, INIT_STD.get(family, 0.2))
    gen = model.generation_config
    gen.eos_token_id = config.get_text_config().eos_token_id
    gen.pad_token_id = tokenizer.pad_token_id
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def image_bytes(width: int = 48, height: int = 40, seed: int = 0, fmt: str = "PNG") -> bytes:
    """An image of random pixels, encoded (PNG unless ``fmt`` says otherwise)."""
    import io

    import numpy as np
    from PIL import Image as PILImage

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    PILImage.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def attachment(width: int = 48, height: int = 40, seed: int = 0):
    """The same image as the engine takes it: ``redline.inference.attachments.Image``."""
    import hashlib

    from redline.inference.attachments import Image

    data = image_bytes(width, height, seed)
    return Image(f"image-{seed}.png", "image/png", hashlib.sha256(data).hexdigest(), data, width, height)
