"""The target's weights in blocks: a GGUF's quantised tensors as stored, or blocks made on load (`--weights`).

A CPU decoding step is bound by reading weights, and a GGUF's quantised tensors are a fraction of the bytes of
the same weights dequantised (docs/measurements.md has the default model's). Here every linear layer whose weight
can be held in blocks of 32 along the input dimension becomes a
`BlockLinear`, multiplied by specdec's CPU kernels (kernels/_cpu.c: integer dot products of the weight codes
with each row of activations rounded to 8 bits, as llama.cpp does). What `--weights` means:

- `dense`: every weight dequantised to the compute dtype, as transformers loaded it.
- `gguf`: every tensor of a type users hold runs on the kernels from its own bits: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
  Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS as packed kinds that keep the file's own fields at the file's size
  (kernels/packed.py); Q3_K and Q2_K with their per-16
  sub-scales (times the super-block's d, exact in float32) as scales of 16 weights (kernels.KINDS); F16, BF16 and
  F32 matrices as they are, on a fixed-order float kernel. Any other type
  (IQ1-IQ3, TQ*, ...) and any matrix whose input size is not a multiple of its block stays dense.
- `int8`: `gguf`, and every other linear layer (float GGUF matrices too) quantised on load to 8-bit blocks
  (symmetric, scale = max|w|/127): a Hugging Face model becomes a different, smaller target, said so wherever
  the target is named.
- `int4`: a GGUF's 4-bit kinds as stored, and every other linear layer (Q8_0, Q5_*, Q6_K, IQ4, float ones too)
  quantised on load to 4-bit blocks (scale = (max - min)/15, offset = min).
- `auto` (models.py decides): `gguf` for a GGUF on a CPU where a plain step measures faster than dense.

Here are the layer that multiplies on blocks (`BlockLinear`), quantising one dense matrix on load
(`quantize_dense`), installing planned blocks in a model (`install_blocks`) and naming what runs on blocks
(`weights_summary`). Quantised models compute in float32 (the kernels take float32 rows). Exactness does not
change: the kernels are row-invariant, and exact.py verifies blocks against one-row forwards as for any model.
Not here: which layers of a loaded model go on blocks and from where (converted_blocks.py), a GGUF type's bytes
(gguf_decode.py), the cache of converted weights (weights_cache.py), one matrix's blocks (block_weights.py), the
choice of a mode (models.py); a GGUF computed in place is repacked by gguf_blocks.py.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ... import kernels
from ...kernels import BLOCK
from .block_weights import BlockWeights


class BlockLinear(torch.nn.Module):
    """A linear layer on specdec's block kernel: float32 rows in, float32 rows out, bias added in float32."""

    records: torch.Tensor  # uint8 [groups of 16 outputs, record bytes] (kernels.pack_records)
    bias: Optional[torch.Tensor]

    def __init__(self, weights: BlockWeights, bias: Optional[torch.Tensor] = None):
        super().__init__()
        self.out_features, self.in_features = weights.shape
        self.kind, self.origin = weights.kind, weights.origin
        self.register_buffer("records", weights.records, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32), persistent=False)
        self._dense: Optional[torch.Tensor] = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.reshape(-1, self.in_features)  # [n, in]
        out = kernels.matmul(rows, self.kind, self.records, self.out_features)  # [n, out]
        if self.bias is not None:
            out += self.bias
        return out.reshape(*hidden.shape[:-1], self.out_features)

    def blocks(self) -> BlockWeights:
        return BlockWeights(self.kind, self.records, self.out_features, self.in_features, self.origin)

    def unpacked_rows(self, ids: torch.Tensor) -> Any:
        """The output rows `ids` unpacked (a drafter's vocabulary subset of an LM head): only the 16-row groups
        holding them are read, so nothing of the whole matrix is kept (an LM head's codes are 136 MB on the 0.5B).
        `pack_rows` packs them (after `join_rows`, parts in order) into records."""
        groups, local = torch.unique(ids // kernels.GROUP, return_inverse=True)
        within = local * kernels.GROUP + ids % kernels.GROUP  # [len(ids)]: each id's row among those groups'
        if not len(groups):
            groups = torch.zeros(1, dtype=torch.long)  # (no rows: read one group, keep none of it)
        records, rows = self.records[groups], len(groups) * kernels.GROUP
        if self.kind in kernels.PACKED:
            return kernels.unpack_fields(self.kind, records, rows).take(within)
        return tuple(None if part is None else part[within] for part in kernels.unpack_records(self.kind, records,
                                                                                               rows))

    def pack_rows(self, rows: Any) -> torch.Tensor:
        """Records of rows from `unpacked_rows` (or `join_rows`)."""
        if self.kind in kernels.PACKED:
            return kernels.pack_fields(self.kind, rows)
        return kernels.pack_records(self.kind, *rows)

    def select_records(self, ids: torch.Tensor) -> torch.Tensor:
        """Records of the output rows `ids` only."""
        return self.pack_rows(self.unpacked_rows(ids))

    @property
    def weight(self) -> torch.Tensor:
        """The dense float32 weight, made on first use (drafters that read the target's LM head rows use it)."""
        if self._dense is None:
            self._dense = self.blocks().dense()
        return self._dense

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, blocks={self.origin}"


def join_rows(parts: Any) -> Any:
    """Unpacked rows (`BlockLinear.unpacked_rows`) of one layer put together, in order."""
    first = parts[0]
    if isinstance(first, kernels.Fields):
        def joined(name: str) -> Optional[torch.Tensor]:
            return None if getattr(first, name) is None else torch.cat([getattr(part, name) for part in parts])

        return kernels.Fields(torch.cat([part.codes for part in parts]), torch.cat([part.d for part in parts]),
                              joined("m"), joined("scales"), joined("minimums"))
    return tuple(None if first[index] is None else torch.cat([part[index] for part in parts])
                 for index in range(len(first)))


def block_layers(model: Any) -> list[BlockLinear]:
    return [module for module in model.modules() if isinstance(module, BlockLinear)]


def weights_summary(model: Any) -> str:
    """'169 Q8_0 + 63 Q5_0 + 24 Q4_K + 12 Q6_K block layers, 0 dense' style (most frequent first), for the chat
    header and the bench report."""
    counts: dict[str, int] = {}
    for layer in block_layers(model):
        counts[layer.origin] = counts.get(layer.origin, 0) + 1
    dense = sum(isinstance(module, torch.nn.Linear) for module in model.modules())
    parts = [f"{count} {origin}" for origin, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    return f"{' + '.join(parts) or 'no'} block layers, {dense} dense"


# -- quantising dense weights on load ------------------------------------------------------------------------


def quantize_dense(weight: torch.Tensor, kind: int) -> BlockWeights:
    """Blocks of 32 for a dense weight [out, in]: kind 8 symmetric (scale = max|w|/127), kind 4 asymmetric
    (scale = (max - min)/15, offset = min), codes rounded to nearest."""
    out_features, in_features = weight.shape
    blocks = weight.detach().to(torch.float32).reshape(out_features, in_features // BLOCK, BLOCK)
    if kind == kernels.KIND_Q8:
        scales = blocks.abs().amax(dim=-1) / 127  # [out, in/32]
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = torch.round(blocks / safe[..., None]).clamp(-127, 127) + 128
        return BlockWeights.from_codes(kind, codes.to(torch.uint8).reshape(out_features, in_features), scales, None,
                                       "int8")
    if kind != kernels.KIND_Q4:
        raise ValueError(f"blocks made on load are of kind 4 or 8, not {kind}")
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    scales = (high - low) / 15
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round((blocks - low[..., None]) / safe[..., None]).clamp(0, 15).to(torch.uint8)  # [out, in/32, 32]
    return BlockWeights.from_codes(kind, codes.reshape(out_features, in_features), scales, low, "int4")


def install_blocks(model: Any, planned: dict[str, BlockWeights]) -> int:
    """Replace the planned linear layers by BlockLinear (in place); returns how many were replaced."""
    modules = dict(model.named_modules())
    for name, weights in planned.items():
        parent_name, _, attribute = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        old = getattr(parent, attribute)
        setattr(parent, attribute, BlockLinear(weights, getattr(old, "bias", None)))
    config = getattr(model, "config", None)  # (a draft head has none)
    if planned and getattr(config, "tie_word_embeddings", False) and "lm_head" in planned:
        model.config.tie_word_embeddings = False  # the head is its own (block) layer now; nothing re-ties it
    return len(planned)
