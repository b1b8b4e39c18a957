"""The engine's KV cache: keys and values in buffers with room to grow, cut back and gathered in place.

transformers' DynamicCache appends by concatenation, so every step copies the whole cache (30 layers x the
context): at 300 tokens that was a quarter of a 135M model's step on a 2-core CPU. `KVCache` is a DynamicCache
whose layers write new entries into preallocated buffers (capacity doubled when full) and hand the model views
of the filled part; rolling back rejected drafts (`crop`) and keeping a tree's accepted path (`keep`) move
only the entries that change. Every layer keeps every token (no sliding-window eviction), which verification
needs to roll back. This file holds the cache only; the engine decides what to keep.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

INITIAL_CAPACITY = 256  # tokens; doubled as needed


class GrowingLayer(DynamicLayer):
    """One layer's keys and values [batch, kv_heads, positions, head_dim] as views of larger buffers."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.length = 0
        self._key_buffer = key_states.new_empty(0)
        self._value_buffer = value_states.new_empty(0)
        self._reserve(key_states, value_states, INITIAL_CAPACITY)
        self.is_initialized = True

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = self._key_buffer.shape[-2] if self._key_buffer.dim() == 4 else 0
        if needed <= capacity:
            return
        capacity = max(needed, 2 * capacity, INITIAL_CAPACITY)
        keys = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])
        values = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
        if self.length:
            keys[..., : self.length, :] = self._key_buffer[..., : self.length, :]
            values[..., : self.length, :] = self._value_buffer[..., : self.length, :]
        self._key_buffer, self._value_buffer = keys, values

    def _expose(self) -> None:
        self.keys = self._key_buffer[..., : self.length, :]
        self.values = self._value_buffer[..., : self.length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        added = key_states.shape[-2]
        self._reserve(key_states, value_states, self.length + added)
        self._key_buffer[..., self.length : self.length + added, :] = key_states
        self._value_buffer[..., self.length : self.length + added, :] = value_states
        self.length += added
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove entries (DynamicLayer's convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of entries to drop")
        if not self.is_initialized or tokens_to_remove == 0:
            return
        self.length = max(0, self.length + tokens_to_remove)
        self._expose()

    def keep(self, positions: torch.Tensor) -> None:
        """Keep the entries at `positions` (ascending), moved to the front in that order; drop the rest."""
        if not self.is_initialized:
            return
        kept = positions.numel()
        keys = self._key_buffer.index_select(-2, positions)  # [b, h, kept, d]
        values = self._value_buffer.index_select(-2, positions)
        self._key_buffer[..., :kept, :] = keys
        self._value_buffer[..., :kept, :] = values
        self.length = kept
        self._expose()

    def reset(self) -> None:
        self.length = 0
        super().reset()


class KVCache(DynamicCache):
    """A DynamicCache of GrowingLayers (models see an ordinary DynamicCache)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    def keep(self, positions: Sequence[int]) -> None:
        """Keep the cached entries at these positions (ascending), in every layer; drop the others."""
        index = torch.tensor(list(positions), dtype=torch.long)
        for layer in self.layers:
            if getattr(layer, "is_initialized", False):
                layer.keep(index.to(layer.device))
