"""One prompt answered twice on the same engine, plainly and speculatively: both speeds, and whether the
outputs are identical (they must be: greedy speculative decoding commits exactly the plain greedy answer).

This is what `specdec chat --compare` and `make demo` show. Both runs are timed after an untimed warm-up and
after the engine's verify-cost curve is known (measured now if this machine has none stored), so neither run
pays for one-time work. Greedy only: under sampling two runs differ by design. It prints nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from ..drafters.none import NoDrafter
from ..errors import SpecdecError

if TYPE_CHECKING:  # pragma: no cover
    from ..decoding.draft import Drafter, StepEvent
    from ..decoding.engine import Engine, Generation, GenerationConfig

WARMUP_TOKENS = 8


@dataclass
class Comparison:
    plain: "Generation"
    speculative: "Generation"

    @property
    def identical(self) -> bool:
        return self.plain.tokens == self.speculative.tokens

    @property
    def first_divergence(self) -> Optional[int]:
        """Index of the first differing new token, or None when the outputs are identical."""
        for index, (plain, speculative) in enumerate(zip(self.plain.tokens, self.speculative.tokens)):
            if plain != speculative:
                return index
        shorter = min(len(self.plain.tokens), len(self.speculative.tokens))
        return None if self.identical else shorter

    @property
    def speedup(self) -> float:
        plain = self.plain.stats.tokens_per_second
        return self.speculative.stats.tokens_per_second / plain if plain > 0 else 0.0


def compare(engine: "Engine", prompt_ids: Sequence[int], drafter: "Drafter", config: "GenerationConfig",
            on_event: Optional[Callable[["StepEvent"], Optional[bool]]] = None) -> Comparison:
    """Answer `prompt_ids` with plain decoding, then with `drafter` (events of the second run go to
    `on_event`), after an untimed warm-up."""
    if not config.greedy:
        raise SpecdecError("temperature must be 0 to compare with plain decoding (greedy outputs are identical; "
                           "sampled ones differ by design)", setting="temperature")
    engine.generate(prompt_ids, NoDrafter(), replace(config, max_new_tokens=WARMUP_TOKENS, stop=()))
    if config.cost_aware:
        engine.cost_curve()
    plain = engine.generate(prompt_ids, NoDrafter(), config)
    speculative = engine.generate(prompt_ids, drafter, config, on_event)
    return Comparison(plain, speculative)
