"""The `none` drafter: never drafts, so the engine's loop is plain autoregressive decoding (the baseline).
`NoDrafter` itself lives in decoding/draft.py, where plain_many.py uses it too."""

from __future__ import annotations

from typing import Optional

from ..decoding.draft import NoDrafter
from .spec import DrafterOptions, DrafterSpec
from .target import TargetInfo

__all__ = ["NoDrafter", "SPEC", "make_no_drafter"]


def make_no_drafter(options: DrafterOptions, target: TargetInfo, draft_max: Optional[int] = None) -> NoDrafter:
    return NoDrafter()


SPEC = DrafterSpec(name="none", help="plain decoding through the same loop (the baseline)", build=make_no_drafter,
                   aux_rank=6)
