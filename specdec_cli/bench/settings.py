"""`BenchSettings`: what one bench run does (methods, drafter options, budget, lengths, sampling, repeats),
checked before the model loads, and recorded in the report's JSON as it was run. The settings it shares with
chat (length, temperature, seed, budget) are checked by GenerationConfig.check, as chat's are."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..defaults import DEFAULT_BENCH_MAX_NEW_TOKENS, DEFAULT_BUDGET
from ..drafters import DrafterOptions
from ..errors import SpecdecError
from .methods import BASELINE, ORACLE, Method, resolve_methods


@dataclass
class BenchSettings:
    methods: list[Method] = field(default_factory=lambda: resolve_methods([BASELINE]))
    options: DrafterOptions = field(default_factory=DrafterOptions)
    draft_max: Optional[int] = None  # engine budget per step; None = the chat default (DEFAULT_BUDGET)
    max_new_tokens: int = DEFAULT_BENCH_MAX_NEW_TOKENS
    temperature: float = 0.0  # 0 = greedy, with the identity check; > 0 = lossless sampling, no check
    seed: Optional[int] = None
    repeats: int = 1
    warmup: bool = True
    raw: bool = False  # prompts without the chat template
    exact: Optional[bool] = None  # row-invariant verification; None = on in 16-bit dtypes (engine.py)
    llama_server: Optional[str] = None  # the llama-server binary for the llama-server rows; None = from PATH

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check(self) -> None:
        if not self.methods or self.methods[0].name != BASELINE:
            raise SpecdecError("the method list must start with the baseline `none`")
        from ..decoding.generation_config import GenerationConfig

        # length, sampling, seed and budget as the engine checks them (generation_config.py), with its messages
        GenerationConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed,
                         budget=self.budget).check()
        if self.repeats < 1:
            raise SpecdecError(f"repeats must be >= 1, got {self.repeats}", setting="repeats")
        if self.options.l_threshold < 0:
            raise SpecdecError(f"l_threshold must be >= 0, got {self.options.l_threshold}", setting="l_threshold")
        from ..drafters import check_drafter_options

        # every drafter option is used by one of the drafters; the files they open exist (a millisecond)
        check_drafter_options([method.drafter for method in self.methods if method.kind == "engine"], self.options)

    def as_json(self) -> dict:
        from ..drafters import min_prob_in_force

        return {
            "baseline": BASELINE,
            "methods": [method.name for method in self.methods],
            "drafters": [method.name for method in self.methods if method.kind == "engine"],
            "oracle_lengths": [method.draft_length for method in self.methods if method.kind == ORACLE],
            "references": [method.name for method in self.methods if method.kind not in ("engine", ORACLE)],
            "exact": self.exact,
            "draft_max": self.draft_max,
            "engine_draft_max": self.budget,  # the engine's per-step budget in force
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "greedy": self.greedy,
            "seed": self.seed,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "raw": self.raw,
            "index": self.options.index,
            "aux": self.options.aux,  # sam's auxiliary drafter (rows named sam+AUX override it)
            "l_threshold": self.options.l_threshold,
            "draft_model": self.options.draft_model,
            "draft_min_prob": self.options.draft_min_prob,  # the flag; 0 = each drafter's own default
            "min_prob_in_force": {method.name: floor for method in self.methods if method.kind == "engine" and
                                  (floor := min_prob_in_force(method.drafter, self.options)) is not None},
            "cost_aware": _default_cost_aware(),  # drafters' rows; oracle rows always verify whole drafts
            "batch_size": 1,
            "llama_server_binary": self.llama_server,
        }

    @property
    def budget(self) -> int:
        """The engine's per-step draft budget: --draft-max, else chat's default."""
        return self.draft_max if self.draft_max is not None else DEFAULT_BUDGET


def _default_cost_aware() -> bool:
    from ..decoding.engine import GenerationConfig

    return GenerationConfig().cost_aware
