"""The fixed-shape forward: `rows` padded rows through every layer, against the whole static cache.

`DeviceDecoder.compute(inputs)` reads a StepInputs (inputs.py) already on the device and returns the logits
[rows, vocab] (float32) and the final normed hidden states [rows, hidden]. Every shape in it depends only on
`rows` and the cache's slot count, never on how many rows are real, how many tokens are committed or where a
tree's nodes sit: those are values in the inputs (the committed length is a device tensor, not a Python int). So:

- each GEMM has the same (M, N, K) at every step: a row's result does not depend on the other rows;
- each query row attends over all the cache's slots, the ones it may not see masked to -inf (probability exactly
  zero), so the split of the keys is the same for every row count (docs/algorithms.md section 12);
- the step can be captured once and replayed (capture.py): no host synchronisation, no allocation that changes.

What is computed is what native.py computes for the same families (RMSNorm, rotary embedding in the rotate-half
convention, grouped-query attention, a gated MLP; q/k/v biases, QK-norm, Gemma's norms, scaled embeddings,
GeLU-tanh, sandwich norms and soft-capping, sliding windows by layer kind), with GEMMs in the compute dtype, the
residual stream, norms, rotary embedding and softmax in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .cache import StaticCache
from .family import Family
from .inputs import StepInputs
from .weights import DeviceWeights


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x float32 [..., dim] normalised over its last dimension, times weight float32 [dim]."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half) of x float32 [rows, heads, head_dim] on its first 2 * half dimensions;
    cos, sin [rows, 1, half]."""
    half = cos.shape[-1]
    first, second, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    rotated = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated


class DeviceDecoder:
    """A family's forward at a fixed padded row count over a StaticCache (see the module docstring)."""

    def __init__(self, family: Family, weights: DeviceWeights, cache: StaticCache):
        self.family, self.weights, self.cache = family, weights, cache
        device, slots = weights.device, cache.slots
        self.key_index = torch.arange(slots, device=device)  # [slots]
        self.cos, self.sin = [], []  # per rotary table: float32 [slots, half]
        for inv_freq, scaling in family.ropes:
            angles = torch.arange(slots, dtype=torch.float32, device=device)[:, None] * inv_freq.to(device)[None]
            self.cos.append(angles.cos() * scaling)
            self.sin.append(angles.sin() * scaling)

    def _masks(self, inputs: StepInputs) -> dict[str, torch.Tensor]:
        """Per layer kind, which slots each row attends to: bool [rows, slots]."""
        rows = inputs.rows
        relative = self.key_index - inputs.past  # [slots]: a slot's place in the block
        in_block = (relative >= 0) & (relative < rows)
        place = relative.clamp(0, rows - 1)
        block = inputs.ancestors.index_select(1, place).bool() & in_block[None, :]  # [rows, slots]
        full = (self.key_index < inputs.past)[None, :] | block
        masks = {"full_attention": full}
        if self.family.window:  # a slot's position: its own index before the block, its row's position inside it
            key_positions = torch.where(in_block, inputs.positions.index_select(0, place), self.key_index)
            near = key_positions[None, :] > inputs.positions[:, None] - self.family.window
            masks["sliding_attention"] = full & near
        return masks

    def compute(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits float32 [rows, vocab], final normed hidden float32 [rows, hidden]) of the staged rows, their keys
        and values written into their slots of the cache."""
        family, weights, cache = self.family, self.weights, self.cache
        rows, dtype = inputs.rows, weights.dtype
        heads, kv_heads, head_dim = family.heads, family.kv_heads, family.head_dim
        group = heads // kv_heads
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        masks = self._masks(inputs)
        rotations = [(cos.index_select(0, inputs.positions)[:, None], sin.index_select(0, inputs.positions)[:, None])
                     for cos, sin in zip(self.cos, self.sin)]  # [rows, 1, half] each
        x = weights.embedding.index_select(0, inputs.ids).float()  # [rows, hidden], the residual stream
        if family.embed_scale is not None:
            x = x * family.embed_scale
        for index, (shape, layer) in enumerate(zip(family.layers, weights.layers)):
            h = _rms_norm(x, layer.attn_norm, layer.attn_eps).to(dtype)
            qkv = (h @ layer.qkv.t()).float()  # [rows, q + 2 kv]
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            q = qkv[:, :q_width].view(rows, heads, head_dim)
            k = qkv[:, q_width : q_width + kv_width].view(rows, kv_heads, head_dim)
            v = qkv[:, q_width + kv_width :].view(rows, kv_heads, head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = _rms_norm(q, layer.q_norm, layer.qk_eps)
                k = _rms_norm(k, layer.k_norm, layer.qk_eps)
            if shape.rope is not None:
                cos, sin = rotations[shape.rope]
                q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            keys, values = cache.keys[index], cache.values[index]  # [kv_heads, slots, head_dim]
            keys.index_copy_(1, inputs.slots, k.transpose(0, 1).to(dtype))
            values.index_copy_(1, inputs.slots, v.transpose(0, 1).to(dtype))
            # each key/value head's query rows side by side: [kv_heads, group * rows, head_dim]
            grouped = q.to(dtype).view(rows, kv_heads, group, head_dim).permute(1, 2, 0, 3)
            grouped = grouped.reshape(kv_heads, group * rows, head_dim)
            scores = torch.bmm(grouped, keys.transpose(1, 2)).float() * shape.scaling  # [kv_heads, g*rows, slots]
            if family.attn_cap is not None:
                scores = torch.tanh(scores / family.attn_cap) * family.attn_cap
            scores = scores.view(kv_heads, group, rows, -1).masked_fill(~masks[shape.kind], -math.inf)
            probs = torch.softmax(scores, dim=-1).to(dtype).view(kv_heads, group * rows, -1)
            attended = torch.bmm(probs, values)  # [kv_heads, group * rows, head_dim]
            attended = attended.view(kv_heads, group, rows, head_dim).permute(2, 0, 1, 3).reshape(rows, q_width)
            x = self._residual(x, (attended @ layer.out.t()).float(), layer.post_attn_norm, family.eps)
            h = _rms_norm(x, layer.mlp_norm, layer.mlp_eps).to(dtype)
            gate, up = (h @ layer.gate_up.t()).float().chunk(2, dim=-1)  # [rows, ffn] each
            act = F.silu(gate) if shape.act == "silu" else F.gelu(gate, approximate="tanh")
            x = self._residual(x, ((act * up).to(dtype) @ layer.down.t()).float(), layer.post_mlp_norm, family.eps)
        final = _rms_norm(x, weights.final_norm, weights.final_eps)  # [rows, hidden]
        logits = (final.to(dtype) @ weights.head.t()).float()  # [rows, vocab]
        if family.final_cap is not None:
            logits = torch.tanh(logits / family.final_cap) * family.final_cap
        return logits, final

    @staticmethod
    def _residual(x: torch.Tensor, branch: torch.Tensor, post_norm: "torch.Tensor | None", eps: float) -> torch.Tensor:
        """x + branch, or x + norm(branch) where the family norms each half's output (gemma2/3)."""
        return x + (branch if post_norm is None else _rms_norm(branch, post_norm, eps))
