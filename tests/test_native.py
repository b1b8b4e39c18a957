"""Block weights in the engine: specdec's native decoder computes what transformers' forward computes on the same
block layers, every drafter's greedy output equals plain decoding (chains and trees, native decoder or
transformers' forward), sampling keeps the model's law, and the KV cache rolls back like a DynamicCache."""

from __future__ import annotations

import pytest
import torch
from conftest import chi_square
from test_families import EOS, PROMPTS, LikelyTree, _drafter, _model, _second_token_law

from specdec_cli import kernels, native, quant
from specdec_cli.cost_curve import CostCurve
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.engine import Engine, GenerationConfig
from specdec_cli.kv_cache import KVCache
from specdec_cli.planner import DraftPlanner

pytestmark = pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")

NEW = 32


def _blocks(family: str, mode: str, seed: int = 11):
    model = _model(family, seed=seed)
    quant.install_blocks(model, quant.plan_blocks(model, mode, None))
    return model


def _engine(model) -> Engine:
    return Engine(model, planner=DraftPlanner(CostCurve.fixed({1: 1.0, 64: 1.0})))


def _config(**settings) -> GenerationConfig:
    return GenerationConfig(**{"max_new_tokens": NEW, "budget": 7, "eos_token_ids": (EOS,), **settings})


@pytest.mark.parametrize("family,mode", [("llama", "int4"), ("qwen2", "int8")])
def test_the_native_decoder_computes_what_transformers_computes(family, mode):
    model = _blocks(family, mode)
    assert native.unsupported(model) is None
    decoder = native.decoder_for(model)
    ids = torch.tensor([PROMPTS[1]])
    positions = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        reference = model(input_ids=ids, position_ids=positions, past_key_values=KVCache(), use_cache=True,
                          output_hidden_states=True)
        cache = KVCache()
        ours = decoder(input_ids=ids, position_ids=positions, past_key_values=cache, output_hidden_states=True)
        scale = float(reference.logits.abs().max())
        assert torch.allclose(ours.logits, reference.logits, atol=2e-3 * scale)
        assert torch.allclose(ours.hidden_states[-1], reference.hidden_states[-1], atol=2e-3 * scale)
        assert cache.get_seq_length() == ids.shape[1]
        last = decoder(input_ids=ids[:, -1:], position_ids=positions[:, -1:] + 1, past_key_values=cache,
                       logits_to_keep=1)
        assert last.logits.shape == (1, 1, model.config.vocab_size) and last.hidden_states is None


def test_what_the_native_decoder_leaves_to_transformers():
    assert "family" in native.unsupported(_blocks("qwen3", "int4"))
    dense = _model("llama", seed=3)
    assert "not a block layer" in native.unsupported(dense)
    assert native.decoder_for(dense) is None


@pytest.fixture(scope="module", params=[("llama", "int4"), ("qwen2", "int8"), ("qwen3", "int4")])
def block_family(request):
    """A tiny block-weight model (llama, qwen2: native decoder; qwen3: transformers' forward made row-invariant)
    and its plain greedy answers through the engine."""
    family, mode = request.param
    model = _blocks(family, mode)
    engine = _engine(model)
    references = [engine.generate(prompt, NoDrafter(), _config()).tokens for prompt in PROMPTS]
    assert engine.exact_outcome.state == "on", engine.exact_check
    assert (engine.native is not None) == (family != "qwen3")
    return type("Family", (), {"name": family, "model": model, "vocab": 64, "references": references})


@pytest.mark.parametrize("kind", ["pld", "chain", "tree", "model", "recycle", "aded"])
def test_speculation_on_block_weights_is_identical_to_plain_decoding(block_family, kind):
    for index, prompt in enumerate(PROMPTS):
        generation = _engine(block_family.model).generate(prompt, _drafter(kind, block_family, index), _config())
        assert generation.tokens == block_family.references[index], (block_family.name, kind, index)
        if kind in ("chain", "tree"):
            assert max(event.verify_rows for event in generation.events if event.kind == "step") >= 4


def test_sampling_on_block_weights_keeps_the_law():
    model = _blocks("llama", "int4", seed=7)
    prompt = PROMPTS[1]
    law = _second_token_law(model, prompt)
    engine = _engine(model)
    assert engine.native is not None
    drafter = LikelyTree(torch.topk(law, 2).indices.tolist(), 64)
    counts = torch.zeros(64, dtype=torch.float64)
    for seed in range(400):
        config = _config(max_new_tokens=3, temperature=1.0, seed=seed, eos_token_ids=(), budget=5)
        counts[engine.generate(prompt, drafter, config).tokens[1]] += 1
    statistic, dof = chi_square(counts, law)
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)


def test_the_kv_cache_rolls_back_and_keeps_paths_like_a_dynamic_cache():
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(0)
    ours, theirs = KVCache(), DynamicCache()
    length = 0
    for step in range(40):  # past the initial capacity (256 entries) twice over
        added = int(torch.randint(1, 30, (1,), generator=generator))
        keys, values = torch.randn(2, 1, 3, added, 4, generator=generator)
        got = ours.update(keys, values, 0)
        want = theirs.update(keys, values, 0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        length += added
        if step % 3 == 0:
            drop = int(torch.randint(0, added, (1,), generator=generator))
            ours.crop(-drop)
            theirs.crop(-drop)
            length -= drop
        if step % 5 == 0 and length > 4:
            keep = [*range(length - 4), length - 3, length - 1]  # a tree path: skip a sibling
            ours.keep(keep)
            index = torch.tensor(keep)
            layer = theirs.layers[0]
            layer.keys, layer.values = layer.keys.index_select(-2, index), layer.values.index_select(-2, index)
            length = len(keep)
        assert ours.get_seq_length() == theirs.get_seq_length() == length
        assert torch.equal(ours.layers[0].keys, theirs.layers[0].keys)
