"""What the device decoder reads off a loaded target: the families it computes, and each layer's shape and kind.

The device decoder computes the families specdec's native decoder computes (target_model/families.py: llama,
mistral, qwen2, qwen3, phi3, smollm3, gemma, gemma2, gemma3_text), read off the loaded model the same way (native.py's
helpers: layer kinds, rotary tables, activation), whatever holds its weights: a GGUF loaded in place (block
layers, quant.BlockLinear) or a transformers model (torch.nn.Linear). `unsupported(model)` says in one line why
it cannot (another family, a rope that changes with the length, an unknown activation); `describe(model)`
returns the `Family`: sizes, per-layer kinds and rotary tables, and which optional parts the family has. This
file reads; it moves no weights (weights.py) and computes nothing (decoder.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .. import families
from ..native.native_support import activation_of, layer_kinds, layers_reason, projections, rope_of


@dataclass(frozen=True)
class LayerShape:
    """One decoder layer as the device decoder computes it."""

    kind: str  # "full_attention" or "sliding_attention"
    rope: Optional[int]  # index into Family.ropes, None for a layer without rotary embedding (smollm3's NoPE)
    scaling: float  # attention score scale
    act: str  # "silu" or "gelu_tanh"
    qk_norm: bool  # RMSNorm on each head of q and k before the rotation (qwen3, gemma3)
    sandwich: bool  # norms after attention and MLP too (gemma2, gemma3)


@dataclass(frozen=True)
class Family:
    """A loaded target's sizes and layer kinds, read once."""

    model_type: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    eps: float
    norm_offset: bool  # Gemma's RMSNorm multiplies by (1 + weight)
    embed_scale: Optional[float]  # Gemma scales embeddings by sqrt(hidden)
    attn_cap: Optional[float]  # gemma2's soft-capped attention scores
    final_cap: Optional[float]  # gemma2's soft-capped logits
    window: int  # sliding window (0: none)
    max_positions: int
    ropes: tuple[tuple[torch.Tensor, float], ...]  # distinct (inv_freq float32 [rotated/2], attention scaling)
    layers: tuple[LayerShape, ...]


def unsupported(model: Any) -> Optional[str]:
    """Why the device decoder cannot compute this model (None: it can), in one line."""
    from ..native.quant import BlockLinear

    config = getattr(model, "config", None)
    if config is None or not families.is_native(getattr(config, "model_type", None)):
        kind = getattr(config, "model_type", "this model")
        return f"{kind} is not a family the device decoder implements ({families.native_list()})"
    reason = layers_reason(model, "device decoder")
    if reason:
        return reason
    for index, layer in enumerate(model.model.layers):
        for _, linear in projections(layer):
            if not isinstance(linear, (BlockLinear, torch.nn.Linear)):
                return f"layer {index} has a projection that is neither a linear nor a block layer"
        if getattr(layer.self_attn.o_proj, "bias", None) is not None or \
                getattr(layer.mlp.down_proj, "bias", None) is not None:
            return "biases on output projections"
        if activation_of(layer.mlp) is None:
            return "an activation other than SiLU or GeLU-tanh"
    if not isinstance(getattr(model, "lm_head", None), (BlockLinear, torch.nn.Linear)):
        return "the output head is not a linear or block layer"
    return None


def describe(model: Any) -> Family:
    """The model's `Family` (call `unsupported` first)."""
    config = model.config
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kinds = layer_kinds(config)
    ropes: dict[tuple[int, float], int] = {}
    tables: list[tuple[torch.Tensor, float]] = []
    layers = []
    for index, layer in enumerate(model.model.layers):
        rope_index = None
        found = rope_of(model, index, kinds[index])
        if found is not None:
            key = (found[0].data_ptr(), found[1])
            if key not in ropes:
                ropes[key] = len(tables)
                tables.append((found[0].detach().to(torch.float32).cpu(), float(found[1])))
            rope_index = ropes[key]
        attention = layer.self_attn
        layers.append(LayerShape(kinds[index], rope_index, float(attention.scaling), str(activation_of(layer.mlp)),
                                 getattr(attention, "q_norm", None) is not None,
                                 hasattr(layer, "pre_feedforward_layernorm")))
    embed = model.model.embed_tokens
    scale = getattr(embed, "embed_scale", None)
    return Family(
        model_type=str(config.model_type), hidden=hidden, heads=heads,
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
        ffn=int(config.intermediate_size), vocab=int(model.lm_head.out_features),
        eps=float(getattr(config, "rms_norm_eps", 1e-6)), norm_offset=families.norm_plus_one(config.model_type),
        embed_scale=None if scale is None else float(torch.as_tensor(scale)),
        attn_cap=getattr(config, "attn_logit_softcapping", None),
        final_cap=getattr(config, "final_logit_softcapping", None),
        window=int(getattr(config, "sliding_window", 0) or 0) if "sliding_attention" in kinds else 0,
        max_positions=int(getattr(config, "max_position_embeddings", 0) or 0),
        ropes=tuple(tables), layers=tuple(layers))
