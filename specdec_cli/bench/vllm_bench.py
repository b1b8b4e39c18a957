"""`specdec bench --engine vllm`: plain vLLM, vLLM's own drafters and specdec's proposers on the same prompts.

Each method runs in its own vLLM process (vllm_runner.py): a warm-up, then the prompts one request at a time
("single": batch 1, each request timed alone, as Spec-Bench measures), then with `concurrency` requests in flight
("concurrent": vLLM's continuous batching, a new request as one finishes; aggregate tokens/s), greedy. The rows,
per regime:

- tokens/s (new tokens / seconds) and speedup over `none` (vLLM plain) in the same regime;
- tau, tokens per target forward: every forward of a request yields one token plus those of its draft that were
  accepted, so tau = new tokens / (new tokens - accepted tokens), from vLLM's counters over that phase alone;
- acceptance, accepted / drafted tokens;
- identical: outputs token-equal to `none`'s in the same regime (vLLM verifies every draft, so a difference is
  a rounding difference between batch shapes, reported as measured).

Single rows are also given per category. The first turn of each prompt is answered (vLLM's offline API takes
no follow-up turns from another method's answers). Methods run one after another, not interleaved (a vLLM engine
starts in ~40 s): the machine's drift falls on the methods unevenly, so repeat a run before trusting a small
difference. Nothing here prints; cli/bench_cmd.py renders the document.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable, Optional, Sequence

from ..defaults import VLLM_DRAFTERS
from ..drafters import DrafterOptions, check_drafter_options
from ..errors import SpecdecError
from ..session.run_settings import DrafterSettings
from ..texts.prompts import Conversation, categories_of
from ..vllm.proposer_settings import ProposerSettings
from ..vllm.runner import (
    VLLM_METHODS,
    VllmAnswer,
    VllmPhase,
    VllmPhaseResult,
    VllmRun,
    VllmSettings,
    method_unavailable,
    run_vllm,
)
from .environment import host_environment
from .methods import BASELINE, OVERALL, WARMUP_MAX_NEW_TOKENS, Method, warn_repeated
from .settings import BenchSettings

SINGLE, CONCURRENT = "single", "concurrent"
RESULT_COLUMNS = ("regime", "category", "method", "prompts", "new_tokens", "seconds", "tokens_per_second", "speedup",
                  "mean_accepted_tokens", "acceptance_rate", "identical", "compared")  # a result row's keys (CSV)
DEFAULT_VLLM_REFERENCES = ("ngram",)
VLLM_KIND = "vllm"  # a Method of vLLM's own drafters (specdec's proposers and `none` are "engine" rows)


@dataclass(frozen=True)
class VllmBenchSettings:
    # the rows (`none` first, then specdec's proposers, then vLLM's own drafters), the warm-up and the run: the
    # target and its dtype, the proposers' options (draft_max: vLLM's draft length), max_new_tokens, raw prompts
    bench: BenchSettings
    concurrency: Optional[int] = None  # prompts submitted together (None: all of them)

    @property
    def method_names(self) -> list[str]:
        return [method.name for method in self.bench.methods]

    @property
    def draft_length(self) -> int:
        """vLLM's num_speculative_tokens for every row that drafts."""
        return self.engine(BASELINE).proposer.draft_length

    def engine(self, method: str, model_dir: str = "") -> VllmSettings:
        """The vLLM engine one row runs in (`model_dir`: the directory it loads)."""
        run = self.bench.run
        load = replace(run.load, target=model_dir) if model_dir else run.load
        return VllmSettings(load, ProposerSettings(DrafterSettings(method, run.drafter.options),
                                                   num_speculative_tokens=run.generation.draft_max))

    def check(self) -> None:
        if not self.bench.methods or self.bench.methods[0].name != BASELINE:
            raise SpecdecError("the method list must start with the baseline `none`")
        for method in self.method_names:  # each method's name and the draft length
            self.engine(method).check()
        self.bench.run.generation.check()  # max_new_tokens (greedy: vLLM answers greedily here)
        if self.concurrency is not None and self.concurrency < 1:
            raise SpecdecError(f"concurrency must be >= 1, got {self.concurrency}", setting="concurrency")

        # --index and --memory (the options the proposers read) are used by one of them, and their files are what
        # they claim; the other drafter options do not reach vLLM
        options = self.bench.run.drafter.options
        check_drafter_options([method for method in self.method_names if method in VLLM_DRAFTERS],
                              DrafterOptions(index=options.index, memory=options.memory))


def vllm_methods(drafters: Sequence[str], references: Sequence[str]) -> list[Method]:
    """`none` first, then the drafters (specdec's proposers), then vLLM's own drafters (--reference)."""
    for name in drafters:
        if name != BASELINE and name not in VLLM_DRAFTERS:
            raise SpecdecError(f"drafter {name} does not run in vLLM: there specdec drafts with "
                               f"{', '.join(VLLM_DRAFTERS)} (vLLM verifies chains)", setting="drafters")
    for name in references or DEFAULT_VLLM_REFERENCES:
        if name not in VLLM_METHODS:
            raise SpecdecError(f"reference {name}: with --engine vllm the references are vLLM's "
                               f"{', '.join(VLLM_METHODS)}", setting="reference")
    named = [*drafters, *(references or DEFAULT_VLLM_REFERENCES)]
    warn_repeated([name for index, name in enumerate(named) if name in named[:index]])
    return [Method(name, VLLM_KIND if name in VLLM_METHODS else "engine")
            for name in dict.fromkeys([BASELINE, *named])]


@dataclass
class VllmProgress:
    method: str
    done: int  # answers so far, over all methods
    total: int


