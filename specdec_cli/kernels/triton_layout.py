"""A GGUF matrix on the device at the file's bits: the layout the packed Triton GEMM (triton_gemm.py) reads.

The CPU kernels' records interleave 16 output columns (kernels/packed.py); a GPU kernel wants each output row's
fields in k order instead. `PackedMatrix` holds a matrix [n, k] of a packed kind (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS) as flat per-row arrays, every one in its GGUF meaning, nothing widened to a float:

- `codes`: 4-, 5- and 6-bit codes' low nibbles, uint8 [n, k / 2] (weight 2j in byte j's low half, 2j + 1 in its
  high half); Q8_0's int8 codes [n, k];
- `plane`: the fifth bit of 5-bit codes, uint8 [n, k / 8] (bit i of byte j: weight 8j + i), or the top two bits
  of 6-bit codes, uint8 [n, k / 4] (bits 2i..2i+1 of byte j: weight 4j + i);
- `d`, float16 [n, k / super_block], and `m` (Q4_1/Q5_1's m, the K-quants' dmin), float16 likewise;
- `scales`: the K-quants' and IQ4_XS's 6-bit sub-block scales, uint8 [n, k / 32], Q6_K's int8 [n, k / 16];
  `minimums`: the K-quants' 6-bit sub-block minimums, uint8 [n, k / 32].

So a Q4_K matrix takes 148 bytes per 256 weights where the file takes 144 (the 6-bit scales in whole bytes), Q6_K
210 as the file, the legacy types and IQ4_NL exactly the file's bytes. A weight means what gguf.quants.dequantize
says, computed in the same order in float32 (`dequantize`, the reference the kernel is tested against):

    legacy  d * (code - zero) [+ m]        K-quants (d * scale) * code - dmin * minimum
    Q6_K    (d * scale) * (code - 32)      IQ4_NL d * table[code]      IQ4_XS (d * (scale - 32)) * table[code]

Every product there is exact in float32 (an 11-bit mantissa times at most 14 bits), so the kernel's order of
multiplication cannot change a weight. Made here from a packed kind's fields (kernels.Fields), a chunk of output
rows at a time on the device (`from_layers`), and read back as fields (`fields`, whose meaning is
kernels.packed.fields_dequantize: `dequantize`); nothing here multiplies (triton_gemm.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .packed import (
    FORM_IQ4XS,
    FORM_K,
    FORM_LEGACY,
    FORM_Q6K,
    IQ4_VALUES,
    PACKED,
    Fields,
    fields_dequantize,
    packed_kind,
)


def takes(kind: int, in_features: int) -> bool:
    """Whether a matrix of this kernels' kind and row length can be held here."""
    return kind in PACKED and in_features % PACKED[kind].super_block == 0 and in_features % 32 == 0


def _empty(device: torch.device) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.uint8, device=device)  # a field the kind has not: never read


