"""ADED (`aded`, Liu et al. 2024): an adaptive tri-gram table searched with PUCT Monte-Carlo tree search.

The table maps a token pair (a, b) to scored successors c. Built from a corpus (`build_trigram_table`: the
tokens of a static index, documents separated by EOS) a score is P(c | a, b) = count(a, b, c) / count(a, b),
top 12 successors per pair; without a corpus the table starts empty and learns from the conversation alone.
Adaptation, before each draft: every trigram inside the last 16 committed tokens gets +0.04 (created at 0.04
when new), capped at 3.0, never renormalised. It runs when a step's event arrives, so steps drafted by
another source (ADED as the hybrid `sam` drafter's auxiliary) adapt the table too. A prompt (the new part
of a conversation) is adapted at the prefill as if it had been committed one token at a time: each trigram
occurrence gets the 14 boosts of the windows it would have sat in. The table lives as long as the drafter
(a chat session).

Search (from the root state (previous token, newest token)): iterations of select -> rollout -> backup over
states up to depth 4. Selection takes a node's first unvisited child (children sorted by score), else the
child maximising the PUCT score

    W/N + (c1 + ln((N_parent + c2 + 1) / c2)) * prior * sqrt(N_parent) / (1 + N),   c1 = 32, c2 = 8,

with prior = score / (sum of the row's top-12 scores). From the first unvisited node the rollout samples
successors proportionally to their scores down to depth 4; the rollout's nodes join the tree, so every
iteration backs up a full-depth path. Reward = 1 + the sum of the scores along the path. The paper runs 150
iterations in compiled code; here the loop stops at 150 or when `time_budget` seconds have passed, whichever
comes first (the default's reason: docs/measurements.md, "ADED's time budget").

Output: the 24 most visited paths (the visited nodes without a visited child, by visits), each extended by
one greedy trigram token, merged into a trie of at most 64 nodes, emitted breadth first with the more visited
children first (a node weighs the visits of the paths through it). When the budget is smaller than the trie
the `budget` heaviest nodes (an ancestor-closed set) are kept.
"""

from __future__ import annotations

import math
import random
import time
from bisect import bisect_right
from typing import TYPE_CHECKING, Optional, Sequence

from ..decoding.draft import NOTHING, Draft, StepEvent
from .sam import check_index, load_index_for_target
from .spec import DrafterOptions, DrafterSpec, draft_length
from .target import TargetInfo
from .token_ids import check_token_ids

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

TOP_SUCCESSORS = 12
WINDOW = 16  # adaptation window (committed tokens)
BOOST = 0.04
CAP = 3.0
C1, C2 = 32.0, 8.0
DEPTH = 4  # search depth (states below the root)
ITERATIONS = 150
TIME_BUDGET = 0.002  # seconds of search per draft, a small share of a target step (docs/measurements.md)
VIEW_CACHE = 50_000  # sorted rows kept for the search; the cache starts over beyond this
PATHS = 24
MAX_NODES = 64
EMPTY_VIEW: tuple = ((), (), (), ())


def pair_key(a: int, b: int) -> int:
    return (int(a) << 32) | int(b)


