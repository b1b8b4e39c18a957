"""The `model` drafter: exact greedy output, self-drafting accepts nearly everything, its cache follows rollbacks."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_EOS, TINY_VOCAB, hf_greedy

PROMPTS = [[1, 5, 9, 14, 20, 7], [1, 30, 31, 32, 33, 34, 35, 36, 12, 40, 2, 6], [1, 17]]


def _tiny_draft(vocab=TINY_VOCAB, seed=99, layers=1):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         initializer_range=0.3, eos_token_id=TINY_EOS, bos_token_id=1, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def _generate(model, drafter, prompt, **settings):
    """One generation with every draft token verified (no cost-aware trimming, when the engine has it)."""
    from dataclasses import fields

    from specdec_cli.decoding.engine import Engine, GenerationConfig

    if any(field.name == "cost_aware" for field in fields(GenerationConfig)):
        settings["cost_aware"] = False
    settings.setdefault("eos_token_ids", (TINY_EOS,))
    config = GenerationConfig(max_new_tokens=settings.pop("max_new_tokens", 40), **settings)
    return Engine(model).generate(prompt, drafter, config)


@pytest.mark.parametrize("draft_max", [1, 4])
def test_greedy_output_is_plain_greedy(tiny_model, draft_max):
    from specdec_cli.drafters.model import ModelDrafter

    drafter = ModelDrafter(_tiny_draft(), draft_max=draft_max, eos_token_ids=(TINY_EOS,))
    for prompt in PROMPTS:  # one drafter across prompts: its cache must restart cleanly
        generation = _generate(tiny_model, drafter, prompt)
        assert generation.tokens == hf_greedy(tiny_model, prompt, 40)
        assert generation.stats.drafted_tokens > 0


def test_self_draft_accepts_nearly_everything(tiny_llama):
    from specdec_cli.drafters.model import ModelDrafter

    drafter = ModelDrafter(tiny_llama, draft_max=6, eos_token_ids=(TINY_EOS,))
    generation = _generate(tiny_llama, drafter, PROMPTS[1], max_new_tokens=60)
    assert generation.tokens == hf_greedy(tiny_llama, PROMPTS[1], 60)
    stats = generation.stats
    assert stats.acceptance_rate > 0.9
    if stats.new_tokens >= 20:
        assert stats.mean_accepted_tokens > 4.0


def test_self_draft_under_sampling_uses_the_warped_distribution(tiny_llama):
    """p_draft == p_target (same model, same warping) means every draft token is accepted."""
    from specdec_cli.drafters.model import ModelDrafter

    settings = dict(max_new_tokens=40, temperature=1.3, top_k=12, top_p=0.9, seed=3, eos_token_ids=())
    drafter = ModelDrafter(tiny_llama, draft_max=5)
    generation = _generate(tiny_llama, drafter, PROMPTS[0], **settings)
    assert generation.stats.drafted_tokens > 20
    assert generation.stats.acceptance_rate > 0.95
    again = _generate(tiny_llama, ModelDrafter(tiny_llama, draft_max=5), PROMPTS[0], **settings)
    assert again.tokens == generation.tokens  # seeded runs repeat


def test_sampling_drafts_carry_distributions(tiny_llama):
    from specdec_cli.decoding.draft import Draft, StepEvent
    from specdec_cli.decoding.engine import GenerationConfig
    from specdec_cli.drafters.model import ModelDrafter

    drafter = ModelDrafter(_tiny_draft(), draft_max=4)
    settings = GenerationConfig(temperature=0.8, top_k=5, seed=1)
    drafter.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[7],
                              settings=settings))
    draft = drafter.propose(PROMPTS[0], 3)
    assert len(draft) == 3 and draft.p_draft is not None
    assert tuple(draft.p_draft.shape) == (3, TINY_VOCAB)
    assert torch.allclose(draft.p_draft.sum(-1), torch.ones(3), atol=1e-5)
    assert ((draft.p_draft > 0).sum(-1) <= 5).all()  # top-k applied
    for row, token in zip(draft.p_draft, draft.tokens):
        assert row[token] > 0


def test_cache_rollback_matches_a_fresh_drafter():
    from specdec_cli.drafters.model import ModelDrafter

    model = _tiny_draft(seed=5, layers=2)
    cached = ModelDrafter(model, draft_max=5)
    context = list(PROMPTS[1])
    for step in range(6):
        draft = cached.propose(context, 5)
        fresh = ModelDrafter(model, draft_max=5).propose(context, 5)
        assert draft.tokens == fresh.tokens
        # accept a prefix of the draft, then a token the draft did not predict (a correction)
        keep = step % (len(draft) + 1)
        context = context + draft.tokens[:keep] + [(draft.tokens[keep] + 1) % TINY_VOCAB if keep < len(draft) else 11]
    diverged = context[:4] + [50, 51]  # a different conversation sharing a short prefix
    assert cached.propose(diverged, 3).tokens == ModelDrafter(model, draft_max=5).propose(diverged, 3).tokens
    assert cached.tokens == diverged + cached.tokens[len(diverged):]


def test_min_prob_stops_the_chain(tiny_llama):
    from specdec_cli.drafters.model import ModelDrafter

    never = ModelDrafter(_tiny_draft(), draft_max=4, min_prob=1.0)
    assert len(never.propose(PROMPTS[0], 4)) == 0
    generation = _generate(tiny_llama, never, PROMPTS[0])
    assert generation.tokens == hf_greedy(tiny_llama, PROMPTS[0], 40)
    assert generation.stats.drafted_tokens == 0


def test_budget_and_draft_max():
    from specdec_cli.drafters.model import ModelDrafter

    drafter = ModelDrafter(_tiny_draft(), draft_max=3)
    assert len(drafter.propose(PROMPTS[0], 10)) <= 3
    assert len(drafter.propose(PROMPTS[0], 0)) == 0


def test_drafts_what_it_is_asked_for():
    """No length rule of its own (the engine's planner sizes its drafts): what was verified changes nothing."""
    from specdec_cli.decoding.draft import Draft, StepEvent
    from specdec_cli.drafters.model import ModelDrafter

    drafter = ModelDrafter(_tiny_draft(), draft_max=6)
    for _ in range(12):
        draft = drafter.propose(PROMPTS[0], 8)
        assert len(draft) == 6
        drafter.observe(StepEvent(kind="step", draft=Draft.empty(draft.source), committed=[3]))
    forwards = drafter.forwards
    assert len(drafter.propose(PROMPTS[0], 0)) == 0 and drafter.forwards == forwards  # asked for nothing: no forward


def test_vocabulary_mismatch_is_refused(tmp_path):
    from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter
    from specdec_cli.errors import SpecdecError

    _tiny_draft(vocab=80).save_pretrained(tmp_path / "draft")
    target = TargetInfo(vocab_size=TINY_VOCAB, eos_token_ids=(TINY_EOS,), fingerprint="")
    with pytest.raises(SpecdecError, match=r"80.*64"):
        make_drafter("model", DrafterOptions(draft_model=str(tmp_path / "draft")), target)


def test_missing_draft_model_is_an_error(tmp_path):
    from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter
    from specdec_cli.errors import SpecdecError

    target = TargetInfo(vocab_size=TINY_VOCAB, eos_token_ids=(TINY_EOS,))
    with pytest.raises(SpecdecError, match="needs a draft model directory"):
        make_drafter("model", DrafterOptions(), target)
    with pytest.raises(SpecdecError, match="no such directory"):
        make_drafter("model", DrafterOptions(draft_model=str(tmp_path / "nope")), target)


def test_restricted_head_drafts_only_allowed_tokens(tiny_model):
    from specdec_cli.drafters.model import ModelDrafter

    head = list(range(0, TINY_VOCAB, 2))  # even ids, plus whatever the context shows
    drafter = ModelDrafter(_tiny_draft(), draft_max=4, eos_token_ids=(TINY_EOS,), head_tokens=head)
    seen: set = set()  # context tokens join the head (and stay while conversations share a prefix)
    for prompt in PROMPTS:
        generation = _generate(tiny_model, drafter, prompt)
        assert generation.tokens == hf_greedy(tiny_model, prompt, 40)
        seen |= set(prompt) | set(generation.tokens)
        drafted = [token for event in generation.events for token in event.draft.tokens]
        assert drafted and all(token % 2 == 0 or token in seen for token in drafted)


def test_restricted_head_under_sampling(tiny_llama):
    from specdec_cli.decoding.draft import Draft, StepEvent
    from specdec_cli.decoding.engine import GenerationConfig
    from specdec_cli.drafters.model import ModelDrafter

    drafter = ModelDrafter(tiny_llama, draft_max=4, head_tokens=[0, 2, 4, 6, 8])
    settings = GenerationConfig(temperature=1.0, seed=2)
    drafter.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[7],
                              settings=settings))
    draft = drafter.propose(PROMPTS[0], 4)
    allowed = {0, 2, 4, 6, 8} | set(PROMPTS[0]) | set(draft.tokens)
    support = set(torch.nonzero(draft.p_draft.sum(0)).flatten().tolist())
    assert support <= allowed
    generation = _generate(tiny_llama, ModelDrafter(tiny_llama, draft_max=4, head_tokens=[0, 2, 4, 6, 8]), PROMPTS[0],
                           temperature=1.0, seed=2, eos_token_ids=())
    assert len(generation.tokens) == 40 and generation.stats.drafted_tokens > 0


def test_the_draft_goes_on_the_targets_device(monkeypatch, tmp_path):
    """`--device cuda` puts the target on the GPU; its draft must follow (the placement, with the device
    injected, since this machine has no GPU)."""
    from specdec_cli.drafters import DrafterOptions, TargetInfo
    from specdec_cli.drafters import model as model_module

    seen = {}

    def fake_load(directory, target, device="cpu", dtype=None):
        seen["device"] = device
        return _tiny_draft(), None, {}

    monkeypatch.setattr(model_module, "load_draft_model", fake_load)
    target = TargetInfo(vocab_size=TINY_VOCAB, eos_token_ids=(TINY_EOS,), device="cuda:0")
    model_module.make_model_drafter(DrafterOptions(draft_model=str(tmp_path)), target)
    assert seen["device"] == "cuda:0"


def test_target_info_names_the_targets_device(tiny_llama):
    from conftest import make_char_tokenizer

    from specdec_cli.drafters import target_info

    assert target_info(tiny_llama, make_char_tokenizer()).device == "cpu"
