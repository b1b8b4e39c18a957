"""The kernels' weight layout: block kinds, and records of GROUP output columns packed and unpacked in torch.

A weight [n, k] is held as records of GROUP (16) output columns, one record per group, in one of a small set of
kinds (`KINDS`): 4-bit or 8-bit codes with a float32 scale per 32 or 16 weights, an integer zero point and
optionally a float32 offset, or float32/float16/bfloat16 weights as they are (kernels/_cpu.c's header comment
has the byte layout). This file packs (`pack_records`), unpacks, dequantises and selects columns, in torch; it
does not call the C kernels (the package's __init__ does). The packed kinds (a GGUF type's own fields at the file's
size) are packed.py's; record_bytes, unpack_records, dequantize and select_columns take them too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from .packed import (
    FORM_K,
    FORM_Q6K,
    KIND_PIQ4_NL,
    KIND_PIQ4_XS,
    KIND_PQ4_0,
    KIND_PQ4_1,
    KIND_PQ4_K,
    KIND_PQ5_0,
    KIND_PQ5_1,
    KIND_PQ5_K,
    KIND_PQ6_K,
    KIND_PQ8_0,
    PACKED,
    fields_codes,
    pack_fields,
    packed_record_bytes,
    table_values,
    unpack_fields,
)

BLOCK = 32  # weights per block along the input dimension
GROUP = 16  # output columns per record


@dataclass(frozen=True)
class Kind:
    """How a kind holds its weights: `bits` 4 (two codes a byte) or 8 (one a byte) with a float32 scale per `sub`
    weights along k, W = scale * (code - zero) (+ a float32 offset per `sub` where `offsets`); or bits 32/16 for
    float weights (float32, float16, bfloat16) multiplied as they are. Block kinds round each row of activations to
    8 bits with one scale per `span` inputs (32; 256 for the K-quants' and Q6_K's packed kinds, as llama.cpp's
    q8_K)."""

    name: str
    bits: int
    sub: int = 0
    zero: int = 0
    offsets: bool = False
    dtype: Optional[torch.dtype] = None  # float kinds
    span: int = 32  # inputs per activation scale (block kinds)


KIND_Q4, KIND_Q4Z, KIND_Q8, KIND_U8, KIND_Q8S, KIND_Q4S, KIND_Q2S = 4, 5, 8, 9, 16, 17, 18
KIND_F32, KIND_F16, KIND_BF16 = 32, 33, 34
KINDS = {
    KIND_Q4: Kind("q4", 4, 32, 0, True),  # Q4_1, Q4_K, int4
    KIND_Q4Z: Kind("q4z", 4, 32, 8),  # Q4_0
    KIND_Q8: Kind("q8", 8, 32, 128),  # Q8_0, Q5_0, IQ4_NL, IQ4_XS, int8 (bytes hold int8 + 128)
    KIND_U8: Kind("u8", 8, 32, 0, True),  # Q5_1, Q5_K
    KIND_Q8S: Kind("q8s", 8, 16, 32),  # Q6_K
    KIND_Q4S: Kind("q4s", 4, 16, 4),  # Q3_K
    KIND_Q2S: Kind("q2s", 4, 16, 0, True),  # Q2_K
    KIND_F32: Kind("f32", 32, dtype=torch.float32),
    KIND_F16: Kind("f16", 16, dtype=torch.float16),
    KIND_BF16: Kind("bf16", 16, dtype=torch.bfloat16),
}
KINDS.update({kind: Kind(info.name.lower(), info.bits, info.sub, info.zero, info.offsets,
                          span=info.super_block if info.form in (FORM_K, FORM_Q6K) else 32)
              for kind, info in PACKED.items()})
PACKED_KINDS = (KIND_PQ4_0, KIND_PQ4_1, KIND_PQ5_0, KIND_PQ5_1, KIND_PQ8_0, KIND_PQ4_K, KIND_PQ5_K, KIND_PQ6_K,
                KIND_PIQ4_NL, KIND_PIQ4_XS)


def kind_of(kind: int) -> Kind:
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown block kind {kind}") from None


def groups(n: int) -> int:
    """Records holding n output columns (GROUP columns a record; the last one padded)."""
    return (n + GROUP - 1) // GROUP


@functools.lru_cache(maxsize=None)
def record_bytes(kind: int, k: int) -> int:
    """Bytes of one group's record: GROUP output columns, k inputs (kernels/_cpu.c's header comment)."""
    if kind in PACKED:
        return packed_record_bytes(kind, k)
    info = kind_of(kind)
    if info.bits >= 16:
        return k * GROUP * info.bits // 8
    subs = BLOCK // info.sub
    return (k // BLOCK) * (4 * GROUP * subs * (2 if info.offsets else 1) + info.bits * 4 * GROUP)


def _pad(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def pack_records(kind: int, codes: torch.Tensor, scales: Optional[torch.Tensor] = None,
                 offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The kernel's layout, one record per group of GROUP output columns (read as one stream): uint8
    [groups(n), record_bytes(kind, k)].

    Block kinds: codes uint8 [n, k] (one code a byte, as the kind stores it: 0..15 for nibble kinds, int8 + 128 for
    zero point 128), scales (and offsets) float32 [n, k / sub]. Float kinds: codes are the weights [n, k] in the
    kind's dtype. Columns past n are zeros."""
    info = kind_of(kind)
    n, k = codes.shape
    count = groups(n)
    if count == 0:
        return torch.empty(0, record_bytes(kind, k), dtype=torch.uint8)
    if info.bits >= 16:
        weights = _pad(codes.to(info.dtype).contiguous(), count * GROUP)  # [G*16, k]
        return weights.reshape(count, GROUP, k).transpose(1, 2).contiguous().view(torch.uint8).reshape(count, -1)
    if k % BLOCK:
        raise ValueError(f"block weights need k a multiple of {BLOCK}, got {k}")
    if scales is None or scales.shape != (n, k // info.sub) or (offsets is None) == info.offsets:
        raise ValueError(f"kind {info.name} needs scales{' and offsets' if info.offsets else ''} [n, k/{info.sub}]")
    blocks, subs, chunks = k // BLOCK, BLOCK // info.sub, info.sub // 4
    codes = _pad(codes.to(torch.uint8), count * GROUP)
    if info.bits == 8:  # [G, blocks, 8 chunks, 16 columns, 4]
        packed = codes.reshape(count, GROUP, blocks, 8, 4).permute(0, 2, 3, 1, 4)
    else:  # per sub-block: vector q holds chunk q (low nibbles) and chunk q + chunks/2 (high nibbles)
        split = codes.reshape(count, GROUP, blocks, subs, 2, chunks // 2, 4)
        nibbles = split[:, :, :, :, 0] | (split[:, :, :, :, 1] << 4)  # [G, 16, blocks, subs, chunks/2, 4]
        packed = nibbles.permute(0, 2, 3, 4, 1, 5)
    parts = [_pad(scales.to(torch.float32), count * GROUP)]
    if info.offsets:
        parts.append(_pad(offsets.to(torch.float32), count * GROUP))  # type: ignore[union-attr]
    per_block = [part.reshape(count, GROUP, blocks, subs).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
                 .reshape(count, blocks, -1) for part in parts]
    records = torch.cat(per_block + [packed.reshape(count, blocks, -1)], dim=2).reshape(count, -1).contiguous()
    if records.shape[1] != record_bytes(kind, k):  # pragma: no cover - a layout mistake
        raise AssertionError("pack_records and record_bytes disagree")
    return records


def unpack_records(kind: int, records: torch.Tensor, n: int) -> tuple[torch.Tensor, Optional[torch.Tensor],
                                                                      Optional[torch.Tensor]]:
    """(codes [n, k], scales, offsets) of packed records (pack_records' inverse; float kinds: (weights, None,
    None); packed kinds: the codes as stored, and the scales and offsets their fields mean)."""
    if kind in PACKED:
        fields = unpack_fields(kind, records, n)
        _, scales, offsets = fields_codes(kind, fields)
        return fields.codes, scales, offsets
    info = kind_of(kind)
    count = records.shape[0]
    if info.bits >= 16:
        k = records.shape[1] // (GROUP * info.bits // 8)
        weights = records.contiguous().view(info.dtype).reshape(count, k, GROUP).transpose(1, 2)  # type: ignore
        return weights.reshape(count * GROUP, k)[:n].contiguous(), None, None
    subs = BLOCK // info.sub
    scale_bytes = 4 * GROUP * subs
    code_bytes = info.bits * 4 * GROUP
    per_block = scale_bytes * (2 if info.offsets else 1) + code_bytes
    blocks = records.shape[1] // per_block
    k, chunks = blocks * BLOCK, info.sub // 4
    data = records.reshape(count, blocks, per_block)

    def floats(start: int) -> torch.Tensor:  # [n, blocks * subs]
        part = data[:, :, start : start + scale_bytes].contiguous().view(torch.float32)  # [G, blocks, subs*16]
        return part.reshape(count, blocks, subs, GROUP).permute(0, 3, 1, 2).reshape(count * GROUP, -1)[:n]

    scales = floats(0).contiguous()
    offsets = floats(scale_bytes).contiguous() if info.offsets else None
    raw = data[:, :, per_block - code_bytes :]
    if info.bits == 8:
        codes = raw.reshape(count, blocks, 8, GROUP, 4).permute(0, 3, 1, 2, 4)
    else:
        nibbles = raw.reshape(count, blocks, subs, chunks // 2, GROUP, 4).permute(0, 4, 1, 2, 3, 5)
        codes = torch.stack([nibbles & 15, nibbles >> 4], dim=4)  # [G, 16, blocks, subs, 2, chunks/2, 4]
    return codes.reshape(count * GROUP, k)[:n].contiguous(), scales, offsets


def dequantize(kind: int, codes: torch.Tensor, scales: Optional[torch.Tensor],
               offsets: Optional[torch.Tensor]) -> torch.Tensor:
    """What (codes, scales, offsets) mean, float32 [n, k]: scale * (code - zero) (+ offset) per weight (IQ4_NL:
    scale * its table's value of the code)."""
    info = kind_of(kind)
    if info.bits >= 16:
        return codes.to(torch.float32)
    assert scales is not None
    n, k = codes.shape
    values = codes.view(torch.int8) if kind == KIND_PQ8_0 else codes  # Q8_0's codes are int8
    if kind in PACKED and PACKED[kind].table:  # IQ4's are indices into its table
        values = table_values(codes)
    weight = (values.to(torch.float32).reshape(n, -1, info.sub) - info.zero) * scales[..., None]
    if offsets is not None:
        weight = weight + offsets[..., None]
    return weight.reshape(n, k)


def select_columns(kind: int, records: torch.Tensor, n: int, ids: torch.Tensor) -> torch.Tensor:
    """Records of the output columns `ids` (in that order) of records holding n columns."""
    if kind in PACKED:
        return pack_fields(kind, unpack_fields(kind, records, n).take(ids))
    codes, scales, offsets = unpack_records(kind, records, n)
    return pack_records(kind, codes[ids], None if scales is None else scales[ids],
                        None if offsets is None else offsets[ids])
