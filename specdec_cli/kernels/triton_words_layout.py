"""A Q4_K or Q6_K matrix on the device at the file's bits, its codes in 32-bit words along the output dimension:
the layout the words GEMM (triton_words_gemm.py) reads.

triton_layout.py holds each output row's codes in k order, a byte at a time; a kernel reading them decodes along k
and shuffles registers. `WordMatrix` holds a matrix [n, k] with the *output* dimension contiguous instead, so that a
tile [BLOCK_K, BLOCK_N] of codes is whole words loaded side by side along n:

- `low`: the codes' low four bits, int32 [k / 8, n]: word (j, column) holds weights 8j .. 8j + 7 of the column,
  weight 8j + i in bits 4i .. 4i + 3 (read back as `(word >> 4 * i) & 15`; a word whose top nibble is 8 or more is
  a negative int32, which the arithmetic shift and the mask undo);
- `high`: Q6_K's top two bits, int32 [k / 16, n]: word (j, column) holds weights 16j .. 16j + 15, weight 16j + i in
  bits 2i .. 2i + 1; Q4_K has none;
- `d`, float16 [k / 256, n], and `m` (Q4_K's dmin), float16 [k / 256, n];
- `scales`: Q4_K's 6-bit sub-block scales, uint8 [k / 32, n], or Q6_K's int8 sub-scales, int8 [k / 16, n];
  `minimums`: Q4_K's 6-bit sub-block minimums, uint8 [k / 32, n].

So a Q4_K matrix takes 148 bytes per 256 weights (the file: 144; the 6-bit scales and minimums in whole bytes), a
Q6_K one 210 (the file's). A weight means what gguf.quants.dequantize says (kernels.packed.fields_dequantize, as
triton_layout.py): Q4_K (d * scale) * code - dmin * minimum, Q6_K (d * scale) * (code - 32). Only these two types
(an 8B Q4_K_M file's matrices; `word_takes`); every other type stays in triton_layout.py's layout.

Made here from a packed kind's fields (kernels.packed.Fields) a chunk of output rows at a time on the device
(`from_layers`, `from_packed`), and read back as fields (`fields`, `dequantize`: the reference the kernel is tested
against); nothing here multiplies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .packed import KIND_PQ4_K, KIND_PQ6_K, Fields, fields_dequantize, packed_kind
from .triton_layout import PackedMatrix, stacked

WORD_KINDS = (KIND_PQ4_K, KIND_PQ6_K)
SUPER = 256  # weights per super-block (one d, one dmin)
LOW_PER_WORD, HIGH_PER_WORD = 8, 16  # 4-bit low codes and 2-bit top codes a 32-bit word


def word_takes(kind: int, in_features: int) -> bool:
    """Whether a matrix of this packed kind and row length can be held in words."""
    return kind in WORD_KINDS and in_features % SUPER == 0


def _empty(device: torch.device) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.int32, device=device)  # a field the kind has not: never read


def _words(values: torch.Tensor, bits: int) -> torch.Tensor:
    """values uint8 [rows, k] of `bits` bits -> int32 [k / (32 / bits), rows]: value j * per + i of a row in bits
    bits * i .. of word (j, row), the word's 32 bits as a (possibly negative) int32."""
    per_word = 32 // bits
    grouped = values.to(torch.int64).reshape(values.shape[0], -1, per_word)  # [rows, k / per, per]
    shifts = torch.arange(per_word, device=values.device, dtype=torch.int64) * bits
    words = (grouped << shifts).sum(dim=-1)  # [rows, k / per] in 0 .. 2^32 - 1
    words = torch.where(words >= 1 << 31, words - (1 << 32), words)  # the same 32 bits as an int32
    return words.to(torch.int32).t()  # [k / per, rows]


