"""Row-invariant verification (exact.py): in bfloat16 (and float32 when asked), speculative output is
token-identical to the engine's own plain decoding, because a token's logits no longer depend on how many
tokens share its forward.

The attention function is checked against one-row calls without a model; then, per family in bfloat16, every
drafter kind (chains, trees, the model drafter) against plain decoding through the same engine; sampling keeps
the model's law; and where exactness cannot be had (eager attention) the engine says so and goes on.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch
from conftest import chi_square, fixed_engine
from helpers import EOS, PROMPTS, LikelyTree, family_drafter, family_model, second_token_law

from specdec_cli.decoding.cost_curve import CostCurve
from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.decoding.planner import DraftPlanner
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.target_model.load.forward_choice import choose_forward
from specdec_cli.target_model.verify.exact import _pad_rows, exact_rows, install, row_invariant, rowwise_attention
from specdec_cli.target_model.verify.tree_mask import tree_attention_mask, tree_layout

NEW = 32
BUDGET = 7  # chains and trees of up to 7 nodes: blocks of up to 8 rows


class _Layer:
    """What rowwise_attention reads from an attention layer."""

    specdec_exact_rows = 16


def _qkv(rows: int, cached: int, dtype=torch.bfloat16):
    generator = torch.Generator().manual_seed(rows * 100 + cached)
    query = torch.randn(1, 6, rows, 16, generator=generator).to(dtype)  # 6 heads sharing 2 key/value heads
    key = torch.randn(1, 2, cached + rows, 16, generator=generator).to(dtype)
    value = torch.randn(1, 2, cached + rows, 16, generator=generator).to(dtype)
    return query, key, value


def _one_row(query, key, value, row, keys):
    """The attention of query row `row` alone over key positions `keys` (a one-row step's call)."""
    out, _ = rowwise_attention(_Layer(), query[:, :, row : row + 1], key[:, :, keys], value[:, :, keys], None,
                               scaling=0.25)
    return out[0, 0]  # [heads, d]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_each_row_equals_a_one_row_call_over_its_own_keys(dtype):
    from torch.nn.functional import scaled_dot_product_attention

    cached, rows = 37, 6
    query, key, value = _qkv(rows, cached, dtype)
    # a chain under the causal mask (None), then a tree: row r's keys are the prefix and its ancestors
    parents = [-1, -1, 0, 1, 3]
    depth, ancestors = tree_layout(parents)
    tree_mask = tree_attention_mask(type("Config", (), {})(), cached, depth, ancestors)  # [1, 1, 6, 43] bool
    for mask in (None, tree_mask):
        block, _ = rowwise_attention(_Layer(), query, key, value, mask, scaling=0.25)  # [1, rows, heads, d]
        for row in range(rows):
            allowed = (torch.arange(cached + row + 1) if mask is None else mask[0, 0, row].nonzero().squeeze(-1))
            assert torch.equal(block[0, row], _one_row(query, key, value, row, allowed)), (mask is None, row)
        # and it is attention: close to SDPA over the whole block with the same mask
        causal = torch.ones(rows, cached + rows, dtype=torch.bool).tril(cached)[None, None]
        reference = scaled_dot_product_attention(query, key.repeat_interleave(3, 1), value.repeat_interleave(3, 1),
                                                 attn_mask=causal if mask is None else mask, scale=0.25)
        assert torch.allclose(block.transpose(1, 2).float(), reference.float(), atol=2e-2)


def test_padded_linear_layers_return_only_the_real_rows():
    layer = torch.nn.Linear(8, 5)
    before, after = _pad_rows(4)
    layer.register_forward_pre_hook(before)
    layer.register_forward_hook(after)
    inputs = torch.randn(1, 3, 8)
    with torch.inference_mode():
        out = layer(inputs)  # run as 4 rows, 3 returned
        padded = torch.nn.functional.linear(torch.cat([inputs, torch.zeros(1, 1, 8)], 1), layer.weight, layer.bias)
        assert out.shape == (1, 3, 5) and torch.equal(out, padded[:, :3])
        assert layer(torch.randn(1, 9, 8)).shape == (1, 9, 5)  # bigger calls (a prefill) run as they are


def test_exact_rows_cover_the_planners_padding():
    assert exact_rows(0) == 1 and exact_rows(7) == 8 and exact_rows(8) == 12 and exact_rows(40) == 41


# -- whole models ------------------------------------------------------------------------------------------------

FAMILIES = ["llama", "qwen2", "mistral", "gemma", "qwen3"]


@pytest.fixture(scope="module", params=FAMILIES)
def bf16_family(request):
    """A tiny model of the family in bfloat16, and its plain greedy answers through an exact engine."""
    model = family_model(request.param, seed=11).to(torch.bfloat16)
    engine = fixed_engine(model, exact=True)
    references = [engine.generate(prompt, NoDrafter(), _config()).tokens for prompt in PROMPTS]
    assert engine.forward.outcome.state == "on", engine.forward.outcome.text()
    return type("Family", (), {"name": request.param, "model": model, "vocab": 64, "references": references})

def _config(**settings) -> GenerationConfig:
    return GenerationConfig(**{"max_new_tokens": NEW, "draft_max": BUDGET, "eos_token_ids": (EOS,), **settings})


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pld", "chain", "tree", "model", "recycle", "aded"])
def test_bfloat16_speculation_is_identical_to_plain_decoding(bf16_family, kind):
    for index, prompt in enumerate(PROMPTS):
        engine = fixed_engine(bf16_family.model, exact=True)
        generation = engine.generate(prompt, family_drafter(kind, bf16_family, index), _config())
        assert generation.tokens == bf16_family.references[index], (bf16_family.name, kind, index)
        if kind in ("chain", "tree"):  # the drafts were long and mostly right: blocks of many rows were verified
            assert max(event.verify_rows for event in generation.events if event.kind == "step") >= 4


def test_float32_is_exact_by_construction_when_asked(tiny_llama):
    model = copy.deepcopy(tiny_llama)
    engine = fixed_engine(model, exact=True)
    plain = engine.generate(PROMPTS[0], NoDrafter(), _config())
    family = type("Family", (), {"model": model, "vocab": 64, "references": [plain.tokens, []]})
    for kind in ("chain", "tree"):
        assert engine.generate(PROMPTS[0], family_drafter(kind, family, 0), _config()).tokens == plain.tokens, kind
    assert engine.forward.outcome.state == "on"


def test_float32_is_left_alone_by_default(tiny_llama):
    engine = Engine(tiny_llama, planner=DraftPlanner(CostCurve.fixed({1: 1.0})))
    engine.generate(PROMPTS[0], NoDrafter(), _config(max_new_tokens=4))
    assert not engine.forward.exact and engine.forward.outcome.state == "off" and engine.forward.outcome.text() == "off"
    assert tiny_llama.config._attn_implementation == "sdpa"


@pytest.mark.slow
def test_sampling_keeps_the_law_in_bfloat16():
    model = family_model("llama", seed=7).to(torch.bfloat16)
    prompt = PROMPTS[1]
    law = second_token_law(model, prompt)
    engine = fixed_engine(model, exact=True)
    drafter = LikelyTree(torch.topk(law, 2).indices.tolist(), 64)
    counts = torch.zeros(64, dtype=torch.float64)
    for seed in range(400):
        config = _config(max_new_tokens=3, temperature=1.0, seed=seed, eos_token_ids=(), draft_max=5)
        counts[engine.generate(prompt, drafter, config).tokens[1]] += 1
    statistic, dof = chi_square(counts, law)
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)


