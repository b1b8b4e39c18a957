"""`min_new_tokens` (the server's `min_tokens` and `ignore_eos`): no end-of-text token is chosen before the answer
has that many tokens, exactly as transformers' `min_new_tokens` bars it, whatever is drafted: drafts of the
end-of-text token at barred positions (chains and trees, at every depth) are rejected, the rows choose their best
other token, and sampling keeps the barred law. The row arithmetic against brute force."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import TINY_VOCAB, chi_square, hf_greedy
from test_engine import DIP_CURVE, FLAT_CURVE, PROMPTS

from specdec_cli.decoding.cost_curve import CostCurve
from specdec_cli.decoding.draft import NOTHING, Draft
from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.decoding.grammar import GrammarSpec
from specdec_cli.decoding.planner import DraftPlanner
from specdec_cli.decoding.step_parts import eos_barred, greedy_without_eos, without_eos
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.drafters.pld import PromptLookupDrafter
from specdec_cli.errors import SpecdecError


class EndingDrafter:
    """Drafts the end-of-text token first at every step, then the true continuation (a chain), or a tree with it
    beside the truth at every depth: what a barred row must refuse."""

    needs = NOTHING

    def __init__(self, reference: list[int], prompt_len: int, eos: int, tree: bool, seed: int = 0):
        self.name = "ending-tree" if tree else "ending"
        self.reference, self.prompt_len, self.eos, self.tree = reference, prompt_len, eos, tree
        self.rng = random.Random(seed)

    def propose(self, context, budget):
        done = len(context) - self.prompt_len
        truth = self.reference[done : done + 4]
        if not self.tree:
            return Draft([self.eos, *truth][:budget], self.name)
        tokens, parents, parent = [], [], -1
        for token in truth:
            siblings = [self.eos, token] if self.rng.random() < 0.5 else [token, self.eos]
            first = len(tokens)
            tokens += siblings
            parents += [parent, parent]
            parent = first + siblings.index(token)
        return Draft(tokens[:budget], self.name, parents=parents[:budget])

    def observe(self, event):
        pass

    def reset(self):
        pass


def _early_eos(model, prompt):
    """A token the model writes early in its free answer, declared its end-of-text token."""
    return hf_greedy(model, prompt, 12, eos=None)[2]


@pytest.mark.parametrize("prompt", PROMPTS[:2])
@pytest.mark.parametrize("drafter, curve", [("none", None), ("pld", FLAT_CURVE), ("ending", None),
                                            ("ending", DIP_CURVE), ("ending-tree", None), ("ending-tree", FLAT_CURVE)])
def test_every_drafter_goes_past_an_early_eos_as_transformers_min_new_tokens(tiny_model, prompt, drafter, curve):
    eos = _early_eos(tiny_model, prompt)
    free = hf_greedy(tiny_model, prompt, 30, eos=eos)
    reference = hf_greedy(tiny_model, prompt, 30, eos=eos, min_new_tokens=10)
    assert len(free) <= 3 and len(reference) >= 10 and eos not in reference[:10]  # the bar changed the answer
    made = {"none": lambda: NoDrafter(), "pld": lambda: PromptLookupDrafter(),
            "ending": lambda: EndingDrafter(reference, len(prompt), eos, tree=False),
            "ending-tree": lambda: EndingDrafter(reference, len(prompt), eos, tree=True)}[drafter]()
    config = GenerationConfig(max_new_tokens=30, draft_max=8, eos_token_ids=(eos,), min_new_tokens=10,
                              cost_aware=curve is not None)
    planner = None if curve is None else DraftPlanner(CostCurve.fixed(curve))
    generation = Engine(tiny_model, planner=planner).generate(prompt, made, config)
    assert generation.tokens == reference
    if drafter == "ending-tree" and curve is None:
        assert generation.stats.accepted_tokens > 0  # the truth beside the barred ending was taken


def test_min_new_tokens_past_the_budget_never_ends_the_answer(tiny_model):
    """`ignore_eos`: min_new_tokens = max_new_tokens, so the answer runs to its budget."""
    prompt = PROMPTS[0]
    eos = _early_eos(tiny_model, prompt)
    config = GenerationConfig(max_new_tokens=25, draft_max=6, eos_token_ids=(eos,), min_new_tokens=25)
    generation = Engine(tiny_model).generate(prompt, PromptLookupDrafter(), config)
    assert generation.finish_reason == "length" and len(generation.tokens) == 25 and eos not in generation.tokens
    assert generation.tokens == hf_greedy(tiny_model, prompt, 25, eos=eos, min_new_tokens=25)


@pytest.mark.slow
def test_sampling_with_the_first_token_barred_keeps_the_barred_law(tiny_llama):
    """Seeded Monte-Carlo: the first new token follows the model's law with the end-of-text token removed, with
    drafts that propose it."""
    from specdec_cli.decoding.sampling import warp_probs

    prompt = [1, 10, 11, 12, 10, 11]
    with torch.inference_mode():
        logits = tiny_llama(torch.tensor([prompt])).logits[0, -1]  # [vocab]
    eos = int(logits.argmax())  # the likeliest first token, barred
    law = warp_probs(logits.masked_fill(torch.arange(TINY_VOCAB) == eos, float("-inf")), 1.0).double()
    counts = torch.zeros(TINY_VOCAB, dtype=torch.float64)
    engine = Engine(tiny_llama)
    drafter = EndingDrafter([11, 12, 10, 11], len(prompt), eos, tree=False)
    for seed in range(800):
        config = GenerationConfig(max_new_tokens=2, temperature=1.0, seed=seed, draft_max=3, eos_token_ids=(eos,),
                                  min_new_tokens=2, cost_aware=False)
        counts[engine.generate(prompt, drafter, config).tokens[0]] += 1
    assert counts[eos] == 0
    statistic, dof = chi_square(counts, law)
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)


def test_barred_rows_by_depth_against_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        size = rng.randrange(0, 9)
        parents = [rng.randrange(-1, node) for node in range(size)] if rng.random() < 0.7 else None
        draft = Draft(list(range(size)), "t", parents=parents)
        answered, least = rng.randrange(0, 6), rng.randrange(0, 12)

        def depth(row, parents=parents):  # the tokens before the one this row chooses, counted along its path
            node, steps = row - 1, 0
            while node >= 0:
                steps += 1
                node = node - 1 if parents is None else parents[node]
            return steps

        expected = [row for row in range(size + 1) if answered + depth(row) < least]
        assert eos_barred(draft, answered, least) == expected


def test_eos_logits_barred_and_greedy_choices_fixed():
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.0], [3.0, 0.0, 9.0, 1.0], [0.0, 7.0, 2.0, 6.0]])
    held = without_eos(logits, [1, 2], [0, 2])
    assert torch.isinf(held[0, 1]) and torch.isinf(held[2, 2]) and held[1, 2] == 9.0 and torch.equal(logits[1], held[1])
    assert without_eos(logits, [1], []) is logits
    assert greedy_without_eos(logits, [1, 2, 1], {1, 2}, [0, 2]) == [3, 2, 3]


def test_min_new_tokens_is_checked():
    with pytest.raises(SpecdecError, match="min_new_tokens must be in"):
        GenerationConfig(min_new_tokens=-1).check()
    with pytest.raises(SpecdecError, match="cannot be combined with a grammar"):
        GenerationConfig(min_new_tokens=3, grammar=GrammarSpec("lark", 'start: "a"')).check()
