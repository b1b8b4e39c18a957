"""`specdec bench`: plain decoding and drafters on the same prompts in one process, measured as the field does.

Conventions (algorithms.md section 7, after Spec-Bench): batch size 1, greedy by default, a warm-up excluded,
the baseline (`none`, plain decoding through the same engine) in the same run on the same prompts.

- Methods run interleaved conversation by conversation (every method on prompt 1, then every method on
  prompt 2, ...), so drift in the machine's speed hits all of them alike. `--repeats N` repeats each
  method on each conversation N times in a row before moving on.
- Each method gets a fresh drafter per conversation; the drafter lives across the turns of that
  conversation. Turn k+1 follows the *baseline's* answer to turn k, so every method sees the same prompts.
- Drafter rows run with the engine's own defaults (chat's draft budget of 8 without --draft-max, and its
  cost-aware trimming of drafts, whose acceptance memory starts fresh per conversation and whose verify-cost
  curve is measured before any timing). Oracle rows switch the trimming off: they verify every drafted token.
- Reference rows: `hf` is transformers' own `generate` (greedy), `hf-pld` its prompt lookup decoding with
  `prompt_lookup_num_tokens=10`. Oracle rows (`oracle-K`) replay the baseline's output with K-token drafts:
  the best speedup this machine allows at that draft length.
- Metrics per method, per category and overall (the pooled sum of every category):
  tokens/s = new tokens / wall seconds (totals); speedup = tokens/s of the method / tokens/s of `none` on the
  same prompts; mean accepted tokens (tau) = tokens committed per target forward, the target's own token
  included; acceptance rate = accepted / drafted tokens; per-position acceptance from pooled counts; shares
  of the wall time spent drafting and verifying (the prefill counts as verifying); mean time to first token;
  for greedy runs, how many outputs are token-identical to the baseline's first repeat.

This module prints nothing and imports neither Typer nor Rich: progress goes through a callback. torch and
transformers are imported inside functions only.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from .drafters import DRAFTERS, DrafterOptions, is_drafter
from .errors import SpecdecError
from .files import write_atomic
from .prompts import Conversation, categories_of
from .stats import GenerationStats

BASELINE = "none"
REFERENCES = {
    "hf": "transformers generate, greedy: plain decoding outside specdec",
    "hf-pld": "transformers prompt lookup decoding, prompt_lookup_num_tokens=10",
}
HF_PLD_TOKENS = 10
ORACLE = "oracle"
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_ORACLE_LENGTHS = (2, 4, 8, 16)
DEFAULT_ENGINE_DRAFT_MAX = 8  # the engine's budget without --draft-max, as in `specdec chat`
WARMUP_MAX_NEW_TOKENS = 16
OVERALL = "overall"

RESULT_FIELDS = (
    "method", "category", "prompts", "turns", "new_tokens", "seconds", "tokens_per_second",
    "tokens_per_second_std", "speedup", "speedup_std", "mean_accepted_tokens", "acceptance_rate",
    "per_position_acceptance", "draft_share", "verify_share", "ttft_seconds", "identical", "compared",
    "steps", "drafted_tokens", "accepted_tokens",
)


# ------------------------------------------------------------------------------------------------ methods


@dataclass(frozen=True)
class Method:
    name: str  # the row label: none, pld, sam, oracle-8, hf, hf-pld
    kind: str  # "engine" (a registered drafter), "oracle", or "hf" (transformers generate)
    draft_length: int = 0  # oracle: tokens per draft

    @property
    def drafter(self) -> str:
        return self.name if self.kind == "engine" else ""


def split_names(text: Optional[str | Sequence[str]]) -> list[str]:
    """'none, pld,sam' -> ['none', 'pld', 'sam'] (lists of such strings are flattened)."""
    if text is None:
        return []
    parts = [text] if isinstance(text, str) else list(text)
    return [name.strip().lower() for part in parts for name in str(part).split(",") if name.strip()]


def parse_lengths(text: Optional[str | Sequence[int]]) -> list[int]:
    if text is None:
        return []
    items = split_names(text) if isinstance(text, str) else [str(item) for item in text]
    lengths: list[int] = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise SpecdecError(f"--oracle-lengths takes whole numbers such as 2,4,8, got {item!r}") from None
        if value < 1:
            raise SpecdecError(f"--oracle-lengths must be >= 1, got {value}")
        if value not in lengths:
            lengths.append(value)
    return lengths


def resolve_methods(
    drafters: Sequence[str], references: Sequence[str] = (), oracle_lengths: Sequence[int] = ()
) -> list[Method]:
    """The method list in running order: `none` first (always), drafters, oracle rows, reference rows.

    `hf` and `hf-pld` may be named among the drafters or the references alike."""
    engine: list[str] = []
    refs: list[str] = []
    for name in [*drafters, *references]:
        if name in REFERENCES:
            if name not in refs:
                refs.append(name)
        elif is_drafter(name):
            if name not in engine:
                engine.append(name)
        elif name == ORACLE or name.startswith(ORACLE + "-"):
            raise SpecdecError("oracle rows come from --oracle (and --oracle-lengths), not from --drafters")
        else:
            choices = ", ".join([*DRAFTERS, "sam+AUX", *REFERENCES])
            raise SpecdecError(f"unknown method {name!r}; choose from: {choices}")
    names = [BASELINE] + [name for name in engine if name != BASELINE]
    methods = [Method(name, "engine") for name in names]
    methods += [Method(f"{ORACLE}-{length}", ORACLE, length) for length in oracle_lengths]
    methods += [Method(name, "hf") for name in refs]
    return methods


# ------------------------------------------------------------------------------------------------ settings


@dataclass
class BenchSettings:
    methods: list[Method] = field(default_factory=lambda: resolve_methods([BASELINE]))
    options: DrafterOptions = field(default_factory=DrafterOptions)
    draft_max: Optional[int] = None  # engine budget per step; None = the chat default (8)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0  # 0 = greedy, with the identity check; > 0 = lossless sampling, no check
    seed: Optional[int] = None
    repeats: int = 1
    warmup: bool = True
    raw: bool = False  # prompts without the chat template

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check(self) -> None:
        if not self.methods or self.methods[0].name != BASELINE:
            raise SpecdecError("the method list must start with the baseline `none`")
        if not self.temperature >= 0.0:
            raise SpecdecError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.max_new_tokens < 1:
            raise SpecdecError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.draft_max is not None and self.draft_max < 1:
            raise SpecdecError(f"--draft-max must be >= 1, got {self.draft_max}")
        if self.repeats < 1:
            raise SpecdecError(f"--repeats must be >= 1, got {self.repeats}")
        if self.options.l_threshold < 0:
            raise SpecdecError(f"--l-threshold must be >= 0, got {self.options.l_threshold}")

    def as_json(self) -> dict:
        return {
            "baseline": BASELINE,
            "methods": [method.name for method in self.methods],
            "drafters": [method.name for method in self.methods if method.kind == "engine"],
            "oracle_lengths": [method.draft_length for method in self.methods if method.kind == ORACLE],
            "references": [method.name for method in self.methods if method.kind == "hf"],
            "draft_max": self.draft_max,
            "engine_draft_max": self.engine_draft_max,
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
            "draft_min_prob": self.options.draft_min_prob,
            "cost_aware": _default_cost_aware(),  # drafters' rows; oracle rows always verify whole drafts
            "batch_size": 1,
        }

    @property
    def engine_draft_max(self) -> int:
        return self.draft_max if self.draft_max is not None else DEFAULT_ENGINE_DRAFT_MAX


# ------------------------------------------------------------------------------------------------ records


@dataclass
class TurnRun:
    """One generation: one method, one turn of one conversation, one repeat."""

    method: str
    conversation: int  # index in the suite
    prompt_id: str
    category: str
    turn: int  # 0-based
    repeat: int  # 0-based
    prompt_tokens: int
    tokens: list[int]
    seconds: float  # wall time around the generate call
    ttft_seconds: Optional[float]
    finish_reason: str
    stats: Optional[GenerationStats] = None  # engine methods only


@dataclass
class ProgressEvent:
    done: int  # units finished (a unit = one method on one conversation, warm-ups included)
    total: int
    method: str
    prompt_id: str
    category: str
    repeat: int
    phase: str  # "warmup" | "run" | "done"


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass
class BenchReport:
    environment: dict
    settings: dict
    results: list[dict]
    per_prompt: list[dict]
    runs: list[TurnRun] = field(default_factory=list, repr=False)

    def as_json(self) -> dict:
        return {
            "environment": self.environment,
            "settings": self.settings,
            "results": self.results,
            "per_prompt": self.per_prompt,
        }


# ------------------------------------------------------------------------------------------------ running


def run_bench(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[Conversation],
    settings: BenchSettings,
    *,
    model_name: Optional[str] = None,
    device: Optional[str] = None,
    dtype: Any = None,
    suite: str = "",
    on_progress: Optional[ProgressCallback] = None,
) -> BenchReport:
    """Run every method on every conversation (interleaved) and aggregate; `suite` names the prompts' source."""
    settings.check()
    if not conversations:
        raise SpecdecError("no prompts to run (check --categories and --limit)")
    started = datetime.now(timezone.utc)
    runner = _Runner(model, tokenizer, settings)
    runner.check_drafters()
    runner.calibrate()
    methods = settings.methods
    units = len(conversations) * len(methods) * settings.repeats
    total = units + (len(methods) if settings.warmup else 0)
    done = 0

    def report(method: str, conversation: Conversation, repeat: int, phase: str) -> None:
        if on_progress is not None:
            on_progress(ProgressEvent(done, total, method, conversation.id, conversation.category, repeat, phase))

    if settings.warmup:
        for method in methods:
            report(method.name, conversations[0], 0, "warmup")
            runner.warm_up(method, conversations[0])
            done += 1
    runs: list[TurnRun] = []
    for index, conversation in enumerate(conversations):
        for repeat in range(settings.repeats):
            for method in methods:
                report(method.name, conversation, repeat, "run")
                runs += runner.run_conversation(method, index, conversation, repeat)
                done += 1
    if on_progress is not None:
        last = conversations[-1]
        on_progress(ProgressEvent(done, total, methods[-1].name, last.id, last.category, settings.repeats - 1, "done"))

    categories = categories_of(conversations)
    results = aggregate(runs, [method.name for method in methods], categories, settings.repeats, settings.greedy)
    per_prompt = per_prompt_rows(runs, [method.name for method in methods], settings.greedy)
    env = environment(model_name or _model_name(model), device or str(runner.device), dtype or _model_dtype(model),
                      started)
    settings_json = settings.as_json()
    settings_json.update(
        prompts=suite,
        categories=categories,
        conversations=len(conversations),
        turns=sum(len(conversation.turns) for conversation in conversations),
    )
    return BenchReport(env, settings_json, results, per_prompt, runs)


