"""The target's weights in blocks: a GGUF's quantised tensors as stored, or blocks made on load (`--weights`).

A CPU decoding step is bound by reading weights, and a GGUF's quantised tensors are a fraction of the bytes of
the same weights dequantised (docs/measurements.md has the default model's). Here every linear layer whose weight
can be held in blocks of 32 along the input dimension becomes a
`BlockLinear`, multiplied by specdec's CPU kernels (kernels/_cpu.c: integer dot products of the weight codes
with each row of activations rounded to 8 bits per block of 32, as llama.cpp does). What `--weights` means:

- `dense`: every weight dequantised to the compute dtype (0.2.0's path).
- `gguf`: every tensor of a type users hold runs on the kernels from its own bits: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
  Q4_K, Q5_K and Q6_K as packed kinds that keep the file's own fields at the file's size (kernels/packed.py);
  IQ4_NL and IQ4_XS as int8 values (IQ4's 16-entry table read at conversion), Q3_K and Q2_K with their per-16
  sub-scales (times the super-block's d, exact in float32) as scales of 16 weights (kernels.KINDS); F16, BF16 and
  F32 matrices as they are, on a fixed-order float kernel. Any other type
  (IQ1-IQ3, TQ*, ...) and any matrix whose input size is not a multiple of its block stays dense.
- `int8`: `gguf`, and every other linear layer (float GGUF matrices too) quantised on load to 8-bit blocks
  (symmetric, scale = max|w|/127): a Hugging Face model becomes a different, smaller target, said so wherever
  the target is named.
- `int4`: a GGUF's 4-bit kinds as stored, and every other linear layer (Q8_0, Q5_*, Q6_K, IQ4, float ones too)
  quantised on load to 4-bit blocks (scale = (max - min)/15, offset = min).
- `auto` (models.py decides): `gguf` for a GGUF on a CPU where a plain step measures faster than dense.

Every block weight taken from a GGUF is checked at conversion against the dense weight transformers dequantised
from the same tensor (including the row order of llama's permuted q/k projections); a tensor that does not match
stays dense. `weights_summary` names each type and how many layers run on blocks or dense. The result is cached
as safetensors (the kernels' packed records) under $SPECDEC_HOME/weights, one file per model and mode.
Quantised models compute in float32 (the kernels take float32 rows). Exactness does not change: the kernels are
row-invariant, and exact.py verifies blocks against one-row forwards as for any model.
This file converts and caches weights; it does not choose a mode (models.py) or run anything but the check.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch

from .. import kernels
from ..errors import SpecdecError, check_choice
from ..kernels import BLOCK
from .load_settings import BLOCK_MODES

CACHE_FORMAT = 3  # bump when the cached file's layout or a conversion rule changes (3: packed kinds)


class BlockWeights:
    """One weight [out, in] as the kernels hold it: packed records of `kind` (kernels.KINDS) and where they came
    from (`origin`: a GGUF type such as "Q4_K", or "int4"/"int8" for blocks made on load)."""

    def __init__(self, kind: int, records: torch.Tensor, out_features: int, in_features: int, origin: str):
        self.kind, self.records, self.origin = kind, records, origin
        self.shape = (int(out_features), int(in_features))
        self._unpacked: Optional[tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]] = None
        self._fields: Optional[kernels.Fields] = None

    @classmethod
    def from_codes(cls, kind: int, codes: torch.Tensor, scales: Optional[torch.Tensor],
                   offsets: Optional[torch.Tensor], origin: str) -> "BlockWeights":
        """codes [out, in] one code a byte (float kinds: the weights), scales/offsets float32 [out, in/sub]."""
        from .. import kernels

        records = kernels.pack_records(kind, codes, scales, offsets)
        weights = cls(kind, records, codes.shape[0], codes.shape[1], origin)
        weights._unpacked = (codes, scales, offsets)  # kept while converting (checks, q/k row order)
        return weights

    @classmethod
    def from_fields(cls, kind: int, fields: kernels.Fields, origin: str) -> "BlockWeights":
        """A packed kind (kernels/packed.py) from its fields [out, in]."""
        from .. import kernels

        weights = cls(kind, kernels.pack_fields(kind, fields), fields.codes.shape[0], fields.codes.shape[1], origin)
        weights._fields = fields  # kept while converting (checks, q/k row order)
        return weights

    def fields(self) -> kernels.Fields:
        """A packed kind's fields (kernels.unpack_fields)."""
        from .. import kernels

        return self._fields if self._fields is not None else kernels.unpack_fields(self.kind, self.records,
                                                                                   self.shape[0])

    def unpacked(self) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """(codes [out, in], scales, offsets): kernels.unpack_records."""
        from .. import kernels

        if self._unpacked is not None:
            return self._unpacked
        return kernels.unpack_records(self.kind, self.records, self.shape[0])

    def forget_unpacked(self) -> None:
        """Drop the codes kept from `from_codes` (a byte a weight): later calls unpack the records again."""
        self._unpacked = None
        self._fields = None

    def dense(self) -> torch.Tensor:
        """The weight as float32 [out, in] (what the blocks mean; for checks and for drafters that read rows)."""
        from .. import kernels

        return kernels.dequantize(self.kind, *self.unpacked())

    def take(self, order: torch.Tensor) -> "BlockWeights":
        """The same blocks with the output rows in `order`."""
        from .. import kernels

        if self.kind in kernels.PACKED:
            return BlockWeights.from_fields(self.kind, self.fields().take(order), self.origin)
        codes, scales, offsets = self.unpacked()
        return BlockWeights.from_codes(self.kind, codes[order], None if scales is None else scales[order],
                                       None if offsets is None else offsets[order], self.origin)


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
        self._unpacked: Optional[tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]] = None
        self._fields: Optional[kernels.Fields] = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from .. import kernels

        rows = hidden.reshape(-1, self.in_features)  # [n, in]
        out = kernels.matmul(rows, self.kind, self.records, self.out_features)  # [n, out]
        if self.bias is not None:
            out += self.bias
        return out.reshape(*hidden.shape[:-1], self.out_features)

    def blocks(self) -> BlockWeights:
        return BlockWeights(self.kind, self.records, self.out_features, self.in_features, self.origin)

    def select_records(self, ids: torch.Tensor) -> torch.Tensor:
        """Records of the output rows `ids` only (a drafter's vocabulary subset of an LM head); the unpacked codes
        are kept for the next call."""
        from .. import kernels

        if self.kind in kernels.PACKED:
            if self._fields is None:
                self._fields = self.blocks().fields()
            return kernels.pack_fields(self.kind, self._fields.take(ids))
        if self._unpacked is None:
            self._unpacked = self.blocks().unpacked()
        codes, scales, offsets = self._unpacked
        return kernels.pack_records(self.kind, codes[ids], None if scales is None else scales[ids],
                                    None if offsets is None else offsets[ids])

    @property
    def weight(self) -> torch.Tensor:
        """The dense float32 weight, made on first use (drafters that read the target's LM head rows use it)."""
        if self._dense is None:
            self._dense = self.blocks().dense()
        return self._dense

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, blocks={self.origin}"


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
    from .. import kernels

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


