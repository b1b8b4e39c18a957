"""Every model family README promises, on tiny models built from configs (no downloads): tree logits equal
sequential decoding where the engine verifies trees, every kind of drafter is greedy-identical to
transformers' `generate`, sampling keeps the target's law, and sliding-window attention (prompts longer than
the window) stays exact because such models verify chains. A family outside the list still works with
chains, and the engine's tree self-check catches a model whose attention ignores the tree mask."""

from __future__ import annotations

import pytest
import torch
from conftest import chi_square, hf_greedy

from specdec_cli.cost_curve import CostCurve
from specdec_cli.draft import Draft
from specdec_cli.drafters.pld import PromptLookupDrafter
from specdec_cli.engine import TREE_MODEL_TYPES, Engine, GenerationConfig
from specdec_cli.planner import DraftPlanner

EOS = 3
WINDOW = 8  # sliding windows are this short, so every prompt below is longer than the window
PROMPTS = [
    [1, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11],
    [1, 5, 6, 7, 8, 9, 20, 21, 22, 23, 24, 25, 26, 27, 5, 6, 7, 8],
]


# family -> (its transformers config class, what differs from the common tiny settings)
CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "llama-big-vocab": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "mistral": ("MistralConfig", {"sliding_window": WINDOW}),
    "phi3": ("Phi3Config", {}),
    "smollm3": ("SmolLM3Config", {}),
    "gemma": ("GemmaConfig", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": WINDOW}),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": WINDOW,
                                         "layer_types": ["sliding_attention", "full_attention"]}),
}


def _config(family: str, vocab: int):
    import transformers

    name, extra = CONFIGS[family]
    return getattr(transformers, name)(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.3, eos_token_id=EOS,
        bos_token_id=1, pad_token_id=0, **extra)


FAMILIES = list(CONFIGS)


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    from transformers import AutoModelForCausalLM

    vocab = 4096 if request.param == "llama-big-vocab" else 64
    torch.manual_seed(sum(map(ord, request.param)))
    model = AutoModelForCausalLM.from_config(_config(request.param, vocab)).eval()
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = 0
    return request.param, model


def _engine(model) -> Engine:
    return Engine(model, planner=DraftPlanner(CostCurve.fixed({1: 1.0, 64: 1.0})))


class Scripted:
    """The true continuation as a chain, or hidden as a later sibling in a tree (junk first)."""

    def __init__(self, reference, prompt_len, vocab, tree=False):
        self.name = "tree" if tree else "chain"
        self.reference, self.prompt_len, self.vocab, self.tree = reference, prompt_len, vocab, tree

    def propose(self, context, budget):
        done = len(context) - self.prompt_len
        truth = self.reference[done : done + min(budget, 4)]
        if not self.tree:
            return Draft(truth, self.name)
        tokens, parents, parent = [], [], -1
        for token in truth[:3]:
            tokens += [(token + 1) % self.vocab, token]
            parents += [parent, parent]
            parent = len(tokens) - 1
        return Draft(tokens[:budget], self.name, parents=parents[:budget])

    def observe(self, event):
        pass


def test_the_tree_list_names_only_families_without_sliding_windows():
    assert {"llama", "qwen2", "qwen3", "phi3", "smollm3", "gemma"} <= TREE_MODEL_TYPES
    assert not {"mistral", "gemma2", "gemma3_text"} & TREE_MODEL_TYPES


def test_tree_logits_equal_sequential_decoding_or_trees_are_off(family_model):
    from transformers import DynamicCache

    family, model = family_model
    engine = _engine(model)
    tokens, parents = [20, 21, 22, 23, 24, 20], [-1, -1, 0, 0, 1, 3]
    prompt = PROMPTS[0]
    with torch.inference_mode():
        cache = DynamicCache()
        engine._forward(prompt[:-1], cache, 0)
        tree_logits = engine._forward([prompt[-1], *tokens], cache, len(prompt) - 1, tree=parents)
        matches = []
        for row in range(len(tokens) + 1):
            path, node = [], row - 1
            while node >= 0:
                path.append(tokens[node])
                node = parents[node]
            reference = model(torch.tensor([prompt + path[::-1]])).logits[0, -1]
            matches.append(torch.allclose(tree_logits[row], reference, atol=1e-4))
    if engine.supports_trees:
        assert all(matches), (family, matches)
        assert engine.tree_check == "passed"
    else:  # a sliding window the tree mask cannot express: chains only, and said so
        assert engine.tree_check == "chains only: sliding-window attention, which one tree mask cannot express"
        assert not all(matches)  # and indeed: past the window the tree's logits are wrong


