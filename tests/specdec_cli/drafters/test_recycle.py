"""Token Recycling: the successor-matrix update, the template expansion, drafts' shape, greedy identity."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TINY_EOS, TINY_VOCAB, CheckedDrafter, check_draft, hf_greedy

from specdec_cli.decoding.draft import Draft, StepEvent
from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.drafters import DrafterOptions, TargetInfo
from specdec_cli.drafters.recycle import TEMPLATE, RecycleDrafter, TreeTemplate, make_recycle_drafter

PROMPT = [1, 10, 11, 12, 13, 10, 11]



def step(draft: Draft, committed, topk, path=()) -> StepEvent:
    return StepEvent(kind="step", draft=draft, committed=list(committed), accepted_path=list(path),
                     scored_topk=[list(row) for row in topk])


def test_template_shape():
    template = TreeTemplate(TEMPLATE)
    assert len(template) == 80
    assert int(template.depths.max()) == 6
    assert all(template.parents[node] < node for node in range(len(template)))
    # earlier siblings never get fewer children than later ones
    children = {}
    for node, parent in enumerate(template.parents.tolist()):
        children.setdefault(parent, []).append(node)
    for kids in children.values():
        counts = [len(children.get(kid, [])) for kid in kids]
        assert counts == sorted(counts, reverse=True)
    with pytest.raises(ValueError):
        TreeTemplate([2, 0])  # two children announced, one child count given


def test_matrix_update_hand_computed():
    drafter = RecycleDrafter(vocab_size=50)
    drafter.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[7],
                              prompt_tokens=(1, 2)))
    # step: root 7 (the prefill's token), tree 20 -> (21, 22), 23; accepted path: node 0 then node 2 (22)
    draft = Draft([20, 23, 22, 21], "recycle", parents=[-1, -1, 0, 0])
    topk = [[20, 1, 2, 3, 4, 5, 6, 8],  # after root 7
            [22, 9, 9, 9, 9, 9, 9, 9],  # after node 0 (20)
            [30, 31, 32, 33, 34, 35, 36, 37],  # after node 1 (23)
            [40, 41, 42, 43, 44, 45, 46, 47],  # after node 2 (22)
            [10, 11, 12, 13, 14, 15, 16, 17]]  # after node 3 (21)
    drafter.observe(step(draft, [20, 22, 40], topk, path=[0, 2]))
    assert drafter.matrix[7].tolist() == topk[0]
    assert drafter.matrix[20].tolist() == topk[1]
    assert drafter.matrix[23].tolist() == topk[2]
    assert drafter.matrix[22].tolist() == topk[3]
    assert drafter.matrix[21].tolist() == topk[4]
    assert drafter.width[[7, 20, 21, 22, 23]].tolist() == [8] * 5
    assert drafter._last == 40
    # next step: root 40 (newest token); a duplicate token 40 also in a rejected node -> the root's row wins,
    # and a duplicate of an accepted node's token in a rejected node loses to the accepted one
    draft = Draft([40, 41, 41], "recycle", parents=[-1, -1, 1])
    topk = [[1] * 8, [2] * 8, [3] * 8, [4] * 8]
    drafter.observe(step(draft, [41, 41, 5], topk, path=[1, 2]))
    assert drafter.matrix[40].tolist() == [1] * 8  # root over the rejected node 0
    assert drafter.matrix[41].tolist() == [4] * 8  # the later accepted node (node 2) over node 1
    assert drafter.matrix[7].tolist() == [20, 1, 2, 3, 4, 5, 6, 8]  # untouched rows stay


def test_a_step_without_a_draft_sets_the_roots_row_and_grows_the_matrix():
    """The one-row update (most steps): the root's row is the target's top tokens, as wide as they are; an id past
    the matrix grows it."""
    drafter = RecycleDrafter(vocab_size=0)  # no vocabulary known: the matrix starts with one row
    drafter.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[7], prompt_tokens=(1,)))
    drafter.observe(step(Draft.empty("recycle"), [9], [[3, 60, 5]]))
    assert drafter.matrix[7, :3].tolist() == [3, 60, 5] and drafter.width[7] == 3 and len(drafter.matrix) >= 61
    drafter.observe(step(Draft.empty("recycle"), [4], [[8, 8, 8, 8, 8, 8, 8, 8, 8, 8]]))  # 10 given: 8 kept
    assert drafter.matrix[9].tolist() == [8] * 8 and drafter.width[9] == 8
    assert drafter.propose([1, 7], 4).tokens[:1] == [3]  # the root 7's best successor drafts first


def test_prefill_puts_prompt_successors_first():
    drafter = RecycleDrafter(vocab_size=20)
    drafter.matrix[9] = [1, 2, 3, 4, 5, 6, 7, 8]
    drafter.width[9] = 8
    prompt = (4, 5, 4, 6, 9, 4, 5)
    drafter.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[11], prompt_tokens=prompt))
    assert drafter.matrix[4, :2].tolist() == [5, 6] and drafter.width[4] == 2  # latest first, distinct
    assert drafter.matrix[6, :1].tolist() == [9] and drafter.width[6] == 1
    assert drafter.matrix[9].tolist() == [4, 1, 2, 3, 5, 6, 7, 8]  # in front of what the target said
    assert drafter.matrix[5, :2].tolist() == [11, 4] and drafter.width[5] == 2  # prompt[-1]: the target's token first
    # the next turn re-sends the conversation (prompt, answer 11) plus new text: only the new pairs count
    drafter.observe(step(Draft.empty("recycle"), [12], [[12, 0, 0, 0, 0, 0, 0, 0]]))  # root 11 -> 12
    drafter.matrix[4, :3] = [7, 8, 9]
    drafter.width[4] = 3
    drafter.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[13],
                              prompt_tokens=(*prompt, 11, 12, 4, 6)))
    assert drafter.matrix[4, :4].tolist() == [6, 7, 8, 9]  # (4, 6) is new; the old (4, 5) is not re-learned
    assert drafter.matrix[12, :1].tolist() == [4]
    assert drafter.matrix[6, :2].tolist() == [13, 9]


def test_expansion_hand_computed():
    # template: root has 2 children; the first of them 2 children, the second 1; the first grandchild 1 child
    drafter = RecycleDrafter(vocab_size=10, template=[2, 2, 1, 1, 0, 0, 0])
    rows = {0: [1, 2], 1: [3, 4], 2: [5, 6], 3: [7, 8], 5: [9, 9]}
    for token, row in rows.items():
        drafter.matrix[token, :2] = row
        drafter.width[token] = 2
    draft = drafter.propose([0], budget=10)
    # root 0 -> 1 (rank 0), 2 (rank 1); 1 -> 3, 4; 2 -> 5; 3 -> 7; emitted best first (path products of
    # RANK_ACCEPT: 1 .45, 3 .2025, 7 .0911, 2 .09, 4 and 5 .0405), parents still before children
    assert draft.tokens == [1, 3, 7, 2, 4, 5]
    assert draft.parents == [-1, 0, 1, -1, 0, 3]
    # a budget keeps the highest-priority nodes: a prefix of the full draft
    small = drafter.propose([0], budget=3)
    assert small.tokens == [1, 3, 7] and small.parents == [-1, 0, 1]
    small = drafter.propose([0], budget=4)
    assert small.tokens == [1, 3, 7, 2] and small.parents == [-1, 0, 1, -1]
    # a row with one known successor: rank-1 children under it are dropped, not drafted as token 0
    drafter.width[1] = 1
    assert drafter.propose([0], budget=10).tokens == [1, 3, 7, 2, 5]
    # an unknown root: nothing to draft
    assert drafter.propose([6], budget=10).tokens == []


def test_drafts_are_valid_trees():
    rng = np.random.default_rng(0)
    drafter = RecycleDrafter(vocab_size=30)
    drafter.matrix[:] = rng.integers(0, 30, size=drafter.matrix.shape)
    drafter.width[:] = rng.integers(0, 9, size=30)
    for budget in (0, 1, 5, 17, 40, 80, 200):
        for root in range(30):
            check_draft(drafter.propose([root], budget), budget)


def test_factory():
    drafter = make_recycle_drafter(DrafterOptions(), TargetInfo(vocab_size=100, eos_token_ids=(3,)), 24)
    assert drafter.name == "recycle" and drafter.draft_max == 24 and drafter.matrix.shape == (100, 8)



@pytest.mark.parametrize("prompt", [PROMPT, [1, 5, 6, 7]])
@pytest.mark.parametrize("cost_aware", [False, True])
def test_greedy_identity(tiny_model, cost_aware, prompt):
    reference = hf_greedy(tiny_model, prompt, 40)
    drafter = RecycleDrafter(TINY_VOCAB)
    config = GenerationConfig(max_new_tokens=40, draft_max=64, eos_token_ids=(TINY_EOS,), cost_aware=cost_aware)
    engine = Engine(tiny_model)
    checked = CheckedDrafter(drafter)
    generation = engine.generate(prompt, checked, config)
    assert generation.tokens == reference
    assert checked.nonempty > 0  # a root never fed to the target yet has no row: no draft that step
    if not cost_aware:  # (the cost model may trim every draft of a weak drafter on a tiny random model)
        assert generation.stats.drafted_tokens > 0
        assert generation.stats.mean_accepted_tokens >= 1.0
    # hot start: the matrix outlives a generation; every root of the same answer again has a row
    checked = CheckedDrafter(drafter)
    again = engine.generate(prompt, checked, config)
    assert again.tokens == reference
    assert checked.nonempty == checked.calls
