"""The live view of speculation: a pure function of the engine's step events.

`TranscriptView.add(event)` folds one event in; `spans()` lists the answer as styled spans: draft tokens
the target accepted ("accepted", green), the target's own token of each step ("target", bold), and the
latest step's rejected draft tokens ("rejected", struck through), which the next step clears. `status()`
gives the numbers under the answer. The Rich plumbing (what is printed above a Live region and what stays
in it) is at the bottom; tests drive the pure part with scripted events and a fake decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

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
    drafter: str = ""
    source: str = ""  # which source drafted the latest step (hybrid drafters name theirs)
    new_tokens: int = 0
    steps: int = 0
    committed_in_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        return self.committed_in_steps / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def line(self) -> str:
        source = f" ({self.source})" if self.source and self.source != self.drafter else ""
        return (f"{self.drafter}{source} · {self.tokens_per_second:.1f} tok/s · "
                f"{self.mean_accepted_tokens:.2f} tokens/step · acceptance {self.acceptance_rate:.0%} · "
                f"{self.new_tokens} tokens")


@dataclass
class TranscriptView:
    decode: Decode
    drafter: str = ""
    show_rejected: bool = True
    tokens: list[int] = field(default_factory=list)  # committed answer tokens
    committed: list[Span] = field(default_factory=list)
    rejected: list[Span] = field(default_factory=list)  # the latest step's rejected drafts only

    def __post_init__(self) -> None:
        self.state = Status(drafter=self.drafter)

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
        state = self.state
        state.new_tokens += len(kept)
        state.seconds += event.draft_seconds + event.verify_seconds
        if event.kind == "step":
            state.steps += 1
            state.committed_in_steps += len(kept)
            state.drafted += len(event.draft)
            state.accepted += event.accepted
            if len(event.draft):
                state.source = event.draft.source

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
        return self.state


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