def _values(words: torch.Tensor, bits: int) -> torch.Tensor:
    """_words' inverse: int32 [k / per, rows] -> uint8 [rows, k]."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, device=words.device, dtype=torch.int32) * bits
    values = (words.t()[..., None] >> shifts) & ((1 << bits) - 1)  # [rows, k / per, per]
    return values.reshape(words.shape[1], -1).to(torch.uint8)


@dataclass
class WordMatrix:
    """A Q4_K or Q6_K matrix [n, k] on the device, in the layout above."""

    kind: int
    n: int
    k: int
    low: torch.Tensor
    high: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor
    scales: torch.Tensor
    minimums: torch.Tensor

    @property
    def six_bit(self) -> bool:
        return self.kind == KIND_PQ6_K

    @property
    def nbytes(self) -> int:
        parts = [self.low, self.d, self.scales] + ([self.high] if self.six_bit else [self.m, self.minimums])
        return sum(part.numel() * part.element_size() for part in parts)

    @staticmethod
    def allocate(kind: int, n: int, k: int, device: torch.device) -> "WordMatrix":
        if not word_takes(kind, k):
            raise ValueError(f"a {packed_kind(kind).name} matrix is not held in words at rows of {k} (Q4_K and Q6_K "
                             f"only, rows a multiple of {SUPER})")
        empty, supers, six_bit = _empty(device), k // SUPER, kind == KIND_PQ6_K
        sub = packed_kind(kind).sub  # weights a scale: 32 (Q4_K), 16 (Q6_K)
        return WordMatrix(
            kind, n, k,
            low=torch.empty(k // LOW_PER_WORD, n, dtype=torch.int32, device=device),
            high=torch.empty(k // HIGH_PER_WORD, n, dtype=torch.int32, device=device) if six_bit else empty,
            d=torch.empty(supers, n, dtype=torch.float16, device=device),
            m=empty if six_bit else torch.empty(supers, n, dtype=torch.float16, device=device),
            scales=torch.empty(k // sub, n, dtype=torch.int8 if six_bit else torch.uint8, device=device),
            minimums=empty if six_bit else torch.empty(k // sub, n, dtype=torch.uint8, device=device))

    def fill(self, start: int, fields: Fields) -> None:
        """Output rows start .. start + len(fields) from a packed kind's fields (on the device)."""
        codes = fields.codes  # uint8 [rows, k]
        count = codes.shape[0]
        columns = slice(start, start + count)
        self.low[:, columns] = _words(codes & 15, 4)  # [k / 8, rows]
        if self.six_bit:
            self.high[:, columns] = _words((codes >> 4) & 3, 2)  # [k / 16, rows]
        self.d[:, columns] = fields.d.t()  # [supers, rows]
        assert fields.scales is not None
        self.scales[:, columns] = fields.scales.reshape(count, -1).t()  # [k / sub, rows]
        if not self.six_bit:
            assert fields.m is not None and fields.minimums is not None
            self.m[:, columns] = fields.m.t()
            self.minimums[:, columns] = fields.minimums.reshape(count, -1).t()

    @staticmethod
    def from_layers(layers: list[Any], device: torch.device, chunk_rows: int) -> "WordMatrix":
        """BlockLinear layers of one kind (Q4_K or Q6_K) and row length, side by side along the outputs (q|k,
        gate|up: one matrix, one launch), moved to the device `chunk_rows` output rows at a time."""
        return stacked(WordMatrix.allocate, layers, device, chunk_rows)

    @staticmethod
    def from_packed(packed: PackedMatrix, chunk_rows: int = 4096) -> "WordMatrix":
        """The same weights as a PackedMatrix of Q4_K or Q6_K (on its device), `chunk_rows` output rows at a time."""
        matrix = WordMatrix.allocate(packed.kind, packed.n, packed.k, packed.codes.device)
        for start in range(0, packed.n, chunk_rows):
            matrix.fill(start, packed.fields(slice(start, min(start + chunk_rows, packed.n))))
        return matrix

    def fields(self, rows: "Optional[slice | torch.Tensor]" = None) -> Fields:
        """The fields of every output row (or the rows given: a slice, or ids [r]) as kernels.packed holds them."""
        pick = slice(0, self.n) if rows is None else rows
        codes = _values(self.low[:, pick], 4)  # uint8 [r, k]
        if self.six_bit:
            codes = codes | (_values(self.high[:, pick], 2) << 4)
        count, supers = codes.shape[0], self.k // SUPER

        def per_super(field: torch.Tensor) -> torch.Tensor:  # [k / sub, n] -> [r, supers, sub-blocks a super-block]
            return field[:, pick].t().reshape(count, supers, -1).contiguous()

        d = self.d[:, pick].t().contiguous()  # float16 [r, supers]
        if self.six_bit:
            return Fields(codes, d, None, per_super(self.scales), None)
        return Fields(codes, d, self.m[:, pick].t().contiguous(), per_super(self.scales), per_super(self.minimums))

    def dequantize(self, rows: "Optional[slice | torch.Tensor]" = None) -> torch.Tensor:
        """The weights float32 [n, k] (or the rows given) as gguf.quants.dequantize computes them."""
        return fields_dequantize(self.kind, self.fields(rows))
