"""One tree from every source (drafters/merge.py), against brute force: the merged trie holds exactly the paths its
sources proposed, each node scored by its best source's path probability, best first with parents before children;
what the merger learns from verified steps reorders the next tree; and the planner's prefix choice for drafts that
carry confidence (planner.choose_prefix, ConfidenceCalibration).
"""

from __future__ import annotations

import random

import pytest

from specdec_cli.decoding.draft import Draft, StepEvent
from specdec_cli.decoding.planner import ConfidenceCalibration, choose_prefix
from specdec_cli.drafters.merge import DraftMerger, OriginAcceptance, fills_budget, merge_drafts, node_origins


def _random_draft(rng: random.Random, source: str) -> Draft:
    size = rng.randint(0, 7)
    tokens = [rng.randint(0, 3) for _ in range(size)]
    if rng.random() < 0.5:
        return Draft(tokens, source, match_len=rng.randint(0, 9))
    parents: list[int] = []
    for node in range(size):
        parents.append(rng.randint(-1, node - 1))
    # siblings with one token would make a source propose one path twice: keep the first
    seen, keep = set(), []
    for node, (token, parent) in enumerate(zip(tokens, parents)):
        if (parent, token) in seen or (parent >= 0 and parent not in keep):
            continue
        seen.add((parent, token))
        keep.append(node)
    index = {node: position for position, node in enumerate(keep)}
    return Draft([tokens[node] for node in keep], source,
                 parents=[-1 if parents[node] < 0 else index[parents[node]] for node in keep])


def _paths(draft: Draft) -> list[tuple[int, ...]]:
    parents = draft.parents if draft.parents is not None else list(range(-1, len(draft) - 1))
    paths: list[tuple[int, ...]] = []
    for node, parent in enumerate(parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (draft.tokens[node],))
    return paths


def _learned(rng: random.Random) -> OriginAcceptance:
    learned = OriginAcceptance()
    for source in ("a", "b", "c"):
        for bucket in range(7):
            for depth in range(1, 13):
                for rank in range(4):
                    if rng.random() < 0.5:
                        learned.seen[(source, bucket, depth, rank)] = seen = rng.uniform(0, 10)
                        learned.kept[(source, bucket, depth, rank)] = rng.uniform(0, seen)
    return learned


@pytest.mark.parametrize("seed", range(5))
def test_the_merged_trie_is_every_source_path_scored_by_its_best_source(seed):
    rng = random.Random(seed)
    for _ in range(200):
        drafts = [_random_draft(rng, source) for source in ("a", "b", "c")[: rng.randint(1, 3)]]
        learned = _learned(rng)
        budget = rng.randint(0, 25)
        merged = merge_drafts(drafts, learned, budget).draft
        # brute force: every proposed path, scored as the best source's product of conditionals along it
        best: dict[tuple[int, ...], float] = {}
        for draft in drafts:
            conditional = [learned.conditional(origin) for origin in node_origins(draft)]
            parents = draft.parents if draft.parents is not None else list(range(-1, len(draft) - 1))
            score: list[float] = []
            for node, path in enumerate(_paths(draft)):
                score.append((score[parents[node]] if parents[node] >= 0 else 1.0) * conditional[node])
                best[path] = max(best.get(path, 0.0), score[node])
        paths = _paths(merged)
        assert len(merged) == min(budget, len(best))
        assert len(set(paths)) == len(paths)  # one node per path
        assert all(parent < node for node, parent in enumerate(merged.parents or range(-1, len(merged) - 1)))
        assert merged.confidence == pytest.approx([best[path] for path in paths])
        assert all(a >= b for a, b in zip(merged.confidence, merged.confidence[1:]))  # best first
        left_out = [value for path, value in best.items() if path not in set(paths)]
        assert not left_out or not paths or max(left_out) <= min(merged.confidence)  # the kept are the best


