"""specdec's CPU kernels from Python: block-quantised matmuls and row-invariant attention (`_cpu.c`).

`matmul` multiplies float32 rows by a weight held in blocks of 32 (4-bit or 8-bit codes, a float32 scale per
block and, for 4-bit codes, an offset); `attention` computes each query row over its own keys. Both return, for
every row, exactly what a one-row call returns, whatever the number of rows or threads (the C file says how).
This module checks what the C code cannot (dtypes, shapes, contiguity) and owns the worker threads' count; it
does not know about models, GGUF files or `--weights` (quant.py does).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

BLOCK = 32  # weights per block along the input dimension
MAX_THREADS = 64  # the pool's limit (_cpu.c)

try:  # built by `pip install` (setup.py); absent in a source tree nobody built
    from . import _cpu  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised only without a compiler
    _cpu = None


def available() -> bool:
    """Whether the compiled kernels are importable."""
    return _cpu is not None


def isa() -> str:
    """The instruction set the kernels run on here: "avx2" or "portable" ("missing" when not compiled)."""
    return _cpu.isa() if _cpu is not None else "missing"


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


def record_bytes(kind: int, k: int) -> int:
    """Bytes of one output column's record: float32 scales (and, kind 4, offsets) per block, then its codes."""
    return (24 if kind == 4 else 36) * (k // BLOCK)


def pack_records(kind: int, codes: torch.Tensor, scales: torch.Tensor, offsets: Optional[torch.Tensor]) -> torch.Tensor:
    """The kernel's layout, one record per output column (read as one stream): uint8 [n, record_bytes].

    kind 4: codes uint8 [n, k/32, 16] (weight i of a block in the low nibble of byte i, weight i + 16 in the high
    nibble), W = scales * code + offsets; kind 8: codes int8 [n, k/32, 32], W = scales * code. scales and offsets
    float32 [n, k/32]."""
    n, blocks = scales.shape
    parts = [scales.to(torch.float32).contiguous().view(torch.uint8).reshape(n, 4 * blocks)]
    if kind == 4:
        if offsets is None:
            raise ValueError("4-bit blocks need offsets")
        parts.append(offsets.to(torch.float32).contiguous().view(torch.uint8).reshape(n, 4 * blocks))
    parts.append(codes.contiguous().view(torch.uint8).reshape(n, -1))
    records = torch.cat(parts, dim=1).contiguous()
    if records.shape[1] != record_bytes(kind, blocks * BLOCK):
        raise ValueError(f"codes of shape {tuple(codes.shape)} do not make kind-{kind} blocks")
    return records


def unpack_records(kind: int, records: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """(codes, scales, offsets) views of packed records (pack_records' inverse)."""
    n = records.shape[0]
    blocks = records.shape[1] // (24 if kind == 4 else 36)
    scales = records[:, : 4 * blocks].contiguous().view(torch.float32)
    offsets = records[:, 4 * blocks : 8 * blocks].contiguous().view(torch.float32) if kind == 4 else None
    if kind == 4:
        codes = records[:, 8 * blocks :].reshape(n, blocks, 16)
    else:
        codes = records[:, 4 * blocks :].contiguous().view(torch.int8).reshape(n, blocks, 32)
    return codes, scales, offsets


def matmul(x: torch.Tensor, kind: int, records: torch.Tensor) -> torch.Tensor:
    """x [rows, k] float32 @ W^T -> [rows, n] float32, W as packed block records (pack_records). Each row of x is
    rounded to 8 bits per block of 32 first (kernels/_cpu.c)."""
    kernel = _require()
    if x.dtype != torch.float32 or x.dim() != 2 or x.device.type != "cpu":
        raise ValueError(f"matmul takes float32 CPU rows [rows, k], got {x.dtype} {tuple(x.shape)} on {x.device}")
    x = x.contiguous()
    rows, k = x.shape
    if records.dtype != torch.uint8 or not records.is_contiguous() or records.shape[1] != record_bytes(kind, k):
        raise ValueError(f"matmul: records of shape {tuple(records.shape)} do not hold kind-{kind} blocks for k={k}")
    n = records.shape[0]
    out = torch.empty(rows, n, dtype=torch.float32)
    if rows:
        kernel.matmul(kind, x.data_ptr(), rows, k, n, records.data_ptr(), out.data_ptr())
    return out


def attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, run_start: torch.Tensor,
              run_stop: torch.Tensor, extra_start: torch.Tensor, extra_pos: torch.Tensor, scale: float) -> torch.Tensor:
    """Each query row attends to its own keys: cache positions run_start[row] .. run_stop[row]-1, then
    extra_pos[extra_start[row] : extra_start[row + 1]] (a tree node's ancestors and itself), in that order.

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
                     out.stride(1))
    return out
