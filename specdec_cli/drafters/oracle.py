"""The oracle drafter (bench only): replays a known output, so every draft is what the target would say.

`specdec bench --oracle` gives it the baseline's own tokens for each turn of a conversation. With greedy
decoding every drafted token is accepted, so its speedup at draft length k is the best any drafter can reach
on this machine with k-token drafts: the ceiling set by the cost of verifying k+1 tokens in one forward.
It is not in the DRAFTERS registry: it needs the answer before the question. The bench runs it with the
engine's cost-aware trimming off, so each step verifies exactly min(k, tokens left) drafted tokens.

A conversation's turns arrive as prefill events; each prefill moves to the next reference. If the committed
text leaves the reference (sampling, or a numerical tie broken the other way), it stops drafting for the rest
of that turn rather than propose tokens it knows are off track.
"""

from __future__ import annotations

from typing import Sequence

from ..decoding.draft import NOTHING, Draft, StepEvent
from ..errors import SpecdecError

SOURCE = "oracle"


class OracleDrafter:
    name = "oracle"
    needs = NOTHING

    def __init__(self, references: Sequence[Sequence[int]], draft_max: int):
        if draft_max < 1:
            raise SpecdecError(f"oracle draft length must be >= 1, got {draft_max}")
        self.references = [list(map(int, reference)) for reference in references]
        self.draft_max = draft_max
        self.turn = -1  # index into references; the first prefill makes it 0
        self.prompt_len = 0
        self.done = 0  # tokens committed in this turn
        self.on_track = True

    def observe(self, event: StepEvent) -> None:
        if event.kind == "prefill":
            self.turn += 1
            self.prompt_len = len(event.prompt_tokens)
            self.done = 0
            self.on_track = True
        reference = self._reference()
        committed = list(event.committed)
        if self.on_track and reference[self.done : self.done + len(committed)] != committed:
            self.on_track = False
        self.done += len(committed)

    def reset(self) -> None:
        """Back on track for the rest of this turn (the next prefill still moves to the next reference)."""
        self.done = 0
        self.on_track = True

    def _reference(self) -> list[int]:
        return self.references[self.turn] if 0 <= self.turn < len(self.references) else []

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        if not self.on_track or budget <= 0:
            return Draft.empty(SOURCE)
        done = len(context) - self.prompt_len if self.prompt_len else self.done
        tokens = self._reference()[done : done + min(budget, self.draft_max)]
        return Draft(tokens, SOURCE) if tokens else Draft.empty(SOURCE)
