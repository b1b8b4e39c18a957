"""specdec's CPU kernels from Python: block-quantised matmuls and row-invariant attention (`_cpu.c`).

`matmul` multiplies float32 rows by a weight held as records of 16 output columns in one of a small set of
kinds (`KINDS`): 4-bit or 8-bit codes with a float32 scale per 32 or 16 weights, an integer zero point and
optionally a float32 offset, into which quant.py repacks every GGUF type exactly (Q4_0 ... Q8_0, the K-quants,
IQ4_NL/IQ4_XS); or float32/float16/bfloat16 weights as they are. Block kinds round each row to 8 bits per block of
32 first and multiply with integer dot products. `attention` computes each query row over its own keys. Both
return, for every row, exactly what a one-row call returns, whatever the number of rows or threads, and matmul
the same bits on every instruction-set path (the C file says how); `force_isa` (or SPECDEC_ISA) picks a path
for tests and timings. This module checks what the C code cannot (dtypes, shapes, contiguity), packs and
unpacks records, and owns the worker threads' count; it does not know about models, GGUF files or `--weights`
(quant.py does).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

BLOCK = 32  # weights per block along the input dimension
GROUP = 16  # output columns per record
MAX_THREADS = 64  # the pool's limit (_cpu.c)

try:  # built by `pip install` (setup.py); absent in a source tree nobody built
    from . import _cpu  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised only without a compiler
    _cpu = None

if _cpu is not None and os.environ.get("SPECDEC_ISA", "").strip():  # e.g. SPECDEC_ISA=avx2 to time that path
    try:
        _cpu.set_isa(os.environ["SPECDEC_ISA"].strip())
    except ValueError as exc:
        import warnings

        warnings.warn(f"SPECDEC_ISA ignored: {exc}", stacklevel=1)


def available() -> bool:
    """Whether the compiled kernels are importable."""
    return _cpu is not None


def isa() -> str:
    """The instruction set the kernels run on: "avx512vnni", "avxvnni", "avx2" or "portable" ("missing" when not
    compiled). The best this CPU has, unless `force_isa` or SPECDEC_ISA chose another."""
    return _cpu.isa() if _cpu is not None else "missing"


def isas() -> list[str]:
    """The instruction-set paths this CPU can run, best last (empty when not compiled)."""
    return list(_cpu.isas()) if _cpu is not None else []


def force_isa(name: Optional[str]) -> None:
    """Run the kernels on path `name` (one of `isas()`), or on the best again with None. Every path computes each
    block kind's products in the same order (kernels/_cpu.c), so results do not change; for tests and timings."""
    _require().set_isa(name or "best")


def _require() -> Any:
    if _cpu is None:
        from ..errors import SpecdecError

        raise SpecdecError("specdec's CPU kernels (specdec_cli.kernels._cpu) are not compiled: run `pip install -e .` "
                           "in the repository (it needs a C compiler)")
    return _cpu


def set_threads(count: int) -> None:
    """Threads the kernels split their work over, the calling thread included (at most MAX_THREADS)."""
    _require().set_threads(max(1, min(int(count), MAX_THREADS)))


def threads() -> int:
    return int(_require().threads())


_threads_chosen = False


def ensure_threads() -> None:
    """Before the first kernel call: as many threads as torch uses (`--threads` sets both)."""
    global _threads_chosen
    if not _threads_chosen:
        _threads_chosen = True
        if _cpu is not None and _cpu.threads() == 1 and torch.get_num_threads() > 1:
            _cpu.set_threads(torch.get_num_threads())


