"""Does a draft model pair with a target? Decided from configs and tokenizers alone — no weights.

The rule is the one the engine applies after loading (``decode.check_draft`` calls
``compare``): same vocabulary → the draft's tokens are the target's ("shared");
different vocabulary sizes → transformers' universal assisted decoding re-tokenises
between the two ("universal"); the same size but different tokens is refused, because
transformers would take them for one tokenizer and accept wrong tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import IncompatibleDraft
from ..sources.config import load_config, load_tokenizer
from ..sources.resolve import resolve

MODES = {
    "shared": "shares the target's vocabulary: its tokens are checked directly",
    "universal": (
        "has a different tokenizer: transformers' universal assisted decoding converts its tokens "
        "to the target's (slower per step than a shared vocabulary)"
    ),
}


@dataclass
class PairCheck:
    mode: str  # "shared" | "universal" | "unknown" (not on this machine yet)
    target: str
    draft: str
    reason: str  # one sentence for the user

    def to_dict(self) -> dict:
        return dict(mode=self.mode, target=self.target, draft=self.draft, reason=self.reason)


def _text_config(cfg):
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def compare(target_name: str, tcfg, ttok, draft_name: str, dcfg, dtok) -> str:
    """ "shared" or "universal", or raise IncompatibleDraft saying why."""
    if getattr(dcfg, "is_encoder_decoder", False) != getattr(tcfg, "is_encoder_decoder", False):
        raise IncompatibleDraft(
            f"The draft {draft_name} is {'an encoder-decoder' if dcfg.is_encoder_decoder else 'a decoder-only'} "
            f"model but the target {target_name} is not.",
            "Choose a decoder-only causal language model as the draft.",
        )
    tv = _text_config(tcfg).vocab_size
    dv = _text_config(dcfg).vocab_size
    if tv == dv and ttok.get_vocab() == dtok.get_vocab():
        return "shared"
    if tv == dv:
        raise IncompatibleDraft(
            f"The draft {draft_name} has the same vocabulary size as {target_name} ({tv}) but different tokens, "
            "and transformers would treat them as one tokenizer.",
            "Choose a draft from the same model family (same tokenizer).",
        )
    return "universal"


def check_pair(target_spec: str, draft_spec: str) -> PairCheck:
    """Compare two models named as ``--model`` accepts, from their configs and tokenizers.

    Mode "unknown" when one of them is not on this machine yet (a hub model not downloaded, the
    starter not fetched): nothing is downloaded to decide; the engine checks again when it loads.
    """

    target, draft = resolve(target_spec), resolve(draft_spec)
    tfolder: Optional[Path] = target.local_folder()
    dfolder: Optional[Path] = draft.local_folder()
    missing = [s.name for s, f in ((target, tfolder), (draft, dfolder)) if f is None]
    if missing:
        return PairCheck(
            "unknown",
            target.name,
            draft.name,
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on this machine yet, "
            "so the tokenizers cannot be compared now; they are compared when the models load.",
        )
    tname, tcfg, ttok = target.name, load_config(tfolder), load_tokenizer(tfolder)
    dname, dcfg, dtok = draft.name, load_config(dfolder), load_tokenizer(dfolder)
    mode = compare(tname, tcfg, ttok, dname, dcfg, dtok)
    reason = f"{dname} {MODES[mode]}."
    if tfolder.resolve() == dfolder.resolve():
        reason += " It is the target itself, though: every drafted token is accepted and nothing is saved."
    return PairCheck(mode, tname, dname, reason)
