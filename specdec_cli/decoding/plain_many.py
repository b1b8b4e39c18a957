"""Plain decoding of many prompts at once: each step, one forward over the newest token of every open answer (the
engine's batched step, batch.py: one implementation of batching, for the server's slots and for this).

On block weights a forward over 8 rows reads the weights once and costs 1.3-1.5x a forward over one (the kernels'
multi-row tiles), so answering several prompts together writes several times the tokens a second of answering
them one by one. Each prompt is computed in pieces in the rows the open answers leave (batch.py); then every step
scores each open answer's newest token in one forward over all of them (Engine.step_many, `ManyForward.many`: each row
attends over its own sequence's cache only, and every other computation is row-invariant), and each answer's
token is chosen as plain decoding chooses it (the argmax, or a sample with the answer's own seeded generator). So
each answer is, bit for bit, what plain decoding of its prompt alone writes with the same settings and seed
(tests/specdec_cli/decoding/test_plain_many.py compares them with the engine's). Answers that end leave and waiting
prompts join between steps (continuous batching), `width` open at a time.

With `keep_features`, each answer also hands back the target's last hidden states along its prompt and answer,
which every forward computes anyway (a head's training reads them: distill/answer_features.py), its prompt's
from the pieces it was computed in.

What it does not do: drafting (the batch is the speedup), stop strings, or forwards that cannot score several
sequences in one call (distill/batched.py pads batches for transformers' models instead).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from ..target_model.verify.forward import ManyForward
from .batch import Batch
from .draft import Needs, NoDrafter, StepEvent
from .engine import Engine
from .generation_config import GenerationConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

MAX_WIDTH = 32  # answers open at once: the native decoder's row-invariant rows (native.ROW_INVARIANT_ROWS)


@dataclass(frozen=True)
class BatchAnswer:
    index: int  # position of the prompt in the list given
    tokens: list[int]  # the answer, its EOS included when the model wrote one
    finish_reason: str  # "eos" or "length"
    # with keep_features: the target's last hidden states (bfloat16) at every position of prompt + answer but the
    # last, [len(prompt) + len(tokens) - 1, hidden] (the newest token is never scored)
    features: Optional[torch.Tensor] = None


class FeatureKeeper(NoDrafter):
    """Plain decoding that keeps what each forward scored: the target's last hidden states of every committed token
    but the newest (the prefill's prompt rows, then one row a step), in bfloat16."""

    needs = Needs(features=True)

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []

    def observe(self, event: StepEvent) -> None:
        import torch

        if event.features is not None:  # (a copy: the forward's buffers are used again)
            self.rows.append(event.features.detach().to(torch.bfloat16, copy=True))

    def features(self) -> Optional[torch.Tensor]:
        import torch

        return torch.cat(self.rows) if self.rows else None


def plain_many(forward: Any, prompts: Sequence[Sequence[int]], config: GenerationConfig, *, width: int,
               seeds: Optional[Sequence[int]] = None, on_answer: Optional[Callable[[BatchAnswer], None]] = None,
               keep_features: bool = False) -> list[BatchAnswer]:
    """Answer every prompt by plain decoding with `config` (its token budget, EOS tokens and sampling settings; stop
    strings are not read), at most `width` open at once, on a forward that scores several sequences per call.
    Sampled, prompt i's random source is seeded with seeds[i] (default: config.seed). `on_answer` is called for
    each answer as it ends (answers end in any order). Answers are bounded by the model's context as the engine
    bounds them. `keep_features`: each answer carries its `features` (FeatureKeeper's)."""
    if not isinstance(forward, ManyForward):
        raise TypeError("plain_many needs a forward that scores several sequences in one call")
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width must be 1..{MAX_WIDTH}, got {width}")
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    config.check()
    plain = replace(config, draft_max=0, stop=(), cost_aware=False)  # no drafts, no stop strings, no timing
    engine = Engine(forward)
    limit = engine.context
    waiting = deque(range(len(prompts)))
    batch, indices, answers = Batch(engine), {}, []

    def finish(index: int, run: Any) -> None:
        generation = batch.close(run)
        kept = run.drafter.features() if keep_features else None
        done = BatchAnswer(index, generation.tokens, generation.finish_reason, kept)
        answers.append(done)
        if on_answer is not None:
            on_answer(done)

    while waiting or len(batch):
        # 1. Join: waiting prompts take the free places (each computed a piece a step, its first token with the last).
        while waiting and len(batch) < width:
            index = waiting.popleft()
            prompt = [int(token) for token in prompts[index]]
            if not prompt:
                raise ValueError(f"prompt {index} is empty")
            if limit is not None and len(prompt) >= limit:
                raise ValueError(f"prompt {index} fills the model's context ({limit} tokens)")
            seeded = plain if seeds is None else replace(plain, seed=int(seeds[index]))
            run = batch.add(prompt, FeatureKeeper() if keep_features else NoDrafter(), seeded)
            indices[id(run)] = index
            if run.finish is not None:
                finish(index, run)
        # 2. Step: every open answer's newest token, after its own cache, in one forward; 3. answers that ended
        # leave (and free their caches).
        for run in batch.step():
            finish(indices[id(run)], run)
    return answers
