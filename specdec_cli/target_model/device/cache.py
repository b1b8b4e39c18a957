"""The device engine's KV cache: static buffers allocated once per forward object, and roll-back in place.

Keys and values of every layer live in two buffers [layers, kv_heads, slots, head_dim] made once, zero-filled
(attention multiplies masked slots' values by exactly zero, which must not meet a NaN). Slot s holds the token at
position s for every committed token; a verify block's rows write slots length .. length + rows - 1 (padding rows
too: they are never read as committed). `DeviceCache` is one generation's view of the buffers: how many slots are
committed (`get_seq_length`), rolled back by `crop` (a count only: nothing moves) and `keep` (a tree's accepted
path gathered into place: one index_select and one index_copy_ for all layers), the same calls the engine's
rollback.py makes on its KVCache. A forward object hands out one view at a time (`StaticCache.view`): a new one
starts empty and the old one must not be used after it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .inputs import Staging


class StaticCache:
    """The buffers: keys and values [layers, kv_heads, slots, head_dim] in the compute dtype, on the device."""

    def __init__(self, layers: int, kv_heads: int, slots: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, staging_rows: int):
        shape = (layers, kv_heads, slots, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.slots = slots
        self.moves = Staging(2 * staging_rows, device)  # source and destination slots of a kept path

    def view(self) -> "DeviceCache":
        return DeviceCache(self)


class DeviceCache:
    """One generation's committed length over a StaticCache (the engine's `cache` on the device engine)."""

    def __init__(self, static: StaticCache):
        self.static = static
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def advance(self, rows: int) -> None:
        """A forward wrote `rows` more slots after the committed ones."""
        self.length += rows

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove committed slots (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of entries to drop")
        self.length = max(0, self.length + tokens_to_remove)

    def keep(self, positions: Sequence[int], start: int = 0) -> None:
        """Keep the first `start` slots where they are and the slots at `positions` (ascending, each >= start) right
        after them, in that order; drop the rest (at most the staging rows move: a tree's accepted path)."""
        moved = list(positions)
        if moved:
            static = self.static
            count = len(moved)
            indices = static.moves.send([*moved, *range(start, start + count)])  # int64 [2 count] on the device
            source, target = indices[:count], indices[count : 2 * count]
            for buffer in (static.keys, static.values):  # [layers, kv_heads, slots, head_dim]
                buffer.index_copy_(2, target, buffer.index_select(2, source))
        self.length = start + len(moved)
