"""The verify-cost curve t(rows): seconds of one target forward over `rows` new tokens on this machine.

Measured, never assumed, and never smoothed: on a CPU it need not be monotone (a forward of more rows can cost
less than one of fewer; docs/methods.md, section 7, has measured curves).
`measure_cost_curve` times every size after a warm-up pass, in interleaved rounds, keeping the minimum; the
result is stored per machine, model and dtype (curve_store.py) as a starting point that every step's own
timing refines (`CostCurve.observe`). Verifying *at least* n rows costs the cheapest
forward of n rows or more (`cheapest_at_least`, `envelope`). How the curve is used to plan is planner.py's.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Optional, Sequence

from ..defaults import VERIFY_ROW_COUNTS

PROBE_SIZES = VERIFY_ROW_COUNTS  # row counts measured up front
MEASURE_SECONDS = 1.5  # the up-front measurement's time budget (after one warm-up pass over every size)
MEASURE_ROUNDS = (2, 6)  # at least / at most this many interleaved timed rounds
WINDOW = 8  # recent observations kept per row count; the estimate is their lower quartile
PAD_MARGIN = 0.02  # fill a block up to a bigger forward only when that is at least 2% cheaper
STALE_STEPS = 256  # a row count not seen for this many steps is stale ...
STALE_STEPS_MOST = 4096  # ... doubled up to this each time a timing agrees with its estimate (AGREE)
AGREE = 0.25  # a timing within 25% of the estimate confirms it
BASE_ROWS = 1  # the plain step: other counts are learned relative to its estimate at the time
CURVE_FORMAT = 3  # the cached curve's JSON (1: monotone-smoothed medians; 2: timed with the calls binding, 0.5.0)


class CostCurve:
    """t(rows): seconds of one target forward over `rows` new tokens, learned from a prior and observations.

    At a row count with observations the estimate is the lower quartile of the last WINDOW of them, the
    prior counted as one more while fewer than WINDOW were seen (timing noise is mostly upward, so a low
    quantile is robust; the prior is outvoted after a few steps). Where the prior has one row, a bigger count's
    observations are kept relative to the one-row estimate of their moment and its estimate is their lower
    quartile times today's one-row estimate: a step timed while the host was busy, or deep in a long context,
    says how much dearer more rows are, not that they stay dear once the host is quiet or the context short (a
    dear estimate is sticky: the planner stops verifying that many rows, so nothing would correct it). A row
    count with none keeps the prior's value scaled by how the observed counts compare with theirs (`_level`).
    Between known row counts, linear interpolation; past the largest, its last slope. No smoothing: the curve
    keeps its real shape. A `learn=False` curve is fixed (tests and replays): observations are ignored.
    """

    def __init__(self, prior: dict[int, float], learn: bool = True, origin: str = "given"):
        if not prior or any(rows < 1 or not seconds > 0 for rows, seconds in prior.items()):
            raise ValueError(f"a cost curve needs positive seconds at row counts >= 1, got {prior!r}")
        self.prior = {int(rows): float(seconds) for rows, seconds in prior.items()}
        self.learn = learn
        self.origin = origin  # "measured", "cache", "given" (where the prior came from)
        self.recent: dict[int, deque] = {}
        self.last_seen: dict[int, int] = {}  # row count -> observation counter when last seen
        self.stale_after: dict[int, int] = {}  # row count -> observations until it is stale (STALE_STEPS at first)
        self.observations = 0
        self._estimates: Optional[dict[int, float]] = None
        self._quartiles: dict[int, float] = {}  # row count -> `_quartile`, until its next observation
        self._cheapest: dict[int, list[int]] = {}  # max rows -> `cheapest_at_least` of 0..max rows (estimates as now)

    @classmethod
    def fixed(cls, prior: dict[int, float]) -> "CostCurve":
        return cls(prior, learn=False, origin="fixed")

    # -- reading ---------------------------------------------------------------------------------------------

    @property
    def seconds(self) -> dict[int, float]:
        """The current estimate at every known row count (the prior's and any observed one), sorted."""
        if self._estimates is None:
            observed = {rows: self._estimate(rows) for rows in self.recent}
            level = self._level(observed)
            sizes = sorted(set(self.prior) | set(self.recent))
            self._estimates = {rows: observed[rows] if rows in observed else self.prior[rows] * level
                               for rows in sizes}
        return self._estimates

    def _estimate(self, rows: int) -> float:
        quartile = self._quartile(rows)
        return quartile * self._quartile(BASE_ROWS) if self._relative(rows) else quartile

    def _quartile(self, rows: int) -> float:
        """The lower quartile of the count's kept observations (relative ones for a bigger count), the prior
        counted as one more while fewer than WINDOW were seen; kept until the count's next observation (the
        planner reads the curve several times a step)."""
        quartile = self._quartiles.get(rows)
        if quartile is None:
            samples = list(self.recent.get(rows, ()))
            if rows in self.prior and len(samples) < WINDOW:
                samples.append(self.prior[rows] / self.prior[BASE_ROWS] if self._relative(rows) else self.prior[rows])
            samples.sort()
            quartile = self._quartiles[rows] = samples[(len(samples) - 1) // 4]
        return quartile

    def _relative(self, rows: int) -> bool:
        """Whether this count's observations are kept relative to the one-row estimate (see the class)."""
        return rows != BASE_ROWS and BASE_ROWS in self.prior

    def _level(self, observed: dict[int, float]) -> float:
        """How this session's timings compare with the prior's where both exist: the median ratio, 1 without
        observations. A row count never observed keeps the prior's shape at this level: a prior measured on a
        quiet machine and steps timed on a busy one (or the reverse) must not make an unobserved count look
        cheaper than an observed smaller one (a busy session once stored t(12) < t(1), and the planner padded
        every step to 12 rows)."""
        ratios = sorted(seconds / self.prior[rows] for rows, seconds in observed.items() if rows in self.prior)
        if not ratios:
            return 1.0
        middle = len(ratios) // 2
        return ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2

    def __call__(self, rows: int) -> float:
        table = self.seconds
        if rows in table:
            return table[rows]
        sizes = list(table)
        if rows < sizes[0]:
            return table[sizes[0]]
        for low, high in zip(sizes, sizes[1:]):
            if rows < high:
                share = (rows - low) / (high - low)
                return table[low] + share * (table[high] - table[low])
        last, before = sizes[-1], sizes[-2] if len(sizes) > 1 else sizes[-1]
        slope = max(0.0, (table[last] - table[before]) / max(1, last - before))
        return table[last] + slope * (rows - last)

    def cheapest_at_least(self, rows: int, max_rows: int) -> int:
        """The row count m in [rows, max_rows] with the lowest t(m): `rows` itself, or a known bigger count
        that is at least PAD_MARGIN cheaper. Worked out for every `rows` up to `max_rows` at once, and kept until
        an estimate changes (the planner asks for every draft length, every step)."""
        if not 0 < rows <= max_rows:
            return self._cheapest_scan(rows, max_rows)
        table = self._cheapest.get(max_rows)
        if table is None:
            table = self._cheapest[max_rows] = [0] + [self._cheapest_scan(size, max_rows)
                                                       for size in range(1, max_rows + 1)]
        return table[rows]

    def _cheapest_scan(self, rows: int, max_rows: int) -> int:
        best, best_seconds = rows, self(rows)
        for size, seconds in self.seconds.items():  # (every known count: t(m) is its entry)
            if rows < size <= max_rows and seconds < best_seconds * (1 - PAD_MARGIN):
                best, best_seconds = size, seconds
        return best

    def envelope(self, max_rows: int) -> Callable[[int], float]:
        """rows -> the cost of verifying at least `rows` rows: min over m >= rows (up to max_rows) of t(m)."""
        return lambda rows: self(self.cheapest_at_least(rows, max(rows, max_rows)))

    # -- learning --------------------------------------------------------------------------------------------

    def observe(self, rows: int, seconds: float) -> None:
        """One forward of `rows` rows took `seconds` (ignored by a fixed curve)."""
        if not self.learn or not seconds > 0:
            return
        value = seconds / self._estimate(BASE_ROWS) if self._relative(rows) else seconds
        if rows in self.prior or rows in self.recent:  # a timing that confirms the estimate makes probing rarer
            estimate = self._estimate(rows)
            agrees = abs(seconds / estimate - 1.0) <= AGREE
            self.stale_after[rows] = min(2 * self.stale_after.get(rows, STALE_STEPS), STALE_STEPS_MOST) \
                if agrees else STALE_STEPS
        before = self._quartile(rows) if rows in self.recent else None
        self.recent.setdefault(rows, deque(maxlen=WINDOW)).append(value)
        self.observations += 1
        self.last_seen[rows] = self.observations
        self._quartiles.pop(rows, None)
        if before is not None and self._quartile(rows) == before:
            return  # the count's lower quartile stands, and with it every estimate (about half the steps)
        self._estimates = None
        self._cheapest.clear()

    def stale(self, candidates: Sequence[int]) -> Optional[int]:
        """The candidate row count whose timing is oldest (never observed first), if any is stale: not seen for
        STALE_STEPS observations, or up to STALE_STEPS_MOST where its timings kept agreeing with its estimate (a
        probe of a count the planner does not choose costs a dearer forward: probing settled counts less often
        keeps that price low; a timing that disagrees starts the count over)."""
        if not self.learn:
            return None
        stale = [rows for rows in candidates if self.observations - self.last_seen.get(rows, -STALE_STEPS) >=
                 self.stale_after.get(rows, STALE_STEPS)]
        return min(stale, key=lambda rows: (self.last_seen.get(rows, -STALE_STEPS), rows)) if stale else None

    # -- storing ---------------------------------------------------------------------------------------------

    def as_json(self) -> dict:
        return {"format": CURVE_FORMAT, "origin": self.origin, "observations": self.observations,
                "seconds": {str(rows): seconds for rows, seconds in self.seconds.items()}}

    @classmethod
    def from_json(cls, document: dict, origin: str = "cache") -> "CostCurve":
        if document.get("format") != CURVE_FORMAT:
            raise ValueError("a cost curve of another format")
        return cls({int(rows): float(seconds) for rows, seconds in document["seconds"].items()}, origin=origin)


def measure_cost_curve(forward: Callable[[int], float], sizes: Sequence[int] = PROBE_SIZES,
                       budget_seconds: float = MEASURE_SECONDS) -> CostCurve:
    """t(rows) from `forward(rows)` (one forward of that many rows; returns its seconds).

    Every size is run once untimed first (a shape's first call pays for allocation and kernel choice), then
    the sizes are timed in interleaved rounds (each round visits them in a rotated order, so a slow second
    of the machine does not land on one size) until the time budget is spent, at least MEASURE_ROUNDS[0]
    rounds; the minimum per size is kept.
    """
    for size in sizes:
        forward(size)
    runs: dict[int, list[float]] = {size: [] for size in sizes}
    started = time.perf_counter()
    for round_index in range(MEASURE_ROUNDS[1]):
        if round_index >= MEASURE_ROUNDS[0] and time.perf_counter() - started > budget_seconds:
            break
        shift = round_index % len(sizes)
        for size in [*sizes[shift:], *sizes[:shift]]:
            runs[size].append(forward(size))
    return CostCurve({size: min(times) for size, times in runs.items()}, origin="measured")

