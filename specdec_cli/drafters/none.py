"""The `none` drafter: never drafts, so the engine's loop is plain autoregressive decoding (the baseline)."""

from __future__ import annotations

from typing import Sequence

from ..decoding.draft import NOTHING, Draft, StepEvent


class NoDrafter:
    name = "none"
    needs = NOTHING

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        return Draft.empty(self.name)

    def observe(self, event: StepEvent) -> None:
        pass

    def reset(self) -> None:
        pass
