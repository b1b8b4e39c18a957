"""The `eagle` drafter: a feature-level head (eagle_head.py) drafts from the target's own hidden states.

The engine's step events carry the target's last hidden states for the positions each forward scored and committed
(the prefill's prompt, then each step's root and accepted drafts), so after every event the drafter holds a feature
for every committed token but the newest. `propose` feeds the head the pairs (f_t, x_{t+1}) it has not seen yet, in
one forward with the head's own KV cache; the last output predicts the newest token's feature, whose LM-head argmax
is the first drafted token; each further token feeds the predicted feature back in with the token just chosen. The
speculative pairs are dropped from the head's cache afterwards (the next event brings the real features). Pairs
more than CATCH_UP_MAX behind are not fed: the head's cache then starts again from the last CATCH_UP_MAX. A chain
stops at `draft_max`, at an EOS, or when the head's own top probability falls below `min_prob`. It drafts what the
engine asks for: the engine's planner asks for nothing when its drafts would not pay (and for a probe now and
then), so a head that does not pay on this machine costs little. It declares `needs.features`: only then do the
engine's forwards return hidden states.

With `tree_width` > 0 it drafts a tree instead, as EAGLE-2 grows one: every node's score is the product of the
head's probabilities along its path; each level, the `tree_width` best-scoring unexpanded nodes are fed to the head
in one forward (each row attending to the committed pairs and its own ancestors only) and offer their
`TREE_CHILDREN` likeliest children that score at least `min_prob`; after `draft_max` levels the `budget` best-
scoring nodes are returned, best first (a child never outscores its parent, so every prefix of the list is a tree;
growing stops early once `budget` nodes outscore every node still to expand). Drafts are deterministic (no
`p_draft`), which speculative sampling handles exactly. Tokens are read through the target's frozen LM head
restricted to the head's `head_tokens` (plus the tokens seen in the context), all of a tree level's rows in one
read; the target's embeddings and LM head come typed (`TargetWeights`: tensors, or the LM head's block layer). When
the target's LM head is in blocks (the default GGUF's is) the head drafts on the same CPU kernels: its layers in
8-bit blocks and the LM-head rows in the target's own blocks, so a head forward reads ~6 MB instead of ~26 MB of
float32. This module never calls the engine and does not train heads.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from ..decoding.draft import Draft, Needs, StepEvent
from ..decoding.stats import decayed_mean
from ..errors import SpecdecError
from .spec import DrafterOptions, DrafterSpec
from .target import TargetInfo, TargetWeights
from .token_ids import check_token_ids

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..target_model.native.quant import BlockLinear

# Levels of head forwards per draft when --draft-max is not given (a chain's length when tree_width is 0); the
# engine's budget caps the tree's nodes. --draft-max sets both.
DEFAULT_TREE_DEPTH = 5
DEFAULT_TREE_WIDTH = 4  # nodes expanded per tree level (0 = chains)
MIN_PROB = 0.1  # the probability floor when --draft-min-prob is 0, in chat and bench (docs/measurements.md)
TREE_CHILDREN = 4  # children offered by each expanded node
# A tree level costs one head forward; expanding a node of score s adds about s/2 expected tokens (its best child's
# score: s x the head's usual confidence in a child), and a step that commits ~1.5 tokens pays for a level costing a
# share c of the step when s/2 >= 1.5 c. So a node is expanded only if its score is at least EXPAND_GAIN x (a
# level's seconds / a verify step's seconds), both measured as the drafter runs (docs/measurements.md).
EXPAND_GAIN = 3.0
# The most committed pairs a draft's catch-up feeds the head: further behind (a long prompt, or many steps the
# planner did not ask for a draft), its cache starts again from the last CATCH_UP_MAX. A 700-token prompt cost the
# first draft 53-76 ms on the real 0.5B, 8-10 with 128, and the head drafted as well (docs/measurements.md).
CATCH_UP_MAX = 128
SOURCE = "eagle"


class HeadVocabulary:
    """The tokens a head may draft (`ids`, [K]) and the target's LM-head rows for them, grown by the tokens seen in
    the context. On a block target the rows stay in its blocks (8 or 4 bits a weight, read by the kernels: the
    target's own logits on those tokens); otherwise they are the dense rows in the target's dtype. Block records
    hold 16 rows each, so tokens seen in the context wait in a small records set of their own, read beside the
    main one, until PENDING_MAX of them are folded in by one repacking (repacking the whole list for every new
    token cost more than a head forward). The rows are kept unpacked for those repackings, the head's own alone
    (each token's row read once from its group of the LM head: the whole head unpacked is 144 MB on the 0.5B)."""

    PENDING_MAX = 256

    def __init__(self, lm_head: Union[torch.Tensor, BlockLinear], ids: Optional[Sequence[int]],
                 bias: Optional[torch.Tensor] = None) -> None:
        """`lm_head`: dense rows [vocab, H] or the target's block layer; `ids`: the head's tokens (None: the whole
        vocabulary); `bias` [vocab], if the LM head has one."""
        import torch

        from .. import kernels
        from ..target_model.native.quant import BlockLinear

        if isinstance(lm_head, BlockLinear) and not kernels.available():
            lm_head = lm_head.weight.detach()  # no kernels to read the blocks: the dense rows
        self.lm_head = lm_head
        self.bias = bias
        if isinstance(lm_head, BlockLinear):
            self.on_blocks = True
            self.device, self.dtype = torch.device("cpu"), torch.float32
            self.vocab = lm_head.out_features
        else:
            self.on_blocks = False
            self.device, self.dtype = lm_head.device, lm_head.dtype
            self.vocab = int(lm_head.shape[0])
        self.main_ids = torch.tensor([], dtype=torch.long, device=self.device)  # [K0]: packed in `rows`
        self.rows = self._rows(self.main_ids)  # block records of K0 rows, or [K0, H] dense rows
        self.pending_ids = self.main_ids  # [P] (block targets): packed in `pending_rows`
        self.pending_rows = self.rows
        self.main_unpacked: Any = None  # (block targets) the rows of main_ids, unpacked (BlockLinear.unpacked_rows)
        self.pending_unpacked: Any = None  # and of pending_ids
        self.ids = self.main_ids  # [K] = main_ids then pending_ids: the logits' columns
        self.known: set[int] = set()
        self.extend(range(self.vocab) if ids is None else ids)

    def _rows(self, ids: torch.Tensor) -> torch.Tensor:
        from ..target_model.native.quant import BlockLinear

        lm_head = self.lm_head
        return lm_head.select_records(ids) if isinstance(lm_head, BlockLinear) else lm_head[ids]

    def extend(self, tokens: Sequence[int]) -> None:
        import torch

        new = sorted({int(token) for token in tokens if 0 <= int(token) < self.vocab} - self.known)
        if not new:
            return
        extra = torch.tensor(new, dtype=torch.long, device=self.device)
        self.known.update(new)
        if not self.on_blocks:
            self.main_ids = torch.cat([self.main_ids, extra])
            self.rows = torch.cat([self.rows, self._rows(extra)]).contiguous()
            self.ids = torch.cat([self.main_ids, self.pending_ids])
            return
        from ..target_model.native.quant import BlockLinear, join_rows

        lm_head = self.lm_head
        assert isinstance(lm_head, BlockLinear)
        unpacked = lm_head.unpacked_rows(extra)
        if len(self.pending_ids) + len(new) <= self.PENDING_MAX and len(self.main_ids):
            self.pending_ids = torch.cat([self.pending_ids, extra])
            parts = [part for part in (self.pending_unpacked, unpacked) if part is not None]
            self.pending_unpacked = join_rows(parts)
            self.pending_rows = lm_head.pack_rows(self.pending_unpacked)
        else:  # one repacking of the whole list
            self.main_ids = torch.cat([self.main_ids, self.pending_ids, extra])
            parts = [part for part in (self.main_unpacked, self.pending_unpacked, unpacked) if part is not None]
            self.main_unpacked, self.pending_unpacked = join_rows(parts), None
            self.rows = lm_head.pack_rows(self.main_unpacked)
            self.pending_ids = self.main_ids[:0]
        self.ids = torch.cat([self.main_ids, self.pending_ids])

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """features [rows, H] -> float32 logits [rows, K] over `ids`."""
        import torch

        from ..target_model.native.quant import BlockLinear

        bias = self.bias
        if isinstance(self.lm_head, BlockLinear):
            from .. import kernels

            rows = features.float()
            logits = kernels.matmul(rows, self.lm_head.kind, self.rows, len(self.main_ids))  # [rows, K0]
            if len(self.pending_ids):
                pending = kernels.matmul(rows, self.lm_head.kind, self.pending_rows, len(self.pending_ids))
                logits = torch.cat([logits, pending], dim=-1)  # [rows, K0 + P]
        else:
            logits = (features.to(self.dtype) @ self.rows.T).float()
        return logits if bias is None else logits + bias[self.ids].float()


class EagleDrafter:
    name = "eagle"
    needs = Needs(features=True)  # the target's hidden states on every event

    def __init__(self, head: Any, weights: TargetWeights, *, head_tokens: Optional[Sequence[int]] = None,
                 draft_max: Optional[int] = None, min_prob: float = 0.0, eos_token_ids: Sequence[int] = (),
                 tree_width: int = DEFAULT_TREE_WIDTH, feature_layers: Sequence[int] = (),
                 expand_gain: float = EXPAND_GAIN, ready: bool = False) -> None:
        """`head`: an EagleHead (eagle_head.py), or with `feature_layers` an EAGLE-3 head (eagle3_head.py: it reads
        those target layers' states through its `reduce`, and tokens through its own LM head); `weights`: the
        target's embeddings and LM head (never trained); `expand_gain` 0 grows trees whatever a level costs;
        `ready`: the head is already another EagleDrafter's `head` on this target (shared, read only)."""
        import torch

        from .. import kernels
        from ..target_model.native.quant import BlockLinear

        self.feature_layers = tuple(feature_layers)
        self.needs = Needs(features=True, feature_layers=self.feature_layers)
        if isinstance(weights.lm_head, BlockLinear) and kernels.available():
            # a block target: the head's layers on the same kernels, in float32
            from .eagle_head import head_on_blocks

            self.device, self.dtype = torch.device("cpu"), torch.float32
            self.head = head if ready else head_on_blocks(head.float()).eval()
        else:  # the target's dtype: a draft reads the head's weights once per forward, so bfloat16 halves it
            lm_head = weights.dense_lm_head()
            self.device, self.dtype = lm_head.device, lm_head.dtype
            self.head = head if ready else head.to(self.device, self.dtype).eval()
        if self.feature_layers:  # its own LM head over its draft vocabulary
            from .eagle3_head import OwnVocabulary

            self.vocabulary: Any = OwnVocabulary(self.head)
        else:  # the target's LM-head rows for the head's tokens (and the context's)
            self.vocabulary = HeadVocabulary(weights.lm_head, head_tokens or None, weights.lm_bias)
        self.weights = weights
        self.draft_max = draft_max or DEFAULT_TREE_DEPTH
        self.min_prob = min_prob
        self.eos = {int(token) for token in eos_token_ids}
        self.tree_width = tree_width
        self.expand_gain = expand_gain
        self.level_seconds: Optional[float] = None  # a tree level's head forward and read-out, decayed mean
        self.step_seconds: Optional[float] = None  # the target's verify forward, decayed mean
        self.reset()

    def reset(self) -> None:
        """Forget the conversation: its features and the head's cache (the next prefill brings new ones)."""

        from .eagle_head import HeadCache

        self.embedded: dict[int, torch.Tensor] = {}  # token -> its embedding [H] (the conversation's tokens)
        self.features: Optional[torch.Tensor] = None  # [committed - 1, H] in the target's dtype: a view of
        self._feature_rows: Optional[torch.Tensor] = None  # [capacity, H], doubled when full (no copy a step)
        self.cache = HeadCache()  # pairs (f_t, x_{t+1}) for cache_start <= t < cache_start + len(cache)
        self.cache_start = 0
        self.last: Optional[torch.Tensor] = None  # the head's prediction of the newest token's feature [H]

    # -- following the engine ------------------------------------------------------------------------------

    def observe(self, event: StepEvent) -> None:
        import torch

        if event.kind == "step" and event.verify_seconds > 0:
            self.step_seconds = decayed_mean(self.step_seconds, event.verify_seconds)
        if event.features is None:
            return
        features = event.features.detach().to(self.device, self.dtype)  # [rows, H] (EAGLE-3: [rows, 3H])
        if self.feature_layers:
            with torch.inference_mode():
                features = self.head.reduce(features)  # [rows, H]: its fc
        if event.kind == "prefill":
            self.reset()
            self._feature_rows, self.features = features, features
            self.vocabulary.extend(event.prompt_tokens)  # names, identifiers: the context's tokens
        elif self.features is not None and self._feature_rows is not None:
            length, rows = int(self.features.shape[0]), int(features.shape[0])
            if length + rows > self._feature_rows.shape[0]:
                grown = self._feature_rows.new_empty((2 * (length + rows), features.shape[1]))
                grown[:length] = self.features
                self._feature_rows = grown
            self._feature_rows[length : length + rows] = features
            self.features = self._feature_rows[: length + rows]
        self.vocabulary.extend(event.committed)

    # -- drafting ------------------------------------------------------------------------------------------

    def _embed(self, tokens: Sequence[int]) -> torch.Tensor:
        """The target's embeddings of `tokens` [1, n, H], each token's row looked up once per conversation (a GGUF's
        table is read and dequantised row by row: a lookup cost a fifth of a head forward)."""
        import torch

        missing = sorted({int(token) for token in tokens} - self.embedded.keys())
        if missing:
            ids = torch.tensor(missing, dtype=torch.long, device=self.device)  # [m]
            for token, row in zip(missing, self.weights.embed(ids).to(self.dtype)):  # [m, H]
                self.embedded[token] = row
        return torch.stack([self.embedded[int(token)] for token in tokens])[None]  # [1, n, H]

    def _top(self, features: torch.Tensor, count: int) -> list[tuple[list[int], list[float]]]:
        """Predicted features [rows, H] -> per row, the `count` likeliest drafted tokens and their probabilities
        (among the head's tokens), best first: one read of the LM-head rows for all of them."""
        import torch

        probs = torch.softmax(self.vocabulary.logits(features), dim=-1)  # [rows, K]
        top = torch.topk(probs, min(count, probs.shape[-1]), dim=-1)
        tokens = self.vocabulary.ids[top.indices].tolist()
        return list(zip(tokens, top.values.tolist()))

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        import torch

        with torch.inference_mode():
            return self._propose(context, budget)

    def _propose(self, context: Sequence[int], budget: int) -> Draft:
        import torch

        known = 0 if self.features is None else int(self.features.shape[0])
        longest = min(budget, self.draft_max)
        if longest <= 0 or self.features is None or known != len(context) - 1:
            return Draft.empty(SOURCE)  # (nothing asked for: the head's catch-up waits for the next draft)
        fed = self.cache_start + len(self.cache)
        if fed > known:  # (cannot happen: the cache only ever holds committed pairs)
            self.cache.crop(known - self.cache_start)
            fed = known
        if known - fed > CATCH_UP_MAX:  # far behind: the head's context starts again, CATCH_UP_MAX pairs back
            from .eagle_head import HeadCache

            self.cache, self.cache_start = HeadCache(), known - CATCH_UP_MAX
            fed = self.cache_start
        if fed < known:  # the pairs (f_t, x_{t+1}) the head has not seen: t = fed .. known - 1
            new = [int(token) for token in context[fed + 1 : known + 1]]
            check_token_ids(new, self.weights.vocab_size)
            positions = torch.arange(fed, known, device=self.device)
            predicted = self.head(self.features[None, fed:known], self._embed(new),
                                  positions, self.cache)[0, -1]  # [H]: the newest token's feature
            self.last = predicted
        elif self.last is not None:
            predicted = self.last
        else:
            return Draft.empty(SOURCE)
        draft = self._tree(predicted, known, budget) if self.tree_width > 0 else self._chain(predicted, known, longest)
        self.cache.crop(known - self.cache_start)  # drop the speculative pairs
        return draft

    def expand_floor(self) -> float:
        """The least score of a tree node worth a head forward to expand: `expand_gain` x a level's share of a
        verify step, once both are measured (before: `min_prob`), never above 0.9."""
        if self.level_seconds is None or not self.step_seconds:
            return self.min_prob
        return max(self.min_prob, min(0.9, self.expand_gain * self.level_seconds / self.step_seconds))

    def _chain(self, predicted: torch.Tensor, known: int, longest: int) -> Draft:
        import torch

        tokens: list[int] = []
        for index in range(longest):
            [([token], [prob])] = self._top(predicted[None], 1)
            if prob < self.min_prob and tokens:
                break
            tokens.append(token)
            if token in self.eos or index == longest - 1:
                break
            position = torch.tensor([known + index], device=self.device)
            predicted = self.head(predicted[None, None], self._embed([token]), position, self.cache)[0, -1]
        return Draft(tokens, SOURCE)

    def _tree(self, root_feature: torch.Tensor, known: int, budget: int) -> Draft:
        import torch

        tokens: list[int] = []  # per node, in creation order
        parents: list[int] = []  # -1 = the root (the newest committed token)
        scores: list[float] = []  # product of the head's probabilities along the path
        depth: list[int] = []
        cache_row: dict[int, int] = {}  # node -> its row in the head's cache (once expanded)

        def offer(parent: int, children: tuple[list[int], list[float]]) -> None:
            for token, prob in zip(*children):  # best first
                score = (scores[parent] if parent >= 0 else 1.0) * prob
                if score < self.min_prob:
                    break  # too unlikely to be worth a verify row, and so are its descendants
                tokens.append(token)
                parents.append(parent)
                scores.append(score)
                depth.append(depth[parent] + 1 if parent >= 0 else 1)

        offer(-1, self._top(root_feature[None], TREE_CHILDREN)[0])
        if not tokens:
            return Draft.empty(SOURCE)
        fed_features = {-1: root_feature}
        floor = self.expand_floor()
        for _ in range(self.draft_max - 1):
            frontier = sorted((node for node in range(len(tokens)) if node not in cache_row and scores[node] >= floor
                               and tokens[node] not in self.eos), key=lambda node: -scores[node])[: self.tree_width]
            if not frontier:
                break
            if sum(score > scores[frontier[0]] for score in scores) >= budget:
                break  # every node yet to come scores at most the best open node's: the chosen `budget` are known
            past = len(self.cache)
            rows = len(frontier)
            mask = torch.zeros(rows, past + rows, dtype=torch.bool, device=self.device)  # [rows, past + rows]
            mask[:, : known - self.cache_start] = True
            for row, node in enumerate(frontier):
                mask[row, past + row] = True
                ancestor = parents[node]
                while ancestor >= 0:
                    mask[row, cache_row[ancestor]] = True
                    ancestor = parents[ancestor]
            features = torch.stack([fed_features[parents[node]] for node in frontier])[None]  # [1, rows, H]
            positions = torch.tensor([known + depth[node] - 1 for node in frontier], device=self.device)
            started = time.perf_counter()
            out = self.head(features, self._embed([tokens[node] for node in frontier]), positions, self.cache,
                            mask)[0]  # [rows, H]
            offered = self._top(out, TREE_CHILDREN)
            self.level_seconds = decayed_mean(self.level_seconds, time.perf_counter() - started)
            for row, (node, children) in enumerate(zip(frontier, offered)):
                cache_row[node] = past + row
                fed_features[node] = out[row]
                offer(node, children)
        best = sorted(range(len(tokens)), key=lambda node: (-scores[node], depth[node]))[:budget]
        chosen: list[int] = []
        order: dict[int, int] = {}  # node -> its index in the draft
        for node in best:  # parents come first: a child never outscores its parent, ties go to the shallower
            if parents[node] < 0 or parents[node] in order:
                order[node] = len(chosen)
                chosen.append(node)
        return Draft([tokens[node] for node in chosen], SOURCE,
                     parents=[order[parents[node]] if parents[node] >= 0 else -1 for node in chosen])


def check_target(target: TargetInfo) -> TargetWeights:
    """A head reads the target's embeddings and plain linear LM head; refuse a target without them."""
    if target.weights is None:
        raise SpecdecError("the eagle drafter reads tokens through the target's LM head; this target has none "
                           "that is a plain linear map")
    return target.weights


def _head_dir(options: DrafterOptions) -> str:
    if not options.draft_model:
        raise SpecdecError("the eagle drafter needs a head directory (make one with `specdec distill train "
                           "--kind eagle`)", setting="draft_model")
    return options.draft_model


def make_eagle_drafter(options: DrafterOptions, target: TargetInfo, draft_max: Optional[int] = None) -> EagleDrafter:
    from .eagle3_head import is_eagle3_dir, load_eagle3
    from .eagle_head import check_head, load_head, share_head, shared_head

    head_dir = _head_dir(options)
    weights = check_target(target)
    if is_eagle3_dir(head_dir):  # a checkpoint in EAGLE-3's published layout
        eagle3, layers = load_eagle3(head_dir, target)
        return EagleDrafter(eagle3, weights, draft_max=draft_max, min_prob=options.draft_min_prob or MIN_PROB,
                            eos_token_ids=target.eos_token_ids, feature_layers=layers)
    shared = shared_head(head_dir, weights.lm_head)  # a live drafter's, on this target
    head, meta = (shared, check_head(head_dir, target)) if shared is not None else load_head(head_dir, target)
    drafter = EagleDrafter(head, weights, head_tokens=meta.get("head_tokens"), draft_max=draft_max,
                           min_prob=options.draft_min_prob or MIN_PROB, eos_token_ids=target.eos_token_ids,
                           ready=shared is not None)
    share_head(head_dir, weights.lm_head, drafter.head)
    return drafter


def check_eagle(options: DrafterOptions) -> None:
    """The head directory is an EAGLE head, specdec's or in EAGLE-3's layout (before the target loads)."""
    from .eagle3_head import is_eagle3_dir, read_eagle3_config
    from .eagle_head import read_head_meta

    head_dir = _head_dir(options)
    if is_eagle3_dir(head_dir):
        read_eagle3_config(head_dir)
    else:
        read_head_meta(head_dir)


SPEC = DrafterSpec(name="eagle", help="a draft head on the target's own hidden states (EAGLE-style; `specdec distill "
                   "train --kind eagle`)", build=make_eagle_drafter, options=("draft_model", "draft_min_prob"),
                   check=check_eagle, aux_rank=4, min_prob=MIN_PROB)