def run_vllm_bench(model_dir: str, model_name: str, prompt_ids: Sequence[Sequence[int]],
                   conversations: Sequence[Conversation], eos_token_ids: Sequence[int], settings: VllmBenchSettings,
                   *, suite: str = "", on_progress: Optional[Callable[[VllmProgress], None]] = None) -> dict:
    """Every method over the prompts (`prompt_ids[i]` is conversation i's first turn, templated); the report."""
    settings.check()
    if not prompt_ids:
        raise SpecdecError("no prompts to run (check --categories and --limit)")
    started = datetime.now(timezone.utc)
    skipped = {method: reason for method in settings.method_names if (reason := method_unavailable(method))}
    methods = [method for method in settings.method_names if method not in skipped]
    together = min(settings.concurrency or len(prompt_ids), len(prompt_ids))
    max_new_tokens = settings.bench.run.generation.max_new_tokens
    phases = [VllmPhase(SINGLE, prompt_ids, max_new_tokens, eos_token_ids),
              VllmPhase(CONCURRENT, prompt_ids, max_new_tokens, eos_token_ids, concurrency=together)]
    if settings.bench.warmup:
        phases.insert(0, VllmPhase("warmup", prompt_ids[:1], WARMUP_MAX_NEW_TOKENS, eos_token_ids))
    total = len(methods) * 2 * len(prompt_ids)
    done = [0]
    runs: dict[str, VllmRun] = {}
    for method in methods:
        def counted(answer: VllmAnswer, method: str = method) -> None:
            if answer.phase != "warmup":
                done[0] += 1
                if on_progress is not None:
                    on_progress(VllmProgress(method, done[0], total))

        if on_progress is not None:
            on_progress(VllmProgress(method, done[0], total))
        runs[method] = run_vllm(settings.engine(method, model_dir), phases, on_answer=counted)
    regimes = {method: {SINGLE: run.phases[SINGLE], CONCURRENT: run.phases[CONCURRENT]} for method, run in runs.items()}
    first = next(iter(runs.values()))
    options = settings.bench.run.drafter.options
    return {
        "environment": _environment(model_name, first, started),
        "settings": {"engine": "vllm", "methods": methods, "references_skipped": skipped,
                     "draft_max": settings.draft_length, "max_new_tokens": max_new_tokens,
                     "concurrency": together, "greedy": True, "prompts": suite,
                     "categories": categories_of(conversations), "conversations": len(conversations),
                     "index": options.index, "memory": options.memory},
        "results": result_rows(regimes, conversations),
        "per_prompt": _per_prompt(regimes, conversations),
        "baseline_single_vs_concurrent": _identical(regimes[BASELINE][SINGLE], regimes[BASELINE][CONCURRENT]),
    }


def result_rows(regimes: dict[str, dict[str, VllmPhaseResult]], conversations: Sequence[Conversation]) -> list[dict]:
    """Per regime: overall rows for every method, then (single only) one row per category and method."""
    rows = []
    groups: list[tuple[str, Optional[str]]] = [(SINGLE, None), (CONCURRENT, None)]
    groups += [(SINGLE, category) for category in categories_of(conversations)]
    for regime, category in groups:
        chosen = [index for index, conversation in enumerate(conversations)
                  if category is None or conversation.category == category]
        base = None
        for method, by_regime in regimes.items():
            run = by_regime[regime]
            answers = [run.answers[index] for index in chosen]
            tokens = sum(len(answer.tokens) for answer in answers)
            seconds = run.seconds if category is None else sum(answer.seconds for answer in answers)
            speed = tokens / seconds if seconds > 0 else None
            if method == BASELINE:
                base = speed
            accepted = run.counters.get("vllm:spec_decode_num_accepted_tokens", 0.0)
            drafted = run.counters.get("vllm:spec_decode_num_draft_tokens", 0.0)
            reference = [regimes[BASELINE][regime].answers[index] for index in chosen]
            same = sum(answer.tokens == other.tokens for answer, other in zip(answers, reference))
            overall = category is None
            rows.append({
                "regime": regime, "category": category or OVERALL, "method": method, "prompts": len(chosen),
                "new_tokens": tokens, "seconds": seconds, "tokens_per_second": speed,
                "speedup": speed / base if speed and base else None,
                # counters are per phase, not per prompt: tau and acceptance on the overall rows only
                "mean_accepted_tokens": (tokens / (tokens - accepted) if tokens > accepted else None)
                if overall and method != BASELINE else None,
                "acceptance_rate": accepted / drafted if overall and drafted else None,
                "identical": same, "compared": len(chosen),
            })
    return rows


def _per_prompt(regimes: dict[str, dict[str, VllmPhaseResult]], conversations: Sequence[Conversation]) -> list[dict]:
    rows = []
    for method, by_regime in regimes.items():
        for regime, run in by_regime.items():
            for conversation, answer, other in zip(conversations, run.answers, regimes[BASELINE][regime].answers):
                rows.append({"method": method, "regime": regime, "prompt_id": conversation.id,
                             "category": conversation.category, "new_tokens": len(answer.tokens),
                             "seconds": answer.seconds, "finish_reason": answer.finish_reason,
                             "identical": answer.tokens == other.tokens})
    return rows


def _identical(single: VllmPhaseResult, concurrent: VllmPhaseResult) -> dict:
    same = sum(a.tokens == b.tokens for a, b in zip(single.answers, concurrent.answers))
    return {"identical": same, "compared": len(single.answers)}


def _environment(model_name: str, run: VllmRun, started: datetime) -> dict:
    return {**host_environment(started), "gpu": None if run.device == "cpu" else run.device, "vllm": run.version,
            "model": model_name, "dtype": run.dtype, "device": run.device}