@pytest.mark.parametrize("seed", range(3))
def test_an_auxiliary_is_skipped_only_when_its_nodes_could_not_be_kept(seed):
    """fills_budget against brute force: whenever it says the own draft fills the budget, merging any draft of the
    auxiliary's source keeps exactly the own draft's nodes; and it does say so for a confident own draft."""
    rng = random.Random(seed)
    said = 0
    for _ in range(400):
        learned = _learned(rng)
        own, budget = _random_draft(rng, "a"), rng.randint(1, 8)
        if not fills_budget(own, ["b"], learned, budget):
            continue
        said += 1
        alone = set(_paths(merge_drafts([own], learned, budget).draft))
        for _ in range(10):
            merged = merge_drafts([own, _random_draft(rng, "b")], learned, budget).draft
            assert set(_paths(merged)) == alone
    assert said > 0
    sure = OriginAcceptance(seen={("a", 6, 1, 0): 100.0}, kept={("a", 6, 1, 0): 100.0})  # a long match: ~0.99
    for depth in range(2, 5):
        sure.seen[("a", 6, depth, 0)] = sure.kept[("a", 6, depth, 0)] = 100.0
    long_match = Draft([1, 2, 3, 4], "a", match_len=40)
    assert fills_budget(long_match, ["b"], sure, 4) and not fills_budget(long_match, ["b"], sure, 5)
    assert not fills_budget(long_match, [], sure, 4)  # no auxiliary draft seen yet: ask it
    merger = DraftMerger()
    assert merger.needs_aux(long_match, 4)
    merger.merge([long_match, Draft([9], "b")], 4)
    merger.learned = sure
    assert not merger.needs_aux(long_match, 4)


def _step(draft: Draft, accepted_path: list[int]) -> StepEvent:
    return StepEvent(kind="step", draft=draft, committed=[], accepted_path=accepted_path)


def test_what_a_source_earns_reorders_the_next_tree():
    merger = DraftMerger()
    chain = Draft([1, 2, 3], "sam-dynamic", match_len=1)
    guess = Draft([7, 8], "recycle", parents=[-1, 0])
    first = merger.merge([chain, guess], 8)
    assert first.tokens[0] == 1  # equal priors: the first listed wins the tie
    for _ in range(20):  # the target keeps taking recycle's guess, never the one-token match's
        draft = merger.merge([chain, guess], 8)
        merger.observe(_step(draft, [draft.tokens.index(7), draft.tokens.index(8)]))
    after = merger.merge([chain, guess], 8)
    assert after.tokens[:2] == [7, 8] and after.source == "sam-dynamic+recycle"
    assert after.confidence[0] > 0.9 and after.confidence[after.tokens.index(1)] < 0.1
    merger.observe(_step(trimmed := Draft(after.tokens[:1], after.source, parents=[-1]), [0]))
    assert trimmed.tokens == [7]  # a verified prefix is learned from as well (it names the same nodes)


def test_a_step_that_verified_something_else_teaches_nothing():
    merger = DraftMerger()
    merger.merge([Draft([1, 2], "a")], 8)
    before = dict(merger.learned.seen)
    merger.observe(_step(Draft([5], "a"), [0]))
    assert merger.learned.seen == before


def test_choose_prefix_against_brute_force():
    rng = random.Random(3)
    for _ in range(300):
        confidence = sorted((rng.random() for _ in range(rng.randint(0, 10))), reverse=True)
        costs = [0.0] + [rng.uniform(1.0, 3.0) for _ in range(12)]
        longest = rng.randint(0, 10)
        cost = costs.__getitem__  # cost(rows) = costs[rows]
        rates = {nodes: (1 + sum(confidence[:nodes])) / cost(nodes + 1)
                 for nodes in range(0, min(longest, len(confidence)) + 1)}
        chosen = choose_prefix(confidence, cost, longest)
        assert rates[chosen] == pytest.approx(max(rates.values()))


