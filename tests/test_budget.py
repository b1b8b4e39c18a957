"""Cost-aware draft length: the arithmetic, without a model."""

from __future__ import annotations

import pytest

from specdec_cli.budget import AcceptanceTracker, CostCurve, choose_length, expected_tokens


def test_expected_tokens_matches_closed_form():
    accept = 0.6
    for length in range(6):
        closed = (1 - accept ** (length + 1)) / (1 - accept)  # algorithms.md section 1
        assert expected_tokens([accept] * length, length) == pytest.approx(closed)


def test_flat_cost_drafts_everything_steep_cost_drafts_nothing():
    flat = CostCurve({1: 1.0, 32: 1.0})
    assert choose_length([0.3] * 8, flat, 8) == 8
    steep = CostCurve({1: 1.0, 2: 2.0, 32: 32.0})
    assert choose_length([0.9] * 8, steep, 8) == 0


def test_cpu_like_curve_prefers_short_drafts_at_low_acceptance():
    cpu = CostCurve({1: 37.0, 2: 39.0, 3: 41.0, 4: 55.0, 8: 66.0, 16: 72.0})
    assert choose_length([0.02] * 8, cpu, 8) == 0
    assert 1 <= choose_length([0.5] * 8, cpu, 8) <= 3
    assert choose_length([0.95] * 15, cpu, 15) == 15


def test_cost_curve_interpolates_and_stays_monotone():
    curve = CostCurve({1: 10.0, 4: 40.0, 8: 30.0})
    assert curve(2) == pytest.approx(20.0)
    assert curve(8) == 40.0  # noise smoothed: more tokens never cost less
    assert curve(16) >= curve(8)


def test_tracker_counts_positions_conditionally():
    tracker = AcceptanceTracker()
    key = tracker.key("pld", 3)
    for _ in range(50):
        tracker.record(key, drafted=4, accepted=1)  # position 1 accepted, position 2 rejected, 3-4 never reached
    rates = tracker.conditional(key, 4)
    assert rates[0] > 0.9 and rates[1] < 0.1
    assert rates[2] == pytest.approx(0.5) and rates[3] == pytest.approx(0.5)  # untried: the prior


def test_tracker_probes_a_useless_source_now_and_then():
    tracker = AcceptanceTracker()
    key = tracker.key("junk", 0)
    for _ in range(60):
        tracker.record(key, drafted=1, accepted=0)
    steep = CostCurve({1: 1.0, 2: 1.5, 32: 20.0})
    plans = [tracker.plan(key, steep, 8) for _ in range(32)]
    assert plans.count(0) >= 28 and 1 in plans


def test_tree_plan_learns_which_size_pays():
    from specdec_cli.budget import tree_sizes

    assert tree_sizes(20) == [1, 2, 4, 8, 16, 20] and tree_sizes(1) == [1]
    cpu = CostCurve({1: 37.0, 2: 39.0, 3: 41.0, 4: 55.0, 8: 66.0, 16: 72.0, 32: 90.0, 64: 120.0})
    tracker = AcceptanceTracker()
    for _ in range(80):  # small trees usually get one token, big ones barely more
        tracker.record_tree("recycle", 1, 1)
        tracker.record_tree("recycle", 2, 1)
        tracker.record_tree("recycle", 64, 1)
    assert tracker.plan_tree("recycle", cpu, 64) in (1, 2)
    junk = AcceptanceTracker()
    for nodes in (1, 2, 4, 8, 16, 32, 64):
        for _ in range(80):
            junk.record_tree("junk", nodes, 0)
    assert junk.plan_tree("junk", cpu, 64) == 0


def test_draft_costs_charge_drafted_tokens_to_their_source():
    from specdec_cli.budget import DraftCosts

    costs = DraftCosts()
    curve = CostCurve({1: 0.040, 2: 0.044, 8: 0.060})
    assert costs.charged(curve, "model")(3) == pytest.approx(curve(3))  # nothing observed: verify cost only
    costs.observe("model", 4, 0.024)  # 6 ms per drafted token
    costs.observe("pld", 8, 0.0)
    assert costs.charged(curve, "model")(1) == pytest.approx(0.040)  # verifying no draft costs no drafting
    assert costs.charged(curve, "model")(3) == pytest.approx(curve(3) + 2 * 0.006)
    assert costs.charged(curve, "pld")(3) == pytest.approx(curve(3))
    costs.observe("model", 1, 0.001)
    assert costs.per_token["model"] == pytest.approx(0.8 * 0.006 + 0.2 * 0.001)
    # with 6 ms per drafted token, a 20%-accepted first token no longer pays; a free one does
    assert choose_length([0.2], costs.charged(curve, "model"), 1) == 0
    assert choose_length([0.2], costs.charged(curve, "pld"), 1) == 1
