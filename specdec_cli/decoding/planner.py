"""Cost-aware planning: how much of each draft to verify, and in one forward of how many rows.

Verifying k drafted tokens costs one target forward over k+1 rows, t(k+1). A step commits
1 + sum over i <= k of P(first i drafts accepted) tokens, so the best k maximises

    expected_tokens(k) / cost(k+1)

and k = 0 (plain decoding) wins whenever the draft is unlikely to be right. The curve t is measured, never
assumed, and it need not be monotone: a forward of more rows can cost less than one of fewer (docs/methods.md,
section 7, has measured curves). Hence:

- `CostCurve` (cost_curve.py) holds t(rows), learned from a measured or stored prior and every step's own
  timing. Verifying *at least* n rows costs min over m >= n of t(m): where a bigger forward is cheaper, the
  block is filled up to it with more of the draft, or with padding rows whose outputs and cache entries are
  dropped. Every COST_PROBE_EVERY-th drafting step may time a row count that has gone stale.
- `AcceptanceTracker` keeps, per draft source and match-length bucket, the conditional acceptance at each
  draft position (chains) and the accepted path length per node count (trees), with a decaying memory.
- `DraftCosts` charges a chain drafter's own seconds per drafted token (a draft model).
- `ConfidenceCalibration` is for drafts that carry their own per-node estimates (`Draft.confidence`: a merged
  tree's, drafters/merge.py): per source, the decayed ratio of accepted tokens to what the estimates promised,
  which scales them before planning (`choose_prefix`: the prefix with the best expected tokens per second).
- `SourceRates` is the safety net: per source, the realised tokens per second of the steps that verified its
  drafts against plain decoding's 1 / t(1); a source that loses is benched (probed now and then).
- `DraftPlanner` puts them together for the engine (and for benchmarks/replay_drafters.py). For a drafter whose
  drafts have a fixed planning key (a draft model, a feature head: no match length) it decides before drafting
  (`draft_budget`), so that drafting which would be trimmed away is never done: the one place where drafting
  stops when it does not pay (drafters do not back off on their own).

Nothing here touches the accept/reject rule: planning changes what is verified, never what is committed.
This module does not run the model or time anything itself: the engine reports each step's seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

from .ask_gate import SourceGates
from .cost_curve import CostCurve

if TYPE_CHECKING:  # pragma: no cover
    from .draft import Draft

COST_PROBE_EVERY = 8  # every 8th drafting step may run a row count whose timing has gone stale
PRIOR_ACCEPT = 0.5  # before any evidence a draft position is a coin flip
PRIOR_WEIGHT = 2.0  # worth this many observations
DECAY = 0.97  # older acceptance evidence fades, so the tracker follows a conversation that turns repetitive
PROBE_EVERY = 16  # a source trimmed to nothing, or benched, still verifies a draft this often
RATE_DECAY = 0.9  # a source's realised speed follows its last ~10 verified steps
RATE_MIN_STEPS = 4.0  # evidence needed before benching a source
RATE_MARGIN = 0.02  # bench a source whose steps run more than 2% slower than plain decoding
TREE_PRIOR_PER_DOUBLING = 0.35  # untried tree sizes look this good: small trees get tried, big ones must earn it


def expected_tokens(conditional_accept: Sequence[float], length: int) -> float:
    """Committed tokens per step with a draft of `length`: 1 + sum_i prod_{j<=i} accept_j."""
    total, survive = 1.0, 1.0
    for position in range(length):
        survive *= conditional_accept[position]
        total += survive
    return total


def choose_length(conditional_accept: Sequence[float], cost: Callable[[int], float], longest: int) -> int:
    """The draft length in 0..longest that maximises expected committed tokens per second.

    `cost(rows)` is the price of a forward that verifies rows - 1 drafted tokens.
    """
    best_length, best_rate = 0, 1.0 / cost(1)
    for length in range(1, longest + 1):
        rate = expected_tokens(conditional_accept, length) / cost(length + 1)
        if rate > best_rate:
            best_length, best_rate = length, rate
    return best_length


def choose_prefix(confidence: Sequence[float], cost: Callable[[int], float], longest: int) -> int:
    """The node count in 0..longest whose prefix maximises expected committed tokens per second, where node i is
    on the accepted path with probability confidence[i] (so a prefix commits 1 + their sum, on average)."""
    best_nodes, best_rate, expected = 0, 1.0 / cost(1), 1.0
    for nodes in range(1, min(longest, len(confidence)) + 1):
        expected += confidence[nodes - 1]
        rate = expected / cost(nodes + 1)
        if rate > best_rate:
            best_nodes, best_rate = nodes, rate
    return best_nodes


@dataclass
class ConfidenceCalibration:
    """Per source of drafts with confidence: decayed (accepted tokens, promised tokens) over verified steps."""

    totals: dict = field(default_factory=dict)

    def scale(self, source: str) -> float:
        accepted, promised = self.totals.get(source, (0.0, 0.0))
        return (accepted + PRIOR_WEIGHT) / (promised + PRIOR_WEIGHT)  # no evidence: 1, the estimates as given

    def calibrated(self, source: str, confidence: Sequence[float]) -> list[float]:
        scale = self.scale(source)
        return [min(1.0, value * scale) for value in confidence]

    def record(self, source: str, confidence: Sequence[float], accepted: int) -> None:
        accepted_sum, promised = self.totals.get(source, (0.0, 0.0))
        self.totals[source] = (accepted_sum * DECAY + accepted, promised * DECAY + sum(confidence))


# ---------------------------------------------------------------------------------------- drafting costs


@dataclass
class DraftCosts:
    """Seconds a source spends drafting per drafted token (decayed mean), so that a chain drafter with a real
    cost, a draft model, is planned with it: verifying k of its tokens is charged the forward plus k drafted
    tokens. Retrieval drafters cost microseconds; tree searches are not charged (their cost does not grow
    with the part of the tree that is verified)."""

    per_token: dict = field(default_factory=dict)  # source -> seconds per drafted token

    def observe(self, source: str, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds >= 0:
            sample = seconds / tokens
            old = self.per_token.get(source)
            self.per_token[source] = sample if old is None else 0.8 * old + 0.2 * sample

    def charged(self, cost: Callable[[int], float], source: str) -> Callable[[int], float]:
        """rows -> seconds of a step that verifies rows - 1 drafted tokens of `source`."""
        per_token = self.per_token.get(source, 0.0)
        return lambda rows: cost(rows) + per_token * max(0, rows - 1)


# ------------------------------------------------------------------------------------- acceptance memory


@dataclass
class AcceptanceTracker:
    """Per (source, match-length bucket): decayed counts of drafted and accepted tokens at each position."""

    drafted: dict = field(default_factory=dict)  # key -> [weight at position i]
    accepted: dict = field(default_factory=dict)
    idle_steps: dict = field(default_factory=dict)  # key -> steps since this key last drafted anything
    tree_stats: dict = field(default_factory=dict)  # (source, node bucket) -> (decayed accepted sum, weight)

    @staticmethod
    def key(source: str, match_len: int) -> tuple[str, int]:
        bucket = 0 if match_len <= 0 else min(1 + int(math.log2(match_len)), 6)  # 0, 1, 2-3, 4-7, ... 32+
        return source, bucket

    def conditional(self, key: tuple[str, int], length: int) -> list[float]:
        """P(draft i accepted | drafts before it accepted), for i < length, with the prior mixed in."""
        drafted = self.drafted.get(key, [])
        accepted = self.accepted.get(key, [])
        rates = []
        for position in range(length):
            seen = drafted[position] if position < len(drafted) else 0.0
            kept = accepted[position] if position < len(accepted) else 0.0
            rates.append((kept + PRIOR_ACCEPT * PRIOR_WEIGHT) / (seen + PRIOR_WEIGHT))
        return rates

    def record(self, key: tuple[str, int], drafted: int, accepted: int) -> None:
        """A step verified `drafted` tokens of this key and accepted the first `accepted` of them."""
        rows_drafted = self.drafted.setdefault(key, [])
        rows_accepted = self.accepted.setdefault(key, [])
        for rows in (rows_drafted, rows_accepted):
            for position in range(len(rows)):
                rows[position] *= DECAY
            while len(rows) < drafted:
                rows.append(0.0)
        # position i was "tried" only if every draft before it was accepted
        for position in range(min(drafted, accepted + 1)):
            rows_drafted[position] += 1.0
            if position < accepted:
                rows_accepted[position] += 1.0

    def plan(self, key: tuple[str, int], cost: Callable[[int], float], longest: int) -> int:
        """How many tokens of a `longest`-token chain draft of this key to verify."""
        if longest <= 0:
            return 0
        length = choose_length(self.conditional(key, longest), cost, longest)
        return self.probe_if_idle(key, length)

    def probe_if_idle(self, key: object, planned: int) -> int:
        """`planned`, or now and then 1 where `key` would verify nothing for long (so its record keeps learning)."""
        if planned:
            self.idle_steps[key] = 0
            return planned
        idle = self.idle_steps[key] = self.idle_steps.get(key, 0) + 1
        return 1 if idle % PROBE_EVERY == 0 else 0  # keep learning about a source that looks useless

    # -- trees: a bandit over node counts ------------------------------------------------------------------
    # A tree's nodes come best first, so keeping m nodes keeps the best m-node subtree. Its payoff is
    # learned per source and node-count bucket as the decayed mean accepted path length.

    def tree_estimate(self, source: str, nodes: int) -> float:
        """Expected accepted path length when verifying `nodes` nodes of this source's trees."""
        bucket = tree_bucket(nodes)
        total, weight = self.tree_stats.get((source, bucket), (0.0, 0.0))
        prior = TREE_PRIOR_PER_DOUBLING * math.log2(bucket + 1)
        return (total + prior * PRIOR_WEIGHT) / (weight + PRIOR_WEIGHT)

    def plan_tree(self, source: str, cost: Callable[[int], float], longest: int) -> int:
        """The node count (a power of two, or all of a smaller tree) with the best expected tokens/s."""
        best_nodes, best_rate = 0, 1.0 / cost(1)
        for nodes in tree_sizes(longest):
            rate = (1.0 + self.tree_estimate(source, nodes)) / cost(nodes + 1)
            if rate > best_rate:
                best_nodes, best_rate = nodes, rate
        return self.probe_if_idle(source, best_nodes)

    def record_tree(self, source: str, nodes: int, accepted: int) -> None:
        """A tree of `nodes` verified nodes got a path of `accepted` tokens accepted (older evidence fades)."""
        key = (source, tree_bucket(nodes))
        total, weight = self.tree_stats.get(key, (0.0, 0.0))
        self.tree_stats[key] = (total * DECAY + accepted, weight * DECAY + 1.0)


