"""The settings of one generation: how many tokens, greedy or sampled, the draft budget, where to stop.

`GenerationConfig.check` refuses settings plain decoding could not honour, naming the setting. The engine reads
these settings and reports them back on the prefill's step event (draft.StepEvent.settings). This file holds
settings only; what they do is the engine's (engine.py), the planner's (planner.py) and sampling.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from ..defaults import DEFAULT_BUDGET, DEFAULT_MAX_NEW_TOKENS, MAX_NEW_TOKENS
from ..errors import SpecdecError

if TYPE_CHECKING:  # pragma: no cover
    from .dry import DryPenalty
    from .grammar import GrammarSpec


@dataclass
class GenerationConfig:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0  # 0 = greedy (exact); > 0 = speculative sampling (lossless)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    seed: Optional[int] = None
    # --draft-max, the one draft-length setting: the most draft tokens (chain) or nodes (tree) the engine verifies
    # per step, and every drafter's longest draft; None: not given, so the engine's DEFAULT_BUDGET and each
    # drafter's own default (drafters/spec.draft_length; model and eagle draft shorter)
    draft_max: Optional[int] = None
    stop: Sequence[str] = ()  # stop strings (need a tokenizer)
    eos_token_ids: Sequence[int] = ()
    cost_aware: bool = True  # verify only as much of each draft as is expected to pay off (planner.py)
    logprobs: Optional[int] = None  # report each token's log probability and this many alternatives (None: off)
    grammar: Optional["GrammarSpec"] = None  # every answer token keeps this grammar (grammar.py); None: free text
    # no end-of-text token is chosen before the answer has this many tokens (transformers' min_new_tokens: the EOS
    # logits at -inf, for the drafts' verification as for plain decoding); max_new_tokens or more: never
    min_new_tokens: int = 0
    # ((token id, bias), ...): each bias added to that token's logit in every choice, drafted or not (OpenAI's
    # logit_bias, -100..100; -100 all but bans the token); () = none
    logit_bias: tuple[tuple[int, float], ...] = ()
    # OpenAI's penalties, -2..2: each token's logit less presence_penalty if it occurs in the answer so far and
    # frequency_penalty times how often (the prompt not counted); 0 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # the repetition penalty (transformers' and vLLM's repetition_penalty, llama.cpp's repeat_penalty): the logit of
    # every token counted divided by it where positive, multiplied by it where not; 1 = off
    repetition_penalty: float = 1.0
    # which tokens the three penalties count. None: transformers', vLLM's and OpenAI's (the repetition penalty every
    # token of the prompt and the answer, presence and frequency the answer's alone); n: llama.cpp's repeat_last_n
    # (all three the last n tokens of the prompt and the answer together; -1: all of them; 0: no penalty at all)
    penalty_last_n: Optional[int] = None
    # llama.cpp's DRY: a token that would extend a repeated stretch of the context penalised (dry.py); None = off
    dry: Optional["DryPenalty"] = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def budget(self) -> int:
        """The engine's per-step budget: `draft_max`, or DEFAULT_BUDGET when it is not given."""
        return DEFAULT_BUDGET if self.draft_max is None else self.draft_max

    def check(self) -> None:
        from .sampling import check_sampling  # (torch: imported when a run is checked, not when the CLI loads)

        check_sampling(self.temperature, self.top_p, self.top_k, self.min_p)
        if self.max_new_tokens < 1:
            raise SpecdecError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}", setting="max_new_tokens")
        if self.max_new_tokens > MAX_NEW_TOKENS:
            raise SpecdecError(f"max_new_tokens must be at most {MAX_NEW_TOKENS:,}, got {self.max_new_tokens:,}",
                               setting="max_new_tokens")
        if self.budget < 0:
            raise SpecdecError(f"draft_max must be >= 0 (0 = no drafting), got {self.draft_max}", setting="draft_max")
        if self.seed is not None:
            check_seed(self.seed)
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise SpecdecError(f"logprobs must be in 0..20 (alternatives per token), got {self.logprobs}",
                               setting="logprobs")
        if not 0 <= self.min_new_tokens <= MAX_NEW_TOKENS:
            raise SpecdecError(f"min_new_tokens must be in 0..{MAX_NEW_TOKENS:,}, got {self.min_new_tokens:,}",
                               setting="min_new_tokens")
        if self.min_new_tokens and self.grammar is not None:  # (the grammar's end may allow end-of-text alone)
            raise SpecdecError("min_new_tokens cannot be combined with a grammar: a grammar decides where the answer "
                               "ends", setting="min_new_tokens")
        if any(not stop for stop in self.stop):
            raise SpecdecError("stop strings must not be empty", setting="stop")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:  # (NaN fails too)
                raise SpecdecError(f"{name} must be in [-2, 2] (0 = off), got {getattr(self, name)}", setting=name)
        if not 0.0 < self.repetition_penalty < float("inf"):  # (NaN fails too)
            raise SpecdecError(f"repetition_penalty must be a number > 0 (1 = off), got {self.repetition_penalty}",
                               setting="repetition_penalty")
        if self.penalty_last_n is not None and self.penalty_last_n < -1:
            raise SpecdecError(f"penalty_last_n must be >= -1 (-1: the whole context, 0: no penalties), got "
                               f"{self.penalty_last_n}", setting="penalty_last_n")
        if self.dry is not None:
            self.dry.check()
        for token, bias in self.logit_bias:
            if not isinstance(token, int) or token < 0 or not -100.0 <= bias <= 100.0:  # (NaN fails too)
                raise SpecdecError(f"logit_bias takes token ids >= 0 with biases in [-100, 100], got {token}: {bias}",
                                   setting="logit_bias")


def check_seed(seed: int) -> None:
    """A random seed torch takes and every command shares: a whole number in [0, 2^63); else one line."""
    if not 0 <= seed < 2**63:
        raise SpecdecError(f"seed must be between 0 and 2^63 - 1, got {seed}", setting="seed")
