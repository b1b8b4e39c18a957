"""One tree from every source: the drafts of several drafters merged into one token tree, every node ranked by
the acceptance its source has earned.

A hybrid (`sam` with an auxiliary) asks each of its sources for a draft every step: the automata's chain (the
longest match in the conversation, an index or the answer memory), and the auxiliary's chain or tree (prompt
lookup, ADED, Token Recycling, a feature head). `merge_drafts` lays them into one trie (a token that two sources
propose after the same path is one node), scores each node by the probability that the target accepts its whole
path, and lists the nodes best first, so that any prefix the engine's planner keeps is the best subtree of that
size. The score of a node is the largest over the sources that proposed it of

    score(parent) x P(accepted | parent accepted; its origin)

where a node's origin is (source, match-length bucket of a retrieval draft, depth, rank among its siblings in
its source's own draft), and `OriginAcceptance` learns that conditional from every verified step (decayed): a
one-token match that the target rarely follows ranks below Token Recycling's first guess, a long match ranks
above everything. Its estimate backs off from depth to the source: a depth with little evidence of its own is
presumed to fare as the same source and match bucket fared at every depth (itself starting from a fixed prior),
so the deep end of a long match is not ranked out, never verified and never learned about. The scores travel
with the draft (`Draft.confidence`): their sum over a prefix is the expected accepted path length of verifying
it, which is what the planner weighs against the cost curve.

An auxiliary whose drafting costs time (a head's forwards) is asked only while what it adds pays for it
(`DraftMerger.aux_pays`, decoding/ask_gate.py): when the accepted nodes only the auxiliary proposed, per step it
was asked, are a larger share of a step's tokens than its drafting is of the step's time (asked always at first,
now and then when it does not pay, and always when it is cheap).

Pure bookkeeping: nothing here drafts, verifies or times anything (the hybrid passes the seconds it measured).
The accept/reject rule never sees scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..decoding.ask_gate import AskGate
from ..decoding.draft import Draft, StepEvent

DECAY = 0.98  # older evidence fades, so the ranking follows the conversation
PRIOR_WEIGHT = 2.0  # the prior is worth this many observations
PRIOR_FIRST = 0.5  # a source's first choice after a path, before any evidence
PRIOR_OTHER = 0.15  # its later choices (siblings) after the same path
MAX_DEPTH = 12  # depths past this share one bucket
MAX_RANK = 3  # sibling ranks past this share one bucket
MAX_BUCKET = 6  # match lengths of 32 and more share one bucket


Origin = tuple[str, int, int, int]  # (source, match bucket, depth, rank)


def match_bucket(match_len: int) -> int:
    """0 (no match: a model, a table), 1, 2-3, 4-7, ... 32+: as the planner buckets chain drafts."""
    return 0 if match_len <= 0 else min(1 + int(math.log2(match_len)), MAX_BUCKET)


def any_depth(origin: Origin) -> tuple[str, int, int]:
    """The origin without its depth: (source, match bucket, rank), whose record backs off a depth's."""
    return origin[0], origin[1], origin[3]


@dataclass
class OriginAcceptance:
    """P(a node is accepted | its parent was), per origin: decayed counts, backing off to the origin at any depth,
    then to a fixed prior."""

    seen: dict = field(default_factory=dict)  # origin, or any_depth(origin) -> decayed verifications (parent kept)
    kept: dict = field(default_factory=dict)  # the same keys -> decayed acceptances

    def conditional(self, origin: Origin) -> float:
        prior = PRIOR_FIRST if origin[3] == 0 else PRIOR_OTHER
        for key in (any_depth(origin), origin):  # each level's estimate is the next one's prior
            prior = (self.kept.get(key, 0.0) + prior * PRIOR_WEIGHT) / (self.seen.get(key, 0.0) + PRIOR_WEIGHT)
        return prior

    def record(self, outcomes: Sequence[tuple[Origin, bool]]) -> None:
        """One step's verified nodes whose parents were accepted: (origin, accepted)."""
        if not outcomes:
            return
        for table in (self.seen, self.kept):
            for key in table:
                table[key] *= DECAY
        for origin, accepted in outcomes:
            for key in (origin, any_depth(origin)):
                self.seen[key] = self.seen.get(key, 0.0) + 1.0
                if accepted:
                    self.kept[key] = self.kept.get(key, 0.0) + 1.0


@dataclass(frozen=True)
class MergedDraft:
    draft: Draft  # the merged tree, best nodes first, with confidence
    origins: list[list[Origin]]  # per node of `draft`: every source's origin that proposed it


def node_origins(draft: Draft) -> list[Origin]:
    """Each node's origin in its own draft: its depth, and its rank among the siblings listed before it."""
    parents = draft.node_parents
    bucket = match_bucket(draft.match_len)
    depths: list[int] = []
    children: dict[int, int] = {}
    origins = []
    for parent in parents:
        depth = 1 if parent < 0 else depths[parent] + 1
        depths.append(depth)
        rank = children.get(parent, 0)
        children[parent] = rank + 1
        origins.append((draft.source, bucket, min(depth, MAX_DEPTH), min(rank, MAX_RANK)))
    return origins


def path_scores(parents: Sequence[int], origins: Sequence[Origin], learned: OriginAcceptance) -> list[float]:
    """Per node of a draft (its parents and node_origins), its path's score by its own source: the product of the
    learned conditionals along it."""
    scores: list[float] = []
    for parent, origin in zip(parents, origins):
        scores.append((1.0 if parent < 0 else scores[parent]) * learned.conditional(origin))
    return scores


