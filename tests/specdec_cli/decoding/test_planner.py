"""Cost-aware planning: the arithmetic, the learned curve and the safety net, without a model or a clock."""

from __future__ import annotations

import pytest

from specdec_cli.decoding.cost_curve import CostCurve, measure_cost_curve
from specdec_cli.decoding.draft import Draft
from specdec_cli.decoding.planner import (
    COST_PROBE_EVERY,
    PROBE_EVERY,
    AcceptanceTracker,
    DraftPlanner,
    Plan,
    choose_length,
    expected_tokens,
)

# Measured on an AMD EPYC in float32 (issue 11): slowest at 2-3 rows, cheaper again from 4 rows on.
EPYC_FLOAT32 = {1: 41.8, 2: 66.1, 3: 79.8, 4: 64.9, 6: 61.7, 8: 60.8, 12: 68.5, 16: 74.0, 24: 87.2, 32: 99.3}


def test_expected_tokens_matches_closed_form():
    accept = 0.6
    for length in range(6):
        closed = (1 - accept ** (length + 1)) / (1 - accept)  # docs/methods.md section 1
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


def test_cost_curve_keeps_its_real_shape():
    curve = CostCurve({1: 10.0, 4: 40.0, 8: 30.0})
    assert curve(2) == pytest.approx(20.0)
    assert curve(8) == 30.0  # no smoothing: 8 rows may really cost less than 4
    assert curve(6) == pytest.approx(35.0)
    assert curve(16) == 30.0  # past the last size: its slope, never below it


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
    from specdec_cli.decoding.planner import tree_sizes

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
    from specdec_cli.decoding.planner import DraftCosts

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


def test_verifying_at_least_n_rows_costs_the_cheapest_bigger_forward():
    curve = CostCurve(EPYC_FLOAT32)
    assert curve.cheapest_at_least(3, 9) == 6  # 6 rows (61.7 ms) beat 3 (79.8 ms); 8 (60.8) is not 2% cheaper
    assert curve.cheapest_at_least(2, 9) == 6
    assert curve.cheapest_at_least(5, 9) == 6 and curve.cheapest_at_least(7, 9) == 7  # 8 is < 2% cheaper
    assert curve.cheapest_at_least(1, 9) == 1  # a plain step stays a plain step
    assert curve.cheapest_at_least(3, 3) == 3  # never past the allowed size
    envelope = curve.envelope(9)
    assert envelope(3) == pytest.approx(61.7) and envelope(9) == pytest.approx(curve(9))
    # at a coin-flip acceptance, 7 of 8 drafted tokens are verified in one 8-row forward, where the smoothed
    # curve of 0.1.0 (t(n >= 3) = t(3)) verified nothing
    assert choose_length([0.5] * 8, envelope, 8) == 7
    # at 35% (prompt lookup on chat), the real curve still drafts; 0.1.0's running maximum did not
    smoothed = CostCurve({size: max(ms for rows, ms in EPYC_FLOAT32.items() if rows <= size) for size in EPYC_FLOAT32})
    assert choose_length([0.35] * 8, envelope, 8) > 0
    assert choose_length([0.35] * 8, smoothed, 8) == 0


def _chain(tokens: int, source: str = "pld") -> Draft:
    return Draft(list(range(tokens)), source, match_len=3)


