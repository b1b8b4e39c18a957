"""Bench metrics (Spec-Bench conventions, docs/methods.md section 8), per method, per category and overall
(the pooled sum of every category), from the raw runs:

tokens/s = new tokens / wall seconds (totals; llama-server rows: llama.cpp's own prompt_ms + predicted_ms);
tokens/s without the prompt = new tokens / (seconds - time to first token) (llama-server: predicted_n /
predicted_ms); speedup = tokens/s of the method / tokens/s of `none` on the
same prompts; speedup over the fastest plain decoding = the same against the best of `none`, `native`, `hf`
and `llama.cpp` (and llama-server's plain row); speedup over llama.cpp = the same against llama.cpp's plain
decoding through its Python binding, over llama-server against its server's plain decoding; mean accepted
tokens (tau) = tokens committed per target forward, the target's own token included; acceptance rate =
accepted / drafted tokens; per-position acceptance from pooled counts (stats.merge); shares of the wall time
spent drafting and verifying (the prefill counts as verifying); mean time to first token; for greedy runs,
how many outputs are token-identical to the baseline's first repeat.
Pure arithmetic over `TurnRun`s (one generation's record, as runner.py makes them); no model, no torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable, Optional, Sequence

from ..decoding.stats import GenerationStats, merge
from .llama_cpp import LLAMA_CPP
from .methods import BASELINE, NATIVE, OVERALL

PLAIN_METHODS = (BASELINE, NATIVE, "hf", LLAMA_CPP)  # plain decoding, in each of the bench's ways


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
    drafted_tokens: Optional[int] = None  # drafted and accepted tokens as an outside engine counts them
    accepted_tokens: Optional[int] = None  # (llama-server's n-gram rows: timings.draft_n, draft_n_accepted)


@dataclass
class ResultRow:
    """One row of the results table: a method on a category (or `overall`); None where it does not apply
    (transformers rows have no acceptance; sampled runs have no identity check)."""

    method: str
    category: str
    prompts: int
    turns: int
    new_tokens: float
    seconds: float
    tokens_per_second: Optional[float]
    tokens_per_second_std: float
    speedup: Optional[float]
    speedup_std: float
    mean_accepted_tokens: Optional[float]
    acceptance_rate: Optional[float]
    per_position_acceptance: list = field(default_factory=list)
    draft_share: Optional[float] = None
    verify_share: Optional[float] = None
    ttft_seconds: Optional[float] = None
    identical: Optional[int] = None
    compared: Optional[int] = None
    steps: Optional[float] = None
    drafted_tokens: Optional[float] = None
    accepted_tokens: Optional[float] = None
    speedup_vs_fastest_plain: Optional[float] = None  # tokens/s over the best plain row's (none, native, hf, llama.cpp)
    speedup_vs_llama_cpp: Optional[float] = None  # tokens/s over llama.cpp's plain decoding of the same GGUF
    decode_tokens_per_second: Optional[float] = None  # without the prompt: tokens / (seconds - time to first token)
    speedup_vs_llama_server: Optional[float] = None  # tokens/s over llama-server's plain decoding

    def as_json(self) -> dict:
        return asdict(self)


RESULT_FIELDS = tuple(item.name for item in fields(ResultRow))  # the CSV columns, in order


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


def _pooled_stats(runs: Sequence[TurnRun]) -> Optional[GenerationStats]:
    """Engine statistics pooled over generations from their raw counts; None for transformers rows."""
    return merge(run.stats for run in runs if run.stats is not None)


def decode_rate(runs: Sequence[TurnRun]) -> Optional[float]:
    """Tokens per second without the prompt: new tokens / (seconds - time to first token), pooled; None when a
    run has no time to first token."""
    if not runs or any(run.ttft_seconds is None for run in runs):
        return None
    return _ratio(sum(len(run.tokens) for run in runs),
                  sum(run.seconds - (run.ttft_seconds or 0.0) for run in runs))


def _outside_counts(runs: Sequence[TurnRun]) -> tuple[Optional[int], Optional[int]]:
    """(drafted, accepted) tokens as an outside engine counted them; (None, None) when none did."""
    counted = [run for run in runs if run.drafted_tokens is not None]
    if not counted:
        return None, None
    return sum(run.drafted_tokens or 0 for run in counted), sum(run.accepted_tokens or 0 for run in counted)


def _outside_rate(runs: Sequence[TurnRun]) -> Optional[float]:
    drafted, accepted = _outside_counts(runs)
    return _ratio(accepted or 0, drafted) if drafted else None


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
    runs: Sequence[TurnRun], methods: Sequence[str], categories: Sequence[str], repeats: int, greedy: bool,
    llama_server_plain: Optional[str] = None,
) -> list["ResultRow"]:
    """One row per (category, method), categories in suite order, then the `overall` rows. `llama_server_plain`
    names the row of llama-server's plain decoding (the base of `speedup_vs_llama_server`), if one ran."""
    plain_methods = PLAIN_METHODS + ((llama_server_plain,) if llama_server_plain else ())
    references = _references(runs)
    rows = []
    for category in [*categories, OVERALL]:
        def members(method: str, category: str = category) -> list[TurnRun]:
            return [run for run in runs if run.method == method and category in (OVERALL, run.category)]

        base = _per_repeat(members(BASELINE))
        base_tokens = sum(tokens for tokens, _ in base.values())
        base_seconds = sum(seconds for _, seconds in base.values())
        base_tps = _ratio(base_tokens, base_seconds)
        for method in methods:
            group = members(method)
            if group:
                rows.append(_result_row(method, category, group, base, base_tps, repeats, greedy, references))
    for category in [*categories, OVERALL]:
        in_category = [row for row in rows if row.category == category]
        plain = [row.tokens_per_second for row in in_category
                 if row.method in plain_methods and row.tokens_per_second is not None]
        llama = [row.tokens_per_second for row in in_category if row.method == LLAMA_CPP and row.tokens_per_second]
        server = [row.tokens_per_second for row in in_category
                  if llama_server_plain and row.method == llama_server_plain and row.tokens_per_second]
        for row in in_category:
            if row.tokens_per_second is not None:
                if plain:
                    row.speedup_vs_fastest_plain = _round(row.tokens_per_second / max(plain))
                if llama:
                    row.speedup_vs_llama_cpp = _round(row.tokens_per_second / llama[0])
                if server:
                    row.speedup_vs_llama_server = _round(row.tokens_per_second / server[0])
    return rows


