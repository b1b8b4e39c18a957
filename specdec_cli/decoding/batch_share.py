"""How many draft tokens each sequence of a batched step verifies (Engine.step_many).

In a batch the sequences' own rows are what makes a forward pay, so drafts get only the rows that keep the forward
within BATCH_DRAFT_COST times the cost of the batch's roots on this machine's verify-cost curve (`batch_share`).
The curve is one sequence's block, though, and a batched step's drafts cost more than their rows: each sequence's
drafting, the attention of its extra rows over its own cache, its acceptance. So the share is also checked against
what the session's batched steps realise (`BatchShares`): per number of sequences, the committed tokens a second of
steps with drafts and of steps without them (decayed means, both measured before either is trusted), and a batch
drafts only while that pays, trying the other way now and then. Answers are the same either way (every draft is
verified); only the speed changes. This file reads timings; it does not time, draft or verify.
"""

from __future__ import annotations

from typing import Callable

BATCH_DRAFT_COST = 1.1  # a batched step's forward may cost this much more than its sequences' roots for drafts
DECAY = 0.9  # each way's realised speed follows its last ~10 steps
MEASURED = 4.0  # steps each way before the faster is chosen
TRY_OTHER_EVERY = 32  # then the slower way is tried again once in this many steps


def batch_share(curve: Callable[[int], float], rows: int, width: int) -> int:
    """Draft tokens each of `width` sequences may verify in one batched step of at most `rows` rows: as many as
    keep the forward within BATCH_DRAFT_COST times the cost of their roots alone on this machine's cost curve."""
    most = rows // width - 1
    limit = curve(width) * BATCH_DRAFT_COST
    fitting = max([size for size in range(width, rows + 1) if curve(size) <= limit], default=width)
    return max(0, min(most, fitting // width - 1))


class BatchShares:
    """Per batch width, the realised speed of batched steps with drafts and without (decayed sums of committed
    tokens and of seconds), and which way the next step goes."""

    def __init__(self) -> None:
        self.tokens: dict[tuple[int, bool], float] = {}
        self.seconds: dict[tuple[int, bool], float] = {}
        self.weight: dict[tuple[int, bool], float] = {}
        self.steps: dict[int, int] = {}

    def choose(self, width: int, share: int) -> int:
        """The share for a step of `width` sequences: `share` (the curve's) or 0, whichever realises more tokens a
        second here; each measured MEASURED steps first, the slower tried again every TRY_OTHER_EVERY steps."""
        if share <= 0:
            return 0
        drafting, plain = self.weight.get((width, True), 0.0), self.weight.get((width, False), 0.0)
        if drafting < MEASURED or plain < MEASURED:
            return share if drafting <= plain else 0  # (both measured, alternately)
        step = self.steps[width] = self.steps.get(width, 0) + 1
        faster = self.rate(width, True) >= self.rate(width, False)
        return share if faster != (step % TRY_OTHER_EVERY == 0) else 0

    def rate(self, width: int, drafted: bool) -> float:
        seconds = self.seconds.get((width, drafted), 0.0)
        return self.tokens.get((width, drafted), 0.0) / seconds if seconds > 0 else 0.0

    def record(self, width: int, drafted: bool, committed: int, seconds: float) -> None:
        """A batched step of `width` sequences (with drafts or without) committed `committed` tokens in `seconds`."""
        key = (width, drafted)
        for table, value in ((self.tokens, float(committed)), (self.seconds, seconds), (self.weight, 1.0)):
            table[key] = table.get(key, 0.0) * DECAY + value
