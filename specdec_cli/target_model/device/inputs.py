"""A step's inputs, written on the host and sent to the device in one transfer.

The host writes integers (token ids, positions, the committed length, a tree's ancestor matrix) into a host
buffer through numpy, which runs no torch operation, and one `copy_` sends the whole buffer to a device buffer
of the same size: every tensor a step computes with is then made on the device. On cuda the host buffers are
pinned, so the copy is asynchronous and no host synchronisation is needed; two of them alternate, each with an
event, so that the host never writes a buffer whose previous copy is still in flight.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch


class Staging:
    """`size` int64 values: host buffers (two, alternating) and the device buffer they are copied into."""

    def __init__(self, size: int, device: torch.device):
        pinned = device.type == "cuda"
        self.host = [torch.zeros(size, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self.arrays = [buffer.numpy() for buffer in self.host]  # the same memory, written without torch
        self.events: list[Optional[object]] = [None, None]
        self.device_buffer = torch.zeros(size, dtype=torch.int64, device=device)
        self.turn = 0

    def array(self) -> np.ndarray:
        """The host buffer to write next (waiting, on cuda, until its previous copy has left)."""
        event = self.events[self.turn]
        if event is not None:
            event.synchronize()  # type: ignore[attr-defined]
        return self.arrays[self.turn]

    def flush(self) -> torch.Tensor:
        """Send the buffer written (`array`) to the device: one copy_; returns the device buffer."""
        host = self.host[self.turn]
        self.device_buffer.copy_(host, non_blocking=True)
        if self.device_buffer.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self.events[self.turn] = event
        self.turn = 1 - self.turn
        return self.device_buffer

    def send(self, values: Sequence[int]) -> torch.Tensor:
        """`values` on the device (the first len(values) entries of the device buffer)."""
        array = self.array()
        array[: len(values)] = values
        return self.flush()


class StepInputs:
    """The inputs of a forward of `rows` padded rows, laid out in one int64 buffer:
    ids [rows] | positions [rows] | slots [rows] | committed length [1] | paths [rows, rows], where paths[r, d] is
    the block row of row r's ancestor at depth d (itself at its own depth; a chain's row r: 0, 1, ..., r)."""

    def __init__(self, rows: int, device: torch.device):
        self.rows = rows
        self.staging = Staging(3 * rows + 1 + rows * rows, device)
        buffer = self.staging.device_buffer
        self.ids = buffer[:rows]
        self.positions = buffer[rows : 2 * rows]
        self.slots = buffer[2 * rows : 3 * rows]
        self.past = buffer[3 * rows : 3 * rows + 1]
        self.paths = buffer[3 * rows + 1 :].view(rows, rows)
        self.chain = np.tile(np.arange(rows, dtype=np.int64), (rows, 1))  # every row's path in a chain

    def write(self, ids: Sequence[int], depth: Sequence[int], ancestors: Optional[np.ndarray], past: int,
              last_slot: int) -> None:
        """Stage a block of n <= rows real rows after `past` committed slots: row i at position past + depth[i] in
        slot past + i; `ancestors` [n, n] (ancestor-or-self, bool; parents before children) or None for a chain.
        Padding rows continue a chain at slots clamped to `last_slot`."""
        rows, n = self.rows, len(ids)
        array = self.staging.array()
        array[:n] = ids
        array[n:rows] = ids[-1] if n else 0
        positions = array[rows : 2 * rows]
        positions[:n] = np.asarray(depth, dtype=np.int64) + past
        positions[n:] = past + np.arange(n, rows)
        slots = array[2 * rows : 3 * rows]
        slots[:] = np.minimum(past + np.arange(rows), last_slot)
        array[3 * rows] = past
        paths = array[3 * rows + 1 :].reshape(rows, rows)
        paths[:] = self.chain
        if ancestors is not None:
            for row in range(n):
                found = np.flatnonzero(ancestors[row])  # ascending: depth 0 (the root) .. the row itself
                paths[row, : len(found)] = found
        self.staging.flush()