class _Runner:
    """Holds the model, the engine and the per-conversation state (prompt ids, the baseline's answers)."""

    def __init__(self, model: Any, tokenizer: Any, settings: BenchSettings):
        from .chat import target_info
        from .engine import Engine

        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.engine = Engine(model, tokenizer)
        self.device = self.engine.device
        self.info = target_info(model, tokenizer)
        self.prompt_ids: dict[int, list[list[int]]] = {}  # conversation -> prompt ids per turn
        self.references: dict[int, list[list[int]]] = {}  # conversation -> baseline tokens per turn (repeat 0)
        self.warmup_reference: list[int] = []  # the baseline's warm-up output, replayed by oracle warm-ups

    # -- pieces --------------------------------------------------------------------------------------------

    def check_drafters(self) -> None:
        """Build each drafter once before the run, so a bad index or draft model fails in the first second."""
        for method in self.settings.methods:
            if method.kind == "engine":
                self._drafter(method, [])

    def _drafter(self, method: Method, references: list[list[int]]):
        from .drafters import make_drafter
        from .drafters.oracle import OracleDrafter

        if method.kind == ORACLE:
            return OracleDrafter(references, method.draft_length)
        return make_drafter(method.drafter, self.settings.options, self.info)

    def _config(self, method: Method, conversation: int, turn: int, max_new_tokens: Optional[int] = None):
        from .engine import GenerationConfig

        settings = self.settings
        seed = None if settings.seed is None else settings.seed + 1000 * conversation + turn
        draft_max = method.draft_length if method.kind == ORACLE else settings.engine_draft_max
        extra = {}
        if method.kind == ORACLE:
            extra["cost_aware"] = False  # the ceiling at exactly this draft length: verify every drafted token
        config = GenerationConfig(
            max_new_tokens=max_new_tokens or settings.max_new_tokens,
            temperature=settings.temperature,
            seed=seed,
            draft_max=draft_max,
            eos_token_ids=self.info.eos_token_ids,
            **extra,
        )
        config.check()
        return config

    def calibrate(self) -> None:
        """Whatever the engine measures once per model (its verify-cost curve) is measured now, untimed."""
        drafts = any(method.kind == "engine" and method.name != BASELINE for method in self.settings.methods)
        if drafts:
            self.engine.cost_curve()

    def _fresh_learning(self) -> None:
        """The engine's per-source acceptance memory starts empty for each conversation, like the drafter:
        results do not depend on the order of the prompts."""
        self.engine.forget()

    def _format(self, messages: list[dict]) -> list[int]:
        from .chat import format_prompt

        return format_prompt(self.tokenizer, messages, self.settings.raw)

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _sync(self) -> None:
        if getattr(self.device, "type", str(self.device)) == "cuda":
            import torch

            torch.cuda.synchronize()

    # -- one generation ------------------------------------------------------------------------------------

    def _generate(self, method: Method, prompt_ids: list[int], drafter: Any, config: Any):
        """-> (tokens, seconds, ttft, finish_reason, stats)"""
        if method.kind == "hf":
            return self._hf_generate(prompt_ids, config, pld=method.name == "hf-pld")
        self._sync()
        started = time.perf_counter()
        generation = self.engine.generate(prompt_ids, drafter, config)
        self._sync()
        seconds = time.perf_counter() - started
        stats = generation.stats
        return generation.tokens, seconds, stats.ttft_seconds, generation.finish_reason, stats

    def _hf_generate(self, prompt_ids: list[int], config: Any, pld: bool):
        import torch
        from transformers.generation.streamers import BaseStreamer

        class FirstTokenClock(BaseStreamer):
            """generate() puts the prompt first, then new tokens: the second put is the first token."""

            def __init__(self) -> None:
                self.calls = 0
                self.at: Optional[float] = None

            def put(self, value: Any) -> None:
                self.calls += 1
                if self.calls == 2 and self.at is None:
                    self.at = time.perf_counter()

            def end(self) -> None:
                pass

        eos = list(config.eos_token_ids)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
        kwargs: dict = dict(max_new_tokens=config.max_new_tokens, min_new_tokens=0, eos_token_id=eos or None,
                            pad_token_id=pad, use_cache=True)
        if config.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=config.temperature, top_p=1.0, top_k=0)
            if config.seed is not None:
                torch.manual_seed(config.seed)
        if pld:
            kwargs["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
        input_ids = torch.tensor([prompt_ids], device=self.device)  # [1, n]
        clock = FirstTokenClock()
        self._sync()
        with torch.inference_mode():
            started = time.perf_counter()
            output = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), streamer=clock, **kwargs)
            tokens = output[0, len(prompt_ids):].tolist()
            self._sync()
            seconds = time.perf_counter() - started
        ttft = clock.at - started if clock.at is not None else None
        finish = "eos" if tokens and tokens[-1] in eos else "length"
        return tokens, seconds, ttft, finish, None

    # -- a conversation ------------------------------------------------------------------------------------

    def run_conversation(self, method: Method, index: int, conversation: Conversation, repeat: int) -> list[TurnRun]:
        """All turns of one conversation with one method. The first baseline run builds the prompts: turn k+1
        is the conversation so far with the baseline's answers, so every method sees the same prompts."""
        building = index not in self.prompt_ids
        if building and method.name != BASELINE:
            raise RuntimeError("the baseline must run first on every conversation")
        drafter = None if method.kind == "hf" else self._drafter(method, self.references.get(index, []))
        self._fresh_learning()
        runs = []
        history: list[dict] = []
        prompts: list[list[int]] = [] if building else self.prompt_ids[index]
        for turn, user_text in enumerate(conversation.turns):
            if building:
                history.append({"role": "user", "content": user_text})
                prompts.append(self._format(history))
            prompt_ids = prompts[turn]
            config = self._config(method, index, turn)
            tokens, seconds, ttft, finish, stats = self._generate(method, prompt_ids, drafter, config)
            if building:
                history.append({"role": "assistant", "content": self._decode(tokens)})
                self.references.setdefault(index, []).append(list(tokens))
            runs.append(TurnRun(method.name, index, conversation.id, conversation.category, turn, repeat,
                                len(prompt_ids), list(tokens), seconds, ttft, finish, stats))
        if building:
            self.prompt_ids[index] = prompts
        return runs

    def warm_up(self, method: Method, conversation: Conversation) -> None:
        """One short generation on the first turn of the first prompt; nothing is recorded."""
        prompt_ids = self._format([{"role": "user", "content": conversation.turns[0]}])
        config = self._config(method, 0, 0, max_new_tokens=min(WARMUP_MAX_NEW_TOKENS, self.settings.max_new_tokens))
        references = [self.warmup_reference] if self.warmup_reference else []
        drafter = None if method.kind == "hf" else self._drafter(method, references)
        self._fresh_learning()
        tokens, *_ = self._generate(method, prompt_ids, drafter, config)
        if method.name == BASELINE:
            self.warmup_reference = list(tokens)


