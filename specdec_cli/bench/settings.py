"""`BenchSettings`: what one bench run does, checked before the model loads, and recorded in the report's JSON as
it was run. The settings it shares with chat (the target's load, the drafters' options, length, temperature, seed,
budget, exact verification, raw prompts) are one `RunSettings` (session/run_settings.py), checked as chat's are;
what is the bench's own is its rows (methods), repeats, warm-up and the llama-server binary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from ..defaults import DEFAULT_BENCH_MAX_NEW_TOKENS
from ..drafters import min_prob_in_force
from ..errors import SpecdecError
from ..session.run_settings import RunSettings, run_settings, take_fields
from ..texts.prompts import Conversation, load_prompts
from .methods import BASELINE, ORACLE, Method, resolve_methods

RUN_DEFAULTS: dict[str, Any] = {"max_new_tokens": DEFAULT_BENCH_MAX_NEW_TOKENS}  # where bench differs from chat


def default_run() -> RunSettings:
    """A bench's run settings by default: chat's, with bench's shorter answers and the drafters named by its rows."""
    return run_settings(None, **RUN_DEFAULTS)


MAX_BATCH = 8  # as `specdec serve --parallel` (server/settings.py)


@dataclass
class BenchSettings:
    run: RunSettings = field(default_factory=default_run)  # run.drafter.options: every drafter row's options
    methods: list[Method] = field(default_factory=lambda: resolve_methods([BASELINE]))
    repeats: int = 1
    warmup: bool = True
    llama_server: Optional[str] = None  # the llama-server binary for the llama-server rows; None = from PATH
    batch: int = 1  # > 1: each engine row's first turns answered again this many at a time (runner.run_batched)

    @property
    def engine_drafters(self) -> list[str]:
        """The drafters of the rows specdec's engine runs, in row order."""
        return [method.drafter for method in self.methods if method.kind == "engine"]

    def check(self) -> None:
        if not self.methods or self.methods[0].name != BASELINE:
            raise SpecdecError("the method list must start with the baseline `none`")
        if self.repeats < 1:
            raise SpecdecError(f"repeats must be >= 1, got {self.repeats}", setting="repeats")
        if not 1 <= self.batch <= MAX_BATCH:
            raise SpecdecError(f"batch must be in 1..{MAX_BATCH} (prompts answered together), got {self.batch}",
                               setting="batch")
        # the drafters' options and files, then length, sampling, seed and budget, as chat checks them
        self.run.check(self.engine_drafters)

    def as_json(self) -> dict:
        options, generation = self.run.drafter.options, self.run.generation
        return {
            "baseline": BASELINE,
            "methods": [method.name for method in self.methods],
            "drafters": [method.name for method in self.methods if method.kind == "engine"],
            "oracle_lengths": [method.draft_length for method in self.methods if method.kind == ORACLE],
            "references": [method.name for method in self.methods if method.kind not in ("engine", ORACLE)],
            "exact": self.run.exact,
            "draft_max": generation.draft_max,
            "engine_draft_max": generation.budget,  # the engine's per-step budget in force
            "max_new_tokens": generation.max_new_tokens,
            "temperature": generation.temperature,
            "greedy": generation.greedy,
            "seed": generation.seed,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "raw": self.run.raw,
            "index": options.index,
            "aux": options.aux,  # sam's auxiliary drafter (rows named sam+AUX override it)
            "l_threshold": options.l_threshold,
            "draft_model": options.draft_model,
            "draft_min_prob": options.draft_min_prob,  # the flag; 0 = each drafter's own default
            "min_prob_in_force": {method.name: floor for method in self.methods if method.kind == "engine" and
                                  (floor := min_prob_in_force(method.drafter, options)) is not None},
            "cost_aware": self.run.generation.cost_aware,  # drafters' rows; oracle rows always verify whole drafts
            "batch_size": 1,
            "batch": self.batch,  # the batched rows' width (1: none)
            "llama_server_binary": self.llama_server,
        }


def bench_settings(methods: Optional[list[Method]] = None, **values: Any) -> BenchSettings:
    """BenchSettings from values named as its own fields (repeats, warmup, llama_server) and its run's
    (session/run_settings.run_settings: target, max_new_tokens, index, draft_max, ...); the rest keep their defaults.
    `bench` and `bench --engine vllm` build theirs here from the same flags."""
    own = take_fields(BenchSettings, values)
    run = run_settings(None, **{**RUN_DEFAULTS, **values})
    return BenchSettings(run, methods or resolve_methods([BASELINE]), **own)


class PromptChoice(NamedTuple):
    """Which prompts a bench runs: --suite or --prompts, then --categories and --limit."""

    suite: Optional[str]
    prompts: Optional[str]
    categories: Optional[str]
    limit: Optional[int]

    def load(self) -> list[Conversation]:
        wanted = [name.strip() for name in (self.categories or "").split(",") if name.strip()]
        return load_prompts(self.prompts, self.suite, categories=wanted, limit=self.limit)

    @property
    def source(self) -> str:
        """The prompts' name in the report: the file, or the suite."""
        return self.prompts or str(self.suite).strip().lower()
