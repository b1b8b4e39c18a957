"""Cost-aware draft length: keep only as much of a draft as pays for its verification.

Verifying k drafted tokens costs one forward over k+1 tokens, t(k+1). On a GPU that is nearly flat in k; on a
CPU it is not (SmolLM2-135M on 2 cores: t(1) ~ 37 ms, t(4) ~ 54 ms, t(16) ~ 71 ms). A step commits
1 + sum over i <= k of P(first i drafts accepted) tokens, so the best k maximises

    expected_tokens(k) / t(k+1)

and k = 0 (plain decoding) wins whenever the draft is unlikely to be right. `CostCurve` holds t(n), measured
once per model and device (cached on disk) and refined by every step's timing; `AcceptanceTracker` keeps,
per draft source and match-length bucket, the conditional acceptance at each position with a decaying
memory; `choose_length` is the pure arithmetic. Nothing here touches the accept/reject rule: trimming a draft
never changes what is committed, only how fast.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

PROBE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
PRIOR_ACCEPT = 0.5  # before any evidence a position is a coin flip
PRIOR_WEIGHT = 2.0  # worth this many observations
DECAY = 0.97  # older evidence fades, so the tracker follows a conversation that turns repetitive
PROBE_EVERY = 16  # when a source is trimmed to nothing, still try one token this often


def expected_tokens(conditional_accept: Sequence[float], length: int) -> float:
    """Committed tokens per step with a draft of `length`: 1 + sum_i prod_{j<=i} accept_j."""
    total, survive = 1.0, 1.0
    for position in range(length):
        survive *= conditional_accept[position]
        total += survive
    return total


def choose_length(conditional_accept: Sequence[float], cost: Callable[[int], float], longest: int) -> int:
    """The draft length in 0..longest that maximises expected committed tokens per second."""
    best_length, best_rate = 0, 1.0 / cost(1)
    for length in range(1, longest + 1):
        rate = expected_tokens(conditional_accept, length) / cost(length + 1)
        if rate > best_rate:
            best_length, best_rate = length, rate
    return best_length


@dataclass
class CostCurve:
    """t(n): seconds for one target forward over n new tokens, piecewise linear between measured sizes."""

    seconds: dict[int, float]

    def __post_init__(self) -> None:
        self._make_monotone()

    def _make_monotone(self) -> None:
        """More tokens never cost less: smooth measurement noise with a running maximum."""
        running = 0.0
        for size in sorted(self.seconds):
            running = max(running, self.seconds[size])
            self.seconds[size] = running

    def __call__(self, tokens: int) -> float:
        sizes = sorted(self.seconds)
        if tokens <= sizes[0]:
            return self.seconds[sizes[0]]
        for low, high in zip(sizes, sizes[1:]):
            if tokens <= high:
                share = (tokens - low) / (high - low)
                return self.seconds[low] + share * (self.seconds[high] - self.seconds[low])
        last, before = sizes[-1], sizes[-2] if len(sizes) > 1 else sizes[-1]
        slope = (self.seconds[last] - self.seconds[before]) / max(1, last - before)
        return self.seconds[last] + slope * (tokens - last)

    def observe(self, tokens: int, seconds: float) -> None:
        """Blend a measured step into the curve (only at measured sizes, so the shape stays monotone-ish)."""
        if tokens in self.seconds and seconds > 0:
            self.seconds[tokens] = 0.9 * self.seconds[tokens] + 0.1 * seconds
            self._make_monotone()


@dataclass
class DraftCosts:
    """Seconds a source spends drafting per drafted token (decayed mean), so that a chain drafter with a real
    cost, a draft model, is planned with it: verifying k of its tokens is charged t(k + 1) plus k drafted
    tokens. Retrieval drafters cost microseconds and are planned as before; tree searches are not charged
    (their cost does not grow with the part of the tree that is verified)."""

    per_token: dict = field(default_factory=dict)  # source -> seconds per drafted token

    def observe(self, source: str, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds >= 0:
            sample = seconds / tokens
            old = self.per_token.get(source)
            self.per_token[source] = sample if old is None else 0.8 * old + 0.2 * sample

    def charged(self, curve: Callable[[int], float], source: str) -> Callable[[int], float]:
        """n -> seconds of a step that verifies n - 1 drafted tokens of `source` (n = tokens in the forward)."""
        per_token = self.per_token.get(source, 0.0)
        return lambda tokens: curve(tokens) + per_token * max(0, tokens - 1)


def measure_cost_curve(forward: Callable[[int], float], sizes: Sequence[int] = PROBE_SIZES, repeats: int = 3) -> CostCurve:
    """Median time of `forward(n)` (which runs one forward of n tokens and returns its seconds) per size."""
    forward(1)  # warm-up
    seconds = {}
    for size in sizes:
        runs = sorted(forward(size) for _ in range(repeats))
        seconds[size] = runs[len(runs) // 2]
    return CostCurve(seconds)


def load_or_measure(cache_file: Optional[Path], make_forward: Callable[[], Callable[[int], float]]) -> CostCurve:
    """The curve from the on-disk cache when present, else measured now (make_forward() builds the timer)."""
    if cache_file is not None and cache_file.is_file():
        try:
            stored = json.loads(cache_file.read_text())
            return CostCurve({int(size): float(value) for size, value in stored["seconds"].items()})
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache is just measured again
    curve = measure_cost_curve(make_forward())
    if cache_file is not None:
        from .files import write_json_atomic

        cache_file.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cache_file, {"seconds": curve.seconds, "measured": time.time()})
    return curve


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
        if length == 0:
            idle = self.idle_steps.get(key, 0) + 1
            self.idle_steps[key] = idle
            if idle % PROBE_EVERY == 0:
                return 1  # keep learning about a source that currently looks useless
        else:
            self.idle_steps[key] = 0
        return length

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
        if best_nodes == 0:
            idle = self.idle_steps.get(source, 0) + 1
            self.idle_steps[source] = idle
            if idle % PROBE_EVERY == 0:
                return 1
        else:
            self.idle_steps[source] = 0
        return best_nodes

    def record_tree(self, source: str, nodes: int, accepted: int) -> None:
        """A tree of `nodes` verified nodes got a path of `accepted` tokens accepted (older evidence fades)."""
        key = (source, tree_bucket(nodes))
        total, weight = self.tree_stats.get(key, (0.0, 0.0))
        self.tree_stats[key] = (total * DECAY + accepted, weight * DECAY + 1.0)


TREE_PRIOR_PER_DOUBLING = 0.35  # untried sizes look this good: small trees get tried, large ones must earn it


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
