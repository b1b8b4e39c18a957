"""A GGUF tensor's bytes as kernel blocks: one small decoder per ggml type, every weight exactly as ggml defines it.

`decode_gguf_blocks(type_name, raw, out_features, in_features)` looks the type up in `DECODERS` ({ggml type name:
decoder}) and returns its BlockWeights, or None for a type the kernels do not take or a row that is not whole
blocks of it. Each decoder reads its own type's bytes (ggml's layouts, checked against gguf/quants.py, the reference
dequantiser) and nothing else:

- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS: the packed kind of the same name, the file's own
  fields at the file's size, repacked by kernels.repack_gguf (`gguf_fields` says what the fields are;
  kernels/packed.py).
- Q3_K: 32 bytes of high bits, 64 of 2-bit pairs, 12 bytes of 6-bit scales (sc - 32) of 16 sub-blocks of 16,
  f16 d, w = (d (sc - 32)) (q - 4): kind q4s. Q2_K: 16 bytes of 4-bit scale/minimum pairs, 64 of 2-bit codes,
  f16 d, dmin, w = (d sc) q - dmin m: kind q2s.
- F32, F16, BF16: the weights themselves (float kinds).

`permuted_rows` is the row order of llama.cpp's interleaved q/k projections (which families have them:
families.Family.permuted_qk). This file neither reads a file (gguf_file.py) nor decides which tensor goes where
(gguf_layout.py, converted_blocks.gguf_blocks).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from ... import kernels
from ...kernels import BLOCK
from ..native.block_weights import BlockWeights

# bytes per block of each GGUF type specdec's kernels take, and weights per block
GGUF_BLOCKS = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q5_0": (22, 32), "Q5_1": (24, 32), "Q8_0": (34, 32),
               "Q2_K": (84, 256), "Q3_K": (110, 256), "Q4_K": (144, 256), "Q5_K": (176, 256), "Q6_K": (210, 256),
               "IQ4_NL": (18, 32), "IQ4_XS": (136, 256)}
GGUF_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
FLOAT_KINDS = {"F32": kernels.KIND_F32, "F16": kernels.KIND_F16, "BF16": kernels.KIND_BF16}

# (raw bytes, out_features, in_features) -> the blocks; raw is [out, bytes per row] or flat, read-only
Decoder = Callable[[np.ndarray, int, int], BlockWeights]


def decode_gguf_blocks(type_name: str, raw: np.ndarray, out_features: int, in_features: int) -> Optional[BlockWeights]:
    """A GGUF tensor's raw bytes as kernel blocks (see the module docstring); None for a type without a decoder
    or rows that are not whole blocks of 32 (and of the type's own block)."""
    decoder = DECODERS.get(type_name)
    if decoder is None or in_features % BLOCK or in_features % GGUF_BLOCKS.get(type_name, (0, BLOCK))[1]:
        return None
    return decoder(raw, out_features, in_features)


def _blocks(raw: np.ndarray, type_name: str, out_features: int, in_features: int) -> np.ndarray:
    """The tensor's bytes as uint8 [out, blocks per row, bytes per block]."""
    size, per = GGUF_BLOCKS[type_name]
    return np.asarray(raw).view(np.uint8).reshape(out_features, in_features // per, size)


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


def _with_scales(kind: int, type_name: str, codes: np.ndarray, scales: np.ndarray, out_features: int,
                 in_features: int, offsets: Optional[np.ndarray] = None) -> BlockWeights:
    """Blocks of a kind with float32 scales (and offsets) per sub-block, from codes [out, ..] one a weight."""
    codes_t = torch.from_numpy(np.ascontiguousarray(codes).astype(np.uint8).reshape(out_features, in_features))
    scales_t = torch.from_numpy(np.ascontiguousarray(scales, dtype=np.float32).reshape(out_features, -1))
    offsets_t = None if offsets is None else torch.from_numpy(
        np.ascontiguousarray(offsets, dtype=np.float32).reshape(out_features, -1))
    sub_blocks = in_features // kernels.kind_of(kind).sub
    if scales_t.shape[1] != sub_blocks:  # pragma: no cover - a layout mistake
        raise AssertionError(f"{type_name}: {scales_t.shape[1]} scales for {sub_blocks} sub-blocks")
    return BlockWeights.from_codes(kind, codes_t, scales_t, offsets_t, type_name)


def _packed(type_name: str) -> Decoder:
    """A packed type: the file's bytes reordered into its kind's records (kernels.repack_gguf, in C)."""
    kind = kernels.KIND_OF_GGUF_TYPE[type_name]

    def decode(raw: np.ndarray, out_features: int, in_features: int) -> BlockWeights:
        data = _blocks(raw, type_name, out_features, in_features)
        rows = np.ascontiguousarray(data).reshape(out_features, -1)  # (the mapped file's bytes, read-only)
        return BlockWeights(kind, kernels.repack_gguf(kind, rows, in_features), out_features, in_features, type_name)

    return decode


def _float(type_name: str) -> Decoder:
    """F32, F16, BF16: the weights as they are, on a float kind."""

    def decode(raw: np.ndarray, out_features: int, in_features: int) -> BlockWeights:
        flat = np.ascontiguousarray(raw).view(np.uint8).reshape(out_features, -1)
        weights = torch.from_numpy(flat.copy()).view(GGUF_FLOATS[type_name]).reshape(out_features, in_features)
        return BlockWeights.from_codes(FLOAT_KINDS[type_name], weights, None, None, type_name)

    return decode


def _q3_k(raw: np.ndarray, out_features: int, in_features: int) -> BlockWeights:
    data = _blocks(raw, "Q3_K", out_features, in_features)
    low = _bits(data[..., 32:96].reshape(out_features, -1, 2, 32), [0, 2, 4, 6], 3)  # [out, supers, 2, 4, 32]
    high = _bits(data[..., :32], list(range(8)), 1)  # [out, supers, 8, 32]
    q = low.reshape(out_features, -1, 8, 32) + 4 * high  # q - 4 is the weight's code
    packed = data[..., 96:108]
    low_scales = _bits(packed[..., :8], [0, 4], 15).reshape(out_features, -1, 16)
    high_scales = _bits(packed[..., 8:12], [0, 2, 4, 6], 3).reshape(out_features, -1, 16)
    sub = (low_scales | (high_scales << 4)).astype(np.float32) - 32
    return _with_scales(kernels.KIND_Q4S, "Q3_K", q, _halves(data, 108)[..., None] * sub, out_features, in_features)


def _q2_k(raw: np.ndarray, out_features: int, in_features: int) -> BlockWeights:
    data = _blocks(raw, "Q2_K", out_features, in_features)
    q = _bits(data[..., 16:80].reshape(out_features, -1, 2, 32), [0, 2, 4, 6], 3)  # [out, supers, 2, 4, 32]
    d, dmin = _halves(data, 80), _halves(data, 82)
    packed = data[..., :16]
    scales = d[..., None] * (packed & 15).astype(np.float32)
    offsets = -(dmin[..., None] * (packed >> 4).astype(np.float32))
    return _with_scales(kernels.KIND_Q2S, "Q2_K", q, scales, out_features, in_features, offsets)


DECODERS: dict[str, Decoder] = {  # a packed kind, where the kernels have one, before any other decoder
    "Q3_K": _q3_k, "Q2_K": _q2_k,
    **{type_name: _packed(type_name) for type_name in kernels.KIND_OF_GGUF_TYPE if type_name in GGUF_BLOCKS},
    **{type_name: _float(type_name) for type_name in GGUF_FLOATS},
}


def _f16(raw: np.ndarray, start: int) -> torch.Tensor:
    """The float16 at byte `start` of every block -> float16 [...] (bits as stored)."""
    return torch.from_numpy(np.ascontiguousarray(raw[..., start : start + 2]).view(np.float16)[..., 0].copy())


def gguf_fields(type_name: str, data: np.ndarray) -> kernels.Fields:
    """A packed type's blocks (uint8 [out, blocks, bytes per block]) as the packed kind's fields (kernels/packed.py):
    the codes as stored, d (m, dmin) as f16, sub-scales as integers; every value as the file holds it. The reference
    for kernels.repack_gguf (C), which loads use; tests hold pack_fields(gguf_fields(...)) equal to it.

    - Q4_0: f16 d, 16 bytes of nibbles (weight i low, i + 16 high), w = d (q - 8); IQ4_NL the same bytes, w = d
      IQ4_VALUES[q] (kernels/packed.py). Q4_1: f16 d, f16 m, nibbles,
      w = d q + m. Q5_0/Q5_1: as Q4_0/Q4_1 with 32 fifth bits after the f16s (bit i: weight i); Q5_0 w = d (q - 16).
    - Q8_0: f16 d, 32 int8 codes, w = d q.
    - Q4_K: super-blocks of 256, f16 d and dmin, 12 bytes of 6-bit scales/minimums for 8 sub-blocks of 32, 128 bytes
      where each 32-byte quarter holds one sub-block (low nibbles) and the next (high); w = (d sc) q - dmin m. Q5_K:
      as Q4_K with 32 bytes of fifth bits (bit j of byte i: weight i of sub-block j).
    - Q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales of sub-blocks of 16, f16 d,
      w = (d sc) (q - 32).
    - IQ4_XS: super-blocks of 256, f16 d, u16 scales_h (bits 2i..2i+1: sub-block i's top 2 bits), 4 bytes
      scales_l (byte i: sub-blocks 2i low, 2i + 1 high nibble), 8 sub-blocks of 32 as IQ4_NL's nibbles,
      w = d (ls - 32) IQ4_VALUES[q]."""
    out_features, size = data.shape[0], data.shape[2]
    if type_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"):
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
    if type_name == "IQ4_XS":
        low = _bits(data[..., 4:8], [0, 4], 15).swapaxes(-1, -2).reshape(out_features, -1, 8)  # sub-block 2i + h
        high = (np.ascontiguousarray(data[..., 2:4]).view(np.uint16) >> (2 * np.arange(8, dtype=np.uint16))) & 3
        q = _legacy_nibbles(data[..., 8:].reshape(out_features, -1, 8, 16))  # [out, supers, 8, 32]
        scales = torch.from_numpy((low | (high << 4)).astype(np.uint8))
        return kernels.Fields(_codes(q, out_features), _f16(data, 0), None, scales)
    raise ValueError(f"{type_name} is not a packed type")


def _codes(q: np.ndarray, out_features: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(q).astype(np.uint8).reshape(out_features, -1))


def permuted_rows(out_features: int, heads: int) -> np.ndarray:
    """Row order of llama's q/k projections in a GGUF: llama.cpp's converter interleaves each head's two rotary
    halves (row h*dim + 2i + j holds Hugging Face row h*dim + j*dim/2 + i); index a GGUF weight with this to get
    the Hugging Face order."""
    half = out_features // heads // 2
    return np.arange(out_features).reshape(heads, half, 2).swapaxes(1, 2).reshape(-1)