def test_calibration_scales_estimates_by_what_they_delivered():
    calibration = ConfidenceCalibration()
    assert calibration.calibrated("m", [0.8, 0.4]) == [0.8, 0.4]  # no evidence: as given
    for _ in range(50):
        calibration.record("m", [0.8, 0.4], 0)  # promised 1.2 a step, delivered nothing
    assert all(value < 0.1 for value in calibration.calibrated("m", [0.8, 0.4]))
    for _ in range(200):
        calibration.record("m", [0.5], 1)  # promised half, delivered one
    assert calibration.calibrated("m", [0.5, 0.9]) == [pytest.approx(min(1.0, 0.5 * calibration.scale("m"))), 1.0]


def test_a_depth_without_evidence_is_presumed_to_fare_as_its_source_did():
    """The deep end of a long match, never verified yet, takes the acceptance its source and match bucket earned at
    the depths that were: it is not ranked out for want of evidence."""
    learned = OriginAcceptance()
    for _ in range(30):
        learned.record([(("sam-dynamic", 6, depth, 0), True) for depth in (1, 2, 3)])
        learned.record([(("sam-dynamic", 1, 1, 0), False)])
    assert learned.conditional(("sam-dynamic", 6, 9, 0)) > 0.85  # deep, long match: as its first three did
    assert learned.conditional(("sam-dynamic", 1, 4, 0)) < 0.2  # a one-token match's deeper nodes: as it did
    assert learned.conditional(("recycle", 0, 1, 0)) == 0.5  # nothing known: the prior


def _gated_steps(merger: DraftMerger, steps: int, *, aux_seconds: float, keeps_aux: bool) -> list[bool]:
    """Steps of a hybrid: the own chain [1, 2] always, the auxiliary's [7] when `aux_pays` says to ask it; the
    target keeps the first own token, and the auxiliary's when `keeps_aux`; a verify forward takes 0.01 s."""
    asked = []
    for _ in range(steps):
        ask = merger.aux_pays()
        asked.append(ask)
        drafts = [Draft([1, 2], "own", match_len=1)]
        if ask:
            drafts.append(Draft([7], "aux"))
            merger.timed_aux(aux_seconds)
        draft = merger.merge(drafts, 8)
        kept = [draft.tokens.index(7)] if ask and keeps_aux else [draft.tokens.index(1)]
        merger.observe(StepEvent(kind="step", draft=draft, committed=[0, 0], accepted_path=kept,
                                 verify_seconds=0.01))
    return asked


def test_a_costly_auxiliary_is_asked_only_while_it_pays():
    """An auxiliary that adds nothing the target keeps, at a third of a step's time, is asked during the warm-up
    and then once in PROBE_EVERY steps; one whose guesses are kept is asked every step at the same cost; one that
    costs next to nothing is always asked; and with the gate off every step asks."""
    from specdec_cli.decoding.ask_gate import PROBE_EVERY, WARMUP_ASKS

    useless = _gated_steps(DraftMerger(), 200, aux_seconds=0.005, keeps_aux=False)
    assert all(useless[:WARMUP_ASKS]) and not any(useless[WARMUP_ASKS : WARMUP_ASKS + PROBE_EVERY - 1])
    assert sum(useless[WARMUP_ASKS:]) == pytest.approx((200 - WARMUP_ASKS) / PROBE_EVERY, abs=1)
    assert all(_gated_steps(DraftMerger(), 200, aux_seconds=0.005, keeps_aux=True))
    assert all(_gated_steps(DraftMerger(), 200, aux_seconds=0.00001, keeps_aux=False))
    assert all(_gated_steps(DraftMerger(cost_gate=False), 200, aux_seconds=0.005, keeps_aux=False))
    merger = DraftMerger()
    _gated_steps(merger, 40, aux_seconds=0.005, keeps_aux=True)
    assert merger.gate.gain == pytest.approx(1.0) and merger.gate.step_tokens == pytest.approx(2.0)
    assert merger.gate.step_seconds == pytest.approx(0.01) and merger.gate.ask_seconds == pytest.approx(0.005)
