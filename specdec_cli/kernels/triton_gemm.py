"""The device engine's GEMM at the file's bits: rows [ROWS, k] times a PackedMatrix [n, k] (triton_layout.py), in
Triton, without a dequantised copy of the weights.

One program computes ROWS x BLOCK_N outputs over one k-span (the whole of k, or a 1/SPLIT of it): it walks the
span in tiles of BLOCK_K, decodes the tile's weights [BLOCK_N, BLOCK_K] from the packed codes (whole bytes along k)
and a scale per sub-block in registers (each weight as triton_layout.py's formulas, in float32, then in the rows'
dtype), and accumulates `tl.dot(rows, weights.T)` in float32, tile after tile in k order. Where SPLIT > 1, each
span's partial sums go to their own slice of a [SPLIT, ROWS, n] buffer, summed in span order after the launch.
So a row's result depends on its own inputs, the weights, and the fixed tiling (ROWS, BLOCK_N, BLOCK_K, SPLIT)
alone: never on the other rows, which the engine's padded steps need (docs/algorithms.md section 12). The tiling
is fixed per matrix by `tiling` (its row length, the device type and the setting), never by how many rows are real.

Measured on an H200 (docs/gpu.md, 2026-11-30), this kernel reads 40-260 GB/s where torch's bfloat16 GEMM reads
1-2 TB/s: the device engine holds a GGUF's matrices here when asked (SPECDEC_DEVICE_PACKED=1) or where their
dequantised copy would not fit the GPU (device/weights.py `packed_wanted`), for memory.

`PackedGemm(matrix)(rows)` returns float32 [ROWS, n] through one torch operator (`specdec::packed_gemm`), which
torch.compile keeps whole inside a compiled layer and a CUDA graph captures like any kernel; a fused q|k|v whose
parts are of different types is one call per part. On a CPU the same kernel runs in Triton's interpreter
(TRITON_INTERPRET=1, set here before triton is imported where the first matrix is on the CPU): slow, for tests.
Triton is imported as the first PackedGemm is made; `available()` says whether it can be.
"""

from __future__ import annotations

import functools
import os
from typing import Any, NamedTuple, Optional

import torch

from ..errors import SpecdecError
from .packed import FORM_IQ4XS, FORM_K, FORM_LEGACY, FORM_Q6K, packed_kind
from .triton_layout import PackedMatrix

GPU_TILES = (16, 128)  # (BLOCK_N, BLOCK_K) on a GPU: the fastest of bench_packed.py's sweep on an H200, unsplit
CPU_BLOCK_N = 512  # the interpreter pays per program and per tile, not per element: few, wide programs
TILES_VARIABLE = "SPECDEC_DEVICE_TILES"  # "16x128", or "32x128x4" (k cut in 4 spans): bench_packed.py's sweep


def check_rows(rows: torch.Tensor, n: int, k: int, what: str) -> None:
    """Rows a device GEMM takes: row-major [R, k] with R a power of two of at least 16 (the engine's padded rows)."""
    count = rows.shape[0]
    if count < 16 or count & (count - 1) or rows.shape[1] != k or rows.stride(1) != 1:
        raise ValueError(f"{what}: rows {tuple(rows.shape)} do not fit a [{n}, {k}] matrix at a row-major "
                         "power-of-two row count of at least 16")


class Tiling(NamedTuple):
    """How a matrix's product is cut: BLOCK_N output columns and a k-span (k / split) per program, walked in tiles
    of BLOCK_K."""

    block_n: int
    block_k: int
    split: int


