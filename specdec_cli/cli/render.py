"""The live view of speculation in the terminal: session/transcript.py's spans drawn with Rich.

`LiveTranscript` prints what is complete above a Live region and keeps the last line, the rejected drafts and the
status line in it. Draft tokens the target accepted are green, the target's own tokens bold, the latest step's
rejected drafts struck through.
"""

from __future__ import annotations

from ..session.transcript import Decode, Span, Status, TranscriptView, text_decoder

__all__ = ["Decode", "LiveTranscript", "Span", "STYLES", "Status", "TranscriptView", "text_decoder"]

STYLES = {"accepted": "green", "target": "bold", "rejected": "red strike dim", "prompt": ""}


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
