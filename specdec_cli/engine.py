"""The draft-then-verify loop: prefill, then steps of draft -> one verify forward -> accept -> commit.

The engine owns the target model and its KV cache. Invariant between steps: the cache holds every committed
token except the newest one, which the next verify forward scores together with the draft. A drafter sees
the committed context and a length budget; it learns what happened from the `StepEvent` the engine emits
after every forward (the same events feed displays and statistics). Acceptance math lives in verify.py,
distribution warping in sampling.py; this file only wires them to the model. It does not format prompts
or print anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from .budget import AcceptanceTracker, CostCurve, load_or_measure
from .draft import Draft, StepEvent
from .drafters.base import Drafter
from .errors import SpecdecError
from .sampling import check_sampling, sample, warp_probs
from .stats import GenerationStats, summarize
from .verify import greedy_accept, speculative_accept

EventCallback = Callable[[StepEvent], None]


@dataclass
class GenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy (exact); > 0 = speculative sampling (lossless)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: Optional[int] = None
    draft_max: int = 8  # the length budget handed to the drafter each step
    stop: Sequence[str] = ()  # stop strings (need a tokenizer)
    eos_token_ids: Sequence[int] = ()
    cost_aware: bool = True  # verify only as much of each draft as is expected to pay off (budget.py)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check(self) -> None:
        check_sampling(self.temperature, self.top_p, self.top_k)
        if self.max_new_tokens < 1:
            raise SpecdecError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.draft_max < 0:
            raise SpecdecError(f"--draft-max must be >= 0, got {self.draft_max}")


@dataclass
class Generation:
    tokens: list[int]  # new tokens (EOS included when the target produced it, like transformers' generate)
    finish_reason: str  # "eos" | "stop" | "length"
    stats: GenerationStats
    events: list[StepEvent] = field(default_factory=list)
    text_end: Optional[int] = None  # with a stop string: length of the decoded text before it


class Engine:
    """Speculative generation with one target model (batch size 1)."""

    def __init__(self, model: Any, tokenizer: Any = None):
        self.model = model
        self.tokenizer = tokenizer  # only needed for stop strings
        self.device = next(model.parameters()).device
        self.acceptance = AcceptanceTracker()  # lives as long as the engine: a chat session learns
        self._cost: Optional[CostCurve] = None

    # -- the model, one forward at a time ------------------------------------------------------------------

    def _forward(self, token_ids: Sequence[int], cache: Any, start: int, last_only: bool = False) -> torch.Tensor:
        """Score token_ids placed at positions start.. after the cached prefix; returns logits [n, vocab]."""
        input_ids = torch.tensor([list(token_ids)], device=self.device)  # [1, n]
        position_ids = torch.arange(start, start + len(token_ids), device=self.device).unsqueeze(0)  # [1, n]
        kwargs = {"logits_to_keep": 1} if last_only else {}
        out = self.model(input_ids=input_ids, position_ids=position_ids, past_key_values=cache, use_cache=True, **kwargs)
        return out.logits[0]  # [n, vocab] (or [1, vocab] with last_only)

    @staticmethod
    def _truncate_cache(cache: Any, length: int) -> None:
        """Roll the KV cache back to `length` tokens (drop the rejected drafts)."""
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)

    # -- the loop ------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        drafter: Drafter,
        config: GenerationConfig,
        on_event: Optional[EventCallback] = None,
    ) -> Generation:
        from transformers import DynamicCache

        config.check()
        if not prompt_ids:
            raise SpecdecError("the prompt is empty")
        if config.stop and self.tokenizer is None:
            raise SpecdecError("stop strings need the target's tokenizer")
        generator = None
        if not config.greedy:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(config.seed if config.seed is not None else torch.seed())
        eos = set(config.eos_token_ids)
        events: list[StepEvent] = []
        context = list(prompt_ids)
        new_tokens: list[int] = []
        cache = DynamicCache()

        def emit(event: StepEvent) -> None:
            events.append(event)
            drafter.observe(event)
            if on_event is not None:
                on_event(event)

        started = time.perf_counter()
        # Prefill: the whole prompt in one forward; its last logits give the first new token.
        logits = self._forward(context, cache, 0, last_only=True)  # [1, vocab]
        first = self._choose(logits[-1], generator, config)
        ttft = time.perf_counter() - started
        finish, committed, text_end = self._commit(context, new_tokens, [first], eos, config)
        emit(StepEvent("prefill", Draft.empty("prefill"), 0, committed, first, context_len=len(context),
                       verify_seconds=ttft, prompt_tokens=tuple(prompt_ids), settings=config, finished=finish))

        while finish is None:
            budget = min(config.draft_max, config.max_new_tokens - len(new_tokens) - 1)
            # 1. Draft: the drafter guesses up to `budget` tokens after the committed context.
            t0 = time.perf_counter()
            draft = drafter.propose(context, budget) if budget > 0 else Draft.empty(drafter.name)
            if config.cost_aware and len(draft):
                key = self.acceptance.key(draft.source, draft.match_len)
                budget = self.acceptance.plan(key, self.cost_curve(), min(budget, len(draft)))
            draft = _trim(draft, budget)
            t1 = time.perf_counter()
            # 2. Verify: score the newest committed token and the whole draft in one forward.
            logits = self._forward([context[-1], *draft.tokens], cache, len(context) - 1)  # [k+1, vocab]
            # 3. Accept: the longest acceptable prefix, then the target's own token after it.
            if config.greedy:
                target_argmax = logits.argmax(dim=-1).tolist()  # [k+1]
                accepted = greedy_accept(draft.tokens, target_argmax)
                target_token = target_argmax[accepted]
            else:
                p_target = warp_probs(logits, config.temperature, config.top_k, config.top_p)  # [k+1, vocab]
                p_draft = None if draft.p_draft is None else draft.p_draft.to(p_target.device, torch.float32)
                accepted, target_token = speculative_accept(draft.tokens, p_target, p_draft, generator)
            # 4. Commit accepted drafts + the correction/bonus token; roll the cache back to match.
            finish, committed, text_end = self._commit(
                context, new_tokens, [*draft.tokens[:accepted], target_token], eos, config
            )
            self._truncate_cache(cache, len(context) - 1)
            t2 = time.perf_counter()
            if config.cost_aware and len(draft):
                self.acceptance.record(key, len(draft), accepted)
                self._cost.observe(len(draft) + 1, t2 - t1)
            emit(StepEvent("step", draft, accepted, committed, target_token, list(range(accepted)), len(context),
                           draft_seconds=t1 - t0, verify_seconds=t2 - t1, finished=finish))

        wall = time.perf_counter() - started
        stats = summarize(events, wall_seconds=wall, ttft_seconds=ttft)
        return Generation(new_tokens, finish, stats, events, text_end)

    def cost_curve(self) -> CostCurve:
        """t(n) for this model on this device: from the cache under $SPECDEC_HOME, else measured now (~1 s)."""
        if self._cost is None:
            self._cost = load_or_measure(self._cost_cache_file(), lambda: self._forward_timer())
        return self._cost

    def _cost_cache_file(self):
        import hashlib

        from .models import specdec_home

        name = getattr(self.model.config, "_name_or_path", "") or ""
        if not name:  # an in-memory model (tests): measure, but do not cache on disk
            return None
        params = sum(p.numel() for p in self.model.parameters())
        dtype = next(self.model.parameters()).dtype
        key = f"{name}|{params}|{self.device}|{dtype}|{torch.get_num_threads()}|{torch.__version__}"
        return specdec_home() / "costs" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"

    def _forward_timer(self, prefix: int = 256) -> Callable[[int], float]:
        """A function n -> seconds of one forward of n new tokens after a `prefix`-token cache."""
        from transformers import DynamicCache

        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, self.model.config.vocab_size, (prefix + 64,), generator=generator).tolist()
        cache = DynamicCache()
        with torch.inference_mode():
            self._forward(ids[:prefix], cache, 0, last_only=True)

        @torch.inference_mode()
        def timed(tokens: int) -> float:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            self._forward(ids[prefix : prefix + tokens], cache, prefix)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - started
            self._truncate_cache(cache, prefix)
            return elapsed

        return timed

    def _choose(self, logits: torch.Tensor, generator: Optional[torch.Generator], config: GenerationConfig) -> int:
        """The target's own choice from one row of logits [vocab], as plain decoding makes it."""
        if config.greedy:
            return int(logits.argmax())
        return sample(warp_probs(logits, config.temperature, config.top_k, config.top_p), generator)

    def _commit(
        self, context: list[int], new_tokens: list[int], tokens: list[int], eos: set[int], config: GenerationConfig
    ) -> tuple[Optional[str], list[int], Optional[int]]:
        """Append tokens, cutting at EOS, at the token budget or at a stop string; returns (finish, committed, text_end)."""
        committed: list[int] = []
        finish: Optional[str] = None
        for token in tokens:
            committed.append(token)
            if token in eos:
                finish = "eos"
                break
            if len(new_tokens) + len(committed) >= config.max_new_tokens:
                finish = "length"
                break
        text_end = None
        if config.stop:
            keep, text_end = self._find_stop(new_tokens, committed, config.stop)
            if text_end is not None:
                committed, finish = committed[:keep], "stop"
        context.extend(committed)
        new_tokens.extend(committed)
        return finish, committed, text_end

    def _find_stop(self, before: list[int], committed: list[int], stops: Sequence[str]) -> tuple[int, Optional[int]]:
        """Where the first stop string begins in the decoded output, and how many committed tokens reach it."""
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        text = decode(before + committed)
        hits = [text.find(stop) for stop in stops if stop and stop in text]
        if not hits:
            return len(committed), None
        cut = min(hits)
        for keep in range(len(committed) + 1):  # the shortest prefix whose text reaches past the stop's start
            if len(decode(before + committed[:keep])) > cut:
                return keep, cut
        return len(committed), cut


def _trim(draft: Draft, length: int) -> Draft:
    """The first `length` tokens of a chain draft (a drafter over budget is cut, never trusted)."""
    if len(draft) <= length:
        return draft
    p_draft = None if draft.p_draft is None else draft.p_draft[:length]
    return Draft(draft.tokens[:length], draft.source, None, p_draft, draft.match_len)
