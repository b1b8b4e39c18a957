"""Acceptance rules without a model: greedy prefix, and speculative sampling's exactness."""

from __future__ import annotations

import pytest
import torch

from specdec_cli.decoding.sampling import warp_probs
from specdec_cli.decoding.verify import greedy_accept, residual, speculative_accept


def test_greedy_accept_counts_matching_prefix():
    assert greedy_accept([5, 6, 7], [5, 6, 7, 8]) == 3
    assert greedy_accept([5, 9, 7], [5, 6, 7, 8]) == 1
    assert greedy_accept([9], [5, 6]) == 0
    assert greedy_accept([], [5]) == 0


def _dist(values):
    tensor = torch.tensor(values, dtype=torch.float64)
    return tensor / tensor.sum()


@pytest.mark.parametrize("p_draft", [[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
def test_acceptance_mass_plus_residual_is_the_target(p_draft):
    """sum_x p_draft(x) min(1, p_target(x)/p_draft(x)) [x] + P(reject) * residual == p_target, analytically."""
    p_target = _dist([0.5, 0.05, 0.15, 0.3])
    p_draft = _dist(p_draft)
    total = torch.zeros(4, dtype=torch.float64)
    for drafted in range(4):
        accept = min(1.0, float(p_target[drafted] / p_draft[drafted]))
        total[drafted] += p_draft[drafted] * accept
        total += p_draft[drafted] * (1 - accept) * residual(p_target, p_draft, drafted)
    assert torch.allclose(total, p_target, atol=1e-12)


@pytest.mark.parametrize("drafted", [0, 1, 2, 3])
def test_deterministic_draft_accept_plus_residual_is_the_target(drafted):
    """A point-mass draft x: p_target(x) [x] + (1 - p_target(x)) * residual == p_target, for every x."""
    p_target = _dist([0.5, 0.05, 0.15, 0.3])
    accept = float(p_target[drafted])
    total = (1 - accept) * residual(p_target, None, drafted)
    total[drafted] += accept
    assert torch.allclose(total, p_target, atol=1e-12)


def _toy_target(prefix):
    """A fixed conditional distribution over 4 tokens given the previous token (a toy 'model')."""
    table = {None: [0.4, 0.3, 0.2, 0.1], 0: [0.1, 0.6, 0.2, 0.1], 1: [0.25, 0.25, 0.25, 0.25],
             2: [0.7, 0.1, 0.1, 0.1], 3: [0.05, 0.05, 0.1, 0.8]}
    return _dist(table[prefix[-1] if prefix else None]).float()


def _toy_draft(prefix):
    table = {None: [0.1, 0.6, 0.2, 0.1], 0: [0.3, 0.3, 0.2, 0.2], 1: [0.5, 0.2, 0.2, 0.1],
             2: [0.1, 0.1, 0.1, 0.7], 3: [0.25, 0.25, 0.25, 0.25]}
    return _dist(table[prefix[-1] if prefix else None]).float()


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [False, True])
def test_monte_carlo_two_token_joint_matches_target(deterministic):
    """Seeded Monte-Carlo: the first two committed tokens follow p_target(x) * p_target(y | x)."""
    generator = torch.Generator().manual_seed(7)
    counts = torch.zeros(4, 4)
    trials = 20000
    for _ in range(trials):
        draft: list[int] = []
        rows_draft = []
        for _ in range(2):  # a 2-token chain drafted from the toy draft model (or a fixed guess)
            row = _toy_draft(draft)
            if deterministic:
                token = (draft[-1] + 1) % 4 if draft else 1
            else:
                token = int(torch.multinomial(row, 1, generator=generator))
            rows_draft.append(row)
            draft.append(token)
        p_target = torch.stack([_toy_target(draft[:i]) for i in range(3)])  # [3, 4]
        p_draft = None if deterministic else torch.stack(rows_draft)
        accepted, next_token = speculative_accept(draft, p_target, p_draft, generator)
        committed = draft[:accepted] + [next_token]
        if len(committed) == 1:  # the next step would draw the second token from the target itself
            committed.append(int(torch.multinomial(_toy_target(committed), 1, generator=generator)))
        counts[committed[0], committed[1]] += 1
    expected = torch.stack([_toy_target([]) [x] * _toy_target([x]) for x in range(4)])  # [4, 4]
    empirical = counts / trials
    # 4 standard errors per cell, a bound a wrong rule (e.g. no residual) breaks by far
    stderr = torch.sqrt(expected * (1 - expected) / trials)
    assert torch.all((empirical - expected).abs() <= 4 * stderr + 1e-4), (empirical, expected)


def test_warp_probs_matches_plain_filters():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])
    probs = warp_probs(logits, temperature=1.0)
    assert torch.allclose(probs, torch.softmax(logits, -1))
    top2 = warp_probs(logits, temperature=1.0, top_k=2)
    assert set(torch.nonzero(top2).flatten().tolist()) == {0, 4}
    nucleus = warp_probs(logits, temperature=1.0, top_p=0.5)  # the best token alone holds > 0.5
    assert torch.nonzero(nucleus).flatten().tolist() == [4]
    hot = warp_probs(logits, temperature=0.5)
    assert torch.allclose(hot, torch.softmax(logits / 0.5, -1))
    assert torch.allclose(warp_probs(logits, 1.0, top_p=1.0).sum(), torch.tensor(1.0))


