"""The fixed-shape forward: `rows` padded rows through every layer, against the whole static cache.

`DeviceDecoder.compute(inputs)` reads a StepInputs (inputs.py) already on the device and returns the logits [rows,
vocab] (float32) and the final normed hidden states [rows, hidden], each layer's keys and values written into their
slots of the cache before its attention reads them (a prompt's chunk: its rows read each other's).
`DeviceDecoder.step(inputs)` is the same computation for a verify step (at most RECENT rows), which writes nothing:
it also returns the block's keys and values of every layer, and `store` writes them into the cache afterwards, one
copy for all layers. A step's rows read each other only in their recent region, which takes the block's keys from
the block itself, so nothing needs the cache written first; and a step that mutates nothing is what torch.compile
fuses without copying the cache (capture.py). Every shape in it depends only on `rows` and the cache's slot count,
never on how many rows are real, how many tokens are committed or where a tree's nodes sit: those are values in the
inputs (the committed length is a device tensor, not a Python int). So:

- each GEMM has the same (M, N, K) at every step: a row's result does not depend on the other rows;
- each query row's keys are read in two regions split by its own position alone (`_attend`): the committed
  ones in one GEMM over every slot of the cache (the others masked: probability exactly zero), its last RECENT
  positions gathered in position order; so the split of the keys is the same for every row count and every
  block shape, a tree's included (docs/algorithms.md section 12);
- the step can be captured once and replayed (capture.py): no host synchronisation, no allocation that changes.

What is computed is what native.py computes for the same families (RMSNorm, rotary embedding in the rotate-half
convention, grouped-query attention, a gated MLP; q/k/v biases, QK-norm, Gemma's norms, scaled embeddings,
GeLU-tanh, sandwich norms and soft-capping, sliding windows by layer kind), with GEMMs in the compute dtype, the
residual stream, norms, rotary embedding and softmax in float32. A matrix held at the file's bits (weights.py)
is multiplied by the packed Triton kernel at the same fixed shapes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from . import ROWS
from .cache import StaticCache
from .family import Family
from .inputs import StepInputs
from .weights import DeviceWeights

RECENT = ROWS  # a row's last RECENT positions are gathered per row (a verify block's deepest row reaches its root)


Block = tuple[torch.Tensor, torch.Tensor]  # a layer's keys and values of the block's rows


class Recent(NamedTuple):
    """Where each row's recent region is read: `slots` [rows, RECENT] for committed positions, `block_rows`
    [rows, RECENT] for positions in the block (the ancestor's row), `in_block` bool [1, rows, RECENT, 1] which."""

    slots: torch.Tensor
    block_rows: torch.Tensor
    in_block: torch.Tensor


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

    def __init__(self, family: Family, weights: DeviceWeights, cache: StaticCache, compiled: bool = False):
        self.family, self.weights, self.cache = family, weights, cache
        self.step_layer: Callable[..., tuple[torch.Tensor, Block]] = self.layer  # a step's layer (capture.py)
        if compiled:
            self.step_layer = torch.compile(self.layer, fullgraph=True, dynamic=False)
        device, slots = weights.device, cache.slots
        self.key_index = torch.arange(slots, device=device)  # [slots]
        self.recent_index = torch.arange(RECENT, device=device)  # [RECENT]
        self.cos, self.sin = [], []  # per rotary table: float32 [slots, half]
        for inv_freq, scaling in family.ropes:
            angles = torch.arange(slots, dtype=torch.float32, device=device)[:, None] * inv_freq.to(device)[None]
            self.cos.append(angles.cos() * scaling)
            self.sin.append(angles.sin() * scaling)

    def _regions(self, inputs: StepInputs) -> tuple[Recent, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """Where each row's keys are read (see `_attend`): its recent region, and per layer kind which slots of the
        early region (bool [rows, slots]) and which recent keys (bool [rows, RECENT]) it attends to."""
        rows, positions, past = inputs.rows, inputs.positions, inputs.past
        early = (positions - (RECENT - 1)).clamp(min=0)  # [rows]: the first position of each row's recent region
        early_mask = self.key_index[None, :] < early[:, None]  # [rows, slots]: committed, slot = position
        recent = early[:, None] + self.recent_index[None, :]  # [rows, RECENT]: positions of the recent region
        recent_mask = recent <= positions[:, None]
        relative = recent - past  # a recent position's depth in the block (< 0: committed)
        block_rows = inputs.paths.gather(1, relative.clamp(0, rows - 1))  # the ancestor's block row at that depth
        slots = recent.clamp(0, self.cache.slots - 1)  # a committed position's slot
        masks = {"full_attention": (early_mask, recent_mask)}
        if self.family.window:  # keys less than `window` positions before the row's own
            oldest = positions[:, None] - self.family.window
            masks["sliding_attention"] = (early_mask & (self.key_index[None, :] > oldest),
                                          recent_mask & (recent > oldest))
        return Recent(slots, block_rows, (relative >= 0)[None, :, :, None]), masks

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block: tuple[torch.Tensor, ...],
                recent_region: Recent, masks: tuple[torch.Tensor, torch.Tensor], scaling: float) -> torch.Tensor:
        """Attention of q [rows, heads, head_dim] (compute dtype) over the cache's keys and values [kv_heads, slots,
        head_dim] and the block's own (`block`: keys and values [kv_heads, rows, head_dim]) -> float32 [kv_heads,
        rows, group, head_dim].

        A row at position P reads two regions, split where only P says (not the number of rows, nor the committed
        length): the early region, positions before max(0, P - RECENT + 1), all committed and in their own slots,
        computed for all rows in one GEMM over every slot of the cache (the others masked: weight exactly zero);
        and the recent region, its last RECENT positions, gathered per row in position order (a tree node's
        ancestors without its siblings between them), so that a tree's row sees its keys laid out as a chain's
        row at the same position does; its positions in the block are read from the block's keys, the committed
        ones from the cache. The two are merged as a softmax over both (their maxima, sums and
        weighted values rescaled by one formula). So a row's result is the same whatever block computes it."""
        family, dtype = self.family, keys.dtype
        rows, heads, head_dim = q.shape
        kv_heads = keys.shape[0]
        group = heads // kv_heads
        early_mask, recent_mask = masks
        cap = family.attn_cap
        # the early region: [kv_heads, group * rows, head_dim] x [kv_heads, head_dim, slots]
        grouped = q.view(rows, kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(kv_heads, group * rows, head_dim)
        early = torch.bmm(grouped, keys.transpose(1, 2)).float().view(kv_heads, group, rows, -1) * scaling
        if cap is not None:
            early = torch.tanh(early / cap) * cap
        early = early.masked_fill(~early_mask, -math.inf)
        early_max = early.amax(dim=-1, keepdim=True)  # [kv_heads, group, rows, 1]; -inf where the region is empty
        weights = torch.exp(early - torch.where(torch.isfinite(early_max), early_max, torch.zeros_like(early_max)))
        early_sum = weights.sum(dim=-1, keepdim=True)
        early_out = torch.bmm(weights.to(dtype).view(kv_heads, group * rows, -1), values).float()
        early_out = early_out.view(kv_heads, group, rows, head_dim).transpose(1, 2)  # [kv_heads, rows, group, d]
        early_max, early_sum = early_max.transpose(1, 2), early_sum.transpose(1, 2)  # [kv_heads, rows, group, 1]
        # the recent region: per row, RECENT gathered keys, the block's from the block
        picked, from_block = recent_region.slots.reshape(-1), recent_region.block_rows.reshape(-1)
        recent_keys, recent_values = (
            torch.where(recent_region.in_block, own.index_select(1, from_block).view(kv_heads, rows, RECENT, head_dim),
                        stored.index_select(1, picked).view(kv_heads, rows, RECENT, head_dim))
            for own, stored in zip(block, (keys, values)))
        per_row = q.view(rows, kv_heads, group, head_dim).transpose(0, 1)  # [kv_heads, rows, group, head_dim]
        recent = torch.matmul(per_row, recent_keys.transpose(-1, -2)).float() * scaling  # [kv, rows, group, RECENT]
        if cap is not None:
            recent = torch.tanh(recent / cap) * cap
        recent = recent.masked_fill(~recent_mask[None, :, None, :], -math.inf)
        recent_max = recent.amax(dim=-1, keepdim=True)  # finite: a row sees itself
        weights = torch.exp(recent - recent_max)
        recent_sum = weights.sum(dim=-1, keepdim=True)
        recent_out = torch.matmul(weights.to(dtype), recent_values).float()  # [kv_heads, rows, group, head_dim]
        # one softmax over both regions
        top = torch.maximum(early_max, recent_max)
        early_scale, recent_scale = torch.exp(early_max - top), torch.exp(recent_max - top)
        return (early_out * early_scale + recent_out * recent_scale) / (early_sum * early_scale +
                                                                        recent_sum * recent_scale)

    def compute(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits float32 [rows, vocab], final normed hidden float32 [rows, hidden]) of the staged rows, their keys
        and values written into their slots of the cache layer by layer (a prompt's chunk)."""
        logits, final, _ = self._forward(inputs, write=True)
        return logits, final

    def step(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor, Block]:
        """A verify step of at most RECENT rows: (logits, final hidden, (keys, values) [layers, kv_heads, rows,
        head_dim] of the block, for `store`); nothing written."""
        return self._forward(inputs, write=False)

    def uncompile(self) -> None:
        """A step's layers run eagerly from now on (a compilation failed: capture.py)."""
        self.step_layer = self.layer

    def store(self, inputs: StepInputs, block: Block) -> None:
        """Write a step's keys and values (`step`) into their slots: one copy each for every layer."""
        for buffer, written in zip((self.cache.keys, self.cache.values), block):  # [layers, kv_heads, slots, d]
            buffer.index_copy_(2, inputs.slots, written)

    def _forward(self, inputs: StepInputs, write: bool) -> tuple[torch.Tensor, torch.Tensor, Block]:
        family, weights, cache = self.family, self.weights, self.cache
        recent_region, masks = self._regions(inputs)
        rotations = [(cos.index_select(0, inputs.positions)[:, None], sin.index_select(0, inputs.positions)[:, None])
                     for cos, sin in zip(self.cos, self.sin)]  # [rows, 1, half] each
        x = weights.embedding(inputs.ids)  # [rows, hidden] float32, the residual stream
        if family.embed_scale is not None:
            x = x * family.embed_scale
        layer_step = self.layer if write else self.step_layer
        written: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])  # per layer [kv_heads, rows, head_dim]
        for index, (shape, layer) in enumerate(zip(family.layers, weights.layers)):
            rotation = rotations[shape.rope] if shape.rope is not None else None
            x, block = layer_step(x, layer, shape, cache.keys[index], cache.values[index], rotation, recent_region,
                                  masks[shape.kind], inputs.slots if write else None)
            if not write:
                written[0].append(block[0])
                written[1].append(block[1])
        final = _rms_norm(x, weights.final_norm, weights.final_eps)  # [rows, hidden]
        logits = weights.head(final.to(weights.dtype))  # [rows, vocab] float32
        if family.final_cap is not None:
            logits = torch.tanh(logits / family.final_cap) * family.final_cap
        if write:
            return logits, final, (cache.keys, cache.values)
        return logits, final, (torch.stack(written[0]), torch.stack(written[1]))  # [layers, kv_heads, rows, d]

    def layer(self, x: torch.Tensor, layer: Any, shape: Any, keys: torch.Tensor, values: torch.Tensor,
              rotation: Optional[tuple[torch.Tensor, torch.Tensor]], recent_region: Recent,
              mask: tuple[torch.Tensor, torch.Tensor], slots: Optional[torch.Tensor]) -> tuple[torch.Tensor, Block]:
        """One layer: the residual stream x float32 [rows, hidden] -> (x after the layer, the block's keys and values
        [kv_heads, rows, head_dim] each); they are written into the layer's cache `keys`, `values` [kv_heads, slots,
        head_dim] at `slots` before attention where slots are given (a prompt's chunk), else only returned. Every
        layer of a shape runs this same function on other tensors, so a step compiles it once (`step_layer`)."""
        family, dtype = self.family, self.weights.dtype
        rows = x.shape[0]
        heads, kv_heads, head_dim = family.heads, family.kv_heads, family.head_dim
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        h = _rms_norm(x, layer.attn_norm, layer.attn_eps).to(dtype)
        qkv = layer.qkv(h)  # [rows, q + 2 kv] float32
        if layer.qkv_bias is not None:
            qkv = qkv + layer.qkv_bias
        q = qkv[:, :q_width].view(rows, heads, head_dim)
        k = qkv[:, q_width : q_width + kv_width].view(rows, kv_heads, head_dim)
        v = qkv[:, q_width + kv_width :].view(rows, kv_heads, head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = _rms_norm(q, layer.q_norm, layer.qk_eps)
            k = _rms_norm(k, layer.k_norm, layer.qk_eps)
        if rotation is not None:
            q, k = _rotate(q, *rotation), _rotate(k, *rotation)
        block = (k.transpose(0, 1).to(dtype), v.transpose(0, 1).to(dtype))  # [kv_heads, rows, head_dim] each
        if slots is not None:
            keys.index_copy_(1, slots, block[0])
            values.index_copy_(1, slots, block[1])
        attended = self._attend(q.to(dtype), keys, values, block, recent_region, mask, shape.scaling)
        attended = attended.transpose(0, 1).reshape(rows, q_width).to(dtype)  # [rows, heads * head_dim]
        x = self._residual(x, layer.out(attended), layer.post_attn_norm, family.eps)
        h = _rms_norm(x, layer.mlp_norm, layer.mlp_eps).to(dtype)
        gate, up = layer.gate_up(h).chunk(2, dim=-1)  # [rows, ffn] each, float32
        act = F.silu(gate) if shape.act == "silu" else F.gelu(gate, approximate="tanh")
        x = self._residual(x, layer.down((act * up).to(dtype)), layer.post_mlp_norm, family.eps)
        return x, block

    @staticmethod
    def _residual(x: torch.Tensor, branch: torch.Tensor, post_norm: "torch.Tensor | None", eps: float) -> torch.Tensor:
        """x + branch, or x + norm(branch) where the family norms each half's output (gemma2/3)."""
        return x + (branch if post_norm is None else _rms_norm(branch, post_norm, eps))
