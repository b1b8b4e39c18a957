"""The device engine's second GEMM at the file's bits: rows [ROWS, k] times a WordMatrix [n, k]
(triton_words_layout.py: Q4_K or Q6_K codes in 32-bit words along n), in Triton, the codes multiplied as small
integers and scaled after the product.

One program computes ROWS x BLOCK_N outputs over one k-span (the whole of k, or a 1/SPLIT of it), walking it in
tiles of BLOCK_K, each tile one sub-block after another (32 weights for Q4_K, 16 for Q6_K: one scale per column):

- the sub-block's words [SUB / 8, BLOCK_N] are loaded whole along n (a thread's 16 bytes at 128 columns), each
  word broadcast to its eight k rows and each row's code cut out by a shift, `(word >> 4 * (r % 8)) & 15` (Q6_K:
  its top two bits likewise from the second word array, one word a column) into codes [SUB, BLOCK_N]. (Loading
  the same word once per k row instead made Triton's software pipeline stage every word eight times in shared
  memory: 77 KB a program at 16 rows, 262 KB at 128, more than an H100 has, in sm_80/sm_90 compiles);
- `tl.dot(rows, codes)` multiplies them on the tensor cores: the codes are small integers (0..15, Q6_K -32..31),
  exact in bfloat16 (and float16, float32), so the product is the rows' exact one, accumulated in float32;
- the sub-block's scale (d * scale) and, for Q4_K, its minimum (dmin * minimum), one [BLOCK_N] vector each, are
  applied after the product: acc += scale * dot - minimum * (the row's sum over the sub-block).

Each weight thereby counts as gguf.quants.dequantize's float32 value (a one-hot row reads it bit for bit: the
scale's product by the code and its difference with the minimum round where gguf's do), not rounded to the rows'
dtype as triton_gemm.py's weights are. Where SPLIT > 1, each span's partial sums go to their own slice of a
[SPLIT, ROWS, n] buffer, summed in span order after the launch. A row's result depends on its own inputs, the
weights and the tiling alone, never on the other rows; the tiling (`word_tiling`) is fixed per matrix by its shape,
the device type and SPECDEC_DEVICE_WORD_TILES, never by how many rows are real.

`WordGemm(matrix)(rows)` returns float32 [ROWS, n] through one torch operator (`specdec::word_gemm`), as
PackedGemm does; the device engine uses it under SPECDEC_DEVICE_KERNEL=words (device/weights.py) for Q4_K and
Q6_K matrices, the rest staying with triton_gemm.py. Not measured on a GPU yet (docs/gpu.md): the GPU tiles below
are a first guess, for bench_packed.py's sweep to correct. On a CPU the kernel runs in Triton's interpreter (tests).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from .packed import KIND_PQ6_K, packed_kind
from .triton_gemm import Tiling, check_rows, interpreter_mode, tiles_setting
from .triton_words_layout import LOW_PER_WORD, WordMatrix

WORD_GPU_TILES = (128, 128)  # (BLOCK_N, BLOCK_K) on a GPU unless set: a guess until bench_packed.py measures it
# (128 columns: a thread's words are 16 bytes along n for Q4_K)
WORD_PROGRAMS, WORD_SPLIT = 256, 8  # unset, k is cut into up to WORD_SPLIT spans while the programs stay within
# WORD_PROGRAMS (a narrow n: attn_v, attn_output); each span writes a [ROWS, n] float32 partial sum
CPU_TILES = (512, 256)  # the interpreter pays per program and per tile, not per element: few, wide programs
WORD_TILES_VARIABLE = "SPECDEC_DEVICE_WORD_TILES"  # "64x128", or "64x128x4" (k cut in 4 spans)


def word_tiling(n: int, k: int, device: torch.device) -> Tiling:
    """The tiling of a word matrix [n, k] on this device: set by its shape, the device type (and
    SPECDEC_DEVICE_WORD_TILES on a GPU) alone, never by the rows. BLOCK_K is halved until it divides k, then the
    split until each span is a whole number of tiles; unset on a GPU, the split doubles up to WORD_SPLIT while the
    programs stay within WORD_PROGRAMS; the interpreter never splits."""
    setting = None if device.type == "cpu" else tiles_setting(WORD_TILES_VARIABLE)
    if device.type == "cpu":
        block_n, block_k, split = *CPU_TILES, 1
    else:
        block_n, block_k, split = setting or (*WORD_GPU_TILES, 1)
    while k % block_k:
        block_k //= 2
    if setting is None and device.type != "cpu":
        columns = -(-n // block_n)  # programs along n
        while split < WORD_SPLIT and columns * split * 2 <= WORD_PROGRAMS and k % (split * 2 * block_k) == 0:
            split *= 2
    while k % (split * block_k):
        split //= 2
    return Tiling(block_n, block_k, split)


@functools.cache
def _kernel(interpret: bool) -> Any:
    """The jitted kernel, made on first use (in the interpreter where `interpret`: triton_gemm.interpreter_mode)."""
    interpreter_mode(interpret)
    import triton
    import triton.language as tl

    @triton.jit
    def words_matmul(x_ptr, out_ptr, low_ptr, high_ptr, d_ptr, dmin_ptr, scales_ptr, minimums_ptr,
                     n, span, x_stride, out_stride,
                     ROWS: tl.constexpr, SIX_BIT: tl.constexpr, SUB: tl.constexpr, IEEE: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        columns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] the weight's output rows
        column, kept = columns[None, :], (columns < n)[None, :]  # [1, BLOCK_N]: past n masked (contiguous loads)
        rows = tl.arange(0, ROWS)
        within = tl.arange(0, SUB)  # [SUB] a sub-block's k offsets
        low_shift = (tl.arange(0, 8) * 4)[None, :, None]  # [1, 8, 1] a word's eight nibbles
        high_shift = ((within % 16) * 2)[:, None]  # [SUB, 1] each k row's top two bits in its word (Q6_K)
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
        begin = tl.program_id(1) * span  # this program's k-span
        for first in range(begin, begin + span, BLOCK_K):
            for part in tl.static_range(BLOCK_K // SUB):  # the tile's sub-blocks, in k order
                start = first + part * SUB
                x = tl.load(x_ptr + rows[:, None] * x_stride + start + within[None, :])  # [ROWS, SUB]
                # the sub-block's words, whole along n: int32 [SUB / 8, BLOCK_N], eight k rows each
                word = tl.load(low_ptr + (start // 8 + tl.arange(0, SUB // 8))[:, None] * n + column, mask=kept,
                               other=0)
                nibbles = (word[:, None, :] >> low_shift) & 15  # [SUB / 8, 8, BLOCK_N]: k row 8j + i at (j, i)
                code = tl.reshape(nibbles, (SUB, BLOCK_N))  # [SUB, BLOCK_N] in k order
                if SIX_BIT:  # one word of top bits per column (SUB = 16)
                    top = tl.load(high_ptr + (start // 16) * n + column, mask=kept, other=0)  # int32 [1, BLOCK_N]
                    code = (code | (((top >> high_shift) & 3) << 4)) - 32  # [SUB, BLOCK_N], -32 .. 31
                if IEEE:
                    dot = tl.dot(x, code.to(x.dtype), input_precision="ieee")  # [ROWS, BLOCK_N] float32
                else:
                    dot = tl.dot(x, code.to(x.dtype))  # exact codes: the rows' own product, in float32
                d = tl.load(d_ptr + (start // 256) * n + column, mask=kept, other=0).to(tl.float32)  # [1, BLOCK_N]
                sub_scale = tl.load(scales_ptr + (start // SUB) * n + column, mask=kept, other=0).to(tl.float32)
                scale = d * sub_scale  # exact: an 11-bit mantissa times 8 bits
                if SIX_BIT:
                    acc += scale * dot
                else:  # Q4_K: each weight less dmin * the sub-block's minimum: the minimum times the rows' sum
                    dmin = tl.load(dmin_ptr + (start // 256) * n + column, mask=kept, other=0).to(tl.float32)
                    sub_minimum = tl.load(minimums_ptr + (start // SUB) * n + column, mask=kept, other=0)
                    minimum = dmin * sub_minimum.to(tl.float32)  # exact likewise
                    total = tl.sum(x.to(tl.float32), axis=1)[:, None]  # [ROWS, 1]
                    acc += scale * dot - minimum * total
        out = out_ptr + tl.program_id(1) * ROWS * out_stride + rows[:, None] * out_stride + columns[None, :]
        tl.store(out, acc, mask=kept)  # this span's partial sums: [ROWS, BLOCK_N] of [SPLIT * ROWS, n]

    return words_matmul


@torch.library.custom_op("specdec::word_gemm", mutates_args=())
def word_gemm(rows: torch.Tensor, low: torch.Tensor, high: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor,
              scales: torch.Tensor, minimums: torch.Tensor, kind: int, block_n: int, block_k: int,
              split: int) -> torch.Tensor:
    """rows [R, k] @ the word matrix's weights.T -> float32 [R, n] (n = low's columns): the kernel's launch (and
    the spans' sum) as one torch operator, which torch.compile keeps whole."""
    n, k, count = low.shape[1], rows.shape[1], rows.shape[0]
    out = torch.empty(split * count, n, dtype=torch.float32, device=rows.device)  # [SPLIT * R, n]
    _kernel(rows.device.type == "cpu")[(-(-n // block_n), split)](
        rows, out, low, high, d, dmin, scales, minimums, n, k // split, rows.stride(0), out.stride(0),
        ROWS=count, SIX_BIT=kind == KIND_PQ6_K, SUB=packed_kind(kind).sub, IEEE=rows.dtype == torch.float32,
        BLOCK_N=block_n, BLOCK_K=block_k)
    return out if split == 1 else out.view(split, count, n).sum(0)  # the spans in order: [R, n]


@word_gemm.register_fake
def _(rows: torch.Tensor, low: torch.Tensor, high: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor,
      scales: torch.Tensor, minimums: torch.Tensor, kind: int, block_n: int, block_k: int,
      split: int) -> torch.Tensor:
    return rows.new_empty(rows.shape[0], low.shape[1], dtype=torch.float32)


class WordGemm:
    """rows [R, k] @ a WordMatrix's weights.T -> float32 [R, n], R a power of two of at least 16 (the engine's
    padded rows): PackedGemm's interface. The tiling is chosen once, here (and the kernel made), never per call;
    `cut` sets it (tests)."""

    def __init__(self, matrix: WordMatrix, cut: Optional[Tiling] = None):
        self.matrix = matrix
        self.tiling = cut or word_tiling(matrix.n, matrix.k, matrix.low.device)
        block_n, block_k, split = self.tiling
        if matrix.k % (split * block_k) or block_k % packed_kind(matrix.kind).sub or block_n < 16:
            raise ValueError(f"word matmul: {self.tiling} does not cut rows of {matrix.k}")
        if (matrix.k // LOW_PER_WORD + 1) * matrix.n >= 1 << 31:  # the kernel's offsets are 32-bit
            raise ValueError(f"word matmul: a [{matrix.n}, {matrix.k}] matrix is too large for 32-bit offsets")
        _kernel(matrix.low.device.type == "cpu")  # made now: Triton is imported before any step

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        matrix = self.matrix
        check_rows(rows, matrix.n, matrix.k, "word matmul")
        return word_gemm(rows, matrix.low, matrix.high, matrix.d, matrix.m, matrix.scales, matrix.minimums,
                         matrix.kind, *self.tiling)