def _default_cost_aware() -> bool:
    from .engine import GenerationConfig

    return GenerationConfig().cost_aware


# ------------------------------------------------------------------------------------------------ metrics


def first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> Optional[int]:
    """Index of the first token that differs from the reference (a length difference counts); None if equal."""
    for position, (token, expected) in enumerate(zip(tokens, reference)):
        if token != expected:
            return position
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def _references(runs: Iterable[TurnRun]) -> dict[tuple[int, int], list[int]]:
    return {(run.conversation, run.turn): run.tokens for run in runs if run.method == BASELINE and run.repeat == 0}


def _ratio(numerator: float, denominator: float) -> Optional[float]:
    return numerator / denominator if denominator else None


def _std(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _per_repeat(runs: Sequence[TurnRun]) -> dict[int, tuple[int, float]]:
    totals: dict[int, tuple[int, float]] = {}
    for run in runs:
        tokens, seconds = totals.get(run.repeat, (0, 0.0))
        totals[run.repeat] = (tokens + len(run.tokens), seconds + run.seconds)
    return totals


def _mean_count(total: float, repeats: int) -> float | int:
    value = total / repeats
    return int(value) if float(value).is_integer() else value


def _pooled_stats(runs: Sequence[TurnRun]) -> Optional[dict]:
    """Engine statistics pooled over generations from the raw counts; None for transformers rows."""
    stats = [run.stats for run in runs if run.stats is not None]
    if not stats:
        return None
    steps = sum(item.steps for item in stats)
    committed = sum(round(item.mean_accepted_tokens * item.steps) for item in stats)
    drafted = sum(item.drafted_tokens for item in stats)
    accepted = sum(item.accepted_tokens for item in stats)
    width = max((len(item.position_drafted) for item in stats), default=0)
    position_drafted = [0] * width
    position_accepted = [0] * width
    for item in stats:
        for position, (n_drafted, n_accepted) in enumerate(zip(item.position_drafted, item.position_accepted)):
            position_drafted[position] += n_drafted
            position_accepted[position] += n_accepted
    return {
        "steps": steps,
        "mean_accepted_tokens": _ratio(committed, steps),
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": _ratio(accepted, drafted),
        "per_position_acceptance": [a / d if d else 0.0 for a, d in zip(position_accepted, position_drafted)],
        "draft_seconds": sum(item.draft_seconds for item in stats),
        "verify_seconds": sum(item.verify_seconds for item in stats),
    }


def _identity(runs: Sequence[TurnRun], references: dict[tuple[int, int], list[int]]) -> tuple[int, int]:
    """(identical, compared) over distinct outputs (conversation, turn); an output is identical when every
    repeat of it equals the baseline's first repeat."""
    verdict: dict[tuple[int, int], bool] = {}
    for run in runs:
        key = (run.conversation, run.turn)
        same = first_divergence(run.tokens, references.get(key, [])) is None
        verdict[key] = verdict.get(key, True) and same
    return sum(verdict.values()), len(verdict)


def _round(value: Any, digits: int = 6) -> Any:
    if isinstance(value, float):
        return round(value, digits) if math.isfinite(value) else None
    if isinstance(value, list):
        return [_round(item, digits) for item in value]
    return value


def aggregate(
    runs: Sequence[TurnRun], methods: Sequence[str], categories: Sequence[str], repeats: int, greedy: bool
) -> list[dict]:
    """One row per (category, method), categories in suite order, then the `overall` rows."""
    references = _references(runs)
    rows = []
    for category in [*categories, OVERALL]:
        def members(method: str) -> list[TurnRun]:
            return [run for run in runs if run.method == method and (category == OVERALL or run.category == category)]

        base = _per_repeat(members(BASELINE))
        base_tokens = sum(tokens for tokens, _ in base.values())
        base_seconds = sum(seconds for _, seconds in base.values())
        base_tps = _ratio(base_tokens, base_seconds)
        for method in methods:
            group = members(method)
            if group:
                rows.append(_result_row(method, category, group, base, base_tps, repeats, greedy, references))
    return rows


def _result_row(method, category, group, base, base_tps, repeats, greedy, references) -> dict:
    per_repeat = _per_repeat(group)
    total_tokens = sum(tokens for tokens, _ in per_repeat.values())
    total_seconds = sum(seconds for _, seconds in per_repeat.values())
    tps = _ratio(total_tokens, total_seconds)
    repeat_tps = [tokens / seconds for tokens, seconds in per_repeat.values() if seconds > 0]
    repeat_speedups = []
    for repeat, (tokens, seconds) in per_repeat.items():
        base_tokens, base_seconds = base.get(repeat, (0, 0.0))
        if seconds > 0 and base_tokens and base_seconds > 0:
            repeat_speedups.append((tokens / seconds) / (base_tokens / base_seconds))
    if method == BASELINE:
        speedup: Optional[float] = 1.0
        repeat_speedups = [1.0 for _ in repeat_speedups]
    else:
        speedup = tps / base_tps if tps is not None and base_tps else None
    pooled = _pooled_stats(group)
    ttfts = [run.ttft_seconds for run in group if run.ttft_seconds is not None]
    identical, compared = _identity(group, references) if greedy else (None, None)
    row = {
        "method": method,
        "category": category,
        "prompts": len({run.conversation for run in group}),
        "turns": len({(run.conversation, run.turn) for run in group}),
        "new_tokens": _mean_count(total_tokens, repeats),
        "seconds": total_seconds / repeats,
        "tokens_per_second": tps,
        "tokens_per_second_std": _std(repeat_tps),
        "speedup": speedup,
        "speedup_std": _std(repeat_speedups),
        "mean_accepted_tokens": pooled["mean_accepted_tokens"] if pooled else None,
        "acceptance_rate": pooled["acceptance_rate"] if pooled else None,
        "per_position_acceptance": pooled["per_position_acceptance"] if pooled else [],
        "draft_share": _ratio(pooled["draft_seconds"], total_seconds) if pooled else None,
        "verify_share": _ratio(pooled["verify_seconds"], total_seconds) if pooled else None,
        "ttft_seconds": statistics.fmean(ttfts) if ttfts else None,
        "identical": identical,
        "compared": compared,
        "steps": _mean_count(pooled["steps"], repeats) if pooled else None,
        "drafted_tokens": _mean_count(pooled["drafted_tokens"], repeats) if pooled else None,
        "accepted_tokens": _mean_count(pooled["accepted_tokens"], repeats) if pooled else None,
    }
    return {key: _round(value) for key, value in row.items()}


def per_prompt_rows(runs: Sequence[TurnRun], methods: Sequence[str], greedy: bool) -> list[dict]:
    """One row per (method, conversation, turn), repeats pooled, in running order."""
    references = _references(runs)
    groups: dict[tuple[int, int, str], list[TurnRun]] = {}
    for run in runs:
        groups.setdefault((run.conversation, run.turn, run.method), []).append(run)
    base_tps: dict[tuple[int, int], Optional[float]] = {}
    for (conversation, turn, method), group in groups.items():
        if method == BASELINE:
            base_tps[(conversation, turn)] = _ratio(sum(len(r.tokens) for r in group), sum(r.seconds for r in group))
    order = {name: position for position, name in enumerate(methods)}
    rows = []
    for (conversation, turn, method), group in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1],
                                                                                        order.get(item[0][2], 99))):
        first = group[0]
        tokens = sum(len(run.tokens) for run in group)
        seconds = sum(run.seconds for run in group)
        tps = _ratio(tokens, seconds)
        base = base_tps.get((conversation, turn))
        pooled = _pooled_stats(group)
        ttfts = [run.ttft_seconds for run in group if run.ttft_seconds is not None]
        divergence = None
        identical = None
        if greedy:
            positions = [first_divergence(run.tokens, references.get((conversation, turn), [])) for run in group]
            diverged = [position for position in positions if position is not None]
            identical = not diverged
            divergence = min(diverged) if diverged else None
        row = {
            "method": method,
            "prompt_id": first.prompt_id,
            "category": first.category,
            "turn": turn + 1,
            "prompt_tokens": first.prompt_tokens,
            "new_tokens": _mean_count(tokens, len(group)),
            "seconds": seconds / len(group),
            "tokens_per_second": tps,
            "speedup": 1.0 if method == BASELINE else (tps / base if tps is not None and base else None),
            "ttft_seconds": statistics.fmean(ttfts) if ttfts else None,
            "steps": _mean_count(pooled["steps"], len(group)) if pooled else None,
            "mean_accepted_tokens": pooled["mean_accepted_tokens"] if pooled else None,
            "acceptance_rate": pooled["acceptance_rate"] if pooled else None,
            "finish_reason": first.finish_reason,
            "identical": identical,
            "first_divergence": divergence,
        }
        rows.append({key: _round(value) for key, value in row.items()})
    return rows


