"""The `none` drafter: never drafts, so the engine's loop is plain autoregressive decoding (the baseline)."""

from __future__ import annotations

from typing import Optional, Sequence

from ..decoding.draft import NOTHING, Draft, StepEvent
from .spec import DrafterOptions, DrafterSpec
from .target import TargetInfo


class NoDrafter:
    name = "none"
    needs = NOTHING

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        return Draft.empty(self.name)

    def observe(self, event: StepEvent) -> None:
        pass

    def reset(self) -> None:
        pass


def make_no_drafter(options: DrafterOptions, target: TargetInfo, draft_max: Optional[int] = None) -> NoDrafter:
    return NoDrafter()


SPEC = DrafterSpec(name="none", help="plain decoding through the same loop (the baseline)", build=make_no_drafter,
                   aux_rank=6)