def _simulate(planner: DraftPlanner, true_ms: dict, steps: int, draft_tokens: int = 8, budget: int = 8,
              accepted_of=lambda keep: keep // 2) -> list[Plan]:
    """Run the planner against a machine whose forwards cost exactly `true_ms` (interpolated)."""
    truth = CostCurve.fixed(true_ms)
    plans = []
    for _ in range(steps):
        draft = _chain(draft_tokens)
        plan = planner.plan(draft, budget)
        kept = Draft(draft.tokens[: plan.keep], draft.source,
                     match_len=draft.match_len) if plan.keep else Draft.empty("pld")
        accepted = accepted_of(plan.keep)
        planner.record(kept, accepted, accepted + 1, plan.rows, truth(plan.rows), 0.0)
        plans.append(plan)
    return plans


def test_padding_fills_a_short_draft_up_to_a_cheaper_forward():
    planner = DraftPlanner(CostCurve.fixed(EPYC_FLOAT32))
    plan = planner.plan(_chain(2), 8)
    assert plan.rows == 6 and plan.keep == 2  # 2 drafted tokens verified in 6 rows: cheaper than 3 rows
    # an 8-token draft at a coin-flip acceptance: 7 tokens in 8 rows (60.8 ms), not cut to the 3-row price
    assert planner.plan(_chain(8), 8) == Plan(7, 8)


def test_a_far_too_pessimistic_stored_curve_is_corrected_within_bounded_steps():
    """The 0.1.0 failure: a stored curve that makes every draft look 2-10x too expensive never drafted again."""
    pessimistic = {size: (ms if size == 1 else ms * 10) for size, ms in EPYC_FLOAT32.items()}
    planner = DraftPlanner(CostCurve(pessimistic))
    plans = _simulate(planner, EPYC_FLOAT32, steps=100)
    assert all(plan.keep == 0 for plan in plans[: COST_PROBE_EVERY - 1])  # at first it believes the prior
    # stale sizes are probed one by one (every COST_PROBE_EVERY steps): within 6 probes every size up to the
    # budget has been timed, and from then on it drafts every step
    settled = 6 * COST_PROBE_EVERY
    assert all(plan.keep > 0 for plan in plans[settled:])
    assert planner.curve(8) == pytest.approx(EPYC_FLOAT32[8])


def test_a_far_too_optimistic_stored_curve_is_corrected_by_the_steps_it_causes():
    """A curve claiming drafts are free makes junk drafts verified; their real cost shows at once."""
    optimistic = {size: 1.0 for size in EPYC_FLOAT32}
    planner = DraftPlanner(CostCurve(optimistic))
    plans = _simulate(planner, EPYC_FLOAT32, steps=200, accepted_of=lambda keep: 0)  # every draft is wrong
    assert plans[0].keep > 0
    late = plans[100:]
    assert sum(plan.keep > 0 for plan in late) <= len(late) // 4  # only probes remain
    assert planner.curve(9) > 50.0


def test_the_curve_estimate_is_the_lower_quartile_of_recent_steps():
    curve = CostCurve({1: 10.0, 4: 20.0})
    for seconds in (12.0, 11.0, 90.0, 11.5, 12.5, 95.0, 11.2, 12.2):  # two noisy spikes
        curve.observe(4, seconds)
    assert curve(4) == pytest.approx(11.2)  # the prior aged out, the spikes ignored
    fixed = CostCurve.fixed({1: 10.0, 4: 20.0})
    fixed.observe(4, 1.0)
    assert fixed(4) == 20.0


def test_a_source_slower_than_plain_decoding_is_benched_and_probed():
    """The acceptance model can be fooled (here: every draft is accepted but costs 3x a plain step to make);
    the realised tokens per second of its steps cannot."""
    flat = {1: 10.0, 32: 10.0}
    planner = DraftPlanner(CostCurve.fixed(flat))
    planner.draft_costs.per_token.clear()
    held = 0
    for _ in range(64):
        draft = _chain(1)
        plan = planner.plan(draft, 8)
        if plan.keep == 0:
            held += 1
            planner.record(Draft.empty("pld"), 0, 1, 1, 10.0, 0.0)
        else:  # 2 tokens per step, but drafting took 30 s of modelled... measured time
            planner.rates.record("pld", 2, 40.0)  # what a learning curve would see: 20 s per token
            planner.record(Draft(draft.tokens[: plan.keep], "pld", match_len=3), 1, 2, plan.rows, 10.0, 30.0)
    assert held >= 40  # benched: 0.05 tokens/s per step second vs plain 0.1
    assert held < 64  # but probed now and then
    assert PROBE_EVERY <= 64


def test_cost_curve_survives_a_round_trip_and_refuses_old_formats():
    curve = CostCurve(EPYC_FLOAT32, origin="measured")
    curve.observe(3, 70.0)
    again = CostCurve.from_json(curve.as_json())
    assert again.seconds == pytest.approx(curve.seconds) and again.origin == "cache"
    with pytest.raises(ValueError):
        CostCurve.from_json({"seconds": {"1": 0.04}})  # 0.1.0's smoothed cache
    with pytest.raises(ValueError):
        CostCurve({1: 0.0})


def test_measurement_warms_every_size_interleaves_rounds_and_keeps_the_minimum():
    calls: list[int] = []
    seen: dict[int, int] = {}

    def forward(rows: int) -> float:
        calls.append(rows)
        seen[rows] = seen.get(rows, 0) + 1
        first = seen[rows] == 1
        return 100.0 if first else rows * (1.0 + 0.1 * (seen[rows] % 2))  # a cold first call, then noise

    curve = measure_cost_curve(forward, sizes=(1, 2, 4), budget_seconds=0.0)
    assert calls[:3] == [1, 2, 4]  # the warm-up pass
    assert calls[3:6] == [1, 2, 4] and calls[6:9] == [2, 4, 1]  # rounds in rotated order
    assert curve.seconds == pytest.approx({1: 1.0, 2: 2.0, 4: 4.0})  # the minimum, cold calls excluded
    assert curve.origin == "measured"


# -- deciding before drafting: the one place that stops drafting when it does not pay --------------------------


STEEP = {1: 1.0, 2: 1.6, 4: 3.0, 8: 6.0}  # verifying costs nearly a forward per row: only sure drafts pay


def _answer(planner, source, drafted, accepted, budget=8):
    """One engine step for a drafter of `source` (no match length): ask, draft `drafted` of it, plan, record."""
    asked = planner.draft_budget(source, budget)
    draft = Draft([5] * min(asked, drafted), source)
    plan = planner.plan(draft, budget)
    kept = Draft(draft.tokens[: plan.keep], source)
    planner.record(kept, min(accepted, plan.keep), min(accepted, plan.keep) + 1, plan.rows, 1.0, 0.0)
    return asked, plan.keep


def test_a_drafter_is_asked_for_nothing_once_its_drafts_do_not_pay_and_probed_now_and_then():
    planner = DraftPlanner(CostCurve.fixed(STEEP))
    assert planner.draft_budget("model", 8) == 8  # no record yet (and no curve asked for): the whole budget
    answers = [_answer(planner, "model", 8, 0) for _ in range(6 * PROBE_EVERY)]
    asked = [count for count, _ in answers[PROBE_EVERY:]]
    assert asked.count(0) > len(asked) * 3 // 4  # no drafting at all on most steps
    probes = [index for index, (count, kept) in enumerate(answers) if count and kept]
    assert probes and all(answers[index][1] <= answers[index][0] for index in probes)  # a probe is verified whole
    later = [_answer(planner, "model", 8, 8) for _ in range(20 * PROBE_EVERY)]  # the drafts turn right
    assert any(asked and kept for asked, kept in later)  # probes still go out, and are verified


def test_what_is_asked_for_is_what_plan_keeps():
    """Decided once: the draft of the asked length is kept whole, never re-decided (nor counted idle twice)."""
    planner = DraftPlanner(CostCurve.fixed({1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8}))
    _answer(planner, "model", 8, 3)  # the first draft: no record yet, planned after drafting
    for _ in range(40):
        asked, kept = _answer(planner, "model", 8, 3)
        assert kept == asked
    assert 0 < asked < 8  # three of every draft accepted: about that many are worth drafting


def test_drafters_without_a_fixed_key_are_asked_for_the_whole_budget():
    """Retrieval drafts carry a match length and hybrids name other sources: planned after drafting, as before."""
    planner = DraftPlanner(CostCurve.fixed(STEEP))
    for _ in range(50):
        plan = planner.plan(Draft([5] * 8, "pld", match_len=3), 8)
        planner.record(Draft([5] * plan.keep, "pld", match_len=3), 0, 1, plan.rows, 1.0, 0.0)
        plan = planner.plan(Draft([5] * 8, "sam-dynamic", match_len=2), 8)
        planner.record(Draft([5] * plan.keep, "sam-dynamic", match_len=2), 0, 1, plan.rows, 1.0, 0.0)
    assert planner.draft_budget("pld", 8) == 8 and planner.draft_budget("sam", 8) == 8


def test_a_costly_drafter_is_asked_for_shorter_chains():
    cheap, costly = (DraftPlanner(CostCurve.fixed({1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8})) for _ in range(2))
    costly.observe_drafting("model", 4, 1.2)  # 0.3 s a drafted token: a third of a forward
    for planner in (cheap, costly):
        for _ in range(40):
            _answer(planner, "model", 8, 6)
    assert costly.draft_budget("model", 8) < cheap.draft_budget("model", 8)


def test_a_benched_source_is_not_even_asked_to_draft_but_for_its_probes():
    """A head whose verified steps run slower than plain decoding (its confident drafts are right, but drafting
    them costs three steps) loses most on drafting itself: once benched, `draft_budget` asks it for nothing, and
    a probe's draft is verified, not held back a second time by `plan`."""
    planner = DraftPlanner(CostCurve.fixed({1: 10.0, 32: 10.0}))
    for _ in range(8):  # plain steps beside the head's slow ones: 2 tokens in 40 s against 1 in 10
        planner.record(Draft.empty("eagle"), 0, 1, 1, 10.0, 0.0)
        planner.rates.record("eagle", 2, 40.0)
    asked = []
    for _ in range(4 * PROBE_EVERY):
        budget = planner.draft_budget("eagle", 8)
        asked.append(budget)
        draft = Draft([5] * budget, "eagle", confidence=[0.95] * budget) if budget else Draft.empty("eagle")
        plan = planner.plan(draft, 8)
        if budget:
            assert plan.keep > 0  # the probe is verified
            planner.learn(Draft(draft.tokens[: plan.keep], "eagle", confidence=[0.95] * plan.keep), plan.keep)
            planner.rates.record("eagle", 2, 40.0)  # and is slow again
        else:
            planner.record(Draft.empty("eagle"), 0, 1, 1, 10.0, 0.0)
    assert asked.count(0) >= 3 * PROBE_EVERY  # no head forward on most steps
    assert 2 <= sum(1 for budget in asked if budget) <= 6  # a probe every PROBE_EVERY steps


def _head_steps(planner, steps: int, accepted: int, draft_seconds: float = 0.002, sure: float = 0.9) -> list[int]:
    """Steps of a lone head (drafts with confidence) on a 10 ms step: ask, draft (timed), plan, record."""
    asked = []
    for _ in range(steps):
        budget = planner.draft_budget("eagle", 4)
        asked.append(budget)
        draft = Draft([5] * budget, "eagle", confidence=[sure] * budget) if budget else Draft.empty("eagle")
        if budget:
            planner.observe_drafting("eagle", budget, draft_seconds)
        plan = planner.plan(draft, 4)
        kept = Draft(draft.tokens[: plan.keep], "eagle", confidence=[sure] * plan.keep) if plan.keep else \
            Draft.empty("eagle")
        got = min(accepted, plan.keep)
        planner.record(kept, got, got + 1, plan.rows, 0.010, draft_seconds if budget else 0.0)
    return asked


def test_a_lone_head_is_asked_only_while_its_accepted_tokens_pay_for_its_forwards():
    """A head whose forwards cost a sixth of a step and whose drafts the target never follows is asked at first,
    then now and then; one whose first token is kept is asked every step (ask_gate.py)."""
    curve = {1: 0.010, 2: 0.010, 4: 0.010, 8: 0.010}  # a learning curve (a fixed one asks always)
    useless = _head_steps(DraftPlanner(CostCurve(curve)), 200, accepted=0)
    assert useless[0]  # (then benched, its steps being slower than plain ones, or gated: asked now and then)
    assert sum(1 for budget in useless if budget) <= 2 * 200 // PROBE_EVERY
    assert all(_head_steps(DraftPlanner(CostCurve(curve)), 200, accepted=1))
    assert all(_head_steps(DraftPlanner(CostCurve(curve)), 200, accepted=0, draft_seconds=0.0001))  # cheap
    unsure = _head_steps(DraftPlanner(CostCurve(curve)), 200, accepted=0, sure=0.01)  # never verified: drafting
    assert sum(1 for budget in unsure if budget) <= 3 * 200 // PROBE_EVERY  # is all it costs, and is stopped
    assert all(_head_steps(DraftPlanner(CostCurve.fixed(curve)), 200, accepted=0))
