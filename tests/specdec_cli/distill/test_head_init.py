"""distill/head_init.py: an EAGLE head started from a copy of the target's last decoder layer computes that layer;
targets whose last layer is not in the Llama layout, and heads of another width, start at random; a GGUF target's
block weights give the same start as the model they were written from; the training report says which start."""

from __future__ import annotations

import pytest
import torch
from helpers import family_model, write_family_gguf

from specdec_cli.distill.head_init import copyable_layer, start_from_layer
from specdec_cli.drafters.eagle_head import EagleHead, head_config_for


def _head(model, mlp: int = 0) -> EagleHead:
    torch.manual_seed(0)
    return EagleHead(head_config_for(model.config, mlp or model.config.intermediate_size))


def _layer_output(model, hidden):
    """The target's last decoder layer on `hidden` [1, n, H], causally, positions 0..n-1."""
    positions = torch.arange(hidden.shape[1])[None]
    out = model.model.layers[-1](hidden, attention_mask=None, position_ids=positions,
                                 position_embeddings=model.model.rotary_emb(hidden, positions))
    return out[0] if isinstance(out, tuple) else out


def test_a_head_started_from_the_last_layer_computes_that_layer():
    """The fusing map adds the token's embedding to the feature, so with a zero feature the head's block sees the
    embedding input as the target's layer would: the same output (keys and values repeated for grouped heads)."""
    model = family_model("llama", seed=3)  # 4 query heads over 2 key/value heads, no biases
    head = _head(model)
    assert start_from_layer(head, model)
    hidden = torch.randn(1, 7, model.config.hidden_size)
    with torch.no_grad():
        ours = head(torch.zeros_like(hidden), hidden, torch.arange(7))
        want = _layer_output(model, hidden)
    assert torch.allclose(ours, want, atol=1e-5 * float(want.abs().max())), (ours - want).abs().max()


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_a_last_layer_of_another_layout_is_not_copied(family):
    """Qwen3's QK norms and Gemma-2's extra norms have no place in the head: it starts at random, untouched."""
    model = family_model(family, seed=3)
    head = _head(model)
    before = {name: value.clone() for name, value in head.state_dict().items()}
    assert copyable_layer(model) is None
    assert not start_from_layer(head, model)
    assert all(torch.equal(value, before[name]) for name, value in head.state_dict().items())


def test_a_head_of_another_mlp_width_is_not_copied():
    model = family_model("llama", seed=3)
    head = _head(model, mlp=model.config.intermediate_size // 2)
    assert not start_from_layer(head, model)


def test_a_gguf_targets_blocks_give_the_start_of_the_model_they_were_written_from(tmp_path):
    """The in-place GGUF target's layers are block weights (q and k rows as transformers orders them): copied, they
    are the source model's weights up to the file's quantisation."""
    from specdec_cli.target_model.load import models

    source = family_model("llama", seed=5)
    write_family_gguf(tmp_path / "tiny.gguf", source, "llama", "gpt2")
    target = models.load_target(str(tmp_path / "tiny.gguf"), device="cpu").model
    from_source, from_file = _head(source), _head(source)
    assert start_from_layer(from_source, source) and start_from_layer(from_file, target)
    for (name, want), got in zip(from_source.state_dict().items(), from_file.state_dict().values()):
        scale = float(want.abs().max())
        assert torch.allclose(got, want, atol=0.15 * scale), (name, float((got - want).abs().max()), scale)


def test_the_training_report_says_where_the_head_started(tiny_llama):
    from specdec_cli.distill.eagle_train import EagleTrainConfig, train_eagle
    from specdec_cli.errors import SpecdecError

    sequences = [[1, 2, 3, 4, 5, 6, 7, 8] * 3, [1, 9, 8, 7, 6, 5, 4, 3] * 3]
    for start, width in (("layer", tiny_llama.config.intermediate_size), ("random", 0)):
        head, result = train_eagle(tiny_llama, sequences, EagleTrainConfig(steps=1, head_vocab=0, holdout=0.5,
                                                                           head_init=start))
        assert result["report"]["started_from"] == start
        assert result["report"]["config"]["head_init"] == start
        if width:
            assert head.config.intermediate_size == width  # a copy is the target's whole MLP
    with pytest.raises(SpecdecError, match="head_init must be one of layer, random"):
        EagleTrainConfig(head_init="zeros").check()