@pytest.mark.parametrize("kind", ["pld", "chain", "tree", "model"])
def test_every_drafter_kind_is_greedy_identical(family_model, kind):
    from specdec_cli.drafters.model import ModelDrafter

    family, model = family_model
    vocab = model.config.vocab_size
    for prompt in PROMPTS:
        reference = hf_greedy(model, prompt, 24, eos=EOS)
        if kind == "pld":
            drafter = PromptLookupDrafter()
        elif kind == "model":
            drafter = ModelDrafter(model, draft_max=4, eos_token_ids=(EOS,))  # the target drafting for itself
        else:
            drafter = Scripted(reference, len(prompt), vocab, tree=kind == "tree")
        config = GenerationConfig(max_new_tokens=24, budget=8, eos_token_ids=(EOS,))
        generation = _engine(model).generate(prompt, drafter, config)
        assert generation.tokens == reference, (family, kind, prompt)
        if kind in ("chain", "model") and len(reference) > 4:
            assert generation.stats.mean_accepted_tokens > 1.5, (family, kind)


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_sampling_keeps_the_law_past_the_window(family):
    """Seeded Monte-Carlo: the first sampled token after a long prompt follows the model's own law, with a
    scripted drafter that is right half the time."""
    from transformers import AutoModelForCausalLM

    from specdec_cli.sampling import warp_probs

    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(_config(family, 64)).eval()
    prompt = PROMPTS[1]
    with torch.inference_mode():
        law = warp_probs(model(torch.tensor([prompt])).logits[0, -1], 1.0).double()  # [vocab]
    guess = int(law.argmax())

    class Half:
        name = "half"

        def propose(self, context, budget):
            return Draft([guess if len(context) % 2 else (guess + 1) % 64], self.name)

        def observe(self, event):
            pass

    engine = _engine(model)
    counts = torch.zeros(64, dtype=torch.float64)
    runs = 600
    for seed in range(runs):
        config = GenerationConfig(max_new_tokens=2, temperature=1.0, seed=seed, eos_token_ids=(), budget=2)
        counts[engine.generate(prompt, Half(), config).tokens[0]] += 1
    statistic, dof = chi_square(counts, law)
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)


def test_a_model_whose_attention_ignores_the_tree_mask_falls_back_to_chains():
    """The self-check compares a small tree's logits with sequential ones the first time a tree would be
    verified; a mismatch means chains for that model, with one warning, and the output stays exact."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(_config("llama", 64)).eval()
    original = model.forward

    def ignore_custom_masks(*args, **kwargs):
        kwargs.pop("attention_mask", None)  # as a family without 4-D mask support behaves
        return original(*args, **kwargs)

    model.forward = ignore_custom_masks
    engine, generation = _tree_drafts_on(model, PROMPTS[0])
    assert not engine.supports_trees and engine.tree_check.startswith("failed")
    assert all(event.draft.parents is None for event in generation.events)  # trees became chains


def test_a_family_outside_the_list_works_with_chains(monkeypatch):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(_config("qwen2", 64)).eval()
    monkeypatch.setattr(model.config, "model_type", "some-new-family")
    engine, _ = _tree_drafts_on(model, PROMPTS[1])
    assert engine.tree_check.startswith("chains only")


def _tree_drafts_on(model, prompt):
    """Tree drafts on a model that must verify chains: one warning, and the output is still exact."""
    reference = hf_greedy(model, prompt, 20, eos=EOS)
    engine = _engine(model)
    with pytest.warns(UserWarning, match="token trees are verified as chains"):
        generation = engine.generate(prompt, Scripted(reference, len(prompt), 64, tree=True),
                                     GenerationConfig(max_new_tokens=20, budget=8, eos_token_ids=(EOS,)))
    assert generation.tokens == reference
    return engine, generation


def test_prompts_longer_than_the_context_are_refused_and_answers_stop_at_its_end():
    from transformers import AutoModelForCausalLM

    from specdec_cli.errors import SpecdecError

    torch.manual_seed(11)
    model = AutoModelForCausalLM.from_config(_config("llama", 64)).eval()  # 256 positions
    engine = _engine(model)
    config = GenerationConfig(max_new_tokens=50, budget=8, eos_token_ids=())
    with pytest.raises(SpecdecError, match="the prompt has 300 tokens, but this model reads at most 256"):
        engine.generate([5] * 300, PromptLookupDrafter(), config)
    generation = engine.generate([5, 6, 7] * 83, PromptLookupDrafter(), config)  # 249 tokens: room for 7
    assert len(generation.tokens) == 7 and generation.finish_reason == "length"
    assert all(event.context_len <= 256 for event in generation.events)
    for event in generation.events[1:]:  # every verify forward (padding rows included) fits the 256 positions
        past = event.context_len - len(event.committed) - 1
        assert past + event.verify_rows <= 256


def test_infinite_temperature_is_refused():
    from specdec_cli.errors import SpecdecError

    with pytest.raises(SpecdecError, match="finite"):
        GenerationConfig(temperature=float("inf")).check()
