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
        self.sent = ""

    def add(self, tokens: Sequence[int]) -> str:
        """Take newly committed tokens; the text that can be sent now ('' when none)."""
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        text = text.rstrip("\ufffd")
        if self.hold:
            text = text[: max(0, len(text) - self.hold)]
        return self._advance(text)

    def finish(self, final: str) -> str:
        """The final answer's text not sent yet."""
        return self._advance(final)

    def _advance(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""  # nothing new, or the decoding changed what was sent (kept as sent)
        piece, self.sent = text[len(self.sent):], text
        return piece
