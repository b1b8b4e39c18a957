"""Every model family README and docs/models.md promise, on tiny models built from configs (no downloads).

Per family: a tree's logits equal sequential decoding (trees deeper than the sliding window included), every
kind of drafter (chains: pld, a scripted chain that is sometimes wrong, the model drafter; trees: a scripted
tree, recycle, aded) is greedy-identical to transformers' `generate` on prompts and answers longer than the
sliding window, and sampling keeps the target's law. Then the engine's tree self-check (it catches attention
that ignores the tree mask, or the window), the cache rules under sliding windows, and the context limits.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import chi_square, fixed_engine, hf_greedy
from helpers import (
    EOS,
    PROMPTS,
    WINDOW,
    LikelyTree,
    ScriptedTree,
    family_drafter,
    family_model,
    perturbed,
    second_token_law,
    tree_path,
)

import specdec_cli.target_model.verify.forward as target_forward
import specdec_cli.target_model.verify.tree_check as tree_check
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.errors import SpecdecError
from specdec_cli.target_model import families
from specdec_cli.target_model.verify.rollback import keep_accepted, truncate_cache

BUDGET = 12  # nodes per verify: deep enough for a tree path longer than the window
NEW = 24
BIG_VOCAB = 262_144  # Gemma 3's vocabulary


# (test id, family, vocabulary, attention implementation or None for the family's default, seed or 0)
VARIANTS = [
    ("llama", "llama", 64, None, 0),
    ("llama-eager", "llama", 64, "eager", 0),  # eager attention adds its mask: a float mask, not a bool one
    ("qwen2", "qwen2", 64, None, 0),
    ("qwen3-hybrid", "qwen3", 64, None, 0),
    ("mistral", "mistral", 64, None, 0),
    ("phi3", "phi3", 64, None, 0),
    ("smollm3", "smollm3", 64, None, 0),
    ("gemma", "gemma", 64, None, 0),
    ("gemma2", "gemma2", 64, None, 0),
    ("gemma3_text", "gemma3_text", 64, None, 5),
    ("gemma3_text-262k", "gemma3_text", BIG_VOCAB, None, 0),
]


class Family:
    def __init__(self, name, family, vocab, attention, seed):
        self.name, self.vocab = name, vocab
        self.model = family_model(family, vocab, attention, seed)
        self.references = [hf_greedy(self.model, prompt, NEW, eos=EOS) for prompt in PROMPTS]


@pytest.fixture(scope="module", params=VARIANTS, ids=[variant[0] for variant in VARIANTS])
def family(request):
    return Family(*request.param)

def _config_for(**settings) -> GenerationConfig:
    settings = {"max_new_tokens": NEW, "draft_max": BUDGET, "eos_token_ids": (EOS,), "cost_aware": False, **settings}
    return GenerationConfig(**settings)


# -- tree masks ------------------------------------------------------------------------------------------------


def test_the_tree_list_names_every_family_tested_here():
    assert {"llama", "qwen2", "qwen3", "mistral", "phi3", "smollm3", "gemma", "gemma2", "gemma3_text"} \
        == {model_type for model_type in families.FAMILIES if families.takes_trees(model_type)}


@pytest.mark.parametrize("shape", ["bushy", "deeper-than-the-window"])
def test_tree_logits_equal_sequential_decoding(family, shape):
    from transformers import DynamicCache

    model = family.model
    engine = fixed_engine(model)
    if shape == "bushy":  # two roots, duplicate tokens at two depths
        tokens, parents = [20, 21, 22, 23, 24, 20], [-1, -1, 0, 0, 1, 3]
    else:  # a junk root, then a 10-deep chain: its deepest nodes see neither the prefix nor the root
        tokens, parents = [30, *range(40, 50)], [-1, -1, *range(1, 10)]
    prompt = PROMPTS[0]
    with torch.inference_mode():
        cache = DynamicCache()
        engine.forward(prompt[:-1], cache, 0)
        tree_logits = engine.forward([prompt[-1], *tokens], cache, len(prompt) - 1, tree=parents).logits  # [n+1, V]
        for row in range(len(tokens) + 1):
            sequence = prompt + [tokens[node] for node in tree_path(parents, row - 1)]
            reference = model(torch.tensor([sequence])).logits[0, -1]  # [V]
            assert torch.allclose(tree_logits[row], reference, atol=1e-4, rtol=1e-4), (family.name, row)
    assert engine.supports_trees and engine.tree_outcome.state == "passed", engine.tree_check


@pytest.mark.parametrize("kind", ["pld", "chain", "model", "tree", "recycle", "aded"])
def test_every_drafter_kind_is_greedy_identical(family, kind):
    for index, prompt in enumerate(PROMPTS):
        engine = fixed_engine(family.model)
        generation = engine.generate(prompt, family_drafter(kind, family, index), _config_for())
        assert generation.tokens == family.references[index], (family.name, kind, index)
        if kind in ("chain", "tree", "model") and len(generation.tokens) > 8:
            assert generation.stats.mean_accepted_tokens > 1.5, (family.name, kind)
        if kind == "tree":  # the trees were verified as trees, and paths deeper than the window accepted
            assert engine.tree_outcome.state == "passed"
            assert any(event.draft.parents is not None and len(event.accepted_path) > WINDOW
                       for event in generation.events) or len(generation.tokens) < NEW


# -- sampling ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family_name,kind", [("gemma2", "tree"), ("mistral", "model")])
def test_sampling_keeps_the_law_past_the_window(family_name, kind):
    """Seeded Monte-Carlo: the 2nd new token (the first one a verify forward decides) after a prompt longer than
    the window follows the model's own law, with a tree (gemma2: eager attention, mixed layers) or the model
    drafter and its draft distributions (mistral)."""
    from specdec_cli.drafters.model import ModelDrafter

    model = family_model(family_name, seed=7)
    prompt = PROMPTS[1]
    law = second_token_law(model, prompt)
    engine = fixed_engine(model)
    if kind == "tree":
        drafter = LikelyTree(torch.topk(law, 2).indices.tolist(), 64)
    else:
        drafter = ModelDrafter(perturbed(model, 0.1), draft_max=3, eos_token_ids=())
    counts = torch.zeros(64, dtype=torch.float64)
    runs = 500
    for seed in range(runs):
        config = _config_for(max_new_tokens=3, temperature=1.0, seed=seed, eos_token_ids=(), draft_max=5)
        counts[engine.generate(prompt, drafter, config).tokens[1]] += 1
    assert engine.tree_outcome.state == ("passed" if kind == "tree" else "not checked")
    statistic, dof = chi_square(counts, law)
    # mean dof, sd sqrt(2 dof): 5 sd is a one-in-millions false alarm; a biased rule overshoots by far
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)


# -- the tree self-check -----------------------------------------------------------------------------------------


def _tree_generation(model, prompt, engine=None):
    reference = hf_greedy(model, prompt, 20, eos=EOS)
    engine = engine or fixed_engine(model)
    drafter = ScriptedTree(reference, len(prompt), model.config.vocab_size)
    return reference, engine, engine.generate(prompt, drafter, _config_for(max_new_tokens=20))


def test_the_self_check_costs_five_small_forwards_and_runs_once():
    model = family_model("gemma3_text", seed=2)
    calls = []
    original = model.forward

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[-1])
        return original(*args, **kwargs)

    model.forward = counting
    engine = fixed_engine(model)
    assert engine.tree_outcome.state == "not checked"
    assert engine.supports_trees and engine.tree_check == "passed"
    assert len(calls) == 5 and max(calls) <= 11, calls  # prompt, tree, three leaf chains
    assert engine.supports_trees and len(calls) == 5  # decided once per engine
    assert model.config.sliding_window == WINDOW  # the window shortened for the check is restored


def test_a_model_whose_attention_ignores_the_tree_mask_falls_back_to_chains():
    """A mismatch means chains for that model, with one warning, and the output stays exact."""
    model = family_model("llama", seed=3)
    original = model.forward

    def ignore_custom_masks(*args, **kwargs):
        kwargs.pop("attention_mask", None)  # as a family without 4-D mask support behaves
        return original(*args, **kwargs)

    model.forward = ignore_custom_masks
    with pytest.warns(UserWarning, match="token trees are verified as chains") as caught:
        reference, engine, generation = _tree_generation(model, PROMPTS[0])
    assert len([w for w in caught if "token trees" in str(w.message)]) == 1
    assert generation.tokens == reference
    assert engine.tree_outcome.state == "failed" and not engine.supports_trees
    assert engine.tree_outcome.detail.startswith("tree node"), engine.tree_check
    assert all(event.draft.parents is None for event in generation.events)  # trees became chains


def test_a_model_that_refuses_custom_masks_falls_back_to_chains():
    """An attention implementation that raises on a 4-D mask (as some kernels do) fails the check, not the run."""
    model = family_model("qwen2", seed=4)
    original = model.forward

    def refuse(*args, **kwargs):
        mask = kwargs.get("attention_mask")
        if isinstance(mask, dict) or (mask is not None and mask.dim() == 4):
            raise NotImplementedError("custom 4-D masks are not supported\nsecond line")
        return original(*args, **kwargs)

    model.forward = refuse
    with pytest.warns(UserWarning, match="chains"):
        reference, engine, generation = _tree_generation(model, PROMPTS[1])
    assert generation.tokens == reference
    assert engine.tree_check == ("failed: the tree forward raised NotImplementedError "
                                 "(custom 4-D masks are not supported)")


def test_the_self_check_catches_a_window_mask_gone_wrong_even_with_a_long_window(monkeypatch):
    """With Mistral's real 4096-token window, a tree mask that forgot the window would agree with sequential
    decoding on any short prompt; the check shortens the window, so it does not agree there."""
    model = family_model("mistral", sliding_window=4096, seed=5)
    real_mask = target_forward.tree_attention_mask

    def windowless(config, *args, **kwargs):
        unwindowed = copy.copy(config)
        unwindowed.sliding_window = None
        return real_mask(unwindowed, *args, **kwargs)

    monkeypatch.setattr(target_forward, "tree_attention_mask", windowless)
    with pytest.warns(UserWarning, match="chains"):
        reference, engine, generation = _tree_generation(model, PROMPTS[0])
    assert engine.tree_outcome.state == "failed", engine.tree_check
    assert engine.tree_outcome.detail.startswith("tree node")
    assert generation.tokens == reference and model.config.sliding_window == 4096
    monkeypatch.setattr(tree_check, "CHECK_WINDOW", 10**6)  # without the shortening: fooled
    assert fixed_engine(model).supports_trees


def test_a_family_outside_the_list_works_with_chains(monkeypatch):
    model = family_model("qwen2", seed=5)
    monkeypatch.setattr(model.config, "model_type", "some-new-family")
    with pytest.warns(UserWarning, match="chains"):
        reference, engine, generation = _tree_generation(model, PROMPTS[1])
    assert generation.tokens == reference
    assert engine.tree_check == "chains only: some-new-family is not a family checked with tree masks"


def test_layers_of_another_kind_get_chains(monkeypatch):
    model = family_model("qwen2", seed=6)
    monkeypatch.setattr(model.config, "layer_types", ["full_attention", "chunked_attention"])
    engine = fixed_engine(model)
    with pytest.warns(UserWarning, match="chains"):
        assert not engine.supports_trees
    assert engine.tree_check == "chains only: no tree mask for chunked_attention layers"


# -- caches under sliding windows -----------------------------------------------------------------------------


def test_a_cache_that_keeps_only_the_window_is_refused_not_wrong():
    """transformers' DynamicCache(config=...) keeps only the last window - 1 entries of a sliding layer, so a
    rollback past the window cannot be done: the engine refuses such a cache in one line, from the first
    rollback on (its own caches keep every entry)."""
    from transformers import DynamicCache

    model = family_model("gemma3_text", seed=8)
    engine = fixed_engine(model)
    prompt = PROMPTS[0]
    with torch.inference_mode():
        short = DynamicCache(config=model.config)
        engine.forward(prompt[:6], short, 0)  # within the window, refused all the same
        with pytest.raises(SpecdecError, match="does not keep every token"):
            keep_accepted(short, 3, [1], False, 4)
        cache = DynamicCache(config=model.config)
        engine.forward(prompt, cache, 0)  # past the window
        assert [layer.keys.shape[-2] for layer in cache.layers] == [WINDOW - 1, len(prompt)]
        with pytest.raises(SpecdecError, match=r"layer 0 \(DynamicSlidingWindowLayer\) does not keep every token"):
            truncate_cache(cache, len(prompt) - 3)
        with pytest.raises(SpecdecError, match="does not keep every token"):
            keep_accepted(cache, len(prompt) - 4, [1, 2], False, len(prompt) - 1)
        plain = DynamicCache()
        engine.forward(prompt, plain, 0)
        assert [layer.keys.shape[-2] for layer in plain.layers] == [len(prompt)] * 2  # what the engine uses


# -- context limits --------------------------------------------------------------------------------------------


def test_prompts_longer_than_the_context_are_refused_and_answers_stop_at_its_end():
    from specdec_cli.drafters.pld import PromptLookupDrafter

    model = family_model("llama", seed=11)  # 256 positions
    engine = fixed_engine(model)
    config = GenerationConfig(max_new_tokens=50, draft_max=8, eos_token_ids=())
    with pytest.raises(SpecdecError, match="the prompt has 300 tokens, but this model reads at most 256"):
        engine.generate([5] * 300, PromptLookupDrafter(), config)
    generation = engine.generate([5, 6, 7] * 83, PromptLookupDrafter(), config)  # 249 tokens: room for 7
    assert len(generation.tokens) == 7 and generation.finish_reason == "length"
    context_len = 249 + len(generation.events[0].committed)
    for event in generation.events[1:]:  # every verify forward (padding rows included) fits the 256 positions
        past = context_len - 1
        context_len += len(event.committed)
        assert past + event.verify_rows <= 256 and context_len <= 256


def test_infinite_temperature_is_refused():
    with pytest.raises(SpecdecError, match="finite"):
        GenerationConfig(temperature=float("inf")).check()
