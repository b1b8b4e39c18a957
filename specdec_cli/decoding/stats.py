"""Statistics of one generation, computed from the engine's step events (Spec-Bench conventions).

- steps: target forwards after the prefill;
- mean_accepted_tokens (tau): tokens committed per step, the target's own token included (plain = 1.0);
- acceptance_rate: accepted draft tokens / drafted tokens;
- per_position_acceptance[i]: among steps whose draft reached depth i+1 (a chain of at least i+1 tokens, or a
  tree with a path that long), the share that accepted at least i+1 draft tokens.
Every figure derives from raw counts kept alongside it, so several generations pool exactly with `merge`
(bench's per-category rows, the REPL's /stats, the distill report). Pure bookkeeping over events; no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Iterable, Optional

from .draft import StepEvent


@dataclass
class GenerationStats:
    new_tokens: int = 0
    steps: int = 0
    mean_accepted_tokens: float = 0.0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    acceptance_rate: float = 0.0
    per_position_acceptance: list[float] = field(default_factory=list)
    tokens_per_second: float = 0.0
    wall_seconds: float = 0.0
    ttft_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    # raw counts, so several generations can be pooled exactly (`merge`)
    committed_in_steps: int = 0  # tokens committed by steps (the prefill's first token excluded)
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    sources: dict = field(default_factory=dict)  # draft source -> steps it drafted

    def as_json(self) -> dict:
        """The contract of `specdec chat --json`'s "stats" object (extra keys are allowed)."""
        return asdict(self)


class Tally:
    """Statistics kept up to date event by event (what a live display reads); `summarize` is a tally of a
    whole generation. `stats` holds raw counts only until `finish` derives the rates."""

    def __init__(self) -> None:
        self.stats = GenerationStats()
        self.latest_source = ""  # which source drafted the latest drafting step (hybrid drafters name theirs)

    def add(self, event: StepEvent) -> None:
        stats = self.stats
        stats.new_tokens += len(event.committed)
        stats.draft_seconds += event.draft_seconds
        stats.verify_seconds += event.verify_seconds
        if event.kind != "step":
            return
        stats.steps += 1
        stats.committed_in_steps += len(event.committed)
        drafted = len(event.draft)
        stats.drafted_tokens += drafted
        stats.accepted_tokens += event.accepted
        if drafted:
            stats.sources[event.draft.source] = stats.sources.get(event.draft.source, 0) + 1
            self.latest_source = event.draft.source
        _add_positions(stats, event.draft.depth, event.accepted)

    def snapshot(self, wall_seconds: Optional[float] = None, ttft_seconds: float = 0.0) -> GenerationStats:
        """The statistics so far, rates derived (wall time: the engine's draft + verify seconds if not given)."""
        stats = replace(self.stats, position_drafted=list(self.stats.position_drafted),
                        position_accepted=list(self.stats.position_accepted), sources=dict(self.stats.sources))
        stats.wall_seconds = stats.draft_seconds + stats.verify_seconds if wall_seconds is None else wall_seconds
        stats.ttft_seconds = ttft_seconds
        return finish(stats)


def summarize(events: Iterable[StepEvent], wall_seconds: float, ttft_seconds: float) -> GenerationStats:
    tally = Tally()
    for event in events:
        tally.add(event)
    return tally.snapshot(wall_seconds, ttft_seconds)


def merge(items: Iterable[GenerationStats]) -> Optional[GenerationStats]:
    """Several generations' statistics pooled from their raw counts (times add up); None for no items."""
    items = list(items)
    if not items:
        return None
    pooled = GenerationStats()
    for item in items:
        for name in ("new_tokens", "steps", "drafted_tokens", "accepted_tokens", "committed_in_steps",
                     "wall_seconds", "ttft_seconds", "draft_seconds", "verify_seconds"):
            setattr(pooled, name, getattr(pooled, name) + getattr(item, name))
        width = max(len(pooled.position_drafted), len(item.position_drafted))
        for counts, more in ((pooled.position_drafted, item.position_drafted),
                             (pooled.position_accepted, item.position_accepted)):
            counts.extend([0] * (width - len(counts)))
            for position, count in enumerate(more):
                counts[position] += count
        for source, steps in item.sources.items():
            pooled.sources[source] = pooled.sources.get(source, 0) + steps
    pooled.ttft_seconds /= len(items)  # a mean: time to first token does not add up
    return finish(pooled)


def _add_positions(stats: GenerationStats, depth: int, accepted: int) -> None:
    while len(stats.position_drafted) < depth:
        stats.position_drafted.append(0)
        stats.position_accepted.append(0)
    for position in range(depth):
        stats.position_drafted[position] += 1
        if position < accepted:
            stats.position_accepted[position] += 1


def finish(stats: GenerationStats) -> GenerationStats:
    """Fill the derived rates from the raw counts."""
    stats.mean_accepted_tokens = stats.committed_in_steps / stats.steps if stats.steps else 0.0
    stats.acceptance_rate = stats.accepted_tokens / stats.drafted_tokens if stats.drafted_tokens else 0.0
    stats.per_position_acceptance = [
        accepted / drafted if drafted else 0.0
        for accepted, drafted in zip(stats.position_accepted, stats.position_drafted)
    ]
    stats.tokens_per_second = stats.new_tokens / stats.wall_seconds if stats.wall_seconds > 0 else 0.0
    return stats


TIMING_DECAY = 0.9  # a drafter's measured seconds (and what they buy) follow its last ~10 values


def decayed_mean(mean: Optional[float], value: float) -> float:
    """A running mean that forgets: `value` alone at first, then TIMING_DECAY of the old mean and the rest of
    `value` (a drafter's timed forwards and gains, which follow the machine's load and the conversation)."""
    return value if mean is None else TIMING_DECAY * mean + (1 - TIMING_DECAY) * value
