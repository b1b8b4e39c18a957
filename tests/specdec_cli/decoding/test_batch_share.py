"""How many draft tokens a batched step's sequences verify (decoding/batch_share.py): the curve's share, and only
while the session's batched steps with drafts realise more tokens a second than without them."""

from __future__ import annotations

from specdec_cli.decoding.batch_share import MEASURED, TRY_OTHER_EVERY, BatchShares, batch_share


def test_the_curves_share_keeps_the_forward_within_its_cost():
    flat = lambda rows: 10.0  # noqa: E731 (rows cost nothing: as many as fit)
    steep = lambda rows: 10.0 * rows  # noqa: E731 (every row costs: none)
    assert batch_share(flat, 32, 4) == 7
    assert batch_share(steep, 32, 4) == 0
    assert batch_share(lambda rows: 10.0 if rows <= 8 else 20.0, 32, 4) == 1
    assert batch_share(flat, 3, 4) == 0  # fewer rows than sequences


def _run(shares: BatchShares, steps: int, seconds_with: float, seconds_without: float, width: int = 4) -> list[int]:
    chosen = []
    for _ in range(steps):
        share = shares.choose(width, 2)
        chosen.append(share)
        shares.record(width, share > 0, width, seconds_with if share else seconds_without)  # a token a sequence
    return chosen


def test_drafts_that_cost_more_than_they_commit_stop_and_are_tried_again_now_and_then():
    shares = BatchShares()
    chosen = _run(shares, 200, seconds_with=0.012, seconds_without=0.009)
    assert chosen[:8] == [2, 0] * 4  # each way measured first, alternately (MEASURED steps each)
    later = chosen[4 * int(MEASURED) : 4 * int(MEASURED) + 5 * TRY_OTHER_EVERY]
    assert later.count(2) == 5  # then plain steps, drafts tried once in a while
    assert shares.rate(4, False) > shares.rate(4, True)


def test_drafts_that_pay_are_kept_and_each_width_is_its_own():
    shares = BatchShares()
    chosen = _run(shares, 100, seconds_with=0.008, seconds_without=0.009)
    later = chosen[4 * int(MEASURED) : 4 * int(MEASURED) + 2 * TRY_OTHER_EVERY]
    assert later.count(0) == 2  # drafts, plain steps tried once in a while
    assert shares.choose(3, 2) == 2  # another width starts measuring afresh (drafts first)
    assert shares.choose(4, 0) == 0  # no rows for drafts: nothing to choose
