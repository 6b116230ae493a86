"""Turn a growing list of token ids into text deltas that join to the final text exactly.

Decoding token by token breaks multi-byte characters (emoji, CJK) that span
tokens, and some tokenizers change earlier text when later tokens arrive. We
decode the whole sequence each time and release only the part that is stable:
no trailing U+FFFD (an incomplete UTF-8 sequence), nothing that could still
become a stop string, and only when what was released before is still a prefix.
"""

from __future__ import annotations

from typing import Sequence


class DeltaDecoder:
    def __init__(self, tokenizer, stop_strings: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.emitted = ""
        self.stopped_at_string = False

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _cut_at_stop(self, text: str) -> str:
        cut = len(text)
        for s in self.stop_strings:
            i = text.find(s)
            if i != -1:
                cut = min(cut, i)
                self.stopped_at_string = True
        return text[:cut]

    def step(self, ids: Sequence[int]) -> str:
        """Return the new stable text after ``ids`` (all new tokens so far)."""
        text = self._cut_at_stop(self._decode(ids))
        if self.stopped_at_string:
            stable = text
        else:
            stable = text.rstrip("\ufffd")
            hold = 0
            for s in self.stop_strings:  # hold back a tail that may grow into a stop string
                for k in range(min(len(s) - 1, len(stable)), 0, -1):
                    if stable.endswith(s[:k]):
                        hold = max(hold, k)
                        break
            stable = stable[: len(stable) - hold]
        if not stable.startswith(self.emitted) or len(stable) <= len(self.emitted):
            return ""
        delta = stable[len(self.emitted) :]
        self.emitted = stable
        return delta

    def finish(self, ids: Sequence[int]) -> tuple[str, str]:
        """Return (final_text, last_delta). The deltas join to final_text."""
        final = self._cut_at_stop(self._decode(ids))
        if final.startswith(self.emitted):
            delta = final[len(self.emitted) :]
        else:
            # The tokenizer rewrote text already shown (rare). Keep what was shown
            # as the final text so the stream and the result never disagree.
            final, delta = self.emitted, ""
        self.emitted = final
        return final, delta
