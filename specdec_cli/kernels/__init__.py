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

import os
from dataclasses import dataclass
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


def matmul(x: torch.Tensor, kind: int, records: torch.Tensor, n: Optional[int] = None) -> torch.Tensor:
    """x [rows, k] float32 @ W^T -> [rows, n] float32, W as packed records (pack_records; n defaults to every
    column the records hold). Block kinds round each row of x to 8 bits per block of 32 first (kernels/_cpu.c)."""
    kernel = _require()
    if x.dtype != torch.float32 or x.dim() != 2 or x.device.type != "cpu":
        raise ValueError(f"matmul takes float32 CPU rows [rows, k], got {x.dtype} {tuple(x.shape)} on {x.device}")
    x = x.contiguous()
    rows, k = x.shape
    n = records.shape[0] * GROUP if n is None else int(n)
    if (records.dtype != torch.uint8 or not records.is_contiguous() or k % BLOCK or
            records.shape[1] != record_bytes(kind, k) or records.shape[0] != groups(n)):
        raise ValueError(f"matmul: records of shape {tuple(records.shape)} do not hold {n} columns of kind "
                         f"{kind_of(kind).name} for k={k}")
    out = torch.empty(rows, n, dtype=torch.float32)
    if rows and n:
        kernel.matmul(kind, x.data_ptr(), rows, k, n, records.data_ptr(), out.data_ptr())
    return out


def attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, run_start: torch.Tensor,
              run_stop: torch.Tensor, extra_start: torch.Tensor, extra_pos: torch.Tensor, scale: float,
              cap: float = 0.0) -> torch.Tensor:
    """Each query row attends to its own keys: cache positions run_start[row] .. run_stop[row]-1, then
    extra_pos[extra_start[row] : extra_start[row + 1]] (a tree node's ancestors and itself), in that order.
    cap > 0 soft-caps the scores (score * scale) before the softmax: cap * tanh(score / cap) (gemma2).

    query [rows, heads, dim] float32 (any strides, unit stride along dim); keys/values [kv_heads, positions, dim]
    float32 or bfloat16 (unit stride along dim); run_start, run_stop [rows], extra_start [rows + 1], extra_pos:
    contiguous int32. Returns [rows, heads, dim] float32."""
    kernel = _require()
    rows, heads, dim = query.shape
    kv_heads = keys.shape[0]
    if query.dtype != torch.float32 or query.stride(2) != 1:
        raise ValueError("attention: query must be float32 with unit stride along its last dimension")
    if keys.dtype != values.dtype or keys.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"attention: keys and values must both be float32 or bfloat16, got {keys.dtype}, "
                         f"{values.dtype}")
    if keys.stride(2) != 1 or values.stride(2) != 1 or keys.shape[2] != dim or values.shape[2] != dim:
        raise ValueError("attention: keys/values [kv_heads, positions, dim] with unit stride along dim")
    for index in (run_start, run_stop, extra_start, extra_pos):
        if index.dtype != torch.int32 or not index.is_contiguous():
            raise ValueError("attention: key positions must be contiguous int32 tensors")
    out = torch.empty(rows, heads, dim, dtype=torch.float32)
    kernel.attention(rows, heads, kv_heads, dim, query.data_ptr(), query.stride(0), query.stride(1),
                     keys.data_ptr(), values.data_ptr(), keys.dtype == torch.bfloat16, keys.stride(0), keys.stride(1),
                     values.stride(0), values.stride(1), run_start.data_ptr(), run_stop.data_ptr(),
                     extra_start.data_ptr(), extra_pos.data_ptr(), float(scale), out.data_ptr(), out.stride(0),
                     out.stride(1), float(cap))
    return out


def _rows(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"{name} takes float32 CPU tensors, got {x.dtype} on {x.device}")
    return x.contiguous()


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [rows, 2 * ffn] float32 -> GeLU-tanh(gate) * up [rows, ffn]: torch's F.gelu(approximate="tanh")
    within a few ulp, every element by one formula on every instruction-set path (kernels/_cpu.c)."""
    kernel = _require()
    gate_up = _rows(gate_up, "gelu_tanh_mul")
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gelu_tanh_mul takes [rows, 2 * ffn], got {tuple(gate_up.shape)}")
    rows, ffn = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, ffn, dtype=torch.float32)
    kernel.gelu_tanh_mul(gate_up.data_ptr(), rows, ffn, out.data_ptr())
    return out


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap) of float32 x (a new tensor), every element by one formula on every path."""
    kernel = _require()
    out = _rows(x, "soft_cap").clone()
    kernel.soft_cap(out.data_ptr(), out.numel(), float(cap))
    return out