@dataclass
class PackedMatrix:
    """A packed kind's matrix [n, k] on the device, in the layout above."""

    kind: int
    n: int
    k: int
    codes: torch.Tensor
    plane: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor
    scales: torch.Tensor
    minimums: torch.Tensor
    table: torch.Tensor  # float32 [16]: IQ4's values (read only by the table kinds)

    @property
    def nbytes(self) -> int:
        parts = [self.codes, self.d]
        info = packed_kind(self.kind)
        parts += [self.plane] if info.bits in (5, 6) else []
        parts += [self.m] if info.offsets else []
        parts += [self.scales] if info.form != FORM_LEGACY else []
        parts += [self.minimums] if info.form == FORM_K else []
        return sum(part.numel() * part.element_size() for part in parts)

    @staticmethod
    def allocate(kind: int, n: int, k: int, device: torch.device) -> "PackedMatrix":
        info = packed_kind(kind)
        if not takes(kind, k):
            raise ValueError(f"a {info.name} matrix needs rows of a multiple of {info.super_block}, got {k}")
        supers = k // info.super_block
        empty = _empty(device)
        codes = torch.empty(n, k, dtype=torch.int8, device=device) if info.bits == 8 else \
            torch.empty(n, k // 2, dtype=torch.uint8, device=device)
        plane = {5: (k // 8,), 6: (k // 4,)}.get(info.bits)
        scale_shape = {FORM_K: k // 32, FORM_IQ4XS: k // 32, FORM_Q6K: k // 16}.get(info.form)
        return PackedMatrix(
            kind, n, k, codes,
            plane=empty if plane is None else torch.empty(n, *plane, dtype=torch.uint8, device=device),
            d=torch.empty(n, supers, dtype=torch.float16, device=device),
            m=torch.empty(n, supers, dtype=torch.float16, device=device) if info.offsets else empty,
            scales=empty if scale_shape is None else torch.empty(
                n, scale_shape, dtype=torch.int8 if info.form == FORM_Q6K else torch.uint8, device=device),
            minimums=torch.empty(n, k // 32, dtype=torch.uint8, device=device) if info.form == FORM_K else empty,
            table=torch.tensor(IQ4_VALUES, dtype=torch.float32, device=device))

    def fill(self, start: int, fields: Fields) -> None:
        """Rows start.. start + len(fields) from a packed kind's fields (on the device)."""
        info = packed_kind(self.kind)
        codes = fields.codes  # uint8 [rows, k]
        rows = slice(start, start + codes.shape[0])
        if info.bits == 8:
            self.codes[rows] = codes.view(torch.int8)
        else:
            low = (codes & 15).reshape(codes.shape[0], -1, 2)
            self.codes[rows] = low[..., 0] | (low[..., 1] << 4)
        if info.bits in (5, 6):
            width = 1 if info.bits == 5 else 2  # top bits a weight
            per_byte = 8 // width
            tops = (codes >> 4).reshape(codes.shape[0], -1, per_byte).to(torch.int32)
            shifts = torch.arange(per_byte, device=codes.device, dtype=torch.int32) * width
            self.plane[rows] = (tops << shifts).sum(dim=-1).to(torch.uint8)
        self.d[rows] = fields.d
        if info.offsets:
            assert fields.m is not None
            self.m[rows] = fields.m
        if info.form != FORM_LEGACY:
            assert fields.scales is not None
            self.scales[rows] = fields.scales.reshape(codes.shape[0], -1)
        if info.form == FORM_K:
            assert fields.minimums is not None
            self.minimums[rows] = fields.minimums.reshape(codes.shape[0], -1)

    @staticmethod
    def from_layers(layers: list[Any], device: torch.device, chunk_rows: int) -> "PackedMatrix":
        """BlockLinear layers of one packed kind and row length, side by side along the outputs (q|k, gate|up: one
        matrix, one launch), moved to the device `chunk_rows` output rows at a time."""
        return stacked(PackedMatrix.allocate, layers, device, chunk_rows)

    def fields(self, rows: "Optional[slice | torch.Tensor]" = None) -> Fields:
        """The fields of every row (or the rows given: a slice, or ids [r]) as kernels.packed holds them: codes
        uint8 [r, k] (an int8 code's byte), the scale fields as stored."""
        info = packed_kind(self.kind)
        pick = slice(0, self.n) if rows is None else rows
        stored = self.codes[pick]
        if info.bits == 8:
            codes = stored.view(torch.uint8)
        else:  # weight 2j in byte j's low half, 2j + 1 in its high half
            codes = torch.stack([stored & 15, stored >> 4], dim=-1).reshape(stored.shape[0], -1)
        if info.bits in (5, 6):
            width = 1 if info.bits == 5 else 2
            shifts = torch.arange(0, 8, width, device=codes.device, dtype=torch.uint8)  # [weights a byte]
            tops = (self.plane[pick][..., None] >> shifts) & ((1 << width) - 1)  # [r, k / (8 / width), 8 / width]
            codes = codes | (tops.reshape(codes.shape[0], -1) << 4)
        count, supers = codes.shape[0], self.k // info.super_block

        def per_super(field: torch.Tensor) -> torch.Tensor:  # [r, supers, sub-blocks a super-block]
            return field[pick].reshape(count, supers, -1)

        return Fields(codes, self.d[pick], self.m[pick] if info.offsets else None,
                      per_super(self.scales) if info.form != FORM_LEGACY else None,
                      per_super(self.minimums) if info.form == FORM_K else None)

    def dequantize(self, rows: "Optional[slice | torch.Tensor]" = None) -> torch.Tensor:
        """The weights float32 [n, k] (or the rows given) as gguf.quants.dequantize computes them
        (kernels.packed.fields_dequantize of `fields`)."""
        return fields_dequantize(self.kind, self.fields(rows))


def stacked(allocate: Any, layers: list[Any], device: torch.device, chunk_rows: int) -> Any:
    """BlockLinear layers of one kind and row length side by side along the outputs in a new device matrix
    (`allocate(kind, n, k, device)`: a PackedMatrix here, a WordMatrix in triton_words_layout.py, each with its
    `fill(first_row, fields)`), their records moved and unpacked `chunk_rows` output rows at a time."""
    from .packed import GROUP, unpack_fields

    kind, k = layers[0].kind, int(layers[0].in_features)
    if any(layer.kind != kind or int(layer.in_features) != k for layer in layers):
        raise ValueError("layers side by side in one device matrix must share their kind and row length")
    matrix = allocate(kind, sum(int(layer.out_features) for layer in layers), k, device)
    per_chunk = max(1, chunk_rows // GROUP)  # records (GROUP output rows each) per chunk
    offset = 0
    for layer in layers:
        n = int(layer.out_features)
        for first in range(0, layer.records.shape[0], per_chunk):
            part = layer.records[first : first + per_chunk].to(device)  # uint8 [groups, record bytes]
            start = first * GROUP
            matrix.fill(offset + start, unpack_fields(kind, part, min(part.shape[0] * GROUP, n - start)))
        offset += n
    return matrix