def tree_bucket(nodes: int) -> int:
    """Node counts are grouped by the power of two at or below them: 1, 2, 4, 8, ..."""
    return 1 << (max(1, nodes).bit_length() - 1)


def tree_sizes(longest: int) -> list[int]:
    """Candidate node counts: powers of two up to `longest`, and `longest` itself."""
    sizes, nodes = [], 1
    while nodes < longest:
        sizes.append(nodes)
        nodes *= 2
    return sizes + [longest] if longest > 0 else sizes


# ------------------------------------------------------------------------------ never slower than plain


@dataclass
class SourceRates:
    """Per draft source, the realised speed of the steps that verified its drafts (decayed sums of committed
    tokens and of seconds, drafting included), against the realised speed of plain steps (one row, nothing
    drafted) in the same session: means against means, so timing noise weighs on both sides alike."""

    tokens: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    weight: dict = field(default_factory=dict)
    benched_steps: dict = field(default_factory=dict)  # source -> steps it has been held back
    plain_seconds: float = 0.0  # decayed sum of plain steps' seconds
    plain_weight: float = 0.0

    def record(self, source: str, committed: int, seconds: float) -> None:
        for table, value in ((self.tokens, committed), (self.seconds, seconds), (self.weight, 1.0)):
            table[source] = table.get(source, 0.0) * RATE_DECAY + value

    def record_plain(self, seconds: float) -> None:
        self.plain_seconds = self.plain_seconds * RATE_DECAY + seconds
        self.plain_weight = self.plain_weight * RATE_DECAY + 1.0

    def tokens_per_second(self, source: str) -> Optional[float]:
        seconds = self.seconds.get(source, 0.0)
        return self.tokens.get(source, 0.0) / seconds if seconds > 0 else None

    def plain_step_seconds(self, fallback: float) -> float:
        """Mean seconds of a plain step in this session (`fallback`, the curve's t(1), before there are any)."""
        return self.plain_seconds / self.plain_weight if self.plain_weight >= 1.0 else fallback

    def losing(self, source: str, plain_seconds: float) -> bool:
        """Whether this source's steps are measurably slower than plain decoding's (`plain_seconds` a step)."""
        rate = self.tokens_per_second(source)
        if rate is None or self.weight.get(source, 0.0) < RATE_MIN_STEPS:
            return False
        return rate < (1.0 - RATE_MARGIN) / plain_seconds

    def hold_back(self, source: str) -> bool:
        """Called for a losing source's draft: True to skip it, False now and then to probe it again."""
        held = self.benched_steps[source] = self.benched_steps.get(source, 0) + 1
        return held % PROBE_EVERY != 0


