"""The view of speculation: a pure function of the engine's step events, shown by `specdec chat` (cli/render.py,
in the terminal) and by `specdec serve`'s chat page (the stream's `speculation` field).

`TranscriptView.add(event)` folds one event in; `spans()` lists the answer as spans: draft tokens the target
accepted ("accepted", with the draft's source), the target's own token of each step ("target"), and the latest
step's rejected draft tokens ("rejected"), which the next step clears. `status()` gives the numbers under the
answer. Nothing here draws: tests drive it with scripted events and a fake decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from ..decoding.stats import Tally

if TYPE_CHECKING:  # pragma: no cover
    from ..decoding.stats import GenerationStats

Decode = Callable[[Sequence[int]], str]
_DECODE_WINDOW = 8  # tokens of left context used to decode a token's text (byte-level BPE, spaces, UTF-8)


def text_decoder(tokenizer) -> Decode:
    """Token ids -> display text (special tokens such as EOS are not shown)."""
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class Span:
    text: str
    kind: str  # "accepted" | "target" | "rejected"
    source: str = ""  # accepted and rejected: the draft's source ("sam-dynamic", "pld", ...)


@dataclass
class Status:
    """The status line under an answer: the drafter, the source of the latest draft, and the statistics so far
    (stats.py's, from the same events the engine summarises)."""

    drafter: str
    source: str
    stats: "GenerationStats"

    def line(self) -> str:
        stats = self.stats
        source = f" ({self.source})" if self.source and self.source != self.drafter else ""
        return (f"{self.drafter}{source} · {stats.tokens_per_second:.1f} tok/s · "
                f"{stats.mean_accepted_tokens:.2f} tokens/step · acceptance {stats.acceptance_rate:.0%} · "
                f"{stats.new_tokens} tokens")


@dataclass
class TranscriptView:
    decode: Decode
    drafter: str = ""
    show_rejected: bool = True
    tokens: list[int] = field(default_factory=list)  # committed answer tokens
    committed: list[Span] = field(default_factory=list)
    rejected: list[Span] = field(default_factory=list)  # the latest step's rejected drafts only

    def __post_init__(self) -> None:
        self.tally = Tally()

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        """Text of each token appended after the committed answer (from a short window of left context)."""
        left = self.tokens[-_DECODE_WINDOW:]
        base = self.decode(left)
        out, seq = [], list(left)
        for token in tokens:
            seq.append(token)
            text = self.decode(seq)
            out.append(text[len(base):] if text.startswith(base) else text)
            base = text
        return out

    def add(self, event) -> None:
        kept = event.committed
        accepted = min(event.accepted, len(kept))
        kinds = ["accepted"] * accepted + ["target"] * (len(kept) - accepted)
        source = event.draft.source
        self.rejected = []
        if self.show_rejected and event.kind == "step" and len(event.draft) > event.accepted:
            rejected_tokens = event.draft.tokens[event.accepted :]
            self.rejected = [Span(text, "rejected", source) for text in self._pieces_after(kept, rejected_tokens)]
        self.committed += [Span(text, kind, source if kind == "accepted" else "")
                           for text, kind in zip(self.pieces(kept), kinds)]
        self.tokens += list(kept)
        self.tally.add(event)

    def _pieces_after(self, kept: Sequence[int], rejected: Sequence[int]) -> list[str]:
        """Rejected drafts are rendered where they were guessed: after the accepted part of this step."""
        accepted_part = list(kept[:-1]) if kept else []
        saved = self.tokens
        self.tokens = saved + accepted_part
        try:
            return self.pieces(rejected)
        finally:
            self.tokens = saved

    def spans(self) -> list[Span]:
        return self.committed + self.rejected

    def status(self) -> Status:
        return Status(self.drafter, self.tally.latest_source, self.tally.snapshot())
