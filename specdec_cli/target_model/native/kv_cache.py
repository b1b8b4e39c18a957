"""The engine's KV cache: keys and values in buffers with room to grow, cut back and gathered in place.

transformers' DynamicCache appends by concatenation, so every step copies the whole cache (30 layers x the
context): at 300 tokens that was a quarter of a 135M model's step on a 2-core CPU. `KVCache`'s layers write new
entries into preallocated buffers (capacity doubled when full) and hand the model views of the filled part;
rolling back rejected drafts (`crop`) and keeping a tree's accepted path (`keep`) move only the entries that
change. Every layer keeps every token (no sliding-window eviction), which verification needs to roll back.

`KVCache` itself needs no transformers (the native decoder's GGUF path never imports it: start-up). A
transformers model's forward needs a transformers `Cache`: `transformers_kv_cache()` makes the same cache as a
DynamicCache (its classes built on first use), and `new_kv_cache(model)` picks the one a model needs. The native
decoder's entries are float32, or bfloat16 with SPECDEC_KV_CACHE (`native_cache_dtype`). This file holds the cache
only; the engine decides what to keep.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Optional, Sequence

import torch

from ...defaults import KV_CACHES
from ...errors import check_choice

INITIAL_CAPACITY = 256  # tokens; doubled as needed
CACHE_VARIABLE = "SPECDEC_KV_CACHE"
CACHE_DTYPES = {name: getattr(torch, name) for name in KV_CACHES}  # the native decoder's; the first the default


def native_cache_dtype() -> torch.dtype:
    """The dtype the native decoder keeps keys and values in (SPECDEC_KV_CACHE, which `--kv-cache` sets): float32 by
    default, as computed; bfloat16 halves the bytes every step reads, which a long context's steps spend much of
    their time on (as a bfloat16 model's cache is kept in transformers and vLLM; llama.cpp keeps float16), at the
    price of answers that may part from transformers' float32 greedy decoding where two tokens nearly tie. Plain and
    speculative decoding read the same cache, so they stay identical either way. Another value is one line (checked
    before a load)."""
    setting = os.environ.get(CACHE_VARIABLE, "").strip().lower() or KV_CACHES[0]
    return CACHE_DTYPES[check_choice(setting, KV_CACHES, "kv_cache", named=CACHE_VARIABLE)]


def _only_none(value: Optional[torch.Tensor]) -> None:
    """transformers clears a layer's keys and values by setting None (`reset`); nothing else may set them."""
    if value is not None:
        raise TypeError("a GrowingLayer's keys and values are views of its buffers; write through update()")


class GrowingLayer:
    """One layer's keys and values [batch, kv_heads, positions, head_dim] as views of larger buffers."""

    is_sliding = False  # every layer keeps every token (rollback.check_rollback asks)

    def __init__(self) -> None:
        self.is_initialized = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        self._initialize(batch, heads, dim, key_states.dtype, key_states.device)

    def _initialize(self, batch: int, heads: int, dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self.length = 0
        self.key_buffer = torch.empty(batch, heads, INITIAL_CAPACITY, dim, dtype=dtype, device=device)
        self.value_buffer = torch.empty_like(self.key_buffer)
        self.is_initialized = True

    def _reserve(self, needed: int) -> None:
        """Room for `needed` entries (the buffers are reallocated, doubling, when they are too small)."""
        capacity = self.key_buffer.shape[-2]
        if needed <= capacity:
            return
        shape = (*self.key_buffer.shape[:-2], max(needed, 2 * capacity), self.key_buffer.shape[-1])
        keys = self.key_buffer.new_empty(shape)
        values = self.value_buffer.new_empty(shape)
        keys[..., : self.length, :] = self.key_buffer[..., : self.length, :]
        values[..., : self.length, :] = self.value_buffer[..., : self.length, :]
        self.key_buffer, self.value_buffer = keys, values

    # transformers' layers keep `keys` and `values` as attributes; here they are views of the filled part of the
    # buffers, made when read (the native decoder writes and reads the buffers themselves and never asks: making
    # two views after every layer's write cost ~5 us, 30 layers a step)
    @property
    def keys(self) -> Optional[torch.Tensor]:  # [batch, kv_heads, length, head_dim]
        return self.key_buffer[..., : self.length, :] if getattr(self, "is_initialized", False) else None

    @keys.setter
    def keys(self, value: Optional[torch.Tensor]) -> None:
        _only_none(value)

    @property
    def values(self) -> Optional[torch.Tensor]:
        return self.value_buffer[..., : self.length, :] if getattr(self, "is_initialized", False) else None

    @values.setter
    def values(self, value: Optional[torch.Tensor]) -> None:
        _only_none(value)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        added = key_states.shape[-2]
        self._reserve(self.length + added)
        self.key_buffer[..., self.length : self.length + added, :] = key_states
        self.value_buffer[..., self.length : self.length + added, :] = value_states
        self.length += added
        return self.key_buffer[..., : self.length, :], self.value_buffer[..., : self.length, :]

    def open_rows(self, heads: int, dim: int, rows: int, dtype: torch.dtype = torch.float32) -> "GrowingLayer":
        """For a writer that fills the buffers itself (native.py): room for `rows` more entries (batch 1, `dtype`
        when first opened); it writes them at positions length .. length + rows - 1, then calls `advance(rows)`."""
        if not self.is_initialized:
            self._initialize(1, heads, dim, dtype, torch.device("cpu"))
        self._reserve(self.length + rows)
        return self

    def advance(self, rows: int) -> None:
        self.length += rows

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove entries (DynamicLayer's convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of entries to drop")
        if not self.is_initialized or tokens_to_remove == 0:
            return
        self.length = max(0, self.length + tokens_to_remove)

    def copy_into(self, other: "GrowingLayer", length: int) -> None:
        """Make `other` (a new layer) hold a copy of this layer's first `length` entries."""
        if not self.is_initialized:
            return
        batch, heads, _, dim = self.key_buffer.shape
        other._initialize(batch, heads, dim, self.dtype, self.device)
        other._reserve(length)
        other.key_buffer[..., :length, :] = self.key_buffer[..., :length, :]
        other.value_buffer[..., :length, :] = self.value_buffer[..., :length, :]
        other.length = length

    def keep(self, positions: torch.Tensor, start: int = 0) -> None:
        """Keep the first `start` entries where they are and the entries at `positions` (ascending, each >= start)
        right after them, in that order; drop the rest."""
        if not self.is_initialized:
            return
        kept = start + positions.numel()
        keys = self.key_buffer.index_select(-2, positions)  # [b, h, kept - start, d]
        values = self.value_buffer.index_select(-2, positions)
        self.key_buffer[..., start:kept, :] = keys
        self.value_buffer[..., start:kept, :] = values
        self.length = kept

    def reset(self) -> None:
        self.length = 0
        self.is_initialized = False


class KVCache:
    """GrowingLayers, one per decoder layer, made as they are first written (DynamicCache's interface: `update`,
    `get_seq_length`, `crop`, `reset`, `layers`)."""

    def __init__(self) -> None:
        self.layers: list[Any] = []

    def new_layer(self) -> GrowingLayer:
        return GrowingLayer()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.layers) <= layer_idx:
            self.layers.append(self.new_layer())
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length() if layer_idx < len(self.layers) else 0

    def crop(self, max_length: int) -> None:
        """Drop the last -max_length entries of every layer (a negative count, as GrowingLayer.crop)."""
        for layer in self.layers:
            layer.crop(max_length)

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()

    def __len__(self) -> int:
        return len(self.layers)

    def native_layer(self, index: int, heads: int, dim: int, rows: int,
                     dtype: torch.dtype = torch.float32) -> GrowingLayer:
        """Layer `index`, with room for `rows` more entries, for a writer that fills it itself (native.py); its
        buffers are made in `dtype`."""
        while len(self.layers) <= index:
            self.layers.append(self.new_layer())
        layer = self.layers[index]
        if not isinstance(layer, GrowingLayer):
            raise TypeError("native writes need GrowingLayers")
        return layer.open_rows(heads, dim, rows, dtype)

    def copy_prefix(self, length: int) -> "KVCache":
        """A new cache of the same kind holding a copy of the first `length` entries of every layer (a prompt
        cache shares a common beginning, a system prompt, with another conversation without giving up its own)."""
        if not 0 <= length <= self.get_seq_length():
            raise ValueError(f"cannot copy {length} entries of a cache holding {self.get_seq_length()}")
        copy = type(self)()
        for layer in self.layers:
            if not isinstance(layer, GrowingLayer):
                raise TypeError("only GrowingLayers are copied")
            fresh = copy.new_layer()
            layer.copy_into(fresh, length)
            copy.layers.append(fresh)
        return copy

    def keep(self, positions: Sequence[int], start: int = 0) -> None:
        """Keep the first `start` entries where they are and the entries at `positions` (ascending, each >= start)
        right after them, in every layer; drop the others (a tree's accepted path after the whole context)."""
        index = torch.tensor(list(positions), dtype=torch.long)
        for layer in self.layers:
            if isinstance(layer, GrowingLayer) and layer.is_initialized:
                layer.keep(index.to(layer.key_buffer.device), start)


def new_kv_cache(model: Any) -> Any:
    """An empty cache for `model`'s forward: a KVCache for the native decoder and a model it computes in place
    (each says so with `native_cache`), the same cache as a transformers DynamicCache for any other."""
    native = getattr(model, "native_cache", False) or getattr(getattr(model, "model", None), "native_cache", False)
    return KVCache() if native else transformers_kv_cache()


def transformers_kv_cache() -> Any:
    """A KVCache that is also a transformers DynamicCache (for a transformers model's forward)."""
    return _transformers_classes()()


@functools.cache
def _transformers_classes() -> Any:
    """KVCache and GrowingLayer as transformers' DynamicCache and DynamicLayer: transformers' own methods where it
    has them (update, masks, get_seq_length), the growing buffers' for the rest; made once, on first use."""
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    class TransformersGrowingLayer(GrowingLayer, DynamicLayer):
        def __init__(self) -> None:
            DynamicLayer.__init__(self)

        def reset(self) -> None:
            self.length = 0
            DynamicLayer.reset(self)

    class TransformersKVCache(DynamicCache, KVCache):
        def __init__(self) -> None:
            Cache.__init__(self, layer_class_to_replicate=TransformersGrowingLayer)

        def new_layer(self) -> GrowingLayer:
            return TransformersGrowingLayer()

    return TransformersKVCache
