"""The kernels' checked handles: what a call into the C extension may be handed, checked once when made.

Rows (a float32 matrix with unit stride along a row), Dense (a contiguous tensor of one dtype), BlockMatrix (a
weight's records of one kind) and KeyPositions (the keys each query row attends to). Each constructor checks what
the C code reads blindly (dtype, device, dimensions, strides, shapes that agree) and raises a ValueError naming the
kernel and the argument; a handle then holds its tensor, so its address stays valid. A decoding step makes some 300
calls, so the calls (kernels/__init__.py) take handles checked once and compare integers, not tensors' attributes.
Not here: the calls themselves, and the records' layout (records.py, packed.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

import torch

from .records import BLOCK, groups, kind_of, record_bytes

F32, U8, I32 = torch.float32, torch.uint8, torch.int32


def _is_dense(tensor: torch.Tensor, dtype: torch.dtype) -> bool:
    return tensor.dtype is dtype and tensor.is_cpu and tensor.is_contiguous()


def refuse(kernel: str, what: str, tensor: Optional[torch.Tensor] = None) -> ValueError:
    seen = "" if tensor is None else f", got {tensor.dtype} {tuple(tensor.shape)} on {tensor.device}"
    return ValueError(f"{kernel}: {what}{seen}")


@functools.lru_cache(maxsize=None)
def _records_shape(kind: int, k: int, n: int) -> tuple[int, int]:
    """The shape of records holding n columns of `kind` for k inputs (raises ValueError on an unknown kind)."""
    return groups(n), record_bytes(kind, k)


class Rows:
    """A float32 CPU matrix [rows, width] with unit stride along a row (rows may be strided: a slice of a wider
    buffer), checked once when made: the calls below then compare integers, not tensors' attributes (a decoding
    step makes some 300 calls, so per-call tensor checks would cost it several percent). Every call also takes a
    plain tensor and makes the Rows itself. Holds the tensor, so its address stays valid."""

    __slots__ = ("tensor", "address", "rows", "width", "row_stride", "contiguous")

    def __init__(self, tensor: torch.Tensor, kernel: str = "Rows", name: str = "the tensor"):
        if tensor.dtype is not F32 or not tensor.is_cpu or tensor.ndim != 2 or tensor.stride()[1] != 1:
            raise refuse(kernel, f"{name} must be a float32 CPU matrix with unit stride along a row", tensor)
        self.tensor = tensor
        self.address: int = tensor.data_ptr()
        self.rows: int = tensor.shape[0]
        self.width: int = tensor.shape[1]
        self.row_stride: int = tensor.stride()[0]
        self.contiguous: bool = tensor.is_contiguous()


class Dense:
    """A contiguous CPU tensor of one dtype (a norm's weight, rotary tables, positions), checked once when made,
    like Rows."""

    __slots__ = ("tensor", "address", "shape")

    def __init__(self, tensor: torch.Tensor, dtype: torch.dtype = F32, kernel: str = "Dense",
                 name: str = "the tensor"):
        if tensor.dtype is not dtype or not tensor.is_cpu or not tensor.is_contiguous():
            raise refuse(kernel, f"{name} must be a contiguous {str(dtype).replace('torch.', '')} CPU tensor", tensor)
        self.tensor = tensor
        self.address: int = tensor.data_ptr()
        self.shape: tuple[int, ...] = tuple(tensor.shape)


def as_rows(value: "torch.Tensor | Rows", kernel: str, name: str) -> Rows:
    return value if isinstance(value, Rows) else Rows(value, kernel, name)


def as_dense(value: "torch.Tensor | Dense", kernel: str, name: str, dtype: torch.dtype = F32) -> Dense:
    return value if isinstance(value, Dense) else Dense(value, dtype, kernel, name)


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
        if (records.dtype is not U8 or not records.is_cpu or not records.is_contiguous() or self.k % BLOCK or
                tuple(records.shape) != _records_shape(self.kind, self.k, self.n)):
            raise ValueError(f"BlockMatrix: records of shape {tuple(records.shape)} do not hold {self.n} columns of "
                             f"kind {kind_of(self.kind).name} for k={self.k}")
        object.__setattr__(self, "_address", records.data_ptr())  # held with the records: it cannot move


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
        if (any(not _is_dense(part, I32) for part in (self.run_start, self.run_stop, self.extra_start, self.extra_pos))
                or tuple(self.run_stop.shape) != (rows,) or tuple(self.extra_start.shape) != (rows + 1,)
                or self.extra_pos.ndim != 1):
            raise ValueError("KeyPositions: run_start, run_stop [rows], extra_start [rows + 1] and extra_pos [extras] "
                             "must be contiguous int32 CPU tensors")
        object.__setattr__(self, "_addresses", tuple(part.data_ptr() for part in (  # held with the tensors
            self.run_start, self.run_stop, self.extra_start, self.extra_pos)))

    @property
    def rows(self) -> int:
        return self.run_start.shape[0]