class TrigramTable:
    """Scored successors per token pair: a static part (sorted arrays from a corpus) under live rows.

    A pair's row becomes a live dict {successor: score} the first time it is adapted (copied from the static
    part); reads go through a cache of sorted top-12 views, dropped for a pair whenever it is adapted.
    """

    def __init__(self, keys: Optional[np.ndarray] = None, offsets: Optional[np.ndarray] = None,
                 successors: Optional[np.ndarray] = None, scores: Optional[np.ndarray] = None):
        import numpy as np

        self.keys = np.zeros(0, np.int64) if keys is None else keys  # [P] sorted pair keys
        self.offsets = np.zeros(1, np.int64) if offsets is None else offsets  # [P+1]
        self.successors = np.zeros(0, np.int64) if successors is None else successors  # [T], per pair by score
        self.scores = np.zeros(0, np.float64) if scores is None else scores  # [T]
        self.live: dict[int, dict[int, float]] = {}
        self._views: dict[int, tuple] = {}

    @property
    def static_pairs(self) -> int:
        return len(self.keys)

    def _static_row(self, key: int) -> dict[int, float]:
        import numpy as np

        at = int(np.searchsorted(self.keys, key))
        if at < len(self.keys) and int(self.keys[at]) == key:
            begin, end = int(self.offsets[at]), int(self.offsets[at + 1])
            return dict(zip(self.successors[begin:end].tolist(), self.scores[begin:end].tolist()))
        return {}

    def row(self, a: int, b: int) -> dict[int, float]:
        """The current successors of (a, b) with their scores (a copy)."""
        key = pair_key(a, b)
        return dict(self.live[key]) if key in self.live else self._static_row(key)

    def view(self, a: int, b: int) -> tuple:
        """(tokens, scores, cumulative scores, priors) of the top-12 successors of (a, b), best first."""
        key = pair_key(a, b)
        cached = self._views.get(key)
        if cached is not None:
            return cached
        if len(self._views) >= VIEW_CACHE:
            self._views.clear()
        row = self.live[key] if key in self.live else self._static_row(key)
        if not row:
            self._views[key] = EMPTY_VIEW
            return EMPTY_VIEW
        best = sorted(row.items(), key=lambda item: (-item[1], item[0]))[:TOP_SUCCESSORS]
        tokens = tuple(token for token, _ in best)
        scores = tuple(score for _, score in best)
        total = sum(scores)
        cumulative, running = [], 0.0
        for score in scores:
            running += score
            cumulative.append(running)
        priors = tuple(score / total for score in scores) if total > 0 else tuple(1.0 / len(scores) for _ in scores)
        view = (tokens, scores, tuple(cumulative), priors)
        self._views[key] = view
        return view

    def adapt(self, a: int, b: int, c: int, amount: float = BOOST) -> None:
        """Add `amount` to the score of (a, b) -> c (created at `amount` when new), capped at 3.0."""
        key = pair_key(a, b)
        row = self.live.get(key)
        if row is None:
            row = self.live[key] = self._static_row(key)
        c = int(c)
        row[c] = min(CAP, row.get(c, 0.0) + amount)
        self._views.pop(key, None)

    def adapt_window(self, tokens: Sequence[int]) -> None:
        """+0.04 for every trigram inside `tokens` (each occurrence counts)."""
        tokens = [int(token) for token in tokens]
        for a, b, c in zip(tokens, tokens[1:], tokens[2:]):
            self.adapt(a, b, c)


def build_trigram_table(tokens: np.ndarray, eos_id: Optional[int] = None, top: int = TOP_SUCCESSORS) -> TrigramTable:
    """Tri-gram table from a token corpus: scores count(a, b, c) / count(a, b), the top `top` successors per
    pair (ties: smaller token id first). Trigrams that contain `eos_id` (document separators) are skipped."""
    import numpy as np

    tokens = np.asarray(tokens, dtype=np.int64).ravel()
    if len(tokens) < 3:
        return TrigramTable()
    a, b, c = tokens[:-2], tokens[1:-1], tokens[2:]
    if eos_id is not None and eos_id >= 0:
        ok = (a != eos_id) & (b != eos_id) & (c != eos_id)
        a, b, c = a[ok], b[ok], c[ok]
    if not len(a):
        return TrigramTable()
    pairs = (a << 32) | b  # [m]
    order = np.lexsort((c, pairs))
    pairs, c = pairs[order], c[order]
    new_trigram = np.ones(len(pairs), dtype=bool)
    new_trigram[1:] = (pairs[1:] != pairs[:-1]) | (c[1:] != c[:-1])
    starts = np.flatnonzero(new_trigram)
    tri_pairs, tri_next = pairs[starts], c[starts]  # unique trigrams, sorted by (pair, successor)
    tri_count = np.diff(np.append(starts, len(pairs)))  # [u]
    new_pair = np.ones(len(tri_pairs), dtype=bool)
    new_pair[1:] = tri_pairs[1:] != tri_pairs[:-1]
    pair_group = np.cumsum(new_pair) - 1  # [u] pair index per trigram
    pair_total = np.bincount(pair_group, weights=tri_count)  # [P] count(a, b)
    # within each pair: by count descending, then successor ascending
    order = np.lexsort((tri_next, -tri_count, pair_group))
    tri_pairs, tri_next, tri_count, pair_group = tri_pairs[order], tri_next[order], tri_count[order], pair_group[order]
    group_start = np.flatnonzero(np.r_[True, pair_group[1:] != pair_group[:-1]])  # [P]
    rank = np.arange(len(pair_group)) - group_start[pair_group]
    keep = rank < top
    tri_pairs, tri_next, tri_count, pair_group = tri_pairs[keep], tri_next[keep], tri_count[keep], pair_group[keep]
    keys = tri_pairs[np.r_[True, pair_group[1:] != pair_group[:-1]]]
    offsets = np.r_[0, np.cumsum(np.bincount(pair_group, minlength=len(pair_total)))].astype(np.int64)
    scores = tri_count / pair_total[pair_group]
    return TrigramTable(keys, offsets, tri_next, scores.astype(np.float64))


