"""The device engine's GEMM at the file's bits: rows [ROWS, k] times a PackedMatrix [n, k] (triton_layout.py), in
Triton, without a dequantised copy of the weights.

One program computes ROWS x BLOCK_N outputs: it walks k in tiles of BLOCK_K, decodes the tile's weights
[BLOCK_N, BLOCK_K] from the packed codes (whole bytes along k) and a scale per sub-block in registers (each weight
as triton_layout.py's formulas, in float32, then in the rows' dtype), and accumulates `tl.dot(rows, weights.T)` in
float32, tile after tile in k order.
So a row's result depends on its own inputs, the weights, and the fixed shapes (ROWS, BLOCK_N, BLOCK_K) alone:
never on the other rows, which the engine's padded steps need (docs/algorithms.md section 12). The tiles are
fixed per matrix by `tiles` (k and the device type), never by how many rows are real.

`PackedGemm(matrix)(rows)` returns float32 [ROWS, n] through one torch operator (`specdec::packed_gemm`), which
torch.compile keeps whole inside a compiled layer and a CUDA graph captures like any kernel; a fused q|k|v whose
parts are of different types is one call per part. On a CPU the same kernel runs in Triton's interpreter
(TRITON_INTERPRET=1, set here before triton is imported where the first matrix is on the CPU): slow, for tests.
Triton is imported as the first PackedGemm is made; `available()` says whether it can be.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from ..errors import SpecdecError
from .packed import FORM_IQ4XS, FORM_K, FORM_LEGACY, FORM_Q6K, packed_kind
from .triton_layout import PackedMatrix

GPU_TILES = (16, 128)  # (BLOCK_N, BLOCK_K) on a GPU: narrow programs, so that a 4096-row matrix is 256 of them
CPU_BLOCK_N = 512  # the interpreter pays per program and per tile, not per element: few, wide programs
TILES_VARIABLE = "SPECDEC_DEVICE_TILES"  # "16x128": a GPU's tiles, for benchmarks/bench_packed.py's sweep


def available() -> bool:
    """Whether Triton is installed here (found, not imported: importing it decides whether it interprets)."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def tiles(k: int, device_type: str) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) for rows of length k on this device type: set by k (and SPECDEC_DEVICE_TILES on a GPU)
    alone, never by the rows. BLOCK_K is halved until it divides k (32 always does)."""
    if device_type == "cpu":
        block_n, block_k = CPU_BLOCK_N, 256
    else:
        block_n, block_k = GPU_TILES
        setting = os.environ.get(TILES_VARIABLE, "").strip()
        if setting:
            parts = setting.lower().split("x")
            sizes = [int(part) for part in parts if part.isdecimal()]
            if len(parts) != 2 or len(sizes) != 2 or any(size < 16 or size & (size - 1) for size in sizes) or \
                    sizes[1] < 32:
                raise SpecdecError(f"{TILES_VARIABLE} must be two powers of two as NxK (N >= 16, K >= 32), e.g. "
                                   f"16x128; got {setting!r}")
            block_n, block_k = sizes
    while k % block_k:
        block_k //= 2
    return block_n, block_k


@functools.cache
def _kernel(interpret: bool) -> Any:
    """The jitted kernel, made on first use (in the interpreter where `interpret`: Triton reads TRITON_INTERPRET
    as it is imported, so a process that imported it for a GPU cannot interpret, and the other way round)."""
    import sys

    if interpret and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    if interpret != (os.environ.get("TRITON_INTERPRET", "0").strip() == "1"):
        raise SpecdecError("the packed kernel runs on a CPU only in Triton's interpreter, and on a GPU only outside "
                           "it: set TRITON_INTERPRET=1 (a CPU) or unset it (a GPU) before anything imports triton")
    import triton
    import triton.language as tl

    @triton.jit
    def packed_matmul(x_ptr, out_ptr, codes_ptr, plane_ptr, d_ptr, m_ptr, scales_ptr, minimums_ptr, table_ptr,
                      n, k, x_stride, out_stride,
                      ROWS: tl.constexpr, BITS: tl.constexpr, ZERO: tl.constexpr, SUB: tl.constexpr,
                      SUPER: tl.constexpr, FORM: tl.constexpr, OFFSETS: tl.constexpr, TABLE: tl.constexpr,
                      IEEE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        SUBS: tl.constexpr = BLOCK_K // SUB  # sub-blocks (one scale each) in a tile's row
        columns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] the weight's output rows
        kept = columns < n
        column = tl.where(kept, columns, 0).to(tl.int64)[:, None]  # [BLOCK_N, 1] (past n: row 0, never stored)
        rows = tl.arange(0, ROWS)
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
        for first in range(0, k, BLOCK_K):
            x = tl.load(x_ptr + rows[:, None] * x_stride + first + tl.arange(0, BLOCK_K)[None, :])  # [ROWS, BLOCK_K]
            # the codes [BLOCK_N, BLOCK_K], read as whole bytes along k
            if BITS == 8:
                code = tl.load(codes_ptr + column * k + first + tl.arange(0, BLOCK_K)[None, :]).to(tl.int32)
            else:
                byte = tl.load(codes_ptr + column * (k // 2) + first // 2 + tl.arange(0, BLOCK_K // 2)[None, :])
                byte = byte.to(tl.int32)  # [BLOCK_N, BLOCK_K / 2]: weight 2j low, 2j + 1 high
                code = tl.reshape(tl.join(byte & 15, byte >> 4), (BLOCK_N, BLOCK_K))
                if BITS == 5:
                    top = tl.load(plane_ptr + column * (k // 8) + first // 8 + tl.arange(0, BLOCK_K // 8)[None, :])
                    bit = (top.to(tl.int32)[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1  # [N, K / 8, 8]
                    code = code | (tl.reshape(bit, (BLOCK_N, BLOCK_K)) << 4)
                if BITS == 6:
                    top = tl.load(plane_ptr + column * (k // 4) + first // 4 + tl.arange(0, BLOCK_K // 4)[None, :])
                    bits = (top.to(tl.int32)[:, :, None] >> (tl.arange(0, 4) * 2)[None, None, :]) & 3
                    code = code | (tl.reshape(bits, (BLOCK_N, BLOCK_K)) << 4)
            if TABLE:
                value = tl.load(table_ptr + code)
            else:
                value = (code - ZERO).to(tl.float32)
            # a scale (and an offset) per sub-block [BLOCK_N, SUBS], as gguf.quants.dequantize computes them
            sub = first // SUB + tl.arange(0, SUBS)[None, :]  # [1, SUBS] the tile's sub-blocks
            d = tl.load(d_ptr + column * (k // SUPER) + (sub * SUB) // SUPER).to(tl.float32)
            if FORM == 1:  # FORM_LEGACY (SUB = SUPER = 32)
                scale = d
            elif FORM == 4:  # FORM_IQ4XS
                scale = d * (tl.load(scales_ptr + column * (k // SUB) + sub).to(tl.float32) - 32.0)
            else:  # FORM_K, FORM_Q6K
                scale = d * tl.load(scales_ptr + column * (k // SUB) + sub).to(tl.float32)
            weight = tl.reshape(value, (BLOCK_N, SUBS, SUB)) * scale[:, :, None]
            if OFFSETS:
                m = tl.load(m_ptr + column * (k // SUPER) + (sub * SUB) // SUPER).to(tl.float32)
                if FORM == 1:
                    weight = weight + m[:, :, None]
                else:  # FORM_K: dmin * the sub-block's minimum, subtracted
                    weight = weight - (m * tl.load(minimums_ptr + column * (k // SUB) + sub).to(tl.float32))[:, :, None]
            tile = tl.trans(tl.reshape(weight, (BLOCK_N, BLOCK_K)).to(x.dtype))  # [BLOCK_K, BLOCK_N]
            if IEEE:
                acc += tl.dot(x, tile, input_precision="ieee")
            else:
                acc += tl.dot(x, tile)
        tl.store(out_ptr + rows[:, None] * out_stride + columns[None, :], acc, mask=kept[None, :])

    return packed_matmul


assert (FORM_LEGACY, FORM_K, FORM_Q6K, FORM_IQ4XS) == (1, 2, 3, 4)  # the kernel's FORM branches


@torch.library.custom_op("specdec::packed_gemm", mutates_args=())
def packed_gemm(rows: torch.Tensor, codes: torch.Tensor, plane: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
                scales: torch.Tensor, minimums: torch.Tensor, table: torch.Tensor, kind: int, block_n: int,
                block_k: int) -> torch.Tensor:
    """rows [R, k] @ the packed matrix's weights.T -> float32 [R, n] (n = d's rows): the kernel's launch as one
    torch operator, so that torch.compile keeps it whole in a compiled layer (it does not trace a launch)."""
    info = packed_kind(kind)
    n, k = d.shape[0], rows.shape[1]
    out = torch.empty(rows.shape[0], n, dtype=torch.float32, device=rows.device)
    _kernel(rows.device.type == "cpu")[(-(-n // block_n),)](
        rows, out, codes, plane, d, m, scales, minimums, table, n, k, rows.stride(0), out.stride(0),
        ROWS=rows.shape[0], BITS=info.bits, ZERO=info.zero, SUB=info.sub, SUPER=info.super_block, FORM=info.form,
        OFFSETS=info.offsets, TABLE=info.table, IEEE=rows.dtype == torch.float32, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


@packed_gemm.register_fake
def _(rows: torch.Tensor, codes: torch.Tensor, plane: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
      scales: torch.Tensor, minimums: torch.Tensor, table: torch.Tensor, kind: int, block_n: int,
      block_k: int) -> torch.Tensor:
    return rows.new_empty(rows.shape[0], d.shape[0], dtype=torch.float32)


class PackedGemm:
    """rows [R, k] @ a PackedMatrix's weights.T -> float32 [R, n], R a power of two of at least 16 (the engine's
    padded rows). The tiles are chosen once, here (and the kernel made), never per call."""

    def __init__(self, matrix: PackedMatrix):
        self.matrix = matrix
        self.block_n, self.block_k = tiles(matrix.k, matrix.codes.device.type)
        _kernel(matrix.codes.device.type == "cpu")  # made now: Triton is imported before any step

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        matrix, count = self.matrix, rows.shape[0]
        if count < 16 or count & (count - 1) or rows.shape[1] != matrix.k or rows.stride(1) != 1:
            raise ValueError(f"packed matmul: rows {tuple(rows.shape)} do not fit a [{matrix.n}, {matrix.k}] matrix "
                             "at a row-major power-of-two row count of at least 16")
        return packed_gemm(rows, matrix.codes, matrix.plane, matrix.d, matrix.m, matrix.scales, matrix.minimums,
                           matrix.table, matrix.kind, self.block_n, self.block_k)
