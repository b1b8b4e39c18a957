"""Plain decoding of many prompts at once: each step, one forward over the newest token of every open answer.

On block weights a forward over 8 rows reads the weights once and costs 1.3-1.5x a forward over one (the kernels'
multi-row tiles), so answering several prompts together writes several times the tokens a second of answering
them one by one. Each prompt is computed alone, in the engine's own blocks (engine.prefill); then every step scores
each open answer's newest token in one forward over all of them (`ManyForward.many`: each row attends over its own
sequence's cache only, and every other computation is row-invariant), and each answer's token is chosen as plain
decoding chooses it (engine.choose: the argmax, or a sample with the answer's own seeded generator). So each answer
is, bit for bit, what plain decoding of its prompt alone writes with the same settings and seed
(tests/specdec_cli/decoding/test_plain_many.py compares them with the engine's). Answers that end leave and waiting
prompts join between steps (continuous batching), `width` open at a time.

What it does not do: drafting (the batch is the speedup), stop strings, or forwards that cannot score several
sequences in one call (distill/batched.py pads batches for transformers' models instead).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

import torch

from ..target_model.verify.forward import ManyForward
from .engine import choose, context_limit, generator_for, prefill
from .generation_config import GenerationConfig
from .step_parts import read_back

MAX_WIDTH = 32  # answers open at once: the native decoder's row-invariant rows (native.ROW_INVARIANT_ROWS)


@dataclass(frozen=True)
class BatchAnswer:
    index: int  # position of the prompt in the list given
    tokens: list[int]  # the answer, its EOS included when the model wrote one
    finish_reason: str  # "eos" or "length"


@dataclass
class _Open:
    """One answer being written: its prompt's index, prompt and answer so far, cache, budget and random source."""

    index: int
    context: list[int]
    cache: Any
    budget: int  # new tokens it may still take
    generator: Optional[torch.Generator]  # None when greedy
    tokens: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None

    def take(self, token: int, eos: set[int]) -> bool:
        """Append the target's choice; whether the answer has ended (at an EOS or its budget)."""
        self.tokens.append(token)
        self.context.append(token)
        if token in eos:
            self.finish_reason = "eos"
        elif len(self.tokens) >= self.budget:
            self.finish_reason = "length"
        return self.finish_reason is not None


def plain_many(forward: Any, prompts: Sequence[Sequence[int]], config: GenerationConfig, *, width: int,
               seeds: Optional[Sequence[int]] = None,
               on_answer: Optional[Callable[[BatchAnswer], None]] = None) -> list[BatchAnswer]:
    """Answer every prompt by plain decoding with `config` (its token budget, EOS tokens and sampling settings; stop
    strings are not read), at most `width` open at once, on a forward that scores several sequences per call.
    Sampled, prompt i's random source is seeded with seeds[i] (default: config.seed). `on_answer` is called for
    each answer as it ends (answers end in any order). Answers are bounded by the model's context as the engine
    bounds them."""
    if not isinstance(forward, ManyForward):
        raise TypeError("plain_many needs a forward that scores several sequences in one call")
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width must be 1..{MAX_WIDTH}, got {width}")
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    config.check()
    forward.prepare(1)  # the row-invariance check, once (a failed check warns, as in the engine)
    limit = context_limit(forward.model.config)
    eos = {int(token) for token in config.eos_token_ids}
    waiting = deque(range(len(prompts)))
    open_answers: list[_Open] = []
    answers: list[BatchAnswer] = []

    def finish(answer: _Open) -> None:
        done = BatchAnswer(answer.index, answer.tokens, answer.finish_reason or "length")
        answers.append(done)
        if on_answer is not None:
            on_answer(done)

    with torch.inference_mode():
        while waiting or open_answers:
            # 1. Join: waiting prompts take the free places, each prompt computed alone (its first token with it).
            while waiting and len(open_answers) < width:
                index = waiting.popleft()
                prompt = [int(token) for token in prompts[index]]
                if not prompt:
                    raise ValueError(f"prompt {index} is empty")
                budget = config.max_new_tokens if limit is None else min(config.max_new_tokens, limit - len(prompt))
                if budget < 1:
                    raise ValueError(f"prompt {index} fills the model's context ({limit} tokens)")
                seeded = config if seeds is None else replace(config, seed=int(seeds[index]))
                answer = _Open(index, prompt, forward.new_cache(), budget, generator_for(seeded))
                logits, _ = prefill(forward, prompt, answer.cache)  # [1, vocab]
                if answer.take(choose(logits[-1], answer.generator, config), eos):
                    finish(answer)
                else:
                    open_answers.append(answer)
            if not open_answers:
                continue
            # 2. Step: every open answer's newest token, after its own cache, in one forward.
            scores = forward.many([([answer.context[-1]], answer.cache, len(answer.context) - 1)
                                   for answer in open_answers])
            if config.greedy:  # each row's argmax, read as plain decoding reads it
                logits = torch.cat([score.logits for score in scores])  # [open, vocab]
                chosen = read_back(logits, True, False)[0] or []
            else:  # each answer's own sample, from its own random source
                chosen = [choose(score.logits[0], answer.generator, config)
                          for score, answer in zip(scores, open_answers)]
            # 3. Leave: answers that ended free their places (and their caches).
            still_open = []
            for answer, token in zip(open_answers, chosen):
                if answer.take(int(token), eos):
                    finish(answer)
                else:
                    still_open.append(answer)
            open_answers = still_open
    return answers