def test_the_row_invariant_kernels_are_switched_on_for_a_forward_only():
    model = family_model("llama", seed=3).to(torch.bfloat16)
    state = install(model, 8)
    assert model.config._attn_implementation == "sdpa" and _padding_hooks(model) == 0
    state = dataclasses.replace(state, padded=[model.lm_head])  # as if its shape rounded rows differently here
    assert not hasattr(model, "specdec_exact_state")  # nothing of specdec's is left on the model
    with row_invariant(model, state):
        assert model.config._attn_implementation == "specdec_rowwise"
        assert _padding_hooks(model) == 2 * len(state.padded)  # before and after each padded layer's call
    assert model.config._attn_implementation == "sdpa" and _padding_hooks(model) == 0
    with pytest.raises(RuntimeError), row_invariant(model, state):
        raise RuntimeError("a forward that fails")
    assert model.config._attn_implementation == "sdpa" and _padding_hooks(model) == 0
    assert not any(module._forward_hooks for module in model.modules())


def test_where_exactness_cannot_be_had_the_engine_says_so_and_goes_on():
    model = family_model("llama", attention="eager", seed=3).to(torch.bfloat16)
    engine = fixed_engine(model, exact=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generation = engine.generate(PROMPTS[0], family_drafter("pld", _Fake(model), 0), _config(max_new_tokens=8))
    assert engine.forward.outcome.state == "failed", engine.forward.outcome.text()
    assert engine.forward.outcome.detail.startswith("row-invariant attention replaces SDPA attention")
    outcome = engine.forward.outcome
    assert outcome.text() == f"failed: {outcome.detail}"  # as displays and bench JSON show it
    assert any("not row-invariant" in str(warning.message) for warning in caught)
    assert len(generation.tokens) == 8 and model.config._attn_implementation == "eager"


class _Fake:
    def __init__(self, model):
        self.model, self.vocab, self.references = model, 64, [[], []]


@pytest.mark.slow
def test_one_forward_handed_to_engines_is_checked_once_and_leaves_the_model_alone(monkeypatch):
    import specdec_cli.target_model.verify.exact as exact

    model = family_model("llama", seed=3).to(torch.bfloat16)
    checks = []
    check = exact.block_mismatch
    monkeypatch.setattr(exact, "block_mismatch",
                        lambda model_, config, device, rows: checks.append(rows) or check(model_, config, device, rows))
    forward = choose_forward(model, exact=True)
    planner = DraftPlanner(CostCurve.fixed({1: 1.0, 64: 1.0}))
    first, second = Engine(forward, planner=planner), Engine(forward, planner=planner)
    assert first.forward is second.forward is forward
    assert forward.prepare(8) == forward.prepare(8) == exact_rows(8) and checks == [exact_rows(8)]  # checked once
    generation = first.generate(PROMPTS[0], NoDrafter(), _config(max_new_tokens=4))
    assert model.config._attn_implementation == "sdpa" and _padding_hooks(model) == 0  # between forwards: its own
    assert forward.prepare(20) == exact_rows(20) > exact_rows(8) and checks[-1] == exact_rows(20)
    assert second.generate(PROMPTS[0], NoDrafter(), _config(max_new_tokens=4)).tokens == generation.tokens
    for _ in range(2):  # bench's native rows: the model's own kernels, nothing re-checked
        with forward.own_kernels():
            assert forward.prepare(8) is None
            first.generate(PROMPTS[0], NoDrafter(), _config(max_new_tokens=4))
    assert len(checks) == 2 and forward.prepare(8) == exact_rows(20)
    assert model.config._attn_implementation == "sdpa" and _padding_hooks(model) == 0
    assert choose_forward(model, exact=True).outcome.state == "not checked"  # another forward checks for itself


def _padding_hooks(model) -> int:
    """exact.py's hooks on the model (transformers adds hooks of its own, to capture hidden states)."""
    return sum(hook.__qualname__.startswith("_pad_rows") for module in model.modules()
               for hook in [*module._forward_pre_hooks.values(), *module._forward_hooks.values()])
