"""New tokens as text that is safe to show before the answer ends: what `specdec chat` prints and `specdec serve`
streams, one rule for both.

A stream sends the text of the tokens committed so far, less what may still change or must never be seen:
- a trailing replacement character (a UTF-8 sequence split across tokens);
- with stop strings, everything from the first stop string that already stands in the text (the engine commits
  the token that reaches into a stop string, then cuts the answer's text where it begins);
- and the longest end of the text that could still begin a stop string (".. 2. Bl" with stop "Blue").
`finish` sends the rest of the final answer (the session's decoding, cut before a stop string), so the pieces
concatenated are the answer a request gets whole. Decoding is the tokenizer's, with special tokens left out, as
`specdec chat` shows answers; the text is decoded piece by piece (each new piece with a few earlier tokens as
context), which gives the whole decoding's text for the tokenizers specdec serves.
"""

from __future__ import annotations

from typing import Any, Sequence


def stop_cut(text: str, stops: Sequence[str]) -> int:
    """How much of `text` may be shown: up to the first stop string in it, less an end that may begin one."""
    found = [text.find(stop) for stop in stops if stop in text]
    if found:
        return min(found)
    held = 0
    for stop in stops:  # the longest end of the text that is a proper beginning of a stop string
        for size in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:size]):
                held = size
                break
    return len(text) - held


class TextStream:
    """The text of an answer, handed out in pieces that never need taking back."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(one for one in stop if one)
        self.tokens: list[int] = []
        self.text = ""  # the text of tokens[:read], decoded piece by piece
        self.prefix = 0  # tokens[prefix:read] decoded again as context for the next piece
        self.read = 0
        self.sent = ""

    def add(self, tokens: Sequence[int]) -> str:
        """Take newly committed tokens; the text that can be sent now ('' when none)."""
        self.tokens.extend(tokens)
        decode = self.tokenizer.decode
        before = decode(self.tokens[self.prefix : self.read], skip_special_tokens=True)
        after = decode(self.tokens[self.prefix :], skip_special_tokens=True)
        if len(after) > len(before) and after.startswith(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self.prefix, self.read = self.read, len(self.tokens)
        text = self.text[: stop_cut(self.text, self.stop)] if self.stop else self.text
        return self._advance(text)

    def finish(self, final: str) -> str:
        """The final answer's text not sent yet."""
        return self._advance(final)

    def _advance(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""  # nothing new, or the decoding changed what was sent (kept as sent)
        piece, self.sent = text[len(self.sent):], text
        return piece
