"""The parts of one verify step that are pure functions of a draft and the logits: the draft cut to what is
verified (`trim`, a tree's `first_branch`), the block padded to the forward's row count (`pad_block`), and the
choices read back from the logits' device in one transfer (`read_back`, several sequences' at once: `read_together`),
the target's own choice from a row (`choose`, under a grammar `allowed_only`, before an answer's `min_new_tokens`
without its end-of-text tokens: `eos_barred`, `without_eos`, `greedy_without_eos`) and sampling's seeded source
(`generator_for`). The engine (engine.py) runs them in its loop; plain_many.py and benchmarks share them. Nothing
here runs a model.
"""

from __future__ import annotations

from typing import Any, Collection, Optional, Sequence

import torch

from .. import kernels
from .draft import Draft
from .generation_config import GenerationConfig
from .grammar import Constraint
from .sampling import sample, warp_probs
from .verify import children_of

SCORED_TOPK = 8  # a drafter that needs scored_topk gets the target's top-8 tokens at every scored position


def read_back(logits: torch.Tensor, greedy: bool, topk: bool) -> tuple[Optional[list[int]], Optional[list[list[int]]]]:
    """Greedy: (each row's argmax [k+1], each row's top SCORED_TOPK tokens [k+1, 8] where `topk`), read back from
    the logits' device in one transfer; sampling: (None, None), read by the sampling rules themselves."""
    if not greedy:
        return None, None
    if _kernel_reads(logits):  # the kernels' one pass: column 0 the argmax (the first maximum, as torch's)
        best = kernels.top_tokens(logits, SCORED_TOPK if topk else 1).tolist()  # [k+1, 8 or 1]
        return [row[0] for row in best], (best if topk else None)
    picked = logits.argmax(dim=-1, keepdim=True)  # [k+1, 1]
    if topk:
        picked = torch.cat([picked, torch.topk(logits, min(SCORED_TOPK, logits.shape[-1]), dim=-1).indices], dim=1)
    rows = picked.tolist()  # the one read
    return [row[0] for row in rows], ([row[1:] for row in rows] if topk else None)


def _kernel_reads(logits: torch.Tensor) -> bool:
    """Whether the kernels read this block's choices: float32 rows in CPU memory, a vocabulary of SCORED_TOPK or
    more (the GPU's, and other dtypes, are torch's)."""
    return (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
            and logits.shape[-1] >= SCORED_TOPK and logits.is_contiguous() and kernels.available())


def trim(draft: Draft, length: int) -> Draft:
    """The first `length` nodes of a draft (parents come first, so any prefix is a tree)."""
    if len(draft) <= length:
        return draft
    parents = None if draft.parents is None else draft.parents[:length]
    p_draft = None if draft.p_draft is None else draft.p_draft[:length]
    confidence = None if draft.confidence is None else draft.confidence[:length]
    return Draft(draft.tokens[:length], draft.source, parents, p_draft, draft.match_len, confidence)


def pad_block(block: list[int], parents: Optional[list[int]], rows: int) -> tuple[list[int], Optional[list[int]]]:
    """Fill a verify block [root, *drafted] up to `rows` rows by repeating its last token: a chain's padding
    continues the chain, a tree's hangs off the root; the engine drops their outputs and cache entries."""
    padding = rows - len(block)
    if padding <= 0:
        return block, parents
    block = [*block, *[block[-1]] * padding]
    return block, None if parents is None else [*parents, *[-1] * padding]


def first_branch(draft: Draft) -> Draft:
    """A tree's first root-to-leaf path (each node's first child), as a chain."""
    tokens, nodes, node = [], [], -1
    children = children_of(draft.parents or [])
    while children.get(node):
        node = children[node][0]
        tokens.append(draft.tokens[node])
        nodes.append(node)
    confidence = None if draft.confidence is None else [draft.confidence[node] for node in nodes]
    return Draft(tokens, draft.source, None, None, draft.match_len, confidence)


