"""Which tokens' log probabilities go with which piece of an answer's text.

The engine reports a log probability for every committed token (decoding/logprobs.py); the text a client sees is
held back near a possible stop string and cut where one matches (texts/text_stream.py). So an entry is released with
the text piece that covers its token (the tokens' own texts laid end to end, special tokens counted as the answer
shows them: empty), and a token that begins past the final text's end (after a stop string's cut) is never
reported. Entries carry the token's text and its alternatives' texts, decoded one token at a time (a special token
by its name, `<|im_end|>`); responses.py shapes them for each API. Not thread-safe: one per
answer, in the worker's thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class LogprobEntry:
    token: int
    text: str
    shown: int  # characters it adds to the answer's text (0 for a special token)
    logprob: float
    top: tuple[tuple[int, str, float], ...]  # (id, text, log probability), best first


class LogprobStream:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pending: list[LogprobEntry] = []
        self.covered = 0  # characters of the released entries' texts
        self.released: list[LogprobEntry] = []

    def add(self, scored: Sequence[Any]) -> None:
        """The committed tokens' TokenLogprobs of one engine event."""
        decode = self.tokenizer.decode
        for item in scored:
            top = tuple((token, decode([token]), value) for token, value in item.top)
            shown = len(decode([item.token], skip_special_tokens=True))
            self.pending.append(LogprobEntry(item.token, decode([item.token]), shown, item.logprob, top))

    def release(self, sent_chars: int) -> list[LogprobEntry]:
        """The entries whose tokens' text lies within the first `sent_chars` characters shown."""
        out = []
        while self.pending and self.covered + self.pending[0].shown <= sent_chars:
            entry = self.pending.pop(0)
            self.covered += entry.shown
            out.append(entry)
        self.released += out
        return out

    def finish(self, final_chars: int) -> list[LogprobEntry]:
        """The rest of the entries whose tokens begin before the final text's end (the others were cut)."""
        out = []
        while self.pending and self.covered < final_chars:
            entry = self.pending.pop(0)
            self.covered += entry.shown
            out.append(entry)
        self.pending.clear()
        self.released += out
        return out