@pytest.mark.parametrize("vocab, scale", [(50, 1.0), (3000, 0.3), (3000, 6.0), (20000, 0.05)])
@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
def test_top_p_keeps_what_sorting_every_probability_keeps(vocab, scale, top_p):
    """The partial top-k search for the nucleus (a flat distribution's cut lies past the first candidates) keeps
    exactly the tokens the rule over a full sort keeps."""
    from specdec_cli.decoding.sampling import _top_p_kept

    probs = torch.softmax(torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab)) * scale, dim=-1)
    ordered, order = torch.sort(probs, dim=-1, descending=True)
    dropped = (torch.cumsum(ordered, dim=-1) - ordered) >= top_p
    expected = torch.zeros_like(dropped).scatter(-1, order, ~dropped)
    assert torch.equal(_top_p_kept(probs, top_p), expected)
    for row in range(3):
        assert torch.equal(_top_p_kept(probs[row], top_p), expected[row])


def test_sampling_draws_each_token_at_its_probability_and_never_an_impossible_one():
    from specdec_cli.decoding.sampling import sample

    probs = torch.tensor([0.1, 0.0, 0.55, 0.0, 0.3, 0.05, 0.0])
    generator = torch.Generator().manual_seed(0)
    trials = 40000
    counts = torch.bincount(torch.tensor([sample(probs, generator) for _ in range(trials)]), minlength=7).double()
    stderr = torch.sqrt(probs.double() * (1 - probs.double()) / trials)
    assert counts[probs == 0].sum() == 0
    assert torch.all((counts / trials - probs.double()).abs() <= 4 * stderr + 1e-4), counts / trials
    assert sample(torch.tensor([0.0, 0.0, 1.0]), generator) == 2  # one possible token, whatever the draw


def test_min_p_drops_what_is_less_likely_than_min_p_times_the_best_and_renormalises():
    """warp_probs' min-p against a brute-force reading (after temperature, top-k and top-p, as transformers
    orders them)."""
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.errors import SpecdecError

    generator = torch.Generator().manual_seed(5)
    for _ in range(20):
        logits = torch.randn(3, 50, generator=generator) * 3
        for min_p in (0.0, 0.05, 0.3, 1.0):
            warped = warp_probs(logits, 0.8, 0, 1.0, min_p)
            for row in range(3):
                probs = torch.softmax(logits[row] / 0.8, -1)
                kept = probs >= min_p * probs.max()
                expected = torch.where(kept, probs, torch.zeros_like(probs))
                assert torch.allclose(warped[row], expected / expected.sum(), atol=1e-6)
                assert bool((warped[row] > 0)[probs.argmax()])  # the best always stays
    with pytest.raises(SpecdecError, match="min_p must be in"):
        GenerationConfig(temperature=1.0, min_p=1.5).check()