# ---------------------------------------------------------------------------------------------- search


def puct_score(visits: int, value: float, prior: float, parent_visits: int, c1: float = C1, c2: float = C2) -> float:
    """W/N + (c1 + ln((N_parent + c2 + 1) / c2)) * prior * sqrt(N_parent) / (1 + N), for a visited child."""
    explore = (c1 + math.log((parent_visits + c2 + 1) / c2)) * prior * math.sqrt(parent_visits) / (1 + visits)
    return value / visits + explore


def select_child(children: Sequence[int], visits: Sequence[int], values: Sequence[float], priors: Sequence[float],
                 parent_visits: int, c1: float = C1, c2: float = C2) -> int:
    """The child to descend into: the first unvisited one (children are sorted best first), else max PUCT."""
    for child in children:
        if visits[child] == 0:
            return child
    weight = (c1 + math.log((parent_visits + c2 + 1) / c2)) * math.sqrt(parent_visits)
    best, best_score = children[0], -math.inf
    for child in children:
        n = visits[child]
        score = values[child] / n + weight * priors[child] / (1 + n)
        if score > best_score:
            best, best_score = child, score
    return best


class SearchTree:
    """Flat node arrays of one search; node 0 is the root state (a, b)."""

    def __init__(self, a: int, b: int):
        self.token = [int(b)]
        self.before = [int(a)]  # the token before this node's (its state is (before, token))
        self.parent = [-1]
        self.depth = [0]
        self.visits = [0]
        self.value = [0.0]
        self.prior = [1.0]
        self.score = [0.0]
        self.children: list[Optional[list[int]]] = [None]

    def expand(self, node: int, table: TrigramTable) -> list[int]:
        tokens, scores, _, priors = table.view(self.before[node], self.token[node])
        first = len(self.token)
        count = len(tokens)
        self.token.extend(tokens)
        self.before.extend([self.token[node]] * count)
        self.parent.extend([node] * count)
        self.depth.extend([self.depth[node] + 1] * count)
        self.visits.extend([0] * count)
        self.value.extend([0.0] * count)
        self.prior.extend(priors)
        self.score.extend(scores)
        self.children.extend([None] * count)
        kids = list(range(first, first + count))
        self.children[node] = kids
        return kids

    def path_tokens(self, node: int) -> list[int]:
        tokens = []
        while node > 0:
            tokens.append(self.token[node])
            node = self.parent[node]
        return tokens[::-1]


def run_search(table: TrigramTable, a: int, b: int, *, depth: int = DEPTH, iterations: int = ITERATIONS,
               time_budget: Optional[float] = TIME_BUDGET, rng: Optional[random.Random] = None,
               c1: float = C1, c2: float = C2) -> tuple[SearchTree, int]:
    """PUCT MCTS from state (a, b); returns the tree and the number of iterations run."""
    rng = rng or random.Random(0)
    tree = SearchTree(a, b)
    visits, value, children = tree.visits, tree.value, tree.children
    node_depth, score = tree.depth, tree.score
    deadline = None if time_budget is None else time.perf_counter() + time_budget
    done = 0
    while done < iterations:
        if deadline is not None and done and time.perf_counter() > deadline:
            break
        node, path, reward = 0, [0], 1.0
        while node_depth[node] < depth:  # selection (and expansion, and the rollout joining the tree)
            kids = children[node]
            if kids is None:
                kids = tree.expand(node, table)
            if not kids:
                break
            if visits[node] == 0 and node != 0:
                # rollout: below a new node, sample successors proportionally to their scores
                _, _, cumulative, _ = table.view(tree.before[node], tree.token[node])
                pick = bisect_right(cumulative, rng.random() * cumulative[-1])
                node = kids[min(pick, len(kids) - 1)]
            else:
                node = select_child(kids, visits, value, tree.prior, visits[node], c1, c2)
            path.append(node)
            reward += score[node]
        for visited in path:  # backup
            visits[visited] += 1
            value[visited] += reward
        done += 1
        if len(path) == 1:  # the root has no successors: nothing to search
            break
    return tree, done


