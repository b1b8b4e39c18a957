"""Token trees: the ancestor mask against sequential decoding, greedy identity, and the exact sampling rule."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import TINY_EOS, TINY_VOCAB, hf_greedy

from specdec_cli.decoding.draft import NOTHING, Draft
from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.decoding.step_parts import first_branch, trim
from specdec_cli.decoding.verify import greedy_accept_tree, speculative_accept_tree
from specdec_cli.target_model.verify.tree_mask import tree_layout

PROMPT = [1, 10, 11, 12, 13, 10, 11]


def test_tree_logits_equal_sequential_decoding(tiny_model):
    from transformers import DynamicCache

    engine = Engine(tiny_model)
    tokens, parents = [20, 21, 22, 23, 24, 20], [-1, -1, 0, 0, 1, 3]  # duplicate token 20 at two depths
    with torch.inference_mode():
        cache = DynamicCache()
        engine.forward(PROMPT[:-1], cache, 0)
        tree_logits = engine.forward([PROMPT[-1], *tokens], cache, len(PROMPT) - 1, tree=parents).logits  # [7, V]

        def path_to(node):
            path = []
            while node >= 0:
                path.append(tokens[node])
                node = parents[node]
            return path[::-1]

        for row in range(len(tokens) + 1):
            sequence = PROMPT + (path_to(row - 1) if row else [])
            reference = tiny_model(torch.tensor([sequence])).logits[0, -1]
            assert torch.allclose(tree_logits[row], reference, atol=1e-4), row


def test_tree_layout():
    depth, ancestors = tree_layout([-1, -1, 0, 2])
    assert depth.tolist() == [0, 1, 1, 2, 3]
    assert ancestors[4].tolist() == [True, True, False, True, True]
    with pytest.raises(ValueError):
        tree_layout([1, -1])


def test_trim_and_first_branch():
    draft = Draft([5, 6, 7, 8], "t", parents=[-1, -1, 0, 1])
    assert trim(draft, 3).parents == [-1, -1, 0]
    assert first_branch(draft).tokens == [5, 7]


class TreeDrafter:
    """A tree around the true continuation: junk first child, the truth as a later sibling, duplicates."""

    name = "tree"
    needs = NOTHING

    def __init__(self, reference, prompt_len, seed=0):
        self.reference, self.prompt_len, self.rng = reference, prompt_len, random.Random(seed)

    def propose(self, context, budget):
        done = len(context) - self.prompt_len
        truth = self.reference[done : done + 3]
        tokens, parents, parent = [], [], -1
        for depth, token in enumerate(truth):
            junk = (token + 1 + self.rng.randrange(TINY_VOCAB - 1)) % TINY_VOCAB
            siblings = [junk, token, token] if depth % 2 == 0 else [token, junk]
            first_index = len(tokens)
            for sibling in siblings:
                tokens.append(sibling)
                parents.append(parent)
            parent = first_index + siblings.index(token)
            if self.rng.random() < 0.3:  # sometimes the truth stops early
                break
        return Draft(tokens[:budget], self.name, parents=parents[:budget])

    def observe(self, event):
        pass

    def reset(self):
        pass


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_greedy_identical_to_plain(tiny_model, seed):
    reference = hf_greedy(tiny_model, PROMPT, 40)
    config = GenerationConfig(max_new_tokens=40, draft_max=16, eos_token_ids=(TINY_EOS,), cost_aware=False)
    generation = Engine(tiny_model).generate(PROMPT, TreeDrafter(reference, len(PROMPT), seed), config)
    assert generation.tokens == reference
    assert generation.stats.mean_accepted_tokens > 1.5  # the truth was found in non-first branches


def test_greedy_accept_tree_takes_first_matching_child():
    tokens, parents = [7, 8, 8, 9], [-1, -1, -1, 2]
    # root argmax 8 -> first child with 8 is node 1 (a leaf) -> stop there
    assert greedy_accept_tree(tokens, parents, [8, 0, 0, 0, 0]) == [1]
    assert greedy_accept_tree(tokens, parents, [5, 0, 0, 0, 0]) == []


@pytest.mark.slow
def test_tree_sampling_rule_is_exact_monte_carlo():
    """Children tried in turn with point-mass drafts, duplicates included: the first token follows p_target."""
    p_root = torch.tensor([0.1, 0.4, 0.3, 0.2])
    p_rows = torch.stack([p_root] + [torch.tensor([0.25] * 4)] * 4)  # rows for root + 4 nodes
    tokens, parents = [1, 1, 3, 0], [-1, -1, -1, 0]
    generator = torch.Generator().manual_seed(3)
    counts = torch.zeros(4)
    trials = 20000
    for _ in range(trials):
        path, next_token = speculative_accept_tree(tokens, parents, p_rows, generator)
        first = tokens[path[0]] if path else next_token
        counts[first] += 1
    stderr = torch.sqrt(p_root * (1 - p_root) / trials)
    assert torch.all((counts / trials - p_root).abs() < 4 * stderr + 1e-4), counts / trials


def test_tree_sampling_analytic_first_token():
    """Exact probabilities of the sequential multi-draft rule equal p_target (duplicates included)."""
    p_target = torch.tensor([0.1, 0.4, 0.3, 0.2], dtype=torch.float64)
    children = [1, 1, 3]
    total = torch.zeros(4, dtype=torch.float64)
    residual, reach = p_target.clone(), 1.0
    for token in children:
        accept = float(residual[token] / residual.sum())
        total[token] += reach * accept
        reach *= 1 - accept
        residual[token] = 0
    total += reach * residual / residual.sum()
    assert torch.allclose(total, p_target)


@pytest.mark.slow
def test_tree_sampling_on_model_keeps_the_distribution(tiny_llama):
    """Engine-level: with a tree drafter at temperature 1, the first new token's law equals the model's."""
    from specdec_cli.decoding.sampling import warp_probs

    prompt = PROMPT
    with torch.inference_mode():
        p_first_two = warp_probs(tiny_llama(torch.tensor([prompt])).logits[0, -1], 1.0).double()
    # measure the 2nd token (the 1st comes from the prefill): compare to its exact law
    with torch.inference_mode():
        batch = torch.tensor([prompt + [token] for token in range(TINY_VOCAB)])
        second = warp_probs(tiny_llama(batch).logits[:, -1], 1.0).double()
    law = (p_first_two.unsqueeze(1) * second).sum(0)
    engine = Engine(tiny_llama)
    reference = [int(law.argmax())] * 8
    counts = torch.zeros(TINY_VOCAB, dtype=torch.float64)
    runs = 600
    for seed in range(runs):
        config = GenerationConfig(max_new_tokens=4, temperature=1.0, seed=seed, draft_max=8, eos_token_ids=(),
                                  cost_aware=False)
        drafter = TreeDrafter(reference + reference, len(prompt) + 1, seed)
        counts[engine.generate(prompt, drafter, config).tokens[1]] += 1
    expected = law * runs
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    wanted = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    statistic = float(((observed - wanted) ** 2 / wanted.clamp(min=1e-9)).sum())
    dof = len(wanted) - 1
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)