# ---------------------------------------------------------------------------------------------- planner


@dataclass(frozen=True)
class Plan:
    keep: int  # draft nodes to verify: a prefix of the draft (parents first)
    rows: int  # rows of the verify forward: keep + 1, or more where a bigger forward is cheaper (padding)


CurveSource = Union[CostCurve, Callable[[], CostCurve]]


class DraftPlanner:
    """Decides each step's verify block from the cost curve, the acceptance memory, drafting costs and the
    sources' realised speed, and learns from every step the engine reports back.

    `curve` is a CostCurve or a function that makes one (called at the first draft worth planning, so plain
    decoding never pays for a measurement).
    """

    def __init__(self, curve: CurveSource):
        self._curve_source = curve
        self._curve: Optional[CostCurve] = curve if isinstance(curve, CostCurve) else None
        self.acceptance = AcceptanceTracker()
        self.calibration = ConfidenceCalibration()
        self.draft_costs = DraftCosts()
        self.rates = SourceRates()
        self.gates = SourceGates()  # whether asking a confidence drafter pays for its drafting
        self.steps = 0  # drafting steps planned
        self._granted: Optional[tuple[str, int]] = None  # (source, nodes): this step's decision before drafting
        self._probing: Optional[str] = None  # a benched source asked to draft this step, as a probe

    @property
    def curve(self) -> CostCurve:
        if self._curve is None:
            source = self._curve_source
            self._curve = source if isinstance(source, CostCurve) else source()
        return self._curve

    @property
    def has_curve(self) -> bool:
        return self._curve is not None

    def forget(self) -> None:
        """Drop what was learned about drafters (acceptance, drafting costs, realised speed); the machine's
        cost curve stays."""
        self.acceptance = AcceptanceTracker()
        self.calibration = ConfidenceCalibration()
        self.draft_costs = DraftCosts()
        self.rates = SourceRates()
        self.gates = SourceGates()

    def observe_drafting(self, source: str, drafted: int, seconds: float) -> None:
        self.draft_costs.observe(source, drafted, seconds)
        self.gates.timed(source, seconds)

    def draft_budget(self, source: str, budget: int) -> int:
        """Before drafting: how many tokens (nodes) to ask of a drafter whose drafts come from `source` with no
        match length (a draft model, a feature head, a table), once such drafts have a record: what `plan` would
        keep of a whole draft, so that drafting that would be trimmed away is not done (0: no drafting this step;
        now and then a probe, as `plan` verifies one). `plan` then keeps that decision for the draft. A drafter
        without such a record (a hybrid's drafts name other sources; a retrieval draft has a match length) is
        asked for `budget` and planned after drafting. A source whose steps run slower than plain decoding
        (`_unless_benched`) is not asked at all, but for a probe now and then, nor is a drafter whose drafts carry
        their confidence under its name while its accepted tokens do not pay for its drafting (ask_gate.py). This
        is the one place that stops drafting when it does not pay: drafters draft what they are asked for."""
        self._granted = self._probing = None
        if budget <= 0 or self._curve is None:
            return budget
        if self._losing(source):
            if self.rates.hold_back(source):
                return 0
            self._probing = source  # (`plan` verifies the probe as it would any draft)
        if self.curve.learn and source in self.calibration.totals and not self.gates.ask(source):
            return 0  # its drafting not worth its time (a fixed curve, tests' and replays', times nothing)
        chain = (source, 0) in self.acceptance.drafted
        tree = any(key[0] == source for key in self.acceptance.tree_stats)
        if not (chain or tree):
            return budget
        keep = self._decide(source, 0, not tree, budget, budget)
        if tree and keep:  # a tree search costs the same for more nodes: fill the forward `plan` will choose
            keep = min(budget, self.curve.cheapest_at_least(keep + 1, self._max_rows(budget)) - 1)
        self._granted = (source, keep)
        return keep

    def plan(self, draft: "Draft", budget: int) -> Plan:
        """How many of the draft's nodes to verify, in a forward of how many rows."""
        granted, self._granted = self._granted, None
        longest = min(budget, len(draft))
        if longest <= 0:
            return Plan(0, 1)
        self.steps += 1
        curve = self.curve
        max_rows = self._max_rows(budget)
        if granted is not None and granted[0] == draft.source:  # decided before drafting (`draft_budget`)
            keep = min(granted[1], longest)
        elif draft.confidence is not None:  # the draft's own estimates, calibrated by its source's record
            keep = self._decide_by_confidence(draft, longest, budget)
        else:
            keep = self._decide(draft.source, draft.match_len, draft.is_chain, longest, budget)
        if self.steps % COST_PROBE_EVERY == 0:  # time a row count that has not been seen for long
            stale = curve.stale([size for size in curve.seconds if 1 < size <= max_rows])
            if stale is not None:
                return Plan(min(longest, stale - 1), stale)
        if keep == 0:
            return Plan(0, 1)
        rows = curve.cheapest_at_least(keep + 1, max_rows)
        return Plan(min(longest, rows - 1), rows)  # a cheaper bigger block takes more of the draft if it has it

    def _decide(self, source: str, match_len: int, chain: bool, longest: int, budget: int) -> int:
        """How many of `longest` drafted tokens (nodes) of `source` pay for their verification (and drafting)."""
        curve = self.curve
        cost = curve.envelope(self._max_rows(budget))
        if chain:
            key = self.acceptance.key(source, match_len)
            keep = self.acceptance.plan(key, self.draft_costs.charged(cost, source), longest)
        else:
            keep = self.acceptance.plan_tree(source, cost, longest)
        return self._unless_benched(source, keep)

    def _decide_by_confidence(self, draft: "Draft", longest: int, budget: int) -> int:
        assert draft.confidence is not None
        cost = self.draft_costs.charged(self.curve.envelope(self._max_rows(budget)), draft.source)
        keep = choose_prefix(self.calibration.calibrated(draft.source, draft.confidence), cost, longest)
        return self._unless_benched(draft.source, self.acceptance.probe_if_idle((draft.source, "confidence"), keep))

    def _unless_benched(self, source: str, keep: int) -> int:
        """`keep`, or 0 while the source's verified steps run slower than plain decoding (probed now and then)."""
        if self._probing == source:  # a probe `draft_budget` asked for: not held back twice
            self._probing = None
            return keep
        if keep and self._losing(source) and self.rates.hold_back(source):
            return 0
        return keep

    def _losing(self, source: str) -> bool:
        """Whether the source's verified steps run measurably slower than this session's plain steps."""
        return self.rates.losing(source, self.rates.plain_step_seconds(self.curve(1)))

    def _max_rows(self, budget: int) -> int:
        """The largest forward a step may use: the budget's rows, or the next known row count above them."""
        above = [size for size in self.curve.seconds if size >= budget + 1]
        return min(above) if above else budget + 1

    def learn(self, draft: "Draft", accepted: int) -> None:
        """How far the target followed a verified draft: what the acceptance memory learns from a step, also from
        a batched step (batch.py), whose time is shared and so teaches the cost curve nothing."""
        if not len(draft):
            return
        if draft.confidence is not None:
            self.calibration.record(draft.source, draft.confidence, accepted)
        elif draft.is_chain:
            self.acceptance.record(self.acceptance.key(draft.source, draft.match_len), len(draft), accepted)
        else:
            self.acceptance.record_tree(draft.source, len(draft), accepted)

    def record(self, draft: "Draft", accepted: int, committed: int, rows: int, verify_seconds: float,
               draft_seconds: float) -> None:
        """What the step did: `draft` is what was verified (already trimmed) in a forward of `rows` rows."""
        if self._curve is None:
            return  # plain decoding before any draft: nothing to learn yet
        curve = self._curve
        curve.observe(rows, verify_seconds)
        self.gates.stepped(draft.source, accepted, committed, verify_seconds)
        if not len(draft):
            if rows == 1:
                self.rates.record_plain(verify_seconds if curve.learn else curve(1))
            return
        self.learn(draft, accepted)
        seconds = verify_seconds + draft_seconds if curve.learn else curve(rows)  # fixed curve: modelled time
        self.rates.record(draft.source, committed, seconds)