def best_paths(tree: SearchTree, table: TrigramTable, paths: int = PATHS) -> tuple[list[list[int]], list[int]]:
    """The `paths` most visited paths (to visited nodes without a visited child; ties: higher path prior),
    each extended by one greedy trigram token, best first; and their visit counts."""
    has_visited_child = [False] * len(tree.token)
    for node in range(1, len(tree.token)):
        if tree.visits[node] > 0:
            has_visited_child[tree.parent[node]] = True
    path_prior = [1.0] * len(tree.token)
    for node in range(1, len(tree.token)):
        path_prior[node] = path_prior[tree.parent[node]] * tree.prior[node]
    leaves = [node for node in range(1, len(tree.token)) if tree.visits[node] > 0 and not has_visited_child[node]]
    leaves.sort(key=lambda node: (-tree.visits[node], -path_prior[node], node))
    result, visits = [], []
    for leaf in leaves[:paths]:
        tokens = tree.path_tokens(leaf)
        successors = table.view(tree.before[leaf], tree.token[leaf])[0]
        if successors:
            tokens.append(successors[0])
        result.append(tokens)
        visits.append(tree.visits[leaf])
    return result, visits


def merge_paths(paths: Sequence[Sequence[int]], max_nodes: int = MAX_NODES,
                path_weights: Optional[Sequence[float]] = None) -> tuple[list[int], list[int], list[float]]:
    """Merge token paths (best first) into a trie of at most `max_nodes` nodes, emitted breadth first.

    Returns (tokens, parents, weights) with parents[i] < i (-1 = root). A node's weight is the summed weight
    of the paths through it (each path weighs 1 by default); children are ordered by weight, ties by the
    earlier path. A path that does not fit is cut where the trie is full.
    """
    trie_token: list[int] = []
    trie_parent: list[int] = []
    trie_weight: list[float] = []
    trie_first: list[int] = []
    lookup: dict[tuple[int, int], int] = {}
    for rank, path in enumerate(paths):
        parent = -1
        for token in path:
            node = lookup.get((parent, int(token)))
            if node is None:
                if len(trie_token) >= max_nodes:
                    break
                node = len(trie_token)
                lookup[(parent, int(token))] = node
                trie_token.append(int(token))
                trie_parent.append(parent)
                trie_weight.append(0.0)
                trie_first.append(rank)
            trie_weight[node] += 1 if path_weights is None else path_weights[rank]
            parent = node
    kids: dict[int, list[int]] = {}
    for node, parent in enumerate(trie_parent):
        kids.setdefault(parent, []).append(node)
    order: list[int] = []
    new_index, head = {-1: -1}, [-1]
    while head:  # breadth first, better children first
        level = []
        for parent in head:
            level.extend(sorted(kids.get(parent, []), key=lambda node: (-trie_weight[node], trie_first[node])))
        for node in level:
            new_index[node] = len(order)
            order.append(node)
        head = level
    tokens = [trie_token[node] for node in order]
    parents = [new_index[trie_parent[node]] for node in order]
    weights = [trie_weight[node] for node in order]
    return tokens, parents, weights


