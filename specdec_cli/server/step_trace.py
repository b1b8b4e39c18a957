"""Each step of an answer as a stream shows it to the chat page (`speculative.trace`): the tokens it committed, each
marked as a draft token the target accepted (with the draft's source) or the target's own, and the draft tokens
it rejected, as text. The same view `specdec chat` draws in the terminal (session/transcript.py).

A step's texts are its tokens' decodings; a stop string may cut the answer's content shorter than their sum, so
the page shows the content as the truth and the trace as its colouring.
"""

from __future__ import annotations

from typing import Any

from ..session.transcript import TranscriptView, text_decoder


class StepTrace:
    def __init__(self, tokenizer: Any):
        self.view = TranscriptView(text_decoder(tokenizer))

    def add(self, event: Any) -> dict:
        """One engine event as the stream's `speculation` field."""
        before = len(self.view.committed)
        self.view.add(event)
        return {"kind": event.kind, "drafted": len(event.draft.tokens) if event.kind == "step" else 0,
                "tokens": [[span.text, span.source if span.kind == "accepted" else ""]
                           for span in self.view.committed[before:]],
                "rejected": [span.text for span in self.view.rejected]}