def merge_drafts(drafts: Sequence[Draft], learned: OriginAcceptance, budget: int) -> MergedDraft:
    """The drafts as one trie of at most `budget` nodes, best first (parents always before their children)."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    depths: list[int] = []
    origins: list[list[Origin]] = []
    child_of: dict[tuple[int, int], int] = {}  # (trie parent, token) -> trie node
    sources: list[str] = []
    for draft in drafts:
        if not len(draft):
            continue
        sources.append(draft.source)
        draft_parents, draft_origins = draft.node_parents, node_origins(draft)
        trie_node: list[int] = []  # draft node -> trie node
        for token, parent, origin, score in zip(draft.tokens, draft_parents, draft_origins,
                                                path_scores(draft_parents, draft_origins, learned)):
            trie_parent = -1 if parent < 0 else trie_node[parent]
            node = child_of.get((trie_parent, int(token)))
            if node is None:
                node = len(tokens)
                child_of[(trie_parent, int(token))] = node
                tokens.append(int(token))
                parents.append(trie_parent)
                scores.append(score)
                depths.append(1 if trie_parent < 0 else depths[trie_parent] + 1)
                origins.append([origin])
            else:
                scores[node] = max(scores[node], score)
                origins[node].append(origin)
            trie_node.append(node)
    name = "+".join(dict.fromkeys(sources)) or (drafts[0].source if drafts else "merged")
    if not tokens or budget <= 0:
        return MergedDraft(Draft([], name, confidence=[]), [])
    # a child never scores above its parent (every factor is <= 1, and a node takes its best source's score), and
    # ties go to the shallower node: sorting keeps parents before children
    order = sorted(range(len(tokens)), key=lambda node: (-scores[node], depths[node], node))[:budget]
    position = {node: index for index, node in enumerate(order)}
    kept_parents: Optional[list[int]] = [-1 if parents[node] < 0 else position[parents[node]] for node in order]
    if kept_parents == list(range(-1, len(order) - 1)):
        kept_parents = None  # a chain: verified as one
    merged = Draft([tokens[node] for node in order], name, parents=kept_parents,
                   confidence=[scores[node] for node in order])
    return MergedDraft(merged, [origins[node] for node in order])


def best_score_of(source: str, learned: OriginAcceptance) -> float:
    """The most any node of `source` can score: a node's score is its parent's times a factor <= 1, so no node
    outscores the best first-level origin of its source (any match bucket, any sibling rank)."""
    return max(learned.conditional((source, bucket, 1, rank))
               for bucket in range(MAX_BUCKET + 1) for rank in range(MAX_RANK + 1))


def fills_budget(own: Draft, sources: Sequence[str], learned: OriginAcceptance, budget: int) -> bool:
    """Whether `own` alone has `budget` nodes that each score more than the best node any of `sources` could add:
    then merging their drafts would keep the same nodes (a shared node's score is the larger of its sources', so
    no node below the budget's last can climb past it), and an auxiliary whose drafting costs time (a head's
    forwards) need not be asked this step."""
    if not sources or len(own) < budget or budget <= 0:
        return False
    least = sorted(path_scores(own.node_parents, node_origins(own), learned), reverse=True)[budget - 1]
    return least > max(best_score_of(source, learned) for source in sources)


class DraftMerger:
    """A hybrid's memory of what it proposed and how each origin fared: `merge` each step, `observe` each event;
    and whether its auxiliary pays for its drafting (`aux_pays`; `cost_gate=False` always asks it)."""

    def __init__(self, cost_gate: bool = True) -> None:
        self.learned = OriginAcceptance()
        self._last: Optional[MergedDraft] = None
        self._asked = False  # the last merge had the auxiliary's draft
        self.aux_sources: list[str] = []  # the sources an auxiliary's drafts came from, as seen
        self.gate = AskGate(cost_gate)  # whether the auxiliary's drafting pays (gain: nodes only it proposed)

    def merge(self, drafts: Sequence[Draft], budget: int) -> Draft:
        """The drafts as one tree; drafts[0] is the hybrid's own, any others the auxiliary's (it was asked)."""
        for draft in drafts[1:]:
            if len(draft) and draft.source not in self.aux_sources:
                self.aux_sources.append(draft.source)
        self._asked = len(drafts) > 1
        self.gate.asked(self._asked)
        self._last = merge_drafts(drafts, self.learned, budget)
        return self._last.draft

    def timed_aux(self, seconds: float) -> None:
        """The auxiliary's drafting call took `seconds`."""
        self.gate.timed(seconds)

    def aux_pays(self) -> bool:
        """Whether to ask the auxiliary this step (ask_gate.py)."""
        return self.gate.pays()

    def needs_aux(self, own: Draft, budget: int) -> bool:
        """False when the own draft fills the budget with nodes no auxiliary node could outscore (fills_budget);
        True before any auxiliary draft was seen."""
        return not fills_budget(own, self.aux_sources, self.learned, budget)

    def observe(self, event: StepEvent) -> None:
        """Learn from the verified part of the last merged draft (a prefix of it, parents first), and what a step
        costs and commits."""
        last, self._last = self._last, None
        if event.kind != "step":
            return
        self.gate.stepped(event.verify_seconds, len(event.committed))
        verified = event.draft
        if last is None or not len(verified) or verified.tokens != last.draft.tokens[: len(verified)]:
            return
        parents = verified.node_parents
        accepted = set(event.accepted_path)
        outcomes = [(origin, node in accepted)
                    for node, parent in enumerate(parents) if parent < 0 or parent in accepted
                    for origin in last.origins[node]]
        self.learned.record(outcomes)
        if self._asked:  # what only the auxiliary proposed and the target kept
            self.gate.gained(sum(all(origin[0] in self.aux_sources for origin in last.origins[node])
                                 for node in accepted))
