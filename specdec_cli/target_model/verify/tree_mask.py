"""Where the tokens of a verify block may look: depth, ancestors and attention masks of a token tree.

A tree block is [root, node 0, node 1, ...] with every parent before its children (draft.py). Each node sits at
position start + depth and attends to the cached prefix, its ancestors and itself; sliding-window layers also
drop keys older than the window. This file builds those tensors; it runs no model.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ...errors import SpecdecError

MASKED_KINDS = ("full_attention", "sliding_attention")  # the layer kinds a tree mask is built for


def attention_kinds(config: Any) -> set[str]:
    """The kinds of attention layer the model has, named as transformers' `layer_types` name them."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return set(layer_types)
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return {"sliding_attention"}  # mistral, phi3: one window for every layer
    return {"full_attention"}


def tree_attention_mask(config: Any, start: int, depth: torch.Tensor, ancestors: torch.Tensor,
                        dtype: torch.dtype = torch.float32, device: Any = None) -> Any:
    """The attention mask of a tree block placed after `start` cached tokens.

    Every node (at position start + depth) sees the cached prefix, its ancestors and itself; on a sliding-window
    layer only the keys less than `sliding_window` positions before its own, as transformers' own sliding
    masks (`kv_idx > q_idx - sliding_window`) do. One mask [1, 1, n, start+n] when all layers attend alike,
    else a dict by layer kind (the form models with mixed layers, gemma2/gemma3, take). Bool (True = attend),
    except for eager attention, which adds its mask to the scores: 0 or the dtype's lowest value there, as
    transformers' own `eager_mask`.
    """
    n = len(depth)
    full = torch.cat([torch.ones(n, start, dtype=torch.bool), ancestors], dim=1)  # [n, start+n]
    masks = {}
    for kind in sorted(attention_kinds(config)):
        if kind == "full_attention":
            mask = full
        elif kind == "sliding_attention":
            query = start + depth  # [n] positions
            key = torch.cat([torch.arange(start), start + depth])  # [start+n] positions
            mask = full & (key[None, :] > query[:, None] - int(config.sliding_window))  # [n, start+n]
        else:
            raise SpecdecError(f"no tree mask for {kind} layers")
        if getattr(config, "_attn_implementation", None) == "eager":
            mask = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
        masks[kind] = mask[None, None].to(device)  # [1, 1, n, start+n]
    return next(iter(masks.values())) if len(masks) == 1 else masks


def tree_paths(parents: Sequence[int]) -> tuple[list[int], np.ndarray]:
    """For a block [root, node 0, node 1, ...] with node i's parent parents[i] (-1: the root): each row's depth and
    ancestor-or-self matrix (bool [n, n]), in numpy (no torch on the host: the device engine's inputs)."""
    size = len(parents) + 1
    depth = [0] * size
    ancestors = np.eye(size, dtype=bool)
    for node, parent in enumerate(parents):
        row, parent_row = node + 1, parent + 1
        if not 0 <= parent_row < row:
            raise ValueError(f"tree node {node} has parent {parent}: parents must come first (breadth-first)")
        depth[row] = depth[parent_row] + 1
        ancestors[row] |= ancestors[parent_row]
    return depth, ancestors


def tree_layout(parents: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """For a block [root, node 0, node 1, ...]: depth [n] and ancestor-or-self mask [n, n] (bool)."""
    depth, ancestors = tree_paths(parents)
    return torch.tensor(depth, dtype=torch.long), torch.from_numpy(ancestors)
