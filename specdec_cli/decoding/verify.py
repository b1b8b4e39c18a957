"""Acceptance rules: which drafted tokens the target keeps, and which token it adds.

Pure functions over token lists and probability tensors, callable from tests without a model.
- Greedy (exact): accept draft tokens while each equals the target's argmax at its position.
- Speculative sampling (lossless): accept drafted x with probability min(1, p_target(x) / p_draft(x));
  at the first rejection draw from normalize(max(0, p_target - p_draft)); after a fully accepted chain
  draw a bonus token from p_target. A deterministic drafter (no p_draft) is the point-mass case: accept
  with probability p_target(x), on rejection draw from p_target with x removed.
Each rule commits between 1 and len(draft)+1 tokens, and the committed sequence is distributed exactly as
plain decoding's (greedy: identical). Token trees reuse these rules node by node (tree verification).
`accept_draft` picks the rule for a step's draft and settings (the engine's accept stage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import torch

from .sampling import sample, warp_probs

if TYPE_CHECKING:  # pragma: no cover
    from .draft import Draft
    from .generation_config import GenerationConfig


def greedy_accept(draft_tokens: Sequence[int], target_argmax: Sequence[int]) -> int:
    """Number of leading draft tokens equal to the target's argmax at their positions.

    target_argmax[i] is the target's choice after the root and draft_tokens[:i]; it has len(draft)+1 entries.
    """
    accepted = 0
    for drafted, wanted in zip(draft_tokens, target_argmax):
        if drafted != wanted:
            break
        accepted += 1
    return accepted


def residual(p_target: torch.Tensor, p_draft: Optional[torch.Tensor], drafted: int) -> torch.Tensor:
    """Distribution to draw from after rejecting `drafted`: normalize(max(0, p_target - p_draft)).

    With p_draft None (a deterministic drafter, point mass on `drafted`) this is p_target without `drafted`.
    """
    if p_draft is None:
        rest = p_target.clone()
        rest[drafted] = 0.0
    else:
        rest = torch.clamp(p_target - p_draft, min=0.0)
    total = rest.sum()
    if total <= 0:  # p_draft >= p_target everywhere: only possible when they are equal; fall back safely
        return p_target
    return rest / total


def speculative_accept(
    draft_tokens: Sequence[int],
    p_target: torch.Tensor,  # [len(draft)+1, vocab], warped like plain sampling
    p_draft: Optional[torch.Tensor],  # [len(draft), vocab] or None for a deterministic drafter
    generator: Optional[torch.Generator],
) -> tuple[int, int]:
    """Returns (number of accepted draft tokens, the target's token after them)."""
    for position, drafted in enumerate(draft_tokens):
        p_target_x = float(p_target[position, drafted])
        p_draft_x = 1.0 if p_draft is None else float(p_draft[position, drafted])
        if p_draft_x <= 0:  # not a sample of p_draft at all: ignore it and draw from the target itself
            return position, sample(p_target[position], generator)
        if torch.rand((), generator=generator).item() >= min(1.0, p_target_x / p_draft_x):
            row_draft = None if p_draft is None else p_draft[position]
            return position, sample(residual(p_target[position], row_draft, drafted), generator)
    return len(draft_tokens), sample(p_target[len(draft_tokens)], generator)


# -- token trees ------------------------------------------------------------------------------------------
# Node i of a tree draft has parent parents[i] (-1 = the root, i.e. the newest committed token). Logit row 0
# belongs to the root and row 1 + i to node i: each row is the target's prediction after that node's path.


def children_of(parents: Sequence[int]) -> dict[int, list[int]]:
    """Parent index (-1 = root) -> its children in draft order."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    return children


def greedy_accept_tree(tokens: Sequence[int], parents: Sequence[int], target_argmax: Sequence[int]) -> list[int]:
    """The accepted path (node indices): from the root, follow the child equal to the target's argmax."""
    children = children_of(parents)
    path: list[int] = []
    node = -1
    while True:
        wanted = target_argmax[node + 1]
        match = next((child for child in children.get(node, []) if tokens[child] == wanted), None)
        if match is None:
            return path
        path.append(match)
        node = match


def speculative_accept_tree(
    tokens: Sequence[int],
    parents: Sequence[int],
    p_target: torch.Tensor,  # [len(tokens)+1, vocab], row 0 = root
    generator: Optional[torch.Generator],
) -> tuple[list[int], int]:
    """Multi-draft rule with point-mass drafts: try each child in turn, accepting x with probability
    p_residual(x) and removing x from the residual when rejected; returns (accepted path, next token)."""
    children = children_of(parents)
    path: list[int] = []
    node = -1
    while True:
        p_residual = p_target[node + 1].clone()
        for child in children.get(node, []):
            drafted = tokens[child]
            mass = float(p_residual.sum())
            accept_prob = float(p_residual[drafted]) / mass if mass > 0 else 0.0
            if accept_prob > 0 and torch.rand((), generator=generator).item() < accept_prob:
                path.append(child)
                node = child
                break
            p_residual[drafted] = 0.0
        else:  # every child rejected (or a leaf): the target's own token from what is left
            if float(p_residual.sum()) <= 0:
                p_residual = p_target[node + 1]
            return path, sample(p_residual / p_residual.sum(), generator)


def accept_draft(draft: "Draft", logits: torch.Tensor, config: "GenerationConfig", generator: Optional[torch.Generator],
                 argmax: Optional[list[int]] = None) -> tuple[list[int], int]:
    """A verify step's rule: (accepted node indices, the target's own token) for a chain or a tree, greedy or by
    speculative sampling, from the verified rows' logits [k+1, vocab]; greedy, `argmax` is the logits' argmax per
    row when already read."""
    if config.greedy:
        target_argmax = argmax if argmax is not None else logits.argmax(dim=-1).tolist()  # [k+1]
        if draft.parents is None:  # a chain
            path = list(range(greedy_accept(draft.tokens, target_argmax)))
        else:
            path = greedy_accept_tree(draft.tokens, draft.parents, target_argmax)
        return path, target_argmax[path[-1] + 1 if path else 0]
    p_target = warp_probs(logits, config.temperature, config.top_k, config.top_p, config.min_p)  # [k+1, vocab]
    if draft.parents is not None:  # a tree
        return speculative_accept_tree(draft.tokens, draft.parents, p_target, generator)
    p_draft = None if draft.p_draft is None else draft.p_draft.to(p_target.device, torch.float32)
    accepted, target_token = speculative_accept(draft.tokens, p_target, p_draft, generator)
    return list(range(accepted)), target_token