# -- a GGUF's own blocks --------------------------------------------------------------------------------------

IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int16)
# bytes per block of each GGUF type specdec's kernels take, and weights per block
GGUF_BLOCKS = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q5_0": (22, 32), "Q5_1": (24, 32), "Q8_0": (34, 32),
               "Q2_K": (84, 256), "Q3_K": (110, 256), "Q4_K": (144, 256), "Q5_K": (176, 256), "Q6_K": (210, 256),
               "IQ4_NL": (18, 32), "IQ4_XS": (136, 256)}
GGUF_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _halves(raw: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block row -> float32 [...]."""
    return np.ascontiguousarray(raw[..., start : start + 2]).view(np.float16)[..., 0].astype(np.float32)


def _bits(data: np.ndarray, shifts: list[int], mask: int) -> np.ndarray:
    """(data >> shift) & mask for each shift, stacked on a new axis before the last: [..., len(shifts), bytes]."""
    return np.stack([(data >> shift) & mask for shift in shifts], axis=-2)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of 6-bit scales and minimums for their 8 sub-blocks: bytes 0-3 hold scales 0-3 (low
    6 bits) and the top 2 bits of scales 4-7, bytes 4-7 the same for minimums, bytes 8-11 the low 4 bits of scales
    4-7 (low nibble) and of minimums 4-7 (high nibble)."""
    first, second, low_bits = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([first & 63, (low_bits & 15) | ((first >> 6) << 4)], axis=-1)
    minimums = np.concatenate([second & 63, (low_bits >> 4) | ((second >> 6) << 4)], axis=-1)
    return scales.astype(np.float32), minimums.astype(np.float32)


def _legacy_nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes of a 32-weight block: weight i in the low nibble of byte i, weight i + 16 in its high nibble."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def decode_gguf_blocks(type_name: str, raw: np.ndarray, out_features: int, in_features: int) -> Optional[BlockWeights]:
    """A GGUF tensor's raw bytes as kernel blocks, every weight exactly as the type defines it (gguf/quants.py,
    the reference dequantiser); None for a type the kernels do not take. Per type (ggml's layouts):

    - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: the packed kind of the same name, the file's own fields at
      the file's size, repacked by kernels.repack_gguf (gguf_fields says what the fields are; kernels/packed.py).
    - IQ4_NL: f16 d, nibbles as Q4_0, w = d table[q]; IQ4_XS: super-blocks of 256, f16 d, 6-bit sub-block scales
      (ls - 32) for 8 sub-blocks of 32, w = d (ls - 32) table[q]: kind q8 (the table's values are int8).
    - Q3_K: 32 bytes of high bits, 64 of 2-bit pairs, 12 bytes of 6-bit scales (sc - 32) of 16 sub-blocks of 16,
      f16 d, w = (d (sc - 32)) (q - 4): kind q4s. Q2_K: 16 bytes of 4-bit scale/minimum pairs, 64 of 2-bit codes,
      f16 d, dmin, w = (d sc) q - dmin m: kind q2s.
    - F32, F16, BF16: the weights themselves (float kinds)."""
    from .. import kernels

    if in_features % BLOCK:
        return None
    if type_name in GGUF_FLOATS:
        dtype = GGUF_FLOATS[type_name]
        flat = np.ascontiguousarray(raw).view(np.uint8).reshape(out_features, -1)
        weights = torch.from_numpy(flat.copy()).view(dtype).reshape(out_features, in_features)
        kind = {"F32": kernels.KIND_F32, "F16": kernels.KIND_F16, "BF16": kernels.KIND_BF16}[type_name]
        return BlockWeights.from_codes(kind, weights, None, None, type_name)
    if type_name not in GGUF_BLOCKS:
        return None
    size, per = GGUF_BLOCKS[type_name]
    if in_features % per:
        return None
    data: np.ndarray = np.asarray(raw).view(np.uint8).reshape(out_features, in_features // per, size)
    shape = (out_features, in_features)
    codes: np.ndarray
    low: np.ndarray
    offsets: Optional[np.ndarray] = None
    if type_name in kernels.KIND_OF_GGUF_TYPE:  # the file's bytes reordered (kernels.repack_gguf, in C)
        kind = kernels.KIND_OF_GGUF_TYPE[type_name]
        rows = np.ascontiguousarray(data).reshape(out_features, -1)  # (the mapped file's bytes, read-only)
        return BlockWeights(kind, kernels.repack_gguf(kind, rows, in_features), out_features, in_features, type_name)
    if type_name == "IQ4_NL":
        q = _legacy_nibbles(data[..., size - 16 :])
        kind, codes, scales = kernels.KIND_Q8, IQ4_VALUES[q] + 128, _halves(data, 0)
    elif type_name == "Q3_K":
        low = _bits(data[..., 32:96].reshape(out_features, -1, 2, 32), [0, 2, 4, 6], 3)  # [out, supers, 2, 4, 32]
        high = _bits(data[..., :32], list(range(8)), 1)  # [out, supers, 8, 32]
        q = low.reshape(out_features, -1, 8, 32) + 4 * high  # q - 4 is the weight's code
        packed = data[..., 96:108]
        low_scales = _bits(packed[..., :8], [0, 4], 15).reshape(out_features, -1, 16)
        high_scales = _bits(packed[..., 8:12], [0, 2, 4, 6], 3).reshape(out_features, -1, 16)
        sub = (low_scales | (high_scales << 4)).astype(np.float32) - 32
        kind, codes, scales = kernels.KIND_Q4S, q, _halves(data, 108)[..., None] * sub
    elif type_name == "Q2_K":
        q = _bits(data[..., 16:80].reshape(out_features, -1, 2, 32), [0, 2, 4, 6], 3)  # [out, supers, 2, 4, 32]
        d, dmin = _halves(data, 80), _halves(data, 82)
        packed = data[..., :16]
        kind, codes = kernels.KIND_Q2S, q
        scales = d[..., None] * (packed & 15).astype(np.float32)
        offsets = -(dmin[..., None] * (packed >> 4).astype(np.float32))
    else:  # IQ4_XS
        d = _halves(data, 0)
        high_bits = np.ascontiguousarray(data[..., 2:4]).view(np.uint16)  # [out, supers, 1]
        low = _bits(data[..., 4:8], [0, 4], 15)  # [out, supers, 2, 4]: sub-block 2i + h in row h, column i
        low = low.swapaxes(-1, -2).reshape(out_features, -1, 8)
        high_scales = (high_bits >> (2 * np.arange(8, dtype=np.uint16))) & 3  # [out, supers, 8]
        scales = d[..., None] * ((low | (high_scales << 4)).astype(np.float32) - 32)
        q = _legacy_nibbles(data[..., 8:].reshape(out_features, -1, 8, 16))  # [out, supers, 8, 32]
        kind, codes = kernels.KIND_Q8, IQ4_VALUES[q] + 128
    codes_t = torch.from_numpy(np.ascontiguousarray(codes).astype(np.uint8).reshape(shape))
    sub = kernels.kind_of(kind).sub
    scales_t = torch.from_numpy(np.ascontiguousarray(scales, dtype=np.float32).reshape(out_features, -1))
    offsets_t = None if offsets is None else torch.from_numpy(
        np.ascontiguousarray(offsets, dtype=np.float32).reshape(out_features, -1))
    if scales_t.shape[1] != in_features // sub:  # pragma: no cover - a layout mistake
        raise AssertionError(f"{type_name}: {scales_t.shape[1]} scales for {in_features // sub} sub-blocks")
    return BlockWeights.from_codes(kind, codes_t, scales_t, offsets_t, type_name)


def _f16(raw: np.ndarray, start: int) -> torch.Tensor:
    """The float16 at byte `start` of every block -> float16 [...] (bits as stored)."""
    return torch.from_numpy(np.ascontiguousarray(raw[..., start : start + 2]).view(np.float16)[..., 0].copy())


def gguf_fields(type_name: str, data: np.ndarray) -> kernels.Fields:
    """A packed type's blocks (uint8 [out, blocks, bytes per block]) as the packed kind's fields (kernels/packed.py):
    the codes as stored, d (m, dmin) as f16, sub-scales as integers; every value as the file holds it. The reference
    for kernels.repack_gguf (C), which loads use; tests hold pack_fields(gguf_fields(...)) equal to it.

    - Q4_0: f16 d, 16 bytes of nibbles (weight i low, i + 16 high), w = d (q - 8). Q4_1: f16 d, f16 m, nibbles,
      w = d q + m. Q5_0/Q5_1: as Q4_0/Q4_1 with 32 fifth bits after the f16s (bit i: weight i); Q5_0 w = d (q - 16).
    - Q8_0: f16 d, 32 int8 codes, w = d q.
    - Q4_K: super-blocks of 256, f16 d and dmin, 12 bytes of 6-bit scales/minimums for 8 sub-blocks of 32, 128 bytes
      where each 32-byte quarter holds one sub-block (low nibbles) and the next (high); w = (d sc) q - dmin m. Q5_K:
      as Q4_K with 32 bytes of fifth bits (bit j of byte i: weight i of sub-block j).
    - Q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales of sub-blocks of 16, f16 d,
      w = (d sc) (q - 32)."""
    out_features, size = data.shape[0], data.shape[2]
    if type_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        q = _legacy_nibbles(data[..., size - 16 :])
        if type_name in ("Q5_0", "Q5_1"):
            q = q | (np.unpackbits(data[..., size - 20 : size - 16], axis=-1, bitorder="little") << 4)
        m = _f16(data, 2) if type_name in ("Q4_1", "Q5_1") else None
        return kernels.Fields(_codes(q, out_features), _f16(data, 0), m)
    if type_name == "Q8_0":
        return kernels.Fields(_codes(data[..., 2:], out_features), _f16(data, 0))
    if type_name in ("Q4_K", "Q5_K"):
        sub_scales, sub_minimums = _k_scales(data[..., 4:16])  # [out, supers, 8]
        quarters = data[..., size - 128 :].reshape(out_features, -1, 4, 32)  # [out, supers, 4, 32]
        q = _bits(quarters, [0, 4], 15).reshape(out_features, -1, 8, 32)  # sub-block 2i low, 2i + 1 high nibbles
        if type_name == "Q5_K":
            q = q | (_bits(data[..., 16:48], list(range(8)), 1) << 4)  # bit j -> sub-block j
        return kernels.Fields(_codes(q, out_features), _f16(data, 0), _f16(data, 2),
                              torch.from_numpy(sub_scales.astype(np.uint8)),
                              torch.from_numpy(sub_minimums.astype(np.uint8)))
    if type_name == "Q6_K":
        low = _bits(data[..., :128].reshape(out_features, -1, 2, 64), [0, 4], 15)  # [out, supers, 2, 2, 64]
        high = _bits(data[..., 128:192].reshape(out_features, -1, 2, 32), [0, 2, 4, 6], 3)  # [.., 2, 4, 32]
        q = low.reshape(out_features, -1, 8, 32) | (high.reshape(out_features, -1, 8, 32) << 4)
        scales = torch.from_numpy(np.ascontiguousarray(data[..., 192:208]).view(np.int8).copy())
        return kernels.Fields(_codes(q, out_features), _f16(data, 208), None, scales)
    raise ValueError(f"{type_name} is not a packed type")


def _codes(q: np.ndarray, out_features: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(q).astype(np.uint8).reshape(out_features, -1))


def permuted_rows(out_features: int, heads: int) -> np.ndarray:
    """Row order of llama's q/k projections in a GGUF: llama.cpp's converter interleaves each head's two rotary
    halves (row h*dim + 2i + j holds Hugging Face row h*dim + j*dim/2 + i); index a GGUF weight with this to get
    the Hugging Face order."""
    half = out_features // heads // 2
    return np.arange(out_features).reshape(heads, half, 2).swapaxes(1, 2).reshape(-1)


def gguf_tensor_names(model: Any, reader: Any) -> dict[str, str]:
    """{model's linear layer name: GGUF tensor name} from gguf's own name map for the file's architecture."""
    import gguf

    arch_field = reader.fields.get("general.architecture")
    arch_name = bytes(arch_field.parts[arch_field.data[0]]).decode() if arch_field is not None else ""
    arch = next((key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == arch_name), None)
    if arch is None:
        return {}
    name_map = gguf.get_tensor_name_map(arch, int(model.config.num_hidden_layers))
    names = {}
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            found = name_map.get_name(module_name)
            if found is not None:
                names[module_name] = f"{found}.weight"
    return names


def _matches(candidate: torch.Tensor, reference: torch.Tensor) -> bool:
    """Whether blocks hold the weight transformers loaded from the same tensor: equal within bfloat16's rounding
    (the conversion of a family computed by transformers is bfloat16; a row out of place is off by whole units)."""
    tolerance = 1e-5 * (1.0 + float(reference.abs().max()))
    return bool(((candidate - reference).abs() <= reference.abs() * 2.0**-8 + tolerance).all())


def gguf_blocks(model: Any, gguf_path: Path) -> Iterator[tuple[str, BlockWeights]]:
    """(linear layer name, its GGUF blocks) for every layer whose tensor is of a kernel type and matches the dense
    weight transformers loaded from the same file (tied output heads read `token_embd`)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    names = gguf_tensor_names(model, reader)
    config = model.config
    for module_name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module.in_features % BLOCK:
            continue
        tensor = tensors.get(names.get(module_name, "")) or (tensors.get("token_embd.weight") if module_name ==
                                                             "lm_head" and "output.weight" not in tensors else None)
        if tensor is None:
            continue
        weights = decode_gguf_blocks(tensor.tensor_type.name, tensor.data, module.out_features, module.in_features)
        if weights is None:
            continue
        reference = module.weight.detach().to(torch.float32)
        if not _matches(weights.dense(), reference):
            heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
            kind = tensor.name.split(".")[-2] if tensor.name.count(".") >= 2 else ""
            if kind not in heads:
                continue
            weights = weights.take(torch.from_numpy(permuted_rows(module.out_features, int(heads[kind]))))
            if not _matches(weights.dense(), reference):
                continue
        weights.forget_unpacked()  # only the records are kept
        yield module_name, weights


# -- converting a model, with a cache ---------------------------------------------------------------------


def plan_blocks(model: Any, mode: str, gguf_path: Optional[Path]) -> dict[str, BlockWeights]:
    """{linear layer name: its blocks} for `mode` (gguf, int8, int4); layers left out stay dense."""
    from .. import kernels

    check_choice(mode, BLOCK_MODES, "weights")
    planned: dict[str, BlockWeights] = {}
    if gguf_path is not None:
        for name, weights in gguf_blocks(model, gguf_path):
            bits = kernels.kind_of(weights.kind).bits
            if (mode == "int4" and bits != 4) or (mode == "int8" and bits >= 16):
                continue  # quantised on load below
            planned[name] = weights
    if mode in ("int8", "int4"):
        kind = kernels.KIND_Q8 if mode == "int8" else kernels.KIND_Q4
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name not in planned and module.in_features % BLOCK == 0:
                planned[name] = quantize_dense(module.weight, kind)
                planned[name].forget_unpacked()
    return planned


def install_blocks(model: Any, planned: dict[str, BlockWeights]) -> int:
    """Replace the planned linear layers by BlockLinear (in place); returns how many were replaced."""
    modules = dict(model.named_modules())
    for name, weights in planned.items():
        parent_name, _, attribute = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        old = getattr(parent, attribute)
        setattr(parent, attribute, BlockLinear(weights, getattr(old, "bias", None)))
    if planned and getattr(model.config, "tie_word_embeddings", False) and "lm_head" in planned:
        model.config.tie_word_embeddings = False  # the head is its own (block) layer now; nothing re-ties it
    return len(planned)


def cache_file(home: Path, identity: str, mode: str) -> Path:
    digest = hashlib.sha256(f"{identity}|{mode}|{CACHE_FORMAT}".encode()).hexdigest()[:16]
    return home / "weights" / f"{mode}-{digest}.safetensors"


def load_cached(path: Path) -> Optional[dict[str, BlockWeights]]:
    """The planned blocks stored at `path`, or None when absent, foreign or unreadable (then converted again)."""
    from safetensors import SafetensorError, safe_open

    from .. import kernels

    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
            if meta.get("format") != str(CACHE_FORMAT) or meta.get("kind") != "specdec-blocks":
                return None
            layers = json.loads(meta["layers"])
            planned = {}
            for name, info in layers.items():
                records = handle.get_tensor(f"{name}.records")
                kind, out_features, in_features = int(info["kind"]), int(info["out"]), int(info["in"])
                if tuple(records.shape) != (kernels.groups(out_features), kernels.record_bytes(kind, in_features)):
                    return None
                planned[name] = BlockWeights(kind, records, out_features, in_features, str(info["origin"]))
            return planned
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError):
        return None


def save_cached(path: Path, planned: dict[str, BlockWeights]) -> None:
    """Write the planned blocks atomically (a read-only home only costs a conversion next time)."""
    from safetensors.torch import save

    from ..files import write_atomic

    tensors: dict[str, torch.Tensor] = {}
    layers = {}
    for name, weights in planned.items():
        tensors[f"{name}.records"] = weights.records.contiguous()
        layers[name] = {"kind": weights.kind, "out": weights.shape[0], "in": weights.shape[1], "origin": weights.origin}
    meta = {"format": str(CACHE_FORMAT), "kind": "specdec-blocks", "layers": json.dumps(layers)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, save(tensors, metadata=meta))
    except (OSError, SpecdecError):
        pass


def convert(model: Any, mode: str, gguf_path: Optional[Path], identity: str, home: Path) -> int:
    """Put `model` (float32, loaded dense) on block weights for `mode`, from the cache when it holds them."""
    path = cache_file(home, identity, mode)
    planned = load_cached(path)
    if planned is None or any(name not in dict(model.named_modules()) for name in planned):
        planned = plan_blocks(model, mode, gguf_path)
        save_cached(path, planned)
    return install_blocks(model, planned)
