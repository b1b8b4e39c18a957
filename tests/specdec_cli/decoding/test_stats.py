"""Statistics from step events, and pooling several generations exactly from raw counts."""

from __future__ import annotations

import pytest

from specdec_cli.decoding.draft import Draft, StepEvent
from specdec_cli.decoding.stats import merge, summarize


def _events(plan):
    """A prefill then one step per (drafted, accepted) pair; each step commits accepted + 1 tokens."""
    events = [StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[1],
                        verify_seconds=0.5)]
    for drafted, accepted in plan:
        draft = Draft(list(range(drafted)), "pld" if drafted % 2 else "sam-dynamic")
        events.append(StepEvent(kind="step", draft=draft, accepted_path=list(range(accepted)),
                                committed=[7] * (accepted + 1), draft_seconds=0.01, verify_seconds=0.1))
    return events


def test_merge_equals_summarizing_all_events_together():
    first, second = [(3, 2), (0, 0), (5, 5)], [(2, 0), (4, 1), (1, 1), (0, 0)]
    one = summarize(_events(first), wall_seconds=2.0, ttft_seconds=0.5)
    two = summarize(_events(second), wall_seconds=3.0, ttft_seconds=0.7)
    pooled = merge([one, two])
    together = summarize(_events(first) + _events(second)[1:], wall_seconds=5.0, ttft_seconds=0.6)
    together.new_tokens += 1  # the second generation's prefill token
    for name in ("steps", "drafted_tokens", "accepted_tokens", "committed_in_steps", "position_drafted",
                 "position_accepted", "sources"):
        assert getattr(pooled, name) == getattr(together, name), name
    assert pooled.new_tokens == one.new_tokens + two.new_tokens
    assert pooled.mean_accepted_tokens == pytest.approx(pooled.committed_in_steps / pooled.steps)
    assert pooled.mean_accepted_tokens == pytest.approx((3 + 1 + 6 + 1 + 2 + 2 + 1) / 7)
    assert pooled.acceptance_rate == pytest.approx(9 / 15)
    assert pooled.per_position_acceptance == pytest.approx(
        [a / d for a, d in zip(pooled.position_accepted, pooled.position_drafted)])
    assert pooled.tokens_per_second == pytest.approx(pooled.new_tokens / 5.0)
    assert pooled.ttft_seconds == pytest.approx(0.6)  # a mean, not a sum
    assert merge([]) is None


def test_per_position_acceptance_counts_a_tree_by_its_depth():
    # a tree of 5 nodes, two levels deep: root -> {0, 1, 2}, 0 -> {3}, 1 -> {4}
    tree = Draft([10, 11, 12, 13, 14], "recycle", parents=[-1, -1, -1, 0, 1])
    assert tree.depth == 2 and Draft([1, 2, 3], "pld").depth == 3 and Draft.empty("pld").depth == 0
    events = [StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[1]),
              # the path 1 -> 4: both levels accepted
              StepEvent(kind="step", draft=tree, accepted_path=list(range(2)), committed=[11, 14, 9]),
              StepEvent(kind="step", draft=tree, accepted_path=list(range(1)), committed=[10, 9]),
              StepEvent(kind="step", draft=Draft([5, 6, 7], "pld"), committed=[9])]
    stats = summarize(events, wall_seconds=1.0, ttft_seconds=0.1)
    assert stats.position_drafted == [3, 3, 1]  # depth, not node count: no tree reaches position 3
    assert stats.position_accepted == [2, 1, 0]
    assert stats.drafted_tokens == 13 and stats.accepted_tokens == 3