# ------------------------------------------------------------------------------------------------ environment


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> Optional[int]:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def environment(model_name: str, device: str, dtype: Any, started: Optional[datetime] = None) -> dict:
    import torch
    import transformers

    from . import __version__

    gpu = None
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.cuda.current_device())
        if torch.cuda.device_count() > 1:
            gpu = f"{gpu} (x{torch.cuda.device_count()})"
    return {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "specdec": __version__,
        "model": model_name,
        "dtype": str(dtype).replace("torch.", ""),
        "device": str(device),
        "date": (started or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
    }


def _model_name(model: Any) -> str:
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return Path(name).name if name else type(model).__name__


def _model_dtype(model: Any) -> Any:
    return getattr(model, "dtype", None) or next(model.parameters()).dtype


# ------------------------------------------------------------------------------------------------ writing


def check_output_path(path: str | Path, flag: str) -> Path:
    """Fail before the run, not after it, when an output file cannot be written there."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise SpecdecError(f"{flag} {path}: is a directory, give a file name")
    if not path.parent.is_dir():
        raise SpecdecError(f"{flag} {path}: the folder {path.parent} does not exist")
    return path


def to_json_text(report: BenchReport | dict) -> str:
    document = report.as_json() if isinstance(report, BenchReport) else report
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def write_json(report: BenchReport | dict, path: str | Path) -> Path:
    return write_atomic(path, to_json_text(report))


def csv_text(results: Sequence[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(RESULT_FIELDS)
    for row in results:
        cells = []
        for key in RESULT_FIELDS:
            value = row.get(key)
            if isinstance(value, list):
                value = " ".join(f"{item:.4f}" for item in value)
            cells.append("" if value is None else value)
        writer.writerow(cells)
    return buffer.getvalue()


def write_csv(results: Sequence[dict], path: str | Path) -> Path:
    return write_atomic(path, csv_text(results))
