"""Which cached keys each query row of a verify block attends to: the attention kernel's view of a mask.

A block's rows attend over the KV cache under a causal mask (a chain), a sliding window, or a tree mask
(tree_mask.py). The row-invariant attention (kernels.attention, and exact.py's per-row SDPA fallback) does not
read masks: it takes, per row, one contiguous run of cache positions and then single positions (a tree node's
ancestors and itself). `row_keys` turns a mask (or none: causal) into that; `window_keys` a chain's keys on a
sliding layer. Both native.py and exact.py read them. This file does not build masks nor compute attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ...kernels import KeyPositions


@dataclass
class RowKeys:
    """Which cached keys each query row of a block attends to, in order: a contiguous run, then single positions.

    runs: per row (start, stop, None) when the keys are one run, else (start, stop, all positions [n]) for the
    SDPA fallback; positions: the same for the kernel (kernels.KeyPositions, checked once here)."""

    runs: list[tuple[int, int, Optional[torch.Tensor]]]
    positions: KeyPositions


PARSED_MASKS = 4  # masks remembered per forward (one per layer kind: full, sliding)
_parsed: list[tuple[Any, RowKeys]] = []  # (mask or (q_len, kv_len), its RowKeys), newest last; masks are held so
# that no other mask can reuse their id


def row_keys(attention_mask: Optional[torch.Tensor], q_len: int, kv_len: int) -> RowKeys:
    """Per query row, its keys. A None mask is causal: the cached keys and the block's rows up to this one."""
    key = (q_len, kv_len) if attention_mask is None else attention_mask
    for held, parsed in _parsed:
        if held is key or (attention_mask is None and isinstance(held, tuple) and held == key):
            return parsed
    if attention_mask is None:
        stops = torch.arange(kv_len - q_len + 1, kv_len + 1, dtype=torch.int32)
        empty = torch.zeros(q_len + 1, dtype=torch.int32)
        parsed = RowKeys([(0, stop, None) for stop in stops.tolist()],
                         KeyPositions(torch.zeros(q_len, dtype=torch.int32), stops, empty, empty[:0]))
        _parsed.append((key, parsed))
        del _parsed[:-PARSED_MASKS]
        return parsed
    # every row at once (a block's rows in a few tensor calls, not a few calls per row): a row's run starts at its
    # first allowed key and stops at the first key after it that is not allowed; the allowed keys past the run
    # are its extras
    allowed = attention_mask[0, 0, :q_len]  # [q, kv] bool
    if not bool(allowed.any(dim=1).all()):
        raise ValueError("a row of the attention mask allows no key")
    index = torch.arange(allowed.shape[1])
    firsts = allowed.to(torch.uint8).argmax(dim=1)  # the first allowed key
    holes = ~allowed & (index[None, :] >= firsts[:, None])
    stops = torch.where(holes.any(dim=1), holes.to(torch.uint8).argmax(dim=1), allowed.shape[1])
    extra = allowed & (index[None, :] >= stops[:, None])
    counts = extra.sum(dim=1)
    picked = torch.split(allowed.nonzero()[:, 1], allowed.sum(dim=1).tolist())  # each row's keys, ascending
    runs: list[tuple[int, int, Optional[torch.Tensor]]] = [
        (first, stop, None if count == 0 else keys)
        for first, stop, count, keys in zip(firsts.tolist(), stops.tolist(), counts.tolist(), picked)]
    extra_start = torch.cat([torch.zeros(1, dtype=counts.dtype), counts.cumsum(0)])
    parsed = RowKeys(runs, KeyPositions(firsts.to(torch.int32), stops.to(torch.int32), extra_start.to(torch.int32),
                                        extra.nonzero()[:, 1].to(torch.int32).contiguous()))
    _parsed.append((attention_mask, parsed))
    del _parsed[:-PARSED_MASKS]
    return parsed


def window_keys(rows: int, past: int, window: int) -> RowKeys:
    """A chain's keys on a sliding layer: row r (at cache position past + r) sees the `window` positions up to its
    own, as transformers' sliding masks (`kv_idx > q_idx - sliding_window`)."""
    stops = torch.arange(past + 1, past + rows + 1, dtype=torch.int32)
    starts = (stops - window).clamp(min=0).to(torch.int32)
    empty = torch.zeros(rows + 1, dtype=torch.int32)
    runs: list[tuple[int, int, Optional[torch.Tensor]]] = [(a, b, None) for a, b in zip(starts.tolist(),
                                                                                          stops.tolist())]
    return RowKeys(runs, KeyPositions(starts, stops, empty, empty[:0]))