def _result_row(method, category, group, base, base_tps, repeats, greedy, references) -> "ResultRow":
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
    drafted, accepted = (None, None) if pooled else _outside_counts(group)
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
        "mean_accepted_tokens": _ratio(pooled.committed_in_steps, pooled.steps) if pooled else None,
        "acceptance_rate": (_ratio(pooled.accepted_tokens, pooled.drafted_tokens) if pooled else
                            _ratio(accepted or 0, drafted) if drafted else None),
        "per_position_acceptance": pooled.per_position_acceptance if pooled else [],
        "draft_share": _ratio(pooled.draft_seconds, total_seconds) if pooled else None,
        "verify_share": _ratio(pooled.verify_seconds, total_seconds) if pooled else None,
        "ttft_seconds": statistics.fmean(ttfts) if ttfts else None,
        "identical": identical,
        "compared": compared,
        "steps": _mean_count(pooled.steps, repeats) if pooled else None,
        "drafted_tokens": (_mean_count(pooled.drafted_tokens, repeats) if pooled else
                           _mean_count(drafted, repeats) if drafted is not None else None),
        "accepted_tokens": (_mean_count(pooled.accepted_tokens, repeats) if pooled else
                            _mean_count(accepted, repeats) if accepted is not None else None),
        "decode_tokens_per_second": decode_rate(group),
    }
    return ResultRow(**{key: _round(value) for key, value in row.items()})


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
            "decode_tokens_per_second": decode_rate(group),
            "speedup": 1.0 if method == BASELINE else (tps / base if tps is not None and base else None),
            "ttft_seconds": statistics.fmean(ttfts) if ttfts else None,
            "steps": _mean_count(pooled.steps, len(group)) if pooled else None,
            "mean_accepted_tokens": _ratio(pooled.committed_in_steps, pooled.steps) if pooled else None,
            "acceptance_rate": (_ratio(pooled.accepted_tokens, pooled.drafted_tokens) if pooled else
                                _outside_rate(group)),
            "finish_reason": first.finish_reason,
            "identical": identical,
            "first_divergence": divergence,
        }
        rows.append({key: _round(value) for key, value in row.items()})
    return rows