def available() -> bool:
    """Whether Triton is installed here (found, not imported: importing it decides whether it interprets)."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def tiles_setting(variable: str = TILES_VARIABLE) -> Optional[tuple[int, int, int]]:
    """A tiles variable's (BLOCK_N, BLOCK_K, SPLIT), or None where unset (the words kernel's reads its own)."""
    setting = os.environ.get(variable, "").strip()
    if not setting:
        return None
    parts = setting.lower().split("x")
    sizes = [int(part) for part in parts if part.isdecimal()]
    if len(parts) not in (2, 3) or len(sizes) != len(parts) or any(size < 1 or size & (size - 1) for size in sizes) \
            or sizes[0] < 16 or sizes[1] < 32:
        raise SpecdecError(f"{variable} must be powers of two as NxK or NxKxSPLIT (N >= 16, K >= 32), e.g. "
                           f"32x128; got {setting!r}")
    return sizes[0], sizes[1], sizes[2] if len(sizes) == 3 else 1


def tiling(k: int, device: torch.device) -> Tiling:
    """The tiling of a matrix of rows of length k on this device: set by k, the device type (and
    SPECDEC_DEVICE_TILES on a GPU) alone, never by the rows. BLOCK_K is halved until it divides k (32 always does),
    then the split until each span is a whole number of tiles; the interpreter never splits."""
    if device.type == "cpu":
        block_n, block_k, split = CPU_BLOCK_N, 256, 1
    else:
        block_n, block_k, split = tiles_setting() or (*GPU_TILES, 1)
    while k % block_k:
        block_k //= 2
    while k % (split * block_k):
        split //= 2
    return Tiling(block_n, block_k, split)


def interpreter_mode(interpret: bool) -> None:
    """Set Triton to interpret where `interpret` (before it is imported), or refuse: Triton reads TRITON_INTERPRET
    as it is imported, so a process that imported it for a GPU cannot interpret, and the other way round."""
    import sys

    if interpret and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    if interpret != (os.environ.get("TRITON_INTERPRET", "0").strip() == "1"):
        raise SpecdecError("the packed kernel runs on a CPU only in Triton's interpreter, and on a GPU only outside "
                           "it: set TRITON_INTERPRET=1 (a CPU) or unset it (a GPU) before anything imports triton")


@functools.cache
def _kernel(interpret: bool) -> Any:
    """The jitted kernel, made on first use (in the interpreter where `interpret`: interpreter_mode)."""
    interpreter_mode(interpret)
    import triton
    import triton.language as tl

    @triton.jit
    def packed_matmul(x_ptr, out_ptr, codes_ptr, plane_ptr, d_ptr, m_ptr, scales_ptr, minimums_ptr, table_ptr,
                      n, k, span, x_stride, out_stride,
                      ROWS: tl.constexpr, BITS: tl.constexpr, ZERO: tl.constexpr, SUB: tl.constexpr,
                      SUPER: tl.constexpr, FORM: tl.constexpr, OFFSETS: tl.constexpr, TABLE: tl.constexpr,
                      IEEE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        SUBS: tl.constexpr = BLOCK_K // SUB  # sub-blocks (one scale each) in a tile's row
        columns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] the weight's output rows
        kept = columns < n
        column = tl.where(kept, columns, 0).to(tl.int64)[:, None]  # [BLOCK_N, 1] (past n: row 0, never stored)
        rows = tl.arange(0, ROWS)
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
        begin = tl.program_id(1) * span  # this program's k-span
        for first in range(begin, begin + span, BLOCK_K):
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
        out = out_ptr + tl.program_id(1) * ROWS * out_stride + rows[:, None] * out_stride + columns[None, :]
        tl.store(out, acc, mask=kept[None, :])  # this span's partial sums: [ROWS, BLOCK_N] of [SPLIT * ROWS, n]

    return packed_matmul


assert (FORM_LEGACY, FORM_K, FORM_Q6K, FORM_IQ4XS) == (1, 2, 3, 4)  # the kernel's FORM branches


@torch.library.custom_op("specdec::packed_gemm", mutates_args=())
def packed_gemm(rows: torch.Tensor, codes: torch.Tensor, plane: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
                scales: torch.Tensor, minimums: torch.Tensor, table: torch.Tensor, kind: int, block_n: int,
                block_k: int, split: int) -> torch.Tensor:
    """rows [R, k] @ the packed matrix's weights.T -> float32 [R, n] (n = d's rows): the kernel's launch (and the
    spans' sum) as one torch operator, so that torch.compile keeps it whole in a compiled layer (it does not trace
    a launch)."""
    info = packed_kind(kind)
    n, k, count = d.shape[0], rows.shape[1], rows.shape[0]
    out = torch.empty(split * count, n, dtype=torch.float32, device=rows.device)  # [SPLIT * R, n]
    _kernel(rows.device.type == "cpu")[(-(-n // block_n), split)](
        rows, out, codes, plane, d, m, scales, minimums, table, n, k, k // split, rows.stride(0), out.stride(0),
        ROWS=count, BITS=info.bits, ZERO=info.zero, SUB=info.sub, SUPER=info.super_block, FORM=info.form,
        OFFSETS=info.offsets, TABLE=info.table, IEEE=rows.dtype == torch.float32, BLOCK_N=block_n, BLOCK_K=block_k)
    return out if split == 1 else out.view(split, count, n).sum(0)  # the spans in order: [R, n]


@packed_gemm.register_fake
def _(rows: torch.Tensor, codes: torch.Tensor, plane: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
      scales: torch.Tensor, minimums: torch.Tensor, table: torch.Tensor, kind: int, block_n: int,
      block_k: int, split: int) -> torch.Tensor:
    return rows.new_empty(rows.shape[0], d.shape[0], dtype=torch.float32)


class PackedGemm:
    """rows [R, k] @ a PackedMatrix's weights.T -> float32 [R, n], R a power of two of at least 16 (the engine's
    padded rows). The tiling is chosen once, here (and the kernel made), never per call; `cut` sets it (tests)."""

    def __init__(self, matrix: PackedMatrix, cut: Optional[Tiling] = None):
        self.matrix = matrix
        self.tiling = cut or tiling(matrix.k, matrix.codes.device)
        if matrix.k % (self.tiling.split * self.tiling.block_k) or self.tiling.block_k % packed_kind(matrix.kind).sub:
            raise ValueError(f"packed matmul: {self.tiling} does not cut rows of {matrix.k}")
        _kernel(matrix.codes.device.type == "cpu")  # made now: Triton is imported before any step

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        matrix = self.matrix
        check_rows(rows, matrix.n, matrix.k, "packed matmul")
        return packed_gemm(rows, matrix.codes, matrix.plane, matrix.d, matrix.m, matrix.scales, matrix.minimums,
                           matrix.table, matrix.kind, *self.tiling)
