"""Several generations on one engine, advanced together: continuous batching that keeps every answer exact.

`Batch.add` begins a generation (Engine.start: its prompt computed alone, in the forward's row-invariant blocks,
its first token committed); `Batch.step` runs one step of every open generation in one forward
(Engine.step_many: each sequence's chain scored after its own KV cache, its rows' bits those of its block alone)
and hands back the generations that ended, which leave; `drop` takes one out at once (a client gone). Because no
row's result depends on the others, each answer is the one its request would get alone: greedy, plain decoding's
answer token for token, whatever else shares the forward and whenever it joined or left.

What it does not do: decide how many generations pay (the caller sets the width), or queue requests (the
server's worker does). Sequences whose drafter reads the target's layer states, and forwards that cannot score
several sequences at once (transformers' modules, the device engine), are stepped one by one, still exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from .draft import Drafter
from .generation_config import GenerationConfig
from .prompt_cache import PromptCache

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine, EventCallback, Generation, Run


class Batch:
    def __init__(self, engine: "Engine"):
        self.engine = engine
        self.runs: list["Run"] = []

    def __len__(self) -> int:
        return len(self.runs)

    def add(self, prompt_ids: Sequence[int], drafter: Drafter, config: GenerationConfig,
            on_event: Optional["EventCallback"] = None, prompt_cache: Optional[PromptCache] = None) -> "Run":
        """Begin a generation (its prompt computed now, alone); it steps with the others until it ends."""
        run = self.engine.start(prompt_ids, drafter, config, on_event, prompt_cache)
        if run.finish is None:
            self.runs.append(run)
        return run

    def step(self) -> list["Run"]:
        """One step of every open generation; those that ended (they leave the batch)."""
        if self.runs:
            self.engine.step_many(self.runs)
        ended = [run for run in self.runs if run.finish is not None]
        self.runs = [run for run in self.runs if run.finish is None]
        return ended

    def drop(self, run: "Run") -> None:
        """Take a generation out now (its client went away): it is never stepped again."""
        if run in self.runs:
            self.runs.remove(run)

    def close(self, run: "Run") -> "Generation":
        """An ended generation's result (Engine.close: statistics, the prompt cache kept)."""
        return self.engine.close(run)
