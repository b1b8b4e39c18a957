"""The packed kinds: a GGUF type's own fields, at the file's size, in records of 16 output columns.

Where records.py's kinds hold a float32 scale (and offset) per 32 or 16 weights, a packed kind keeps what the file
stores: f16 `d` (and `m`, or `dmin`), Q4_K/Q5_K's 6-bit sub-block scales and minimums, Q6_K's int8 sub-scales, and
codes of 4, 5, 6 or 8 bits (nibbles plus a fifth-bit or 2-bit plane). A column of a record therefore holds exactly
its row's bytes in the GGUF (Q4_K 4.5 bits a weight, Q6_K 6.5625, Q8_0 8.5), and the kernels multiply it at that
size (csrc/matmul_packed.c has the byte layout and the order of operations, which gives the same bits as the
float32-scale kind the same weights would repack into).

A matrix is described by its `Fields` (per output row: codes and the type's scale fields, as integers and f16); this
file packs fields into records (`pack_fields`), unpacks them (`unpack_fields`), and says what they mean
(`fields_codes`: codes, float32 scales and offsets as records.py's kinds hold them; `fields_dequantize`). It does
not read GGUF bytes (target_model/native/quant.py turns a GGUF block into fields) nor call the C kernels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

BLOCK, GROUP = 32, 16
KIND_PQ4_0, KIND_PQ4_1, KIND_PQ5_0, KIND_PQ5_1, KIND_PQ8_0 = 40, 41, 42, 43, 44
KIND_PQ4_K, KIND_PQ5_K, KIND_PQ6_K = 45, 46, 47
KIND_PIQ4_NL, KIND_PIQ4_XS = 48, 49
FORM_LEGACY, FORM_K, FORM_Q6K, FORM_IQ4XS = 1, 2, 3, 4
IQ4XS_SCALE_ZERO = 32  # an IQ4_XS sub-block's scale is d * (its 6-bit value - 32)
# IQ4_NL's 16 weight values (ggml's kvalues_iq4nl; csrc/kernels.h IQ4_TABLE): a weight is d times the nibble's value
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


@dataclass(frozen=True)
class PackedKind:
    """A packed kind: its GGUF type, code bits (8: int8 codes), weights per scale (`sub`), zero point, whether it
    has offsets (m or dmin), how its scales are held (`form`), weights per super-block (`super_block`) and whether
    a code is an index into IQ4_VALUES (`table`: IQ4_NL, Q4_0's bytes) rather than a value."""

    name: str
    bits: int
    sub: int
    zero: int
    offsets: bool
    form: int
    super_block: int
    table: bool = False

    @property
    def header_bytes(self) -> int:  # per super-block and group (csrc/blocks.c, cpu_packed_header_bytes)
        if self.form == FORM_K:
            return 2 * 2 * GROUP + 12 * GROUP
        if self.form == FORM_Q6K:
            return 2 * GROUP + 16 * GROUP
        if self.form == FORM_IQ4XS:
            return 2 * GROUP + 6 * GROUP
        return 2 * GROUP * (2 if self.offsets else 1)

    @property
    def block_bytes(self) -> int:  # codes of a block of 32, per group
        return {4: 16, 5: 20, 6: 24, 8: 32}[self.bits] * GROUP

    @property
    def super_bytes(self) -> int:
        return self.header_bytes + self.super_block // BLOCK * self.block_bytes


PACKED = {
    KIND_PQ4_0: PackedKind("Q4_0", 4, 32, 8, False, FORM_LEGACY, 32),
    KIND_PQ4_1: PackedKind("Q4_1", 4, 32, 0, True, FORM_LEGACY, 32),
    KIND_PQ5_0: PackedKind("Q5_0", 5, 32, 16, False, FORM_LEGACY, 32),
    KIND_PQ5_1: PackedKind("Q5_1", 5, 32, 0, True, FORM_LEGACY, 32),
    KIND_PQ8_0: PackedKind("Q8_0", 8, 32, 0, False, FORM_LEGACY, 32),
    KIND_PQ4_K: PackedKind("Q4_K", 4, 32, 0, True, FORM_K, 256),
    KIND_PQ5_K: PackedKind("Q5_K", 5, 32, 0, True, FORM_K, 256),
    KIND_PQ6_K: PackedKind("Q6_K", 6, 16, 32, False, FORM_Q6K, 256),
    KIND_PIQ4_NL: PackedKind("IQ4_NL", 4, 32, 0, False, FORM_LEGACY, 32, table=True),
    KIND_PIQ4_XS: PackedKind("IQ4_XS", 4, 32, 0, False, FORM_IQ4XS, 256, table=True),
}
KIND_OF_GGUF_TYPE = {info.name: kind for kind, info in PACKED.items()}


@dataclass
class Fields:
    """A matrix [n, k] as a packed kind's fields, per output row (n rows, `supers` = k / super_block):
    codes uint8 [n, k] (the code as stored: 0..15, 0..31, 0..63, or the int8 code's byte); d float16 [n, supers];
    m float16 [n, supers] (Q4_1/Q5_1's m, the K-quants' dmin; else None); scales uint8 [n, supers, 8] (Q4_K/Q5_K,
    IQ4_XS: 6-bit) or int8 [n, supers, 16] (Q6_K), else None; minimums uint8 [n, supers, 8] (Q4_K/Q5_K, 6-bit), else
    None."""

    codes: torch.Tensor
    d: torch.Tensor
    m: Optional[torch.Tensor] = None
    scales: Optional[torch.Tensor] = None
    minimums: Optional[torch.Tensor] = None

    def take(self, rows: torch.Tensor) -> "Fields":
        """The fields of output rows `rows`, in that order."""
        def pick(part: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if part is None else part[rows]

        return Fields(self.codes[rows], self.d[rows], pick(self.m), pick(self.scales), pick(self.minimums))


def packed_kind(kind: int) -> PackedKind:
    try:
        return PACKED[kind]
    except KeyError:
        raise ValueError(f"not a packed kind: {kind}") from None


def packed_record_bytes(kind: int, k: int) -> int:
    info = packed_kind(kind)
    if k % info.super_block:
        raise ValueError(f"kind {info.name} needs k a multiple of {info.super_block}, got {k}")
    return k // info.super_block * info.super_bytes


def _padded(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def _columns_last(part: torch.Tensor, count: int) -> torch.Tensor:
    """A one-byte field [count * 16, supers, values] -> uint8 [count, supers, values * 16]: the 16 columns of each
    value side by side."""
    per_row = part.reshape(count, GROUP, part.shape[1], -1)  # [G, 16, supers, values]
    raw = per_row.permute(0, 2, 3, 1).contiguous()  # [G, supers, values, 16]
    return raw.view(torch.uint8).reshape(count, part.shape[1], -1)


def _halves_bytes(part: torch.Tensor, count: int) -> torch.Tensor:
    """f16 [count*16, supers] -> uint8 [count, supers, 32]: the 16 columns' halves side by side."""
    return part.reshape(count, GROUP, -1).transpose(1, 2).contiguous().view(torch.uint8).reshape(count, -1, 2 * GROUP)


def _six_bit_planes(values: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """6-bit values uint8 [count*16, supers, 8] -> (nibbles [count, supers, 64]: byte (p, c) = value 2p's low 4
    bits | value 2p+1's << 4; top bits [count, supers, 32]: byte (p, c) bits 2t..2t+1 = value 4p+t's top 2)."""
    low = (values & 15).reshape(values.shape[0], -1, 4, 2)
    nibbles = low[..., 0] | (low[..., 1] << 4)  # [rows, supers, 4]
    tops = ((values >> 4) & 3).reshape(values.shape[0], -1, 2, 4)
    top_bytes = tops[..., 0] | (tops[..., 1] << 2) | (tops[..., 2] << 4) | (tops[..., 3] << 6)  # [rows, supers, 2]
    return _columns_last(nibbles, count), _columns_last(top_bytes, count)


def _code_bytes(info: PackedKind, codes: torch.Tensor, count: int, supers: int) -> torch.Tensor:
    """codes uint8 [count*16, k] -> uint8 [count, supers, blocks per super-block * block bytes]."""
    blocks = info.super_block // BLOCK
    per = codes.reshape(count, GROUP, supers, blocks, 8, 4)  # [G, 16 columns, supers, blocks, chunk, weight]
    parts = []
    if info.bits == 8:
        parts.append(per.permute(0, 2, 3, 4, 1, 5))  # [G, supers, blocks, 8 chunks, 16, 4]
    else:
        chunks = info.sub // 4
        split = per.reshape(count, GROUP, supers, blocks, BLOCK // info.sub, 2, chunks // 2, 4) & 15
        nibbles = split[:, :, :, :, :, 0] | (split[:, :, :, :, :, 1] << 4)  # [G, 16, S, B, subs, chunks/2, 4]
        parts.append(nibbles.permute(0, 2, 3, 4, 5, 1, 6))  # [G, S, B, subs, chunks/2, 16, 4]
        if info.bits == 5:
            fifth = (per >> 4) & 1  # [G, 16, S, B, 8, 4]
            plane = fifth[:, :, :, :, 0].clone()  # [G, 16, S, B, 4]
            for i in range(1, 8):
                plane |= fifth[:, :, :, :, i] << i
            parts.append(plane.permute(0, 2, 3, 1, 4))  # [G, S, B, 16, 4]
        elif info.bits == 6:
            tops = ((per >> 4) & 3).reshape(count, GROUP, supers, blocks, 2, 4, 4)  # [.., sub-block, t, weight]
            plane = tops[:, :, :, :, :, 0].clone()  # [G, 16, S, B, 2, 4]
            for t in range(1, 4):
                plane |= tops[:, :, :, :, :, t] << (2 * t)
            parts.append(plane.permute(0, 2, 3, 4, 1, 5))  # [G, S, B, 2, 16, 4]
    flat = [part.reshape(count, supers, blocks, -1).to(torch.uint8) for part in parts]
    return torch.cat(flat, dim=3).reshape(count, supers, -1)


def pack_fields(kind: int, fields: Fields) -> torch.Tensor:
    """Records of a packed kind, uint8 [groups(n), packed_record_bytes(kind, k)] (columns past n are zeros)."""
    info = packed_kind(kind)
    n, k = fields.codes.shape
    count = (n + GROUP - 1) // GROUP
    supers = k // info.super_block
    if count == 0:
        return torch.empty(0, packed_record_bytes(kind, k), dtype=torch.uint8)
    rows = count * GROUP
    header = [_halves_bytes(_padded(fields.d.to(torch.float16), rows), count)]
    if info.offsets:
        assert fields.m is not None
        header.append(_halves_bytes(_padded(fields.m.to(torch.float16), rows), count))
    if info.form == FORM_K:
        assert fields.scales is not None and fields.minimums is not None
        scale_low, scale_top = _six_bit_planes(_padded(fields.scales.to(torch.uint8), rows), count)
        min_low, min_top = _six_bit_planes(_padded(fields.minimums.to(torch.uint8), rows), count)
        header += [scale_low, min_low, scale_top, min_top]
    elif info.form == FORM_Q6K:
        assert fields.scales is not None
        header.append(_columns_last(_padded(fields.scales.to(torch.int8), rows).view(torch.uint8), count))
    elif info.form == FORM_IQ4XS:
        assert fields.scales is not None
        header += list(_six_bit_planes(_padded(fields.scales.to(torch.uint8), rows), count))
    codes = _code_bytes(info, _padded(fields.codes.to(torch.uint8), rows), count, supers)
    records = torch.cat(header + [codes], dim=2).reshape(count, -1).contiguous()
    if records.shape[1] != packed_record_bytes(kind, k):  # pragma: no cover - a layout mistake
        raise AssertionError("pack_fields and packed_record_bytes disagree")
    return records


def _columns_first(part: torch.Tensor, values: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """_columns_last's inverse: uint8 [G, supers, values * 16 * size] -> dtype [G * 16, supers, values]."""
    count, supers = part.shape[:2]
    typed = part.contiguous().view(dtype).reshape(count, supers, values, GROUP)
    return typed.permute(0, 3, 1, 2).reshape(count * GROUP, supers, values)


def _six_bit_values(nibbles: torch.Tensor, tops: torch.Tensor) -> torch.Tensor:
    """_six_bit_planes' inverse: -> uint8 [G * 16, supers, 8]."""
    low = _columns_first(nibbles, 4)  # [rows, supers, 4]
    top = _columns_first(tops, 2)  # [rows, supers, 2]
    low_values = torch.stack([low & 15, low >> 4], dim=-1).reshape(low.shape[0], -1, 8)
    top_values = torch.stack([(top >> (2 * t)) & 3 for t in range(4)], dim=-1).reshape(top.shape[0], -1, 8)
    return low_values | (top_values << 4)


def unpack_fields(kind: int, records: torch.Tensor, n: int) -> Fields:
    """pack_fields' inverse: the fields of the first n columns."""
    info = packed_kind(kind)
    count = records.shape[0]
    supers = records.shape[1] // info.super_bytes
    blocks = info.super_block // BLOCK
    data = records.reshape(count, supers, info.super_bytes)

    def halves(start: int) -> torch.Tensor:  # [G * 16, supers] float16
        return _columns_first(data[:, :, start : start + 2 * GROUP], 1, torch.float16)[..., 0][:n].contiguous()

    fields = Fields(codes=torch.empty(0), d=halves(0))
    if info.offsets:
        fields.m = halves(2 * GROUP)
    if info.form == FORM_K:
        base = 4 * GROUP
        fields.scales = _six_bit_values(data[:, :, base : base + 64], data[:, :, base + 128 : base + 160])[:n]
        fields.minimums = _six_bit_values(data[:, :, base + 64 : base + 128], data[:, :, base + 160 : base + 192])[:n]
    elif info.form == FORM_Q6K:
        fields.scales = _columns_first(data[:, :, 2 * GROUP : 18 * GROUP], 16, torch.int8)[:n].contiguous()
    elif info.form == FORM_IQ4XS:
        fields.scales = _six_bit_values(data[:, :, 2 * GROUP : 6 * GROUP], data[:, :, 6 * GROUP : 8 * GROUP])[:n]
    code = data[:, :, info.header_bytes :].reshape(count, supers, blocks, info.block_bytes)
    if info.bits == 8:
        per = code.reshape(count, supers, blocks, 8, GROUP, 4).permute(0, 4, 1, 2, 3, 5)  # [G, 16, S, B, 8, 4]
    else:
        chunks = info.sub // 4
        subs = BLOCK // info.sub
        nibbles = code[..., : 16 * GROUP].reshape(count, supers, blocks, subs, chunks // 2, GROUP, 4)
        nibbles = nibbles.permute(0, 5, 1, 2, 3, 4, 6)  # [G, 16, S, B, subs, chunks/2, 4]
        per = torch.stack([nibbles & 15, nibbles >> 4], dim=5).reshape(count, GROUP, supers, blocks, 8, 4)
        if info.bits == 5:
            plane = code[..., 16 * GROUP : 20 * GROUP].reshape(count, supers, blocks, GROUP, 4).permute(0, 3, 1, 2, 4)
            fifth = torch.stack([(plane >> i) & 1 for i in range(8)], dim=4)  # [G, 16, S, B, 8, 4]
            per = per | (fifth << 4)
        elif info.bits == 6:
            plane = code[..., 16 * GROUP :].reshape(count, supers, blocks, 2, GROUP, 4).permute(0, 4, 1, 2, 3, 5)
            tops = torch.stack([(plane >> (2 * t)) & 3 for t in range(4)], dim=5)  # [G, 16, S, B, 2, 4 t, 4]
            per = per | (tops.reshape(count, GROUP, supers, blocks, 8, 4) << 4)
    fields.codes = per.reshape(count * GROUP, -1)[:n].contiguous()
    return fields


@functools.cache
def _iq4_table(device: torch.device) -> torch.Tensor:
    return torch.tensor(IQ4_VALUES, dtype=torch.int16, device=device)  # made once a device (never in a capture)


def table_values(codes: torch.Tensor) -> torch.Tensor:
    """IQ4's codes (indices 0..15) as the int16 values they stand for, on the codes' device."""
    return _iq4_table(codes.device)[codes.long()]


def fields_codes(kind: int, fields: Fields) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """What the fields mean as records.py's kinds hold it: (codes less the zero point, or IQ4's table values, as
    int16 [n, k]; float32 scales [n, k / sub]; float32 offsets [n, k / sub] or None): weight = (code - zero) * scale
    (+ offset)."""
    info = packed_kind(kind)
    n, k = fields.codes.shape
    if info.table:
        codes = table_values(fields.codes)
    else:
        codes = fields.codes.view(torch.int8).to(torch.int16) if info.bits == 8 else \
            fields.codes.to(torch.int16) - info.zero
    d = fields.d.to(torch.float32)  # [n, supers]
    per_super = info.super_block // info.sub
    if info.form == FORM_LEGACY:
        scales = d
    else:
        assert fields.scales is not None
        sub_scales = fields.scales.to(torch.float32) - (IQ4XS_SCALE_ZERO if info.form == FORM_IQ4XS else 0)
        scales = d[..., None] * sub_scales  # exact: an 11-bit mantissa times <= 8 bits
    offsets = None
    if info.offsets:
        assert fields.m is not None
        m = fields.m.to(torch.float32)
        offsets = m if info.form == FORM_LEGACY else -(m[..., None] * fields.minimums.to(torch.float32))  # type: ignore
        offsets = offsets.reshape(n, -1).contiguous()
    scales = scales.reshape(n, -1).contiguous()
    if scales.shape[1] != k // info.sub or per_super * (k // info.super_block) != scales.shape[1]:
        raise AssertionError("fields_codes: scales and codes disagree")  # pragma: no cover
    return codes, scales, offsets


def fields_dequantize(kind: int, fields: Fields) -> torch.Tensor:
    """The weights the fields mean, float32 [n, k]."""
    info = packed_kind(kind)
    codes, scales, offsets = fields_codes(kind, fields)
    n, k = codes.shape
    weight = codes.to(torch.float32).reshape(n, -1, info.sub) * scales[..., None]
    if offsets is not None:
        weight = weight + offsets[..., None]
    return weight.reshape(n, k)
