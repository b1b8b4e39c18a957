"""One generation's state as the engine's loop reads and changes it (`Run`: engine.py's `begin` makes one, its
stages step it, `close` ends it) and what it hands back (`Generation`). Plain data and the few reads the stages
share: the events sent on (`emit`), the committed tokens' log probabilities where asked (`logprobs`), the verify
rows where an end-of-text token may not end the answer yet (`barred`: `GenerationConfig.min_new_tokens`). Nothing
here runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from . import penalties
from .draft import Draft, Drafter, FinishReason, StepEvent
from .dry import Breakers, dry_rows
from .generation_config import GenerationConfig
from .grammar import Constraint
from .logprobs import token_logprobs
from .prompt_cache import PromptCache
from .stats import GenerationStats
from .step_parts import eos_barred

# Called with each event; a callback that returns True ends the generation after it (finish "length": cut short
# by its caller's limit, as a server's time limit for an answer).
EventCallback = Callable[[StepEvent], Optional[bool]]


@dataclass
class Generation:
    tokens: list[int]  # new tokens (EOS included when the target produced it, like transformers' generate)
    finish_reason: FinishReason
    stats: GenerationStats
    events: list[StepEvent] = field(default_factory=list)
    text_end: Optional[int] = None  # with a stop string: length of the decoded text before it
    cached_tokens: int = 0  # prompt tokens whose KV entries came from the prompt cache (not computed)


@dataclass
class Run:
    """One generation's state, as the loop's stages read and change it (Engine.begin makes one)."""

    config: GenerationConfig
    drafter: Drafter
    on_event: Optional[EventCallback]
    limit: Optional[int]  # the longest sequence the model and the forward's cache hold (None: unknown)
    max_rows: Optional[int]  # the largest row-invariant block (None: verification is not exact)
    context: list[int]  # the prompt and every committed token
    cache: Any
    cached: int  # prompt tokens the prompt cache held
    constraint: Optional[Constraint]
    generator: Optional[torch.Generator]
    eos: set[int]
    started: float
    prompt_cache: Optional[PromptCache] = None  # keeps the entries when the generation closes
    events: list[StepEvent] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    finish: Optional[FinishReason] = None
    text_end: Optional[int] = None
    ttft: float = 0.0
    computed: Optional[int] = None  # until the first token: the prompt's tokens in the cache (None after it)
    prompt_features: list[torch.Tensor] = field(default_factory=list)  # its pieces' [n, hidden], until then, where
    # the drafter reads features (Engine.step_many)
    dry_breakers: Optional[Breakers] = None  # config.dry's breakers as the tokenizer's tokens, when DRY is on
    _bias: Optional[torch.Tensor] = field(default=None, repr=False)  # [vocab] config.logit_bias, made when first used

    def emit(self, event: StepEvent) -> None:
        self.events.append(event)
        self.drafter.observe(event)
        if self.on_event is not None and self.on_event(event) and self.finish is None:
            self.finish = "length"

    def shaped(self, logits: torch.Tensor, draft: Optional[Draft] = None) -> torch.Tensor:
        """The target's logits [rows, vocab] as its choices read them, row r choosing the token after the context
        and the draft's path to node r - 1 (row 0: after the context alone): `config.logit_bias` added, then the
        repetition, presence and frequency penalties for the tokens that row counts (penalties.py), then DRY's
        (dry.py). So a drafted row is judged as plain decoding judges the same position. The same tensor when none
        is set."""
        config = self.config
        penalised = penalties.in_effect(config)
        if not config.logit_bias and not penalised and self.dry_breakers is None:
            return logits
        if config.logit_bias:
            if self._bias is None or self._bias.device != logits.device or self._bias.dtype != logits.dtype:
                bias = torch.zeros(logits.shape[-1], dtype=torch.float32)  # [vocab]
                for token, value in config.logit_bias:
                    bias[token] = value
                self._bias = bias.to(logits.device, logits.dtype)
            shaped = logits + self._bias
        else:
            shaped = logits.clone()  # (the penalties write into a copy, never into the forward's own tensor)
        if penalised:
            shaped = penalties.penalised(shaped, config, self.context, self.new_tokens, draft)
        if self.dry_breakers is not None and config.dry is not None:  # (after the penalties: llama.cpp's order)
            shaped = dry_rows(shaped, self.context, draft, config.dry, self.dry_breakers)
        return shaped

    def logprobs(self, rows: torch.Tensor, committed: list[int]) -> Optional[list]:
        """The committed tokens' log probabilities from the rows that chose them, where asked."""
        return None if self.config.logprobs is None else token_logprobs(rows, committed, self.config.logprobs)

    def barred(self, draft: Draft) -> list[int]:
        """The verify rows [k+1] of this draft where an end-of-text token may not be chosen yet: those choosing a
        token before the answer's `min_new_tokens`-th (none once the answer has as many)."""
        return eos_barred(draft, len(self.new_tokens), self.config.min_new_tokens)
