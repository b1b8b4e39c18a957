"""Prompt lookup decoding (`pld`): continue the most recent earlier occurrence of the context's last n-gram.

For n from `max_ngram` down to `min_ngram`, find the latest earlier position where the last n tokens of the
context occurred, and propose the tokens that followed there. A table of each n-gram's latest end, kept in step
with the context it was last given (extended by the new tokens only; built again for a context that does not
extend it), answers in microseconds where a scan of the whole context cost ~0.13 ms a step (3% of a default-model
step, paid on every step). `find_latest_match` is the scan, kept as the reference the table is tested against.
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
        self._indexed: list[int] = []  # the context the table holds
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest occurrence before the last token
        self._source: Optional[Sequence[int]] = None  # the sequence last indexed (the engine's grows in place)

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        budget = min(budget, self.draft_max)
        if budget <= 0 or len(context) < 2:
            return Draft.empty(self.name)
        self._catch_up(context)
        for ngram in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            end = self._latest.get(tuple(context[-ngram:]))  # (ends before the context's last token: an earlier one)
            if end is not None:
                follow = [int(token) for token in context[end : end + budget]]
                return Draft(follow, self.name, match_len=match_length(context, end))
        return Draft.empty(self.name)

    def _catch_up(self, context: Sequence[int]) -> None:
        """Index every n-gram of `context` ending before its last token: only the new ones where `context` extends
        the context indexed last, else all of them (a new conversation)."""
        known = len(self._indexed)
        if known > len(context) or (context is self._source and known and context[known - 1] != self._indexed[-1]) \
                or (context is not self._source and list(context[:known]) != self._indexed):
            known = 0  # (the engine's context, one list that only grows, is compared whole once)
        check_token_ids(context[known:], self.vocab_size)  # (before the table changes: a refused one leaves it be)
        if known == 0:
            self._indexed, self._latest = [], {}
        self._source = context
        self._indexed.extend(int(token) for token in context[known:])
        indexed, latest = self._indexed, self._latest
        for end in range(max(known, self.min_ngram), len(indexed)):  # ends before the last token's: [n, len - 1]
            for ngram in range(self.min_ngram, min(self.max_ngram, end) + 1):
                latest[tuple(indexed[end - ngram : end])] = end

    def observe(self, event: StepEvent) -> None:
        pass  # the table follows the context each draft is given

    def reset(self) -> None:
        self._indexed, self._latest, self._source = [], {}, None


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


def match_length(tokens: Sequence[int], end: int, longest: int = 64) -> int:
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
