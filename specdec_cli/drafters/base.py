"""The drafter interface: two typed methods, nothing else.

`propose(context, budget)` returns a `Draft` of at most `budget` tokens (nodes) to follow `context`, the
whole committed token sequence (prompt and generated tokens). `observe(event)` is told every engine event,
the prefill included, so stateful drafters (automata, n-gram tables, draft-model caches) stay in step with
the committed text. A drafter never calls back into the engine.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from ..draft import Draft, StepEvent


@runtime_checkable
class Drafter(Protocol):
    name: str

    def propose(self, context: Sequence[int], budget: int) -> Draft: ...

    def observe(self, event: StepEvent) -> None: ...
