"""The live view of speculation: a pure function of the engine's step events.

`TranscriptView.add(event)` folds one event in; `spans()` lists the answer as styled spans: draft tokens
the target accepted ("accepted", green), the target's own token of each step ("target", bold), and the
latest step's rejected draft tokens ("rejected", struck through), which the next step clears. `status()`
gives the numbers under the answer. The Rich plumbing (what is printed above a Live region and what stays
in it) is at the bottom; tests drive the pure part with scripted events and a fake decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from ..decoding.stats import Tally

if TYPE_CHECKING:  # pragma: no cover
    from ..decoding.stats import GenerationStats

STYLES = {"accepted": "green", "target": "bold", "rejected": "red strike dim", "prompt": ""}

Decode = Callable[[Sequence[int]], str]
_DECODE_WINDOW = 8  # tokens of left context used to decode a token's text (byte-level BPE, spaces, UTF-8)


def text_decoder(tokenizer) -> Decode:
    """Token ids -> display text (special tokens such as EOS are not shown)."""
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class Span:
    text: str
    kind: str  # "accepted" | "target" | "rejected"


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
        self.rejected = []
        if self.show_rejected and event.kind == "step" and len(event.draft) > event.accepted:
            rejected_tokens = event.draft.tokens[event.accepted :]
            self.rejected = [Span(text, "rejected") for text in self._pieces_after(kept, rejected_tokens)]
        self.committed += [Span(text, kind) for text, kind in zip(self.pieces(kept), kinds)]
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


# -- Rich plumbing ---------------------------------------------------------------------------------------


class LiveTranscript:
    """Streams a TranscriptView to a terminal without ever cropping a long answer.

    Complete lines are printed above the Live region and stay; only the last, unfinished line, the
    rejected drafts and the status line live in the region, so the region is never taller than a few lines.
    """

    def __init__(self, console, view: TranscriptView):
        from rich.live import Live

        self.console = console
        self.view = view
        self.flushed_spans = 0  # committed spans already printed above the region
        self.flushed_chars = 0  # characters of the span at flushed_spans already printed
        self.live = Live(console=console, auto_refresh=False, transient=True, vertical_overflow="visible")

    def __enter__(self) -> "LiveTranscript":
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.view.rejected = []
        self._flush(final=True)
        self.live.update("", refresh=True)
        self.live.__exit__(*exc)

    def on_event(self, event) -> None:
        self.view.add(event)
        self._flush(final=False)
        self.live.update(self._region(), refresh=True)

    def _flush(self, final: bool) -> None:
        """Print every committed line that is complete (all of it when final)."""
        from rich.text import Text

        pending = Text()
        spans = self.view.committed
        for index in range(self.flushed_spans, len(spans)):
            text = spans[index].text[self.flushed_chars if index == self.flushed_spans else 0 :]
            pending.append(text, STYLES[spans[index].kind])
        plain = pending.plain
        cut = len(plain) if final else plain.rfind("\n") + 1
        if cut <= 0:
            return
        self.live.console.print(pending[: cut - 1] if plain[cut - 1 : cut] == "\n" else pending[:cut],
                                soft_wrap=True)
        # advance the flush cursor by `cut` characters
        remaining = cut
        while remaining > 0 and self.flushed_spans < len(spans):
            left = len(spans[self.flushed_spans].text) - self.flushed_chars
            if remaining >= left:
                remaining -= left
                self.flushed_spans += 1
                self.flushed_chars = 0
            else:
                self.flushed_chars += remaining
                remaining = 0

    def _region(self):
        from rich.console import Group
        from rich.text import Text

        line = Text()
        spans = self.view.committed
        for index in range(self.flushed_spans, len(spans)):
            text = spans[index].text[self.flushed_chars if index == self.flushed_spans else 0 :]
            line.append(text, STYLES[spans[index].kind])
        for span in self.view.rejected:
            line.append(span.text, STYLES["rejected"])
        return Group(line, Text(self.view.status().line(), style="dim"))
