"""The family table (target_model/families.py) is the one place family facts live: a toy row added to it reaches
every module that asks about families, and the Gemma norm's float32 arithmetic is what it is for a reason."""

from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import family_model

from specdec_cli import kernels
from specdec_cli.target_model import families
from specdec_cli.target_model.device import family as device_family
from specdec_cli.target_model.gguf import gguf_families, gguf_layout
from specdec_cli.target_model.load import converted_blocks
from specdec_cli.target_model.native import native, native_support, quant
from specdec_cli.target_model.verify import tree_check
from specdec_cli.target_model.verify.check_outcome import CheckOutcome

TOY = families.Family("toy", "toyarch", norm_plus_one=True, embedding_scale=True, permuted_qk=True,
                      own_gguf_loader=True, qk_norm=True, sandwich_norms=True, qkv_bias=True)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(families.FAMILIES, "toy", TOY)


def _config(**extra):
    settings = dict(model_type="toy", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=128, vocab_size=96, num_hidden_layers=1, hidden_act="silu", rope_parameters={})
    return SimpleNamespace(**{**settings, **extra})


def test_the_decoders_refusals_list_a_new_row(toy):
    other = SimpleNamespace(config=SimpleNamespace(model_type="other"))
    assert families.native_list().endswith("smollm3, toy")
    if kernels.available():
        assert native_support.unsupported(other).endswith(f"({families.native_list()})")
    assert device_family.unsupported(other).endswith(f"({families.native_list()})")


def test_tree_check_reads_a_new_row(toy, monkeypatch):
    forward = SimpleNamespace(tree_outcome=lambda: CheckOutcome("passed"))
    model = SimpleNamespace(config=_config())
    assert tree_check.check_trees(model, forward).state == "passed"
    monkeypatch.setitem(families.FAMILIES, "toy", dataclasses.replace(TOY, trees=False))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert tree_check.check_trees(model, forward).state == "chains only"


def test_the_gguf_layout_and_loaders_read_a_new_row(toy):
    expected = {item.gguf_name: item for item in gguf_layout.expected_tensors(_config(), "toyarch", set())}
    assert expected["blk.0.attn_q.weight"].heads == 4 and expected["blk.0.attn_k.weight"].heads == 2  # permuted
    assert {"blk.0.attn_q_norm.weight", "blk.0.post_ffw_norm.weight", "blk.0.attn_q.bias"} <= set(expected)
    file = SimpleNamespace(architecture="toyarch")
    assert gguf_layout.native_reason(file, _config()) is None
    assert families.is_native_architecture("toyarch") and gguf_families.reads("toyarch")


def test_without_the_row_its_files_are_not_native():
    file = SimpleNamespace(architecture="toyarch")
    assert gguf_layout.native_reason(file, _config()) == "toyarch is not a family specdec's native decoder computes"
    assert not gguf_families.reads("toyarch") and not families.takes_trees("toy")


@pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")
def test_the_native_and_device_decoders_take_the_norm_convention_from_the_row(toy):
    model = family_model("llama", num_hidden_layers=1)
    quant.install_blocks(model, converted_blocks.plan_blocks(model, "int8", None))
    with torch.no_grad():
        model.model.norm.weight.uniform_(-1, 1)
    model.config.model_type = "toy"
    decoder = native.NativeDecoder(model)
    assert torch.equal(decoder.final_norm.tensor, 1.0 + model.model.norm.weight.float())
    assert device_family.describe(model).norm_offset


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_stored_gemma_norm_is_what_the_converted_model_multiplies_by(dtype):
    """A GGUF stores Gemma's 1 + weight (a converter adds the one to the float32 or bfloat16 weight); transformers'
    loader subtracts it and Gemma's norm adds it back, both in float32. For any value made so, 1 + (stored - 1) is
    the stored value bit for bit, so the in-place path multiplies by the stored value itself (gguf_model). (A value
    no converter makes, 0.1 say, loses low bits on the way: only hand-made files could tell the paths apart.)"""
    generator = torch.Generator().manual_seed(0)
    weights = torch.cat([torch.randn(200_000, generator=generator) * scale
                         for scale in (1e-8, 1e-3, 0.3, 0.7, 1.0, 1.5, 10.0, 1e4)]).to(dtype)
    stored = (weights + 1).float()
    assert torch.equal(1.0 + (stored - 1.0), stored)
    assert np.float32(1) + (np.float32(0.1) - np.float32(1)) != np.float32(0.1)
