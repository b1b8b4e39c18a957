"""Prompt lookup's n-gram table (drafters/pld.py) against the scan it replaced, on random growing contexts."""

from __future__ import annotations

import random

import numpy as np

from specdec_cli.drafters.pld import PromptLookupDrafter, find_latest_match, match_length


def _scanned(context: list[int], budget: int, max_ngram: int, min_ngram: int) -> tuple[list[int], int]:
    """What prompt lookup drafts, by scanning the whole context: (tokens, match length)."""
    tokens = np.asarray(context, dtype=np.int64)
    for ngram in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        start = find_latest_match(tokens, ngram)
        if start is not None:
            return tokens[start + ngram : start + ngram + budget].tolist(), match_length(tokens, start + ngram)
    return [], 0


def test_the_table_drafts_what_a_scan_of_the_whole_context_drafts():
    rng = random.Random(0)
    for max_ngram, min_ngram in ((3, 1), (4, 2), (1, 1)):
        drafter = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram, draft_max=6)
        for _ in range(30):  # conversations: each a new context, growing by 1-4 tokens a step (rarely rewritten)
            context = [rng.randrange(6) for _ in range(rng.randrange(1, 8))]
            for _ in range(60):
                budget = rng.randrange(0, 8)
                draft = drafter.propose(context, budget)
                expected, matched = _scanned(context, min(budget, 6), max_ngram, min_ngram) if budget and \
                    len(context) >= 2 else ([], 0)
                assert draft.tokens == expected, (context, budget)
                if expected:
                    assert draft.match_len == matched
                if rng.random() < 0.05:
                    context = context[: rng.randrange(len(context) + 1)]  # a context that does not extend the last
                if rng.random() < 0.5:
                    context.extend(rng.randrange(6) for _ in range(rng.randrange(1, 5)))  # the same list, grown
                else:
                    context = context + [rng.randrange(6) for _ in range(rng.randrange(1, 5))]
