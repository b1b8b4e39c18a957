"""Rolling the KV cache back to the committed tokens after a verify forward.

A verify forward appends an entry for every row of its block: the root, each drafted node and any padding. Once
the accepted path is known, the cache must hold the prefix, the root and that path's entries only, in order:
a chain's accepted drafts are its first entries, so the rest is cropped (`truncate_cache`); a tree's accepted
path is gathered into place first (`keep_accepted`). Caches that cannot be rolled back are refused in one line
(`check_rollback`). This file does not decide what was accepted (verify.py) nor hold the cache (kv_cache.py).
"""

from __future__ import annotations

from typing import Any, Sequence

from ...errors import SpecdecError


def keep_accepted(cache: Any, past: int, path: Sequence[int], is_chain: bool, length: int) -> None:
    """Keep the `past` prefix, the root and the accepted path's entries, `length` in all; drop the rest of the
    block (cache.keep and cache.crop are kv_cache.KVCache's)."""
    if not is_chain and list(path) != list(range(len(path))):  # a tree path: gather it into place
        check_rollback(cache)
        cache.keep([past + 1 + node for node in path], start=past + 1)  # the prefix and root stay in place
    truncate_cache(cache, length)


def truncate_cache(cache: Any, length: int) -> None:
    """Roll the KV cache back to `length` tokens (drop the rejected drafts)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        check_rollback(cache)
        cache.crop(-extra)


def check_rollback(cache: Any) -> None:
    """Refuse a cache that cannot be rolled back or gathered: one with layers that do not keep an entry for every
    cached token (transformers' sliding-window layers keep the last window - 1; a recurrent state keeps none)."""
    length = cache.get_seq_length()
    for index, layer in enumerate(getattr(cache, "layers", ())):
        if not getattr(layer, "is_initialized", True):
            continue  # a layer that shares another's entries
        held = getattr(layer, "keys", None)
        if getattr(layer, "is_sliding", False) or held is None or held.dim() < 2 or held.shape[-2] != length:
            raise SpecdecError(f"the KV cache's layer {index} ({type(layer).__name__}) does not keep every token, so "
                               "rejected drafts cannot be rolled back: use a plain DynamicCache()")
