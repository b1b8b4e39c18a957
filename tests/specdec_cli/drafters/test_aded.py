"""ADED: the tri-gram table, its adaptation, PUCT selection, the trie merge, drafts' shape, greedy identity."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from conftest import TINY_EOS, CheckedDrafter, check_draft, hf_greedy

from specdec_cli.decoding.draft import Draft, StepEvent
from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.drafters import DrafterOptions, TargetInfo
from specdec_cli.drafters.aded import (
    AdedDrafter,
    TrigramTable,
    best_paths,
    build_trigram_table,
    keep_best,
    make_aded_drafter,
    merge_paths,
    puct_score,
    run_search,
    select_child,
)
from specdec_cli.errors import SpecdecError

PROMPT = [1, 10, 11, 12, 13, 10, 11]
CORPUS = np.array([1, 2, 3, 1, 2, 3, 1, 2, 4, 0, 1, 2, 5], dtype=np.int32)  # EOS 0 separates two documents



def test_table_from_corpus_hand_computed():
    table = build_trigram_table(CORPUS, eos_id=0)
    # (1,2) -> 3 twice, 4 once, 5 once (the EOS-crossing trigrams are skipped): count(1,2) = 4
    assert table.row(1, 2) == {3: 0.5, 4: 0.25, 5: 0.25}
    assert table.row(2, 3) == {1: 1.0}
    assert table.row(3, 1) == {2: 1.0}
    assert table.row(2, 4) == {} and table.row(4, 0) == {} and table.row(0, 1) == {}
    assert table.static_pairs == 3
    # only the top successors are kept (ties: smaller id first); scores stay count / count(a, b)
    assert build_trigram_table(CORPUS, eos_id=0, top=2).row(1, 2) == {3: 0.5, 4: 0.25}
    # without an EOS id every trigram counts
    assert build_trigram_table(CORPUS).row(2, 4) == {0: 1.0}
    assert build_trigram_table(np.array([5, 6])).static_pairs == 0


def test_view_is_top12_best_first_with_priors():
    table = TrigramTable()
    for successor in range(15):
        for _ in range(successor + 1):
            table.adapt(7, 8, successor)
    tokens, scores, cumulative, priors = table.view(7, 8)
    assert tokens == tuple(range(14, 2, -1))  # the 12 best
    assert scores[0] == pytest.approx(0.6) and scores[-1] == pytest.approx(0.16)
    assert cumulative[-1] == pytest.approx(sum(scores))
    assert sum(priors) == pytest.approx(1.0) and priors[0] == pytest.approx(0.6 / sum(scores))
    assert table.view(1, 1) == ((), (), (), ())


def test_adaptation_hand_computed():
    table = build_trigram_table(CORPUS, eos_id=0)
    table.adapt_window([1, 2, 3, 9])  # trigrams (1,2,3) and (2,3,9)
    assert table.row(1, 2) == pytest.approx({3: 0.54, 4: 0.25, 5: 0.25})  # +0.04, no renormalisation
    assert table.row(2, 3) == pytest.approx({1: 1.0, 9: 0.04})  # created at 0.04
    table.adapt(2, 3, 1, 1.98)
    assert table.row(2, 3)[1] == pytest.approx(2.98)
    table.adapt(2, 3, 1)
    assert table.row(2, 3)[1] == pytest.approx(3.0)
    table.adapt(2, 3, 1)
    assert table.row(2, 3)[1] == pytest.approx(3.0)  # capped
    # the view follows the adaptation
    assert table.view(2, 3)[0] == (1, 9)


def test_adaptation_window_is_the_last_16_tokens():
    drafter = AdedDrafter(time_budget=None)
    context = list(range(100, 120))  # 20 distinct tokens: 18 trigrams, the last 16 tokens hold 14
    drafter.propose(context, 8)  # no events seen: the window of the context itself is adapted
    adapted = [(a, b) for a, b in zip(context, context[1:]) if drafter.table.row(a, b)]
    assert adapted == list(zip(context[4:18], context[5:19]))
    assert drafter.table.row(104, 105) == pytest.approx({106: 0.04})
    # a step commits 120: the new window (105 .. 120) is adapted before the next draft, once
    drafter.observe(StepEvent(kind="step", draft=Draft.empty("aded"), committed=[120],
                              scored_topk=[[0] * 8]))
    assert drafter.table.row(104, 105) == pytest.approx({106: 0.04})
    assert drafter.table.row(105, 106) == pytest.approx({107: 0.08})
    assert drafter.table.row(118, 119) == pytest.approx({120: 0.04})
    drafter.propose(context + [120], 8)
    assert drafter.table.row(105, 106) == pytest.approx({107: 0.08})


def test_prompt_is_adapted_once_per_new_text():
    drafter = AdedDrafter(time_budget=None)
    prompt = (5, 6, 7, 5, 6, 8)
    drafter.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[9],
                              prompt_tokens=prompt))
    per_occurrence = 0.04 * 14
    assert drafter.table.row(5, 6) == pytest.approx({7: per_occurrence, 8: per_occurrence})
    drafter.observe(StepEvent(kind="step", draft=Draft.empty("aded"), committed=[5],
                              scored_topk=[[0] * 8]))
    # the step adapted the window (5 6 7 5 6 8 9 5): +0.04 each
    assert drafter.table.row(5, 6) == pytest.approx({7: per_occurrence + 0.04, 8: per_occurrence + 0.04})
    assert drafter.table.row(8, 9) == pytest.approx({5: 0.04})
    # the next turn re-sends the conversation: only the trigrams ending in new text are adapted
    drafter.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[1],
                              prompt_tokens=(*prompt, 9, 5, 6, 7)))
    assert drafter.table.row(5, 6) == pytest.approx({7: 2 * per_occurrence + 0.04, 8: per_occurrence + 0.04})
    assert drafter.table.row(9, 5) == pytest.approx({6: per_occurrence})
    assert drafter.table.row(8, 9) == pytest.approx({5: 0.04})  # text seen before: not again


def test_puct_selection_hand_computed():
    visits, priors = [9, 5, 4], [1.0, 0.4, 0.6]  # node 0 is the parent (N = 9), children 1 and 2
    weight = (32 + math.log((9 + 8 + 1) / 8)) * math.sqrt(9)  # 98.4328...
    # child 1: Q = 25/5 = 5, U = 98.43 * 0.4 / 6 = 6.562 -> 11.562; child 2: Q = 1, U = 98.43 * 0.6 / 5 = 11.812
    values = [0.0, 25.0, 4.0]
    assert puct_score(5, 25.0, 0.4, 9) == pytest.approx(5 + weight * 0.4 / 6)
    assert puct_score(4, 4.0, 0.6, 9) == pytest.approx(12.8119, abs=1e-3)
    assert select_child([1, 2], visits, values, priors, 9) == 2
    values[1] = 35.0  # Q = 7 -> 13.562 beats 12.812
    assert select_child([1, 2], visits, values, priors, 9) == 1
    # an unvisited child goes first, the first one in (best-first) order
    assert select_child([1, 2, 3], [9, 5, 0, 0], [0, 25.0, 0, 0], [1, 0.2, 0.3, 0.5], 9) == 2


def test_search_finds_the_likely_paths():
    table = build_trigram_table(CORPUS, eos_id=0)
    tree, iterations = run_search(table, 3, 1, iterations=150, time_budget=None, rng=random.Random(1))
    assert iterations == 150
    assert tree.visits[0] == 150
    paths, visits = best_paths(tree, table)
    assert paths[0] == [2, 3, 1, 2, 3]  # the cycle 1 2 3, the greedy extension included
    assert visits == sorted(visits, reverse=True)
    assert all(len(path) <= 5 for path in paths)
    # a root with no successors: one iteration and nothing to draft
    tree, iterations = run_search(table, 7, 7, time_budget=None)
    assert iterations == 1 and best_paths(tree, table) == ([], [])


def test_search_respects_the_time_budget():
    rng = np.random.default_rng(0)
    corpus = rng.integers(0, 30, size=20000)
    table = build_trigram_table(corpus)
    _, iterations = run_search(table, int(corpus[0]), int(corpus[1]), iterations=10**9, time_budget=0.003)
    assert 1 <= iterations < 10**6


def test_trie_merge_hand_computed():
    paths = [[1, 2, 3], [1, 2, 4], [1, 5], [6]]
    tokens, parents, weights = merge_paths(paths)
    assert tokens == [1, 6, 2, 5, 3, 4]
    assert parents == [-1, -1, 0, 0, 2, 2]
    assert weights == [3, 1, 2, 1, 1, 1]
    # weighted paths reorder siblings: 6 outweighs 1
    tokens, parents, _ = merge_paths(paths, path_weights=[1, 1, 1, 5])
    assert tokens == [6, 1, 2, 5, 3, 4] and parents == [-1, -1, 1, 1, 2, 2]
    # the node limit cuts paths where the trie is full
    tokens, parents, _ = merge_paths(paths, max_nodes=4)
    assert tokens == [1, 2, 3, 4] and parents == [-1, 0, 1, 1]
    # keeping the heaviest nodes, heaviest first, stays a tree (parents first)
    tokens, parents, weights = merge_paths(paths)
    assert keep_best(tokens, parents, weights, 3) == ([1, 2, 6], [-1, 0, -1])  # weights 3, then 2 and 2


def test_trie_merge_random_paths_stay_valid():
    rng = random.Random(0)
    for _ in range(50):
        paths = [[rng.randrange(6) for _ in range(rng.randrange(1, 7))] for _ in range(24)]
        tokens, parents, weights = merge_paths(paths, 64)
        assert len(tokens) == len(parents) <= 64
        assert all(-1 <= parent < node for node, parent in enumerate(parents))
        depth = [0] * len(parents)
        for node, parent in enumerate(parents):
            depth[node] = 1 if parent < 0 else depth[parent] + 1
        assert depth == sorted(depth)  # breadth first
        siblings = {}
        for node, parent in enumerate(parents):
            siblings.setdefault(parent, []).append(tokens[node])
        assert all(len(set(kids)) == len(kids) for kids in siblings.values())  # a trie: no duplicate children
        for budget in (1, 7, 30):
            small_tokens, small_parents = keep_best(tokens, parents, weights, budget)
            assert len(small_tokens) == min(budget, len(tokens))
            assert all(-1 <= parent < node for node, parent in enumerate(small_parents))


def test_drafts_are_valid_trees():
    rng = np.random.default_rng(1)
    drafter = AdedDrafter(build_trigram_table(rng.integers(0, 20, size=5000)), time_budget=None, iterations=60)
    for budget in (0, 1, 5, 20, 64, 100):
        for _ in range(5):
            context = rng.integers(0, 20, size=30).tolist()
            draft = drafter.propose(context, budget)
            check_draft(draft, min(budget, 64))
    assert len(draft) > 0


def test_factory(tmp_path):
    from specdec_cli.sam.automaton import build_static
    from specdec_cli.sam.index import save_index

    target = TargetInfo(vocab_size=10, eos_token_ids=(0,))
    drafter = make_aded_drafter(DrafterOptions(), target)
    assert drafter.name == "aded" and drafter.table.static_pairs == 0
    path = tmp_path / "small.sam"
    save_index(path, build_static(CORPUS, vocab_size=10, separators=(0,)),
               {"tokenizer_fingerprint": "sha256:test", "vocab_size": 10, "eos_id": 0})
    drafter = make_aded_drafter(DrafterOptions(index=str(path), aded_time_budget=0.01), target,
                                draft_max=32)
    assert drafter.table.row(1, 2) == {3: 0.5, 4: 0.25, 5: 0.25}
    assert drafter.draft_max == 32 and drafter.time_budget == 0.01
    with pytest.raises(SpecdecError, match="tokenizer"):
        make_aded_drafter(DrafterOptions(index=str(path)), TargetInfo(10, (0,), fingerprint="sha256:other"))



@pytest.mark.parametrize("prompt", [PROMPT, [1, 5, 6, 7]])
@pytest.mark.parametrize("cost_aware", [False, True])
def test_greedy_identity(tiny_model, cost_aware, prompt):
    reference = hf_greedy(tiny_model, prompt, 40)
    drafter = AdedDrafter(time_budget=None, iterations=60)
    config = GenerationConfig(max_new_tokens=40, draft_max=64, eos_token_ids=(TINY_EOS,), cost_aware=cost_aware)
    engine = Engine(tiny_model)
    generation = engine.generate(prompt, CheckedDrafter(drafter), config)
    assert generation.tokens == reference
    # the table outlives the generation: the same request again is drafted from the first answer
    checked = CheckedDrafter(drafter)
    again = engine.generate(prompt, checked, config)
    assert again.tokens == reference
    assert checked.nonempty >= checked.calls / 2
    if not cost_aware:  # (the cost model may trim drafts after a weak first answer)
        assert generation.stats.mean_accepted_tokens >= 1.0
        assert again.stats.drafted_tokens > 0
        assert again.stats.mean_accepted_tokens >= 1.5
