"""Several generations on one engine, advanced together: continuous batching that keeps every answer exact.

`Batch.add` begins a generation (Engine.begin); `Batch.step` runs one step of every open generation in one forward
(Engine.step_many: each sequence's chain scored after its own KV cache, its rows' bits those of its block alone),
the rows they leave computing the next pieces of the new generations' prompts (a prompt's last piece gives its
first token), and hands back the generations that ended, which leave; `drop` takes one out at once (a client
gone). So a new prompt never stops the others' answers for its whole length. Because no row's result depends on
the others, and a prompt's cache entries are the same bits in pieces of any size, each answer is the one its
request would get alone: greedy, plain decoding's answer token for token, whatever else shares the forward and
whenever it joined or left. A drafter that reads the target's last states (an EAGLE head) gets the prompt's from its
pieces, the same bits; one that reads layer states, and forwards that cannot score several sequences at once, have
the prompt computed whole by `add` (Engine.start).

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
        self.runs: list["Run"] = []  # generations past their prompts, a step each `step`
        self.prompts: list["Run"] = []  # generations whose prompts are computed a piece each `step`, in arrival order

    def __len__(self) -> int:
        return len(self.runs) + len(self.prompts)

    def add(self, prompt_ids: Sequence[int], drafter: Drafter, config: GenerationConfig,
            on_event: Optional["EventCallback"] = None, prompt_cache: Optional[PromptCache] = None) -> "Run":
        """Begin a generation: its prompt computed in the next steps beside the others (or now, whole, where it
        cannot be); it steps with the others until it ends."""
        engine = self.engine
        run = engine.begin(prompt_ids, drafter, config, on_event, prompt_cache)
        if engine.batches([drafter]):  # (not where the drafter reads layer states)
            self.prompts.append(run)
            return run
        engine.compute_prompt(run)
        if run.finish is None:
            self.runs.append(run)
        return run

    def step(self) -> list["Run"]:
        """One step of every open generation (and a piece of each waiting prompt); those that ended (they leave
        the batch)."""
        if self.runs or self.prompts:
            self.engine.step_many(self.runs, self.prompts)
            self.runs += [run for run in self.prompts if run.computed is None]  # first token committed
            self.prompts = [run for run in self.prompts if run.computed is not None]
        ended = [run for run in self.runs if run.finish is not None]
        self.runs = [run for run in self.runs if run.finish is None]
        return ended

    def drop(self, run: "Run") -> None:
        """Take a generation out now (its client went away): it is never stepped again."""
        self.runs, self.prompts = ([held for held in runs if held is not run] for runs in (self.runs, self.prompts))

    def close(self, run: "Run") -> "Generation":
        """An ended generation's result (Engine.close: statistics, the prompt cache kept)."""
        return self.engine.close(run)
