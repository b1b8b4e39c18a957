"""The target's weights on the device, put there once: dense matrices in the compute dtype, norms in float32.

A block layer (quant.BlockLinear: a GGUF's blocks repacked for specdec's kernels, or blocks made on load) is
moved to the device as its packed records, a chunk of CHUNK_ROWS output rows at a time, and dequantised there
(kernels.records.unpack_records and dequantize are torch code, so they run wherever the records are) into the
compute dtype: host memory never holds more than one chunk's records beyond the mapped file, and never a float32
copy of the model. A transformers linear layer is moved (and cast) as it is. The projections that read the same
input are fused into one matrix (q|k|v, gate|up), so each is one GEMM. A GGUF's token embeddings (left in the
mapped file, gguf_model.MappedEmbedding) are dequantised on the host a chunk of rows at a time and moved.

Every tensor made here is on the device given; nothing here computes a forward (decoder.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..native.native import norm_multiplier
from ..native.native_support import projections
from .family import Family

CHUNK_ROWS = 4096  # output rows of a block matrix dequantised at a time on the device (and embedding rows)


def _norm(norm: Any, offset: bool, device: torch.device) -> tuple[torch.Tensor, float]:
    """An RMSNorm's float32 multiplier [dim] on the device (native.norm_multiplier: 1 + weight for Gemma) and its
    eps."""
    eps = float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 1e-6)
    return norm_multiplier(norm, offset).to(device), eps


def fill_matrix(out: torch.Tensor, layer: Any) -> None:
    """out [layer's outputs, inputs] (on the device, in the compute dtype) = the layer's weight."""
    from ...kernels.records import GROUP, dequantize, unpack_records
    from ..native.quant import BlockLinear

    if not isinstance(layer, BlockLinear):
        out.copy_(layer.weight.detach())
        return
    per_chunk = max(1, CHUNK_ROWS // GROUP)  # records (GROUP output rows each) per chunk
    records = layer.records
    for first in range(0, records.shape[0], per_chunk):
        part = records[first : first + per_chunk].to(out.device)  # uint8 [groups, record bytes]
        start = first * GROUP
        rows = min(part.shape[0] * GROUP, layer.out_features - start)
        codes, scales, offsets = unpack_records(layer.kind, part, rows)
        out[start : start + rows].copy_(dequantize(layer.kind, codes, scales, offsets))  # [rows, in]


def fused(layers: list[Any], device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The layers' weights side by side along the outputs [sum of outputs, in] and their biases (float32 [sum] or
    None), on the device."""
    widths = [int(layer.out_features) for layer in layers]
    matrix = torch.empty(sum(widths), int(layers[0].in_features), dtype=dtype, device=device)
    biases, start, any_bias = [], 0, False
    for layer, width in zip(layers, widths):
        fill_matrix(matrix[start : start + width], layer)
        bias = getattr(layer, "bias", None)
        any_bias |= bias is not None
        biases.append(torch.zeros(width, device=device) if bias is None else
                      bias.detach().to(device=device, dtype=torch.float32))
        start += width
    return matrix, (torch.cat(biases) if any_bias else None)


def embedding_table(embed: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The token embeddings [vocab, hidden] on the device (unscaled), a chunk of rows at a time from a GGUF."""
    rows = getattr(embed, "rows", None)  # gguf_model.MappedEmbedding: rows dequantised on demand
    if rows is None:
        return embed.weight.detach().to(device=device, dtype=dtype)
    table = torch.empty(int(embed.num_embeddings), int(embed.embedding_dim), dtype=dtype, device=device)
    for first in range(0, table.shape[0], CHUNK_ROWS):
        ids = torch.arange(first, min(first + CHUNK_ROWS, table.shape[0]))
        table[first : first + len(ids)].copy_(rows(ids))
    return table


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # float32 [hidden]
    attn_eps: float
    qkv: torch.Tensor  # [q + 2 kv widths, hidden]
    qkv_bias: Optional[torch.Tensor]  # float32 [q + 2 kv widths]
    q_norm: Optional[torch.Tensor]  # float32 [head_dim]
    k_norm: Optional[torch.Tensor]
    qk_eps: float
    out: torch.Tensor  # [hidden, q width]
    post_attn_norm: Optional[torch.Tensor]  # float32 [hidden] (gemma2/3)
    mlp_norm: torch.Tensor  # float32 [hidden]
    mlp_eps: float
    gate_up: torch.Tensor  # [2 ffn, hidden]
    down: torch.Tensor  # [hidden, ffn]
    post_mlp_norm: Optional[torch.Tensor]  # float32 [hidden] (gemma2/3)


@dataclass
class DeviceWeights:
    """Every weight of the target on one device."""

    device: torch.device
    dtype: torch.dtype
    embedding: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # float32 [hidden]
    final_eps: float
    head: torch.Tensor  # [vocab, hidden]

    @staticmethod
    def load(model: Any, family: Family, device: torch.device, dtype: torch.dtype) -> "DeviceWeights":
        """The model's weights moved to `device` in `dtype`, layer by layer."""
        offset = family.norm_offset
        layers = []
        with torch.no_grad():
            for layer in model.model.layers:
                attention = layer.self_attn
                linears = [module for _, module in projections(layer)]
                attention_inputs = linears[:1] if hasattr(attention, "qkv_proj") else linears[:3]
                qkv, qkv_bias = fused(attention_inputs, device, dtype)
                out = fused([attention.o_proj], device, dtype)[0]
                mlp = layer.mlp
                gate_up_layers = [mlp.gate_up_proj] if hasattr(mlp, "gate_up_proj") else [mlp.gate_proj, mlp.up_proj]
                gate_up = fused(gate_up_layers, device, dtype)[0]
                down = fused([mlp.down_proj], device, dtype)[0]
                sandwich = hasattr(layer, "pre_feedforward_layernorm")
                attn_norm, attn_eps = _norm(layer.input_layernorm, offset, device)
                mlp_norm, mlp_eps = _norm(layer.pre_feedforward_layernorm if sandwich else
                                          layer.post_attention_layernorm, offset, device)
                q_norm = getattr(attention, "q_norm", None)
                k_norm = getattr(attention, "k_norm", None)
                layers.append(LayerWeights(
                    attn_norm=attn_norm, attn_eps=attn_eps, qkv=qkv, qkv_bias=qkv_bias,
                    q_norm=None if q_norm is None else _norm(q_norm, offset, device)[0],
                    k_norm=None if k_norm is None else _norm(k_norm, offset, device)[0],
                    qk_eps=family.eps if q_norm is None else _norm(q_norm, offset, device)[1],
                    out=out,
                    post_attn_norm=_norm(layer.post_attention_layernorm, offset, device)[0] if sandwich else None,
                    mlp_norm=mlp_norm, mlp_eps=mlp_eps, gate_up=gate_up, down=down,
                    post_mlp_norm=_norm(layer.post_feedforward_layernorm, offset, device)[0] if sandwich else None))
            final_norm, final_eps = _norm(model.model.norm, offset, device)
            head = fused([model.lm_head], device, dtype)[0]
            embedding = embedding_table(model.model.embed_tokens, device, dtype)
        return DeviceWeights(device, dtype, embedding, layers, final_norm, final_eps, head)