@dataclass(frozen=True)
class Kind:
    """How a kind holds its weights: `bits` 4 (two codes a byte) or 8 (one a byte) with a float32 scale per `sub`
    weights along k, W = scale * (code - zero) (+ a float32 offset per `sub` where `offsets`); or bits 32/16 for
    float weights (float32, float16, bfloat16) multiplied as they are."""

    name: str
    bits: int
    sub: int = 0
    zero: int = 0
    offsets: bool = False
    dtype: Optional[torch.dtype] = None  # float kinds


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
    None))."""
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
    """What (codes, scales, offsets) mean, float32 [n, k]: scale * (code - zero) (+ offset) per weight."""
    info = kind_of(kind)
    if info.bits >= 16:
        return codes.to(torch.float32)
    assert scales is not None
    n, k = codes.shape
    weight = (codes.to(torch.float32).reshape(n, -1, info.sub) - info.zero) * scales[..., None]
    if offsets is not None:
        weight = weight + offsets[..., None]
    return weight.reshape(n, k)


def select_columns(kind: int, records: torch.Tensor, n: int, ids: torch.Tensor) -> torch.Tensor:
    """Records of the output columns `ids` (in that order) of records holding n columns."""
    codes, scales, offsets = unpack_records(kind, records, n)
    return pack_records(kind, codes[ids], None if scales is None else scales[ids],
                        None if offsets is None else offsets[ids])


# -- the C calls, typed ---------------------------------------------------------------------------------------------
# Every call into _cpu goes through the functions below: they take tensors, check what the C code reads blindly
# (dtype, device, dimensions, the unit stride along a row, shapes that agree) and raise ValueError naming the
# kernel and the argument, never handing C a pointer it would read past. Values (positions within a rotary table,
# key positions within the cache) are the caller's to keep in range. The checks are attribute reads, one or two
# microseconds a call, against the tens of microseconds a decoding step's kernel calls take.

_F32, _U8, _I32 = torch.float32, torch.uint8, torch.int32


def _refuse(kernel: str, what: str, tensor: Optional[torch.Tensor] = None) -> ValueError:
    seen = "" if tensor is None else f", got {tensor.dtype} {tuple(tensor.shape)} on {tensor.device}"
    return ValueError(f"{kernel}: {what}{seen}")


def _not_matrix(tensor: torch.Tensor) -> bool:
    """Not a float32 CPU matrix [rows, width] whose elements lie side by side along a row (rows may be strided)."""
    return tensor.dtype is not _F32 or not tensor.is_cpu or tensor.ndim != 2 or tensor.stride()[1] != 1


def _not_dense(tensor: torch.Tensor, dtype: torch.dtype = _F32) -> bool:
    """Not a contiguous CPU tensor of `dtype`."""
    return tensor.dtype is not dtype or not tensor.is_cpu or not tensor.is_contiguous()


@functools.lru_cache(maxsize=None)
def _records_shape(kind: int, k: int, n: int) -> tuple[int, int]:
    """The shape of records holding n columns of `kind` for k inputs (raises ValueError on an unknown kind)."""
    return groups(n), record_bytes(kind, k)


@dataclass(frozen=True)
class BlockMatrix:
    """A weight W [n, k] as packed records (pack_records) of `kind`, checked once when made: `matmul_into` then
    checks only the rows it multiplies (a decoding step's matmuls, layer after layer)."""

    kind: int
    records: torch.Tensor  # uint8 [groups(n), record_bytes(kind, k)], contiguous, on the CPU
    k: int
    n: int
    _address: int = field(init=False, repr=False, compare=False, default=0)  # the records' (set once checked)

    def __post_init__(self) -> None:
        records = self.records
        if (records.dtype is not _U8 or not records.is_cpu or not records.is_contiguous() or self.k % BLOCK or
                tuple(records.shape) != _records_shape(self.kind, self.k, self.n)):
            raise ValueError(f"BlockMatrix: records of shape {tuple(records.shape)} do not hold {self.n} columns of "
                             f"kind {kind_of(self.kind).name} for k={self.k}")
        object.__setattr__(self, "_address", records.data_ptr())  # held with the records: it cannot move


def matmul_into(x: torch.Tensor, matrix: BlockMatrix, out: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """out (+)= x @ W^T: x contiguous float32 [rows, k], out float32 [rows, n] (rows may be strided: a slice of a
    wider buffer), W a checked BlockMatrix (matmul's product, with the records checked once). Returns out."""
    kernel = _cpu if _cpu is not None else _require()
    if type(matrix) is not BlockMatrix:
        raise _refuse("matmul_into", f"the weight must be a BlockMatrix, got {type(matrix).__name__}")
    if x.dtype is not _F32 or not x.is_cpu or x.ndim != 2 or not x.is_contiguous():
        raise _refuse("matmul_into", "x must be contiguous float32 CPU rows [rows, k]", x)
    rows, k = x.shape
    out_strides = out.stride()
    if (out.dtype is not _F32 or not out.is_cpu or out.shape != (rows, matrix.n) or out_strides[1] != 1 or
            k != matrix.k):
        raise _refuse("matmul_into", f"x [rows, {matrix.k}] and out [rows, {matrix.n}] with unit stride along a row",
                      out)
    if rows:
        kernel.matmul(matrix.kind, x.data_ptr(), rows, k, matrix.n, matrix._address, out.data_ptr(),
                      out_strides[0], accumulate)
    return out


def matmul(x: torch.Tensor, kind: int, records: torch.Tensor, n: Optional[int] = None,
           out: Optional[torch.Tensor] = None, accumulate: bool = False) -> torch.Tensor:
    """x [rows, k] float32 @ W^T -> [rows, n] float32, W as packed records (pack_records; n defaults to every
    column the records hold, or to out's width). Block kinds round each row of x to 8 bits per block of 32 first
    (kernels/_cpu.c). With `out` (float32 [rows, n], rows may be strided: a slice of a wider buffer) the product
    is written there, or added to it with `accumulate`; returns out."""
    kernel = _cpu if _cpu is not None else _require()
    if x.dtype is not _F32 or not x.is_cpu or x.ndim != 2:
        raise _refuse("matmul", "x must be float32 CPU rows [rows, k]", x)
    x = x.contiguous()
    rows, k = x.shape
    if out is None:
        if accumulate:
            raise _refuse("matmul", "accumulate needs an out to add to")
        n = records.shape[0] * GROUP if n is None else int(n)
        out = torch.empty(rows, n, dtype=torch.float32)
    else:
        if _not_matrix(out):
            raise _refuse("matmul", "out must be a float32 CPU matrix with unit stride along a row", out)
        out_rows, width = out.shape
        if out_rows != rows or (n is not None and width != n):
            raise _refuse("matmul", f"out must be [{rows}, {n if n is not None else 'n'}]", out)
        n = width
    if (records.dtype is not _U8 or not records.is_cpu or not records.is_contiguous() or k % BLOCK or
            records.shape != _records_shape(kind, k, n)):
        raise ValueError(f"matmul: records of shape {tuple(records.shape)} do not hold {n} columns of kind "
                         f"{kind_of(kind).name} for k={k}")
    if rows and n:
        kernel.matmul(kind, x.data_ptr(), rows, k, n, records.data_ptr(), out.data_ptr(), out.stride()[0],
                      accumulate)
    return out


@dataclass(frozen=True)
class KeyPositions:
    """Which cached keys each of `rows` query rows attends to, checked once when made: cache positions
    run_start[row] .. run_stop[row]-1, then extra_pos[extra_start[row] : extra_start[row + 1]] (a tree node's
    ancestors and itself), in that order. All contiguous int32 CPU tensors: run_start, run_stop [rows],
    extra_start [rows + 1], extra_pos [extras]. The positions must lie within the keys the attention gets."""

    run_start: torch.Tensor
    run_stop: torch.Tensor
    extra_start: torch.Tensor
    extra_pos: torch.Tensor
    _addresses: tuple[int, ...] = field(init=False, repr=False, compare=False, default=())  # (set once checked)

    def __post_init__(self) -> None:
        rows = self.run_start.shape[0] if self.run_start.ndim == 1 else -1
        if (any(_not_dense(part, _I32) for part in (self.run_start, self.run_stop, self.extra_start, self.extra_pos))
                or tuple(self.run_stop.shape) != (rows,) or tuple(self.extra_start.shape) != (rows + 1,)
                or self.extra_pos.ndim != 1):
            raise ValueError("KeyPositions: run_start, run_stop [rows], extra_start [rows + 1] and extra_pos [extras] "
                             "must be contiguous int32 CPU tensors")
        object.__setattr__(self, "_addresses", tuple(part.data_ptr() for part in (  # held with the tensors
            self.run_start, self.run_stop, self.extra_start, self.extra_pos)))

    @property
    def rows(self) -> int:
        return self.run_start.shape[0]


def attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: KeyPositions, scale: float,
              cap: float = 0.0, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Each query row attends to its own keys (`positions`: KeyPositions). cap > 0 soft-caps the scores
    (score * scale) before the softmax: cap * tanh(score / cap) (gemma2).

    query [rows, heads, dim] float32 (any strides, unit stride along dim); keys/values [kv_heads, positions, dim]
    or [1, kv_heads, positions, dim] (a KV cache's buffers), float32 or bfloat16, unit stride along dim. Writes
    [rows, heads, dim] float32 into `out` (unit stride along dim) or a new tensor, and returns it."""
    kernel = _cpu if _cpu is not None else _require()
    if query.dtype is not _F32 or not query.is_cpu or query.ndim != 3 or query.stride()[2] != 1:
        raise _refuse("attention", "query must be float32 CPU [rows, heads, dim] with unit stride along dim", query)
    rows, heads, dim = query.shape
    key_strides, value_strides = keys.stride(), values.stride()
    key_shape = keys.shape
    if (keys.dtype not in (_F32, torch.bfloat16) or values.dtype is not keys.dtype or not keys.is_cpu or
            not values.is_cpu or key_shape != values.shape or key_shape[-1] != dim or key_strides[-1] != 1 or
            value_strides[-1] != 1 or not (len(key_shape) == 3 or (len(key_shape) == 4 and key_shape[0] == 1))):
        raise _refuse("attention", f"keys and values must be float32 or bfloat16 CPU [(1,) kv_heads, positions, {dim}] "
                      "alike with unit stride along dim", values)
    kv_heads = key_shape[-3]
    if heads % kv_heads:
        raise _refuse("attention", f"{heads} query heads do not share {kv_heads} key/value heads evenly")
    if type(positions) is not KeyPositions or positions.run_start.shape[0] != rows:
        raise _refuse("attention", f"positions must be KeyPositions of {rows} rows")
    if out is None:
        out = torch.empty(rows, heads, dim, dtype=torch.float32)
    elif out.dtype is not _F32 or not out.is_cpu or out.shape != query.shape or out.stride()[2] != 1:
        raise _refuse("attention", f"out must be float32 CPU [{rows}, {heads}, {dim}] with unit stride along dim", out)
    out_strides, query_strides = out.stride(), query.stride()
    kernel.attention(rows, heads, kv_heads, dim, query.data_ptr(), query_strides[0], query_strides[1],
                     keys.data_ptr(), values.data_ptr(), keys.dtype is torch.bfloat16, key_strides[-3],
                     key_strides[-2], value_strides[-3], value_strides[-2], *positions._addresses,
                     float(scale), out.data_ptr(), out_strides[0], out_strides[1], float(cap))
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """RMSNorm of each row: out = weight * x / sqrt(mean(x^2) + eps). x, out float32 [rows, dim] (rows may be
    strided; out may be x); weight float32 [dim]. Returns out (a new tensor if not given)."""
    kernel = _cpu if _cpu is not None else _require()
    if _not_matrix(x):
        raise _refuse("rms_norm", "x must be a float32 CPU matrix with unit stride along a row", x)
    shape = x.shape
    if _not_dense(weight) or weight.shape != shape[1:]:
        raise _refuse("rms_norm", f"weight must be a contiguous float32 CPU [{shape[1]}]", weight)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    elif _not_matrix(out) or out.shape != shape:
        raise _refuse("rms_norm", f"out must be a float32 CPU matrix [{shape[0]}, {shape[1]}]", out)
    kernel.rms_norm(x.data_ptr(), shape[0], shape[1], x.stride()[0], weight.data_ptr(), float(eps), out.data_ptr(),
                    out.stride()[0])
    return out


def rms_norm_heads(x: torch.Tensor, head_dim: int, weight: torch.Tensor, eps: float) -> None:
    """In place: RMSNorm of each head of head_dim in every row of x [rows, heads * head_dim] (float32, rows may be
    strided: q's or k's columns of fused q/k/v rows), each head as rms_norm computes it (QK-norm)."""
    kernel = _cpu if _cpu is not None else _require()
    if _not_matrix(x) or x.shape[1] % head_dim:
        raise _refuse("rms_norm_heads", f"x must be a float32 CPU matrix of whole heads of {head_dim}", x)
    if _not_dense(weight) or weight.shape != (head_dim,):
        raise _refuse("rms_norm_heads", f"weight must be a contiguous float32 CPU [{head_dim}]", weight)
    rows, width = x.shape
    kernel.rms_norm_heads(x.data_ptr(), rows, x.stride()[0], width // head_dim, head_dim, weight.data_ptr(),
                          float(eps))


def rope(x: torch.Tensor, heads: int, head_dim: int, positions: torch.Tensor, cos: torch.Tensor,
         sin: torch.Tensor) -> None:
    """In place: the rotary embedding (rotate-half) of the first `heads` heads of each row of x [rows, width]
    (float32, rows may be strided), row r at positions[r] (int32 [rows]); cos/sin float32 [positions, half] tables
    turn the first 2 * half dimensions of each head (half < head_dim / 2: a partial rotary). Positions must lie
    within the tables."""
    kernel = _cpu if _cpu is not None else _require()
    if _not_matrix(x) or x.shape[1] < heads * head_dim:
        raise _refuse("rope", f"x must be a float32 CPU matrix holding {heads} heads of {head_dim} a row", x)
    rows = x.shape[0]
    if _not_dense(positions, _I32) or positions.shape != (rows,):
        raise _refuse("rope", f"positions must be contiguous int32 [{rows}]", positions)
    table = cos.shape
    if (_not_dense(cos) or _not_dense(sin) or len(table) != 2 or sin.shape != table or 2 * table[1] > head_dim):
        raise _refuse("rope", "cos and sin must be contiguous float32 [positions, half] alike, half <= "
                      f"{head_dim // 2}", sin)
    kernel.rope(x.data_ptr(), rows, x.stride()[0], heads, head_dim, positions.data_ptr(), cos.data_ptr(),
                sin.data_ptr(), table[1])


def store_rows(rows: torch.Tensor, cache: torch.Tensor, start: int) -> None:
    """Copy each row of rows [n, heads * dim] (float32, rows may be strided: k's or v's columns of fused q/k/v
    rows) into a KV cache buffer [(1,) heads, capacity, dim] at positions start .. start + n - 1."""
    kernel = _cpu if _cpu is not None else _require()
    if _not_matrix(rows):
        raise _refuse("store_rows", "rows must be a float32 CPU matrix with unit stride along a row", rows)
    count, width = rows.shape
    shape, strides = cache.shape, cache.stride()
    if (cache.dtype is not _F32 or not cache.is_cpu or strides[-1] != 1 or shape[-3] * shape[-1] != width or
            not (len(shape) == 3 or (len(shape) == 4 and shape[0] == 1))):
        raise _refuse("store_rows", "cache must be a float32 CPU buffer [(1,) heads, capacity, dim] for rows of "
                      f"{width}", cache)
    if start < 0 or start + count > shape[-2]:
        raise _refuse("store_rows", f"positions {start}..{start + count - 1} past the cache's {shape[-2]}")
    kernel.store_rows(rows.data_ptr(), count, rows.stride()[0], shape[-3], shape[-1], cache.data_ptr(), strides[-3],
                      strides[-2], int(start))


def _gated(name: str, gate_up: torch.Tensor, out: Optional[torch.Tensor]) -> tuple[Any, int, int, torch.Tensor]:
    """The kernel, rows, ffn and the output of a gated activation, checked."""
    kernel = _cpu if _cpu is not None else _require()
    if _not_dense(gate_up) or gate_up.ndim != 2 or gate_up.shape[1] % 2:
        raise _refuse(name, "gate_up must be a contiguous float32 CPU [rows, 2 * ffn]", gate_up)
    rows, ffn = gate_up.shape[0], gate_up.shape[1] // 2
    if out is None:
        return kernel, rows, ffn, torch.empty(rows, ffn, dtype=torch.float32)
    if _not_dense(out) or out.shape != (rows, ffn):
        raise _refuse(name, f"out must be a contiguous float32 CPU [{rows}, {ffn}]", out)
    return kernel, rows, ffn, out


def silu_mul(gate_up: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """gate_up [rows, 2 * ffn] float32 -> SiLU(gate) * up [rows, ffn] (into `out` where given)."""
    kernel, rows, ffn, out = _gated("silu_mul", gate_up, out)
    kernel.silu_mul(gate_up.data_ptr(), rows, ffn, out.data_ptr())
    return out


def gelu_tanh_mul(gate_up: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """gate_up [rows, 2 * ffn] float32 -> GeLU-tanh(gate) * up [rows, ffn] (into `out` where given): torch's
    F.gelu(approximate="tanh") within a few ulp, every element by one formula on every instruction-set path
    (kernels/_cpu.c)."""
    if gate_up.dtype is not _F32 or not gate_up.is_cpu:
        raise _refuse("gelu_tanh_mul", "gate_up must be float32 on the CPU", gate_up)
    gate_up = gate_up.contiguous()
    kernel, rows, ffn, out = _gated("gelu_tanh_mul", gate_up, out)
    kernel.gelu_tanh_mul(gate_up.data_ptr(), rows, ffn, out.data_ptr())
    return out


def soft_cap_(x: torch.Tensor, cap: float) -> torch.Tensor:
    """In place: x = cap * tanh(x / cap) of contiguous float32 x, every element by one formula on every path."""
    kernel = _cpu if _cpu is not None else _require()
    if _not_dense(x):
        raise _refuse("soft_cap", "x must be a contiguous float32 CPU tensor", x)
    kernel.soft_cap(x.data_ptr(), x.numel(), float(cap))
    return x


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap) of float32 x, a new tensor (soft_cap_)."""
    if x.dtype is not _F32 or not x.is_cpu:
        raise _refuse("soft_cap", "x must be float32 on the CPU", x)
    return soft_cap_(x.contiguous().clone(), cap)


def peak(path: str, seconds: float = 0.05) -> float:
    """One thread's multiply-adds a second on path `path`'s dot-product instruction alone (for benchmarks); nan
    where the build has no such measure."""
    kernel = _require()
    return float(kernel.peak(path, seconds)) if hasattr(kernel, "peak") else float("nan")


def build_file() -> Optional[str]:
    """The compiled extension's file (None when not compiled): its time stamp says which build computed."""
    return getattr(_cpu, "__file__", None) if _cpu is not None else None
