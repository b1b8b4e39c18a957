"""New tokens as text that is safe to send before the answer ends.

A stream sends the text of the tokens committed so far, less what may still change: a trailing replacement
character (a UTF-8 sequence split across tokens) and, with stop strings, the last characters that could begin
one (the engine cuts the answer where a stop string begins, and the client must never see it). `finish` sends the
rest of the final answer (the session's decoding, cut before a stop string). Decoding is the tokenizer's, with
special tokens left out, as `specdec chat` shows answers.
"""

from __future__ import annotations

from typing import Any, Sequence


class TextStream:
    """The text of an answer, handed out in pieces that never need taking back."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.hold = max((len(one) for one in stop), default=1) - 1  # characters a stop string may begin in
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
        text = self.text[: max(0, len(self.text) - self.hold)] if self.hold else self.text
        return self._advance(text)

    def finish(self, final: str) -> str:
        """The final answer's text not sent yet."""
        return self._advance(final)

    def _advance(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""  # nothing new, or the decoding changed what was sent (kept as sent)
        piece, self.sent = text[len(self.sent):], text
        return piece