class AdedDrafter:
    name = "aded"
    needs = NOTHING

    def __init__(self, table: Optional[TrigramTable] = None, *, draft_max: int = MAX_NODES,
                 time_budget: Optional[float] = TIME_BUDGET, iterations: int = ITERATIONS, seed: int = 0,
                 vocab_size: int = 0):
        self.vocab_size = vocab_size  # ids at or above it are refused (0: not known; negative ones always are)
        self.table = table if table is not None else TrigramTable()
        self.draft_max = draft_max
        self.time_budget = time_budget
        self.iterations = iterations
        self.rng = random.Random(seed)
        self.seen: list[int] = []  # the conversation so far (to adapt only new prompt text)
        self.last_iterations = 0

    def reset(self) -> None:
        """Forget the conversation (the next prompt is learned whole); the tri-gram table stays."""
        self.seen = []

    def observe(self, event: StepEvent) -> None:
        check_token_ids(event.committed, self.vocab_size, "committed tokens")
        if event.kind == "prefill":
            prompt = [int(token) for token in event.prompt_tokens]
            check_token_ids(prompt, self.vocab_size, "prompt")
            seen = self.seen
            if len(prompt) >= len(seen) and prompt[: len(seen)] == seen:
                new_from = max(0, len(seen) - 2)  # trigrams that end in the new text
            else:
                new_from = 0
            self.learn_text(prompt[new_from:])
            self.seen = prompt + [int(token) for token in event.committed]
            return
        self.seen.extend(int(token) for token in event.committed)
        # adapt before the next draft (here, so that steps drafted by another source count too)
        self.table.adapt_window(self.seen[-WINDOW:])

    def learn_text(self, tokens: Sequence[int]) -> None:
        """Adapt as if `tokens` were committed one at a time: each trigram gets the boosts of every window."""
        per_occurrence = BOOST * (WINDOW - 2)
        tokens = [int(token) for token in tokens]
        for a, b, c in zip(tokens, tokens[1:], tokens[2:]):
            self.table.adapt(a, b, c, per_occurrence)

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        budget = min(budget, self.draft_max)
        window = [int(token) for token in context[-WINDOW:]]
        check_token_ids(window, self.vocab_size)  # the tokens it reads: the window (and the last two of it)
        if window != self.seen[-WINDOW:]:  # called without the events: adapt from the context itself
            self.seen = [int(token) for token in context]
            self.table.adapt_window(window)
        if budget <= 0 or len(context) < 2:
            return Draft.empty(self.name)
        tree, self.last_iterations = run_search(self.table, int(context[-2]), int(context[-1]),
                                                iterations=self.iterations, time_budget=self.time_budget,
                                                rng=self.rng)
        paths, visits = best_paths(tree, self.table)
        if not paths:
            return Draft.empty(self.name)
        tokens, parents, weights = merge_paths(paths, MAX_NODES, visits)
        tokens, parents = keep_best(tokens, parents, weights, budget)
        return Draft(tokens, self.name, parents=parents)


def keep_best(tokens: Sequence[int], parents: Sequence[int], weights: Sequence[float],
              budget: int) -> tuple[list[int], list[int]]:
    """The `budget` nodes of highest weight, heaviest first, parents renumbered. Weights never grow along a
    path and ties go to the earlier node, so parents still precede children and every prefix is the best
    subtree of its size (the engine may keep only a prefix)."""
    keep = sorted(range(len(tokens)), key=lambda node: (-weights[node], node))[:budget]
    new_index = {-1: -1}
    for position, node in enumerate(keep):
        new_index[node] = position
    return [tokens[node] for node in keep], [new_index[parents[node]] for node in keep]


def make_aded_drafter(options: DrafterOptions, target: TargetInfo, draft_max: Optional[int] = None) -> AdedDrafter:
    """The `aded` drafter for `make_drafter`: with `options.index` the tri-gram table is built from the index's
    corpus tokens (checked against the target's tokenizer like the `sam` drafter's index), else it starts
    empty and learns from the conversation. `options.aded_time_budget` (seconds) overrides the per-draft search
    time."""
    import numpy as np

    table = None
    if options.index:
        index = load_index_for_target(options.index, target)
        table = build_trigram_table(np.asarray(index.automaton.text), index.eos_id)
    time_budget = TIME_BUDGET if options.aded_time_budget is None else float(options.aded_time_budget)
    return AdedDrafter(table, draft_max=min(draft_length(draft_max), MAX_NODES), time_budget=time_budget,
                       vocab_size=target.vocab_size)


SPEC = DrafterSpec(name="aded", help="ADED: an adaptive tri-gram table searched with PUCT into a token tree",
                   build=make_aded_drafter, options=("index", "aded_time_budget"), check=check_index, aux_rank=2)
