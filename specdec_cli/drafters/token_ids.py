"""Token ids checked where they enter a drafter, the one thing every drafter shares. It holds no base class: the
protocol itself is `Drafter` in decoding/draft.py, typed and nothing else:

`propose(context, budget)` returns a `Draft` of at most `budget` tokens (nodes) to follow `context`, the
whole committed token sequence (prompt and generated tokens). `observe(event)` is told every engine event,
the prefill included, so stateful drafters (automata, n-gram tables, draft-model caches) stay in step with
the committed text; `reset()` forgets the conversation. `needs` (a `Needs`) says what a drafter reads from the
events beyond tokens (the target's scored top-k, its hidden states): the engine computes that and nothing
else. Whether drafting pays is the engine's planner's call (`budget` 0: the engine does not even ask); a
drafter drafts what it is asked for. A drafter never calls back into the engine.

Token ids are checked where they enter a drafter (`check_token_ids`): one negative or not below the vocabulary
(when the drafter knows it) is a one-line SpecdecError, never a hang, a wrapped index or a huge allocation. The
engine only ever hands over the target's own ids; the check is for the library API and for engines that can
send anything (vllm/proposer.py leaves such a row undrafted instead).
"""

from __future__ import annotations

from typing import Any

from ..errors import TOKEN_LIMIT, SpecdecError, TokenIdError


def check_token_ids(tokens: Any, vocab_size: int = 0, what: str = "context") -> None:
    """Raise a one-line TokenIdError (a SpecdecError and a ValueError) unless every id in `tokens` (a sequence or
    array of ints, any shape) lies in [0, vocab_size), or in [0, 2**31) when the vocabulary is not known (0). Costs
    one pass in C over `tokens`."""
    import numpy as np  # here: the command line imports this module, and starts without numpy

    if isinstance(tokens, np.ndarray):
        if tokens.size == 0:
            return
        low, high = int(tokens.min()), int(tokens.max())
    else:
        if not len(tokens):
            return
        try:
            low, high = int(min(tokens)), int(max(tokens))
        except TypeError:  # nested (rows of ids) or not numbers
            array = np.asarray(tokens)
            if not np.issubdtype(array.dtype, np.integer):
                raise TokenIdError(f"token ids in the {what} must be integers, got {array.dtype}") from None
            check_token_ids(array, vocab_size, what)
            return
    limit = vocab_size if vocab_size > 0 else TOKEN_LIMIT
    if low < 0:
        raise TokenIdError(f"token id {low} in the {what}: token ids are never negative")
    if high >= limit:
        raise TokenIdError(f"token id {high} in the {what} is outside the vocabulary (ids 0 to {limit - 1})")


def valid_token_ids(tokens: Any, vocab_size: int = 0) -> bool:
    """Whether `check_token_ids` would accept `tokens`."""
    try:
        check_token_ids(tokens, vocab_size)
    except SpecdecError:
        return False
    return True
