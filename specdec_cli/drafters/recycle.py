"""Token Recycling (`recycle`, Luo et al. 2024): recycle the target's own top-k guesses into a token tree.

A successor matrix `M` [vocab, 8] (int32, zeros at start) holds, for each token, the target's top-8 next
tokens the last time that token was fed to it. Every step event carries the target's top-8 at every scored
position (`scored_topk`: row 0 for the root, the token the step fed first, row 1 + i for draft node i), so
after each step `M[fed token] = its top-8` for the root and every drafted node, accepted or not. Where one
step fed the same token twice the row from the accepted path wins (its context is the real one), then the
root's, then the rejected nodes' (later nodes over earlier ones).

The prefill event carries no top-k (the engine scores only the prompt's last position), so the prompt gives
what it can: each prompt token's successors in the prompt (distinct, most recent first) go in front of its
row, until the target's own top-8 overwrites the row when the token is fed (what that gains:
docs/measurements.md, "Token Recycling"); the row of the prompt's last token gets the target's first token in
front. A chat turn that re-sends the conversation contributes only
its new text. Rows are "filled" to a width (0-8); a tree node is drafted only where its parent's row has an
entry at the node's rank, so an empty matrix drafts nothing instead of token 0.

Drafting expands a fixed, imbalanced tree template (80 nodes, depth 6; earlier siblings get more children)
level by level with one vectorised gather `M[parent tokens, ranks]` per level. The template was grown
best-first from a guess of the per-rank acceptance (0.6, 0.14, 0.06, 0.035, ...; a node's worth is the
product over its path). A node's priority is that product under `RANK_ACCEPT`; when the budget is
smaller than the tree, the `budget` valid nodes of highest priority are kept (an ancestor-closed subtree,
since priority falls along every path) and emitted breadth first, better siblings first. The matrix lives
as long as the drafter, so a chat session starts every turn hot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from ..decoding.draft import Draft, Needs, StepEvent
from .spec import DrafterOptions, DrafterSpec, draft_length
from .target import TargetInfo
from .token_ids import check_token_ids

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

TOPK = 8  # successors kept per token (the engine's SCORED_TOPK)
# Children per template node, breadth first (node 0 = the root). Earlier siblings get more children.
TEMPLATE = [
    8,  # depth 0 (the root): 8 children
    7, 3, 2, 1, 1, 1, 1, 0,  # depth 1: 8 nodes
    6, 2, 1, 1, 1, 1, 0, 2, 1, 0, 1, 0, 1, 1, 1, 0,  # depth 2: 16 nodes
    4, 2, 1, 1, 0, 0, 2, 1, 1, 1, 0, 0, 2, 1, 1, 1, 1, 0, 0,  # depth 3: 19 nodes
    3, 1, 1, 0, 1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0,  # depth 4: 19 nodes
    2, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0,  # depth 5: 11 nodes
    0, 0, 0, 0, 0, 0, 0,  # depth 6: 7 leaves
]
# Probability that the successor of rank r is right, rounded from a measurement (docs/measurements.md, "Token
# Recycling"); only the order of the priorities matters.
RANK_ACCEPT = (0.45, 0.09, 0.045, 0.03, 0.015, 0.01, 0.007, 0.005)


class TreeTemplate:
    """A template given as child counts per node in breadth-first order, flattened into index arrays."""

    def __init__(self, child_counts: Sequence[int], rank_accept: Sequence[float] = RANK_ACCEPT):
        import numpy as np

        counts = [int(count) for count in child_counts]
        if not counts or any(count < 0 or count > TOPK for count in counts):
            raise ValueError(f"child counts must be 0..{TOPK}")
        # per drafted node; parent -1 = root; template node j+1 = drafted j
        parent: list[int] = []
        rank: list[int] = []
        depth: list[int] = []
        for template_node, count in enumerate(counts):
            if template_node > len(parent):
                raise ValueError("template: a node has children but no parent")
            for child in range(count):
                parent.append(template_node - 1)
                rank.append(child)
                depth.append(1 if template_node == 0 else depth[template_node - 1] + 1)
        if len(parent) + 1 != len(counts):
            raise ValueError(f"template: {len(counts)} child counts for {len(parent) + 1} nodes")
        self.parents = np.array(parent, dtype=np.int64)  # [n]
        self.ranks = np.array(rank, dtype=np.int64)  # [n]
        self.depths = np.array(depth, dtype=np.int64)  # [n]
        # level d occupies a contiguous slice (breadth first)
        self.levels = [np.flatnonzero(self.depths == level) for level in range(1, int(self.depths.max(initial=0)) + 1)]
        priority = np.ones(len(parent))
        accept = np.asarray(rank_accept, dtype=np.float64)
        for node in range(len(parent)):
            above = priority[parent[node]] if parent[node] >= 0 else 1.0
            priority[node] = above * accept[rank[node]]
        self.priority = priority  # [n], strictly decreasing along every path
        self.by_priority = np.argsort(-priority, kind="stable")  # [n] nodes, most promising first

    def __len__(self) -> int:
        return len(self.parents)


class RecycleDrafter:
    name = "recycle"
    needs = Needs(scored_topk=True)  # the target's top-8 at every scored position: the matrix's rows

    def __init__(self, vocab_size: int, draft_max: Optional[int] = None, template: Sequence[int] = TEMPLATE):
        import numpy as np

        self.vocab_size = vocab_size  # ids at or above it are refused (0: not known; negative ones always are)
        self.matrix = np.zeros((max(1, vocab_size), TOPK), dtype=np.int32)  # [vocab, 8]
        self.width = np.zeros(max(1, vocab_size), dtype=np.int8)  # [vocab]: filled entries per row (0 = unknown)
        self.template = TreeTemplate(template)
        self.draft_max = len(self.template) if draft_max is None else draft_max  # None: the whole template
        self._last: Optional[int] = None  # newest committed token: the root of the next step
        self._seen: list[int] = []  # the conversation so far (prompt and committed tokens)

    def reset(self) -> None:
        """Forget the conversation (the next prompt is learned whole); the matrix stays, so the next starts hot."""
        self._last = None
        self._seen = []

    # ------------------------------------------------------------------------------ learning

    def _ensure_rows(self, largest: int) -> None:
        """Grow the matrix when the model emits ids beyond the vocabulary it was sized for."""
        import numpy as np

        if largest >= len(self.matrix):
            rows = largest + 1
            self.matrix = np.concatenate([self.matrix, np.zeros((rows - len(self.matrix), TOPK), np.int32)])
            self.width = np.concatenate([self.width, np.zeros(rows - len(self.width), np.int8)])

    def update(self, fed: Sequence[int], topk: Sequence[Sequence[int]], accepted_path: Sequence[int] = ()) -> None:
        """M[fed[i]] = topk[i]; fed[0] is the root, fed[1 + j] draft node j. Duplicates: path > root > others."""
        import numpy as np

        if not len(fed):
            return
        if len(fed) == 1 and len(topk):  # a step that verified no draft (most of them): one row, no duplicates
            token, row = int(fed[0]), [int(successor) for successor in topk[0][:TOPK]]
            self._ensure_rows(max(token, *row))
            self.matrix[token, : len(row)] = row
            self.width[token] = len(row)
            return
        fed_arr = np.asarray(fed, dtype=np.int64)  # [m]
        rows = np.asarray(topk, dtype=np.int64)[: len(fed_arr), :TOPK]  # [m, <=8]
        fed_arr = fed_arr[: len(rows)]
        on_path = [1 + node for node in accepted_path if 1 + node < len(fed_arr)]
        path_set = set(on_path)
        order = [row for row in range(1, len(fed_arr)) if row not in path_set] + [0] + on_path  # later wins
        ordered = fed_arr[order]
        # the last occurrence of each token in `order`
        _, first_from_end = np.unique(ordered[::-1], return_index=True)
        keep = np.asarray(order)[len(order) - 1 - first_from_end]
        self._ensure_rows(int(max(fed_arr.max(), rows.max(initial=0))))
        width = rows.shape[1]
        self.matrix[fed_arr[keep], :width] = rows[keep]
        self.width[fed_arr[keep]] = width

    def learn_prompt(self, prompt: Sequence[int], first: Optional[int] = None) -> None:
        """Prefill: each token's successors in the prompt (distinct, latest first) go in front of its row, the
        row's other entries after them; prompt[-1]'s row gets the target's first token in front."""
        if len(prompt) >= 2:
            tokens = [int(token) for token in prompt]
            self._ensure_rows(max(tokens))
            successors: dict[int, list[int]] = {}
            for token, nxt in zip(tokens[-2::-1], tokens[:0:-1]):  # latest pair first
                row = successors.setdefault(token, [])
                if nxt not in row and len(row) < TOPK:
                    row.append(nxt)
            for token, row in successors.items():
                self._put_first(token, row)
        if first is not None and len(prompt):
            self._put_first(int(prompt[-1]), [int(first)])

    def _put_first(self, token: int, successors: list[int]) -> None:
        self._ensure_rows(max(token, *successors))
        width = int(self.width[token])
        row = (successors + [t for t in self.matrix[token, :width].tolist() if t not in successors])[:TOPK]
        self.matrix[token, : len(row)] = row
        self.width[token] = len(row)

    def observe(self, event: StepEvent) -> None:
        # the ids it indexes its matrix with, or stores: checked first (a wrapped index, or a matrix grown to a huge id)
        check_token_ids(event.committed, self.vocab_size, "committed tokens")
        check_token_ids(event.draft.tokens, self.vocab_size, "draft")
        if event.scored_topk is not None:  # (rows of ids: checked as one list)
            check_token_ids([token for row in event.scored_topk for token in row], self.vocab_size,
                            "target's top tokens")
        if event.kind == "prefill":
            prompt = [int(token) for token in event.prompt_tokens]
            check_token_ids(prompt, self.vocab_size, "prompt")
            seen = self._seen
            # a chat turn re-sends the conversation: learn from its new text only (the rest was fed already)
            start = len(seen) - 1 if 0 < len(seen) <= len(prompt) and prompt[: len(seen)] == seen else 0
            self.learn_prompt(prompt[start:], event.committed[0] if event.committed else None)
            self._seen = prompt
        elif event.scored_topk is not None and self._last is not None:
            self.update([self._last, *event.draft.tokens], event.scored_topk, event.accepted_path)
        if event.committed:
            self._last = int(event.committed[-1])
            self._seen.extend(int(token) for token in event.committed)

    # ------------------------------------------------------------------------------ drafting

    def expand(self, root: int) -> tuple[np.ndarray, np.ndarray]:
        """The whole template under `root`: (tokens [n], valid [n]); a node is valid when its parent is and the
        parent's row has an entry at the node's rank."""
        import numpy as np

        template = self.template
        tokens = np.zeros(len(template), dtype=np.int64)
        valid = np.zeros(len(template), dtype=bool)
        if root >= len(self.matrix):
            return tokens, valid
        for level in template.levels:
            parents = template.parents[level]
            ranks = template.ranks[level]
            if parents[0] < 0:  # the first level: children of the root
                parent_tokens = np.full(len(level), root, dtype=np.int64)
                parent_valid = np.ones(len(level), dtype=bool)
            else:
                parent_tokens = tokens[parents]
                parent_valid = valid[parents]
            tokens[level] = self.matrix[parent_tokens, ranks]
            valid[level] = parent_valid & (ranks < self.width[parent_tokens])
        return tokens, valid

    def propose(self, context: Sequence[int], budget: int) -> Draft:

        budget = min(budget, self.draft_max)
        if budget <= 0 or not len(context):
            return Draft.empty(self.name)
        check_token_ids(context[-1:], self.vocab_size)  # the only token it reads: the root
        root = int(context[-1])
        if root >= len(self.width) or not self.width[root]:
            return Draft.empty(self.name)  # nothing known after the root (a first-level node needs its row)
        tokens, valid = self.expand(root)
        # most promising first: priority falls along every path, so parents still precede their children and
        # any prefix the engine keeps is the best subtree of that size
        order = self.template.by_priority
        keep = order[valid[order]][:budget]
        if not len(keep):
            return Draft.empty(self.name)
        return Draft(tokens[keep].tolist(), self.name, parents=reindex_parents(self.template.parents, keep))


def reindex_parents(parents: np.ndarray, keep: np.ndarray) -> list[int]:
    """Parents of the kept nodes (ancestor-closed, parents first) in the kept numbering; -1 stays the root."""
    import numpy as np

    new_index = np.full(len(parents), -1, dtype=np.int64)
    new_index[keep] = np.arange(len(keep))
    old = parents[keep]
    return np.where(old >= 0, new_index[np.maximum(old, 0)], -1).tolist()


def make_recycle_drafter(options: DrafterOptions, target: TargetInfo,
                         draft_max: Optional[int] = None) -> RecycleDrafter:
    """The `recycle` drafter for `make_drafter`: a matrix sized to the target's vocabulary."""
    return RecycleDrafter(target.vocab_size, draft_max=draft_length(draft_max))


SPEC = DrafterSpec(name="recycle", help="Token Recycling: a tree from the target's own recent top-8 predictions per "
                   "token", build=make_recycle_drafter, aux_rank=1)
