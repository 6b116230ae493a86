"""Token ids to text deltas: at every token the text equals one decode of all tokens so far, the deltas join to
the final text, and each token decodes only a tail (not the whole reply again)."""

import pytest
from conftest import CORPUS, build_tokenizer

from redline.inference.decoding.textstream import DeltaDecoder

TEXT = (
    "Hello there, world!  Two  spaces, a tab\there.\n\n你好，世界！日本語もあります。 Emoji 😀🚀🎉 café naïve "
    "Zürich.\n```python\ndef f(x):\n    return x * 2\n```\n"
) * 12


def metaspace_tokenizer():
    """SentencePiece's convention (Llama 2, Mistral): '▁' for a space, dropped at the start of a decode, and
    byte fallback for what the vocabulary lacks — the decode of a tail depends on what precedes it."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "</s>", *bytes_])
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


def wordpiece_tokenizer():
    """'##' continuations joined by the decoder, which also cleans up spaces before punctuation."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=500, special_tokens=["[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


TOKENIZERS = {"byte-level BPE": build_tokenizer, "metaspace": metaspace_tokenizer, "wordpiece": wordpiece_tokenizer}


@pytest.mark.parametrize("kind", TOKENIZERS)
def test_text_at_every_token_is_the_whole_decode_and_each_token_decodes_a_tail(kind):
    tok = TOKENIZERS[kind]()
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) > 500
    decoded = []  # how many tokens each decode call was handed
    decoder = DeltaDecoder(tok, ["</answer>"])
    whole = decoder._decode
    decoder._decode = lambda part: decoded.append(len(part)) or whole(part)
    deltas, whole_decodes = [], 0
    for n in range(1, len(ids) + 1):
        assert decoder.text(ids[:n]) == whole(ids[:n]), n
        decoded.clear()
        deltas.append(decoder.step(ids[:n]))
        whole_decodes += sum(decoded) > 64  # more than a tail and its context
    # WordPiece's clean-up can rewrite the context's last characters once the next token arrives ("do n't" ->
    # "don't"); there the whole text is decoded, which is rare. The BPE tokenizers of chat models never need it.
    assert whole_decodes <= (len(ids) // 20 if kind == "wordpiece" else 0), whole_decodes
    final, last = decoder.finish(ids)
    assert "".join(deltas) + last == final == whole(ids)


def test_a_stop_string_across_the_anchor_is_still_found():
    tok = build_tokenizer()
    ids = tok("x" * 40 + " Stop here. and not this", add_special_tokens=False)["input_ids"]
    decoder = DeltaDecoder(tok, ["Stop here."])
    shown = "".join(decoder.step(ids[:n]) for n in range(1, len(ids) + 1))
    assert decoder.stopped_at_string and shown == "x" * 40 + " "