def read_together(runs: Sequence[Any], scores: Sequence[Any]) -> list[Optional[tuple]]:
    """A batched step's greedy sequences' (engine.Run) choices read back in one read for all of them (read_back
    over their rows, the `scores`' logits, together), split per sequence; None for the others (they read their
    own)."""
    together = [index for index, run in enumerate(runs) if run.config.greedy]
    reads: list[Optional[tuple]] = [None] * len(runs)
    if len(together) < 2:
        return reads
    topk = any(runs[index].drafter.needs.scored_topk for index in together)
    argmax, top = read_back(torch.cat([scores[index].logits for index in together]), True, topk)
    first = 0
    for index in together:
        rows = scores[index].logits.shape[0]
        mine = top[first : first + rows] if top is not None and runs[index].drafter.needs.scored_topk else None
        reads[index] = ((argmax or [])[first : first + rows], mine)
        first += rows
    return reads


def allowed_only(logits: torch.Tensor, constraint: Optional[Constraint], draft_tokens: Sequence[int]) -> torch.Tensor:
    """logits [k+1, vocab] with what the grammar forbids at each row (after the draft's tokens before it) at -inf;
    as they are without a grammar."""
    if constraint is None:
        return logits
    allowed = constraint.masks(draft_tokens, logits.shape[-1]).to(logits.device)  # [k+1, vocab]
    return logits.masked_fill(~allowed, float("-inf"))


def eos_barred(draft: Draft, answered: int, min_new_tokens: int) -> list[int]:
    """The verify rows (of [k+1]: the root's, then each node's) that choose a token coming before the answer's
    `min_new_tokens`-th, where an end-of-text token is barred (`GenerationConfig.min_new_tokens`): in a chain the
    first ones, in a tree those of nodes less deep than the tokens still to come."""
    left = min_new_tokens - answered  # tokens still to come before EOS may end the answer
    if left <= 0:
        return []
    if draft.parents is None:
        return list(range(min(left, len(draft) + 1)))
    depths = [0]  # the root's row chooses the answer's next token; a node's row, the token after that node
    for parent in draft.parents:
        depths.append(depths[parent + 1] + 1)
    return [row for row, depth in enumerate(depths) if depth < left]


def without_eos(logits: torch.Tensor, eos: Collection[int], barred: Sequence[int]) -> torch.Tensor:
    """logits [k+1, vocab] with the end-of-text tokens at -inf in the `barred` rows (as plain decoding's
    `min_new_tokens` bars them); as they are where none is barred."""
    if not barred or not eos:
        return logits
    held = logits.clone()
    held[torch.tensor(barred)[:, None], torch.tensor(sorted(eos))[None, :]] = float("-inf")
    return held


def greedy_without_eos(logits: torch.Tensor, argmax: list[int], eos: set[int], barred: Sequence[int]) -> list[int]:
    """Greedy choices [k+1] with a barred row's end-of-text choice replaced by its best other token (the argmax
    of `without_eos`'s row: what plain decoding chooses there)."""
    choices = list(argmax)
    for row in barred:
        if choices[row] in eos:
            choices[row] = int(without_eos(logits[row : row + 1], eos, [0])[0].argmax())
    return choices


def choose(logits: torch.Tensor, generator: Optional[torch.Generator], config: GenerationConfig) -> int:
    """The target's own choice from one row of logits [vocab], as plain decoding makes it."""
    if config.greedy:
        return int(logits.argmax())
    return sample(warp_probs(logits, config.temperature, config.top_k, config.top_p, config.min_p), generator)


def generator_for(config: GenerationConfig) -> Optional[torch.Generator]:
    """Sampling's random source, seeded from the settings (None when greedy)."""
    if config.greedy:
        return None
    generator = torch.Generator(device="cpu")
    generator.manual_seed(config.seed if config.seed is not None else torch.seed())
    return generator
