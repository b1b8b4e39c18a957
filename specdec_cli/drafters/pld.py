"""Prompt lookup decoding (`pld`): continue the most recent earlier occurrence of the context's last n-gram.

For n from `max_ngram` down to `min_ngram`, find the latest earlier position where the last n tokens of the
context occurred, and propose the tokens that followed there. Stateless: it reads the context each step.
It does not look outside the current context (the suffix-automaton drafter does that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from ..decoding.draft import NOTHING, Draft, StepEvent
from ..defaults import DEFAULT_BUDGET
from .spec import DrafterOptions, DrafterSpec, draft_length
from .target import TargetInfo
from .token_ids import check_token_ids

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np


class PromptLookupDrafter:
    name = "pld"
    needs = NOTHING

    def __init__(self, max_ngram: int = DrafterOptions.pld_max_ngram, min_ngram: int = DrafterOptions.pld_min_ngram,
                 draft_max: Optional[int] = None, vocab_size: int = 0):
        self.max_ngram = max(1, max_ngram)
        self.min_ngram = max(1, min(min_ngram, self.max_ngram))
        self.draft_max = draft_max if draft_max is not None else DEFAULT_BUDGET
        self.vocab_size = vocab_size  # ids at or above it are refused (0: not known)

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        import numpy as np

        budget = min(budget, self.draft_max)
        if budget <= 0 or len(context) < 2:
            return Draft.empty(self.name)
        tokens = np.asarray(context, dtype=np.int64)  # [n]
        check_token_ids(tokens, self.vocab_size)
        for ngram in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            start = find_latest_match(tokens, ngram)
            if start is not None:
                follow = tokens[start + ngram : start + ngram + budget]
                if len(follow):
                    return Draft(follow.tolist(), self.name, match_len=match_length(tokens, start + ngram))
        return Draft.empty(self.name)

    def observe(self, event: StepEvent) -> None:
        pass

    def reset(self) -> None:
        pass  # it keeps nothing: every draft reads the context it is given


def find_latest_match(tokens: np.ndarray, ngram: int) -> Optional[int]:
    """Start of the latest earlier occurrence of tokens[-ngram:] (not the suffix itself), or None."""
    import numpy as np

    pattern = tokens[-ngram:]
    # candidate starts 0 .. len-ngram-1: windows that end before the suffix's own position
    candidates = len(tokens) - ngram
    if candidates <= 0:
        return None
    hits = tokens[:candidates] == pattern[0]  # [candidates]
    for offset in range(1, ngram):
        hits &= tokens[offset : candidates + offset] == pattern[offset]
    found = np.flatnonzero(hits)
    return int(found[-1]) if len(found) else None


def match_length(tokens: np.ndarray, end: int, longest: int = 64) -> int:
    """How many tokens before `end` equal the context's last tokens (the match behind a draft), up to longest."""
    length = 0
    while length < longest and end - length - 1 >= 0 and tokens[end - length - 1] == tokens[len(tokens) - length - 1]:
        length += 1
    return length


def make_pld_drafter(options: DrafterOptions, target: TargetInfo,
                     draft_max: Optional[int] = None) -> PromptLookupDrafter:
    return PromptLookupDrafter(max_ngram=options.pld_max_ngram, min_ngram=options.pld_min_ngram,
                               draft_max=draft_length(draft_max), vocab_size=target.vocab_size)


SPEC = DrafterSpec(name="pld", help="prompt lookup: continue the longest recent n-gram match in the context",
                   build=make_pld_drafter, options=("pld_max_ngram", "pld_min_ngram"), aux_rank=5)
