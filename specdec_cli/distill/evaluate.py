"""Measuring a draft against its target on held-out prompts: agreement and real speculative acceptance.

For every prompt the target answers greedily through the engine with the draft as the `model` drafter; the
answer is the target's own (greedy verification is exact), and the run gives the mean accepted tokens per
target forward (tau, the target's own token included) and the acceptance rate. Along that same answer
one forward of the target and one of the draft give the top-1 agreement (share of answer positions where
the draft's argmax is the target's argmax) and the mean of 1 - TVD(p_target, p_draft) at temperature 1,
the per-token acceptance speculative sampling would have. The engine's cost-aware trimming, if any, is
switched off so that the numbers describe the draft, not the scheduler.

`evaluate_draft` measures a trained draft directory and, unless told not to, the untrained initialisation
it started from (rebuilt from its recorded init), and stores both under "evaluation" in the directory's
`distill_report.json`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..decoding.stats import GenerationStats, merge
from ..drafters import model as model_drafter
from ..drafters import target_info
from ..drafters.model import ModelDrafter
from ..drafters.target import TargetWeights
from ..errors import SpecdecError
from ..files import read_json, write_json_atomic
from ..texts.data_rows import read_rows
from ..texts.prompt_ids import first_turn_ids
from ..texts.prompts import Conversation
from .checkpoints import REPORT
from .data import split_rows
from .student import build_student

DEFAULT_EVAL_TOKENS = 128
AGREEMENT_ROWS = 16  # positions whose whole-vocabulary distributions _agreement holds at once (96 at once: ~350 MB)


@dataclass
class DraftScore:
    label: str
    prompts: int = 0
    positions: int = 0  # answer positions compared
    agreement: float = 0.0  # top-1 agreement with the target along its answers
    sampling_acceptance: float = 0.0  # mean 1 - TVD(p_target, p_draft) at temperature 1
    steps: int = 0
    new_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    mean_accepted_tokens: float = 0.0  # committed tokens per target forward (plain decoding = 1.0)
    acceptance_rate: float = 0.0
    per_position_acceptance: list = field(default_factory=list)  # stats.py's: by draft depth
    tokens_per_second: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    per_category: dict = field(default_factory=dict)  # category -> {"agreement", "mean_accepted_tokens"}

    def as_json(self) -> dict:
        body = asdict(self)
        for key in ("agreement", "sampling_acceptance", "mean_accepted_tokens", "acceptance_rate",
                    "tokens_per_second", "draft_seconds", "verify_seconds"):
            body[key] = round(body[key], 4)
        return body


@dataclass
class EvalProgress:
    label: str
    done: int
    total: int
    score: DraftScore


# ---------------------------------------------------------------------------------------------- prompts


def tokenized(tokenizer: Any, prompts: Sequence[Conversation], raw: bool = False) -> list[Conversation]:
    """The prompts with their first turns' token ids as the target reads them (chat template unless `raw`)."""
    return [replace(prompt, prompt_ids=tuple(first_turn_ids(tokenizer, prompt.first_turn, raw))) for prompt in prompts]


def prompts_from_data(data_path: str, holdout: float, fingerprint: str, target_name: str = "") -> list[Conversation]:
    """The held-out rows of a data file, split exactly as training split them, with the token ids they recorded."""
    rows = read_rows(data_path, fingerprint, target_name)
    _, held = split_rows(rows, holdout)
    if not held:
        raise SpecdecError(
            f"{data_path}: no held-out rows (the draft was trained with --holdout {holdout}); "
            "evaluate on --suite builtin or --prompts FILE instead"
        )
    return [Conversation(str(row.get("id", "")), str(row.get("category", "")), (str(row.get("prompt", "")),),
                         prompt_ids=tuple(int(t) for t in row["prompt_ids"]))
            for row in held]


def _prompt_ids(prompt: Conversation) -> tuple[int, ...]:
    if prompt.prompt_ids is None:
        raise ValueError(f"prompt {prompt.id!r} is not tokenized (evaluate.tokenized)")
    return prompt.prompt_ids


def read_report(draft_dir: Path) -> dict:
    return read_json(draft_dir / REPORT)


# ---------------------------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Candidate:
    """One thing to score: a drafter the engine drafts with, and its logits [m, V] along the target's answer
    (what it would predict at each answer position, given the true context: the top-1 agreement's input), as a
    tensor or as LogitRows."""

    drafter: Any
    logits_along: Callable[["Reference"], Any]
    head_tokens: Optional[Sequence[int]] = None  # the tokens it may draft besides the context's (None = all)


@dataclass(frozen=True)
class LogitRows:
    """Logits [m, V] along an answer made a few rows at a time from their states, never all at once (a 151,936-token
    vocabulary's row is 0.6 MB): the first `zero_rows` rows are zeros (no prediction there), the rest read out."""

    states: Any  # [m - zero_rows, H]
    read_out: Callable[[Any], Any]  # [r, H] -> [r, vocab] float32
    vocab: int
    zero_rows: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return self.zero_rows + int(self.states.shape[0]), self.vocab

    def rows(self, first: int, stop: int) -> Any:
        """Rows first .. stop - 1 [stop - first, vocab] (each row's bits whatever the rows read with it: the read-out
        is row-invariant)."""
        import torch

        zeros = max(0, min(stop, self.zero_rows) - first)
        states = self.states[max(first - self.zero_rows, 0) : max(stop - self.zero_rows, 0)]
        read = self.read_out(states).float().cpu() if states.shape[0] else torch.zeros(0, self.vocab)
        return torch.cat([torch.zeros(zeros, self.vocab), read]) if zeros else read


@dataclass(frozen=True)
class Reference:
    """The target's greedy answer to one prompt, and the target along it (one forward)."""

    ids: Any  # [1, n] prompt + answer
    start: int  # position start predicts answer[0]
    end: int  # one past the last compared position
    target_logits: Any  # [m, V] float32, or LogitRows (softmax taken a few rows at a time where read)
    features: Any  # [n, H] the target's last hidden states, float32
    layer_states: dict = field(default_factory=dict)  # layer -> [n, H] the states entering it (score_candidates'
    # feature_layers only), float32


def score_drafts(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[Conversation],
    drafts: dict,
    *,
    max_new_tokens: int = DEFAULT_EVAL_TOKENS,
    draft_max: int = 6,
    min_prob: float = 0.0,
    head_tokens: Optional[Sequence[int]] = None,
    on_progress: Optional[Callable[[EvalProgress], None]] = None,
) -> dict:
    """{label: DraftScore} for every draft model in `drafts` ({label: model}) over the same prompts.

    `head_tokens` restricts every draft's output head as the `model` drafter does (None = full head).
    """
    info = target_info(target, tokenizer)

    def along(model: Any) -> Callable[[Reference], Any]:
        def logits(reference: Reference) -> Any:
            return model(input_ids=reference.ids.to(_device(model))).logits[0, reference.start : reference.end]

        return logits

    candidates = {label: Candidate(ModelDrafter(model.eval(), draft_max=draft_max, min_prob=min_prob,
                                                eos_token_ids=info.eos_token_ids, head_tokens=head_tokens),
                                   along(model), head_tokens)
                  for label, model in drafts.items()}
    return score_candidates(target, tokenizer, prompts, candidates, eos_token_ids=info.eos_token_ids,
                            max_new_tokens=max_new_tokens, budget=draft_max, on_progress=on_progress,
                            weights=info.weights)


def score_candidates(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[Conversation],
    candidates: dict,
    *,
    eos_token_ids: Sequence[int],
    max_new_tokens: int = DEFAULT_EVAL_TOKENS,
    budget: int = 6,
    on_progress: Optional[Callable[[EvalProgress], None]] = None,
    feature_layers: Sequence[int] = (),
    weights: Optional[TargetWeights] = None,
) -> dict:
    """{label: DraftScore} for every Candidate in `candidates` ({label: candidate}) over the same prompts; the
    references along the answers keep the states entering `feature_layers` (for heads that read them). With the
    target's `weights`, its logits along an answer are read out of its last states a few rows at a time."""
    from ..decoding.engine import Engine, GenerationConfig
    from ..target_model.verify.exact_setup import states_forward

    if not prompts:
        raise SpecdecError("no prompts to evaluate on")
    engine = Engine(target, tokenizer)
    along = states_forward(target)  # the target along each answer, with the layers' states a head reads
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, draft_max=budget,
                              eos_token_ids=tuple(eos_token_ids), cost_aware=False)
    config.check()
    scores = {label: DraftScore(label) for label in candidates}
    sums = {label: {"tvd": 0.0, "matches": 0} for label in candidates}
    runs: dict = {label: [] for label in candidates}  # label -> GenerationStats of each prompt
    categories: dict = {label: {} for label in candidates}  # label -> category -> [matches, positions, stats list]
    for index, prompt in enumerate(prompts):
        reference = None  # the target's answer and its distributions along it, shared by all candidates
        for label, candidate in candidates.items():
            candidate.drafter.reset()
            generation = engine.generate(_prompt_ids(prompt), candidate.drafter, config)
            stats = generation.stats
            if reference is None:  # greedy runs all produce the target's own answer: measure along the first
                reference = _target_along(along, _prompt_ids(prompt), list(generation.tokens), feature_layers,
                                          weights)
            score, acc = scores[label], sums[label]
            score.prompts += 1
            runs[label].append(stats)
            matches, tvd_sum, positions = _agreement(candidate, reference)
            score.positions += positions
            acc["matches"] += matches
            acc["tvd"] += tvd_sum
            bucket = categories[label].setdefault(prompt.source_category or "prompts", [0, 0, []])
            bucket[0] += matches
            bucket[1] += positions
            bucket[2].append(stats)
            _finish(score, acc, categories[label], runs[label])
            if on_progress is not None:
                on_progress(EvalProgress(label, index + 1, len(prompts), score))
    return scores


def _finish(score: DraftScore, acc: dict, categories: dict, runs: list) -> None:
    """The score's speed and acceptance from its generations pooled (stats.merge); agreement from `acc`."""
    pooled = merge(runs) or GenerationStats()
    score.steps, score.new_tokens = pooled.steps, pooled.new_tokens
    score.drafted_tokens, score.accepted_tokens = pooled.drafted_tokens, pooled.accepted_tokens
    score.draft_seconds, score.verify_seconds = pooled.draft_seconds, pooled.verify_seconds
    score.mean_accepted_tokens = pooled.mean_accepted_tokens
    score.acceptance_rate = pooled.acceptance_rate
    score.per_position_acceptance = [round(value, 4) for value in pooled.per_position_acceptance]
    score.tokens_per_second = pooled.tokens_per_second
    score.agreement = acc["matches"] / score.positions if score.positions else 0.0
    score.sampling_acceptance = 1.0 - acc["tvd"] / score.positions if score.positions else 0.0
    score.per_category = {
        name: {"agreement": round(matches / positions, 4) if positions else 0.0,
               "mean_accepted_tokens": round((merge(stats) or GenerationStats()).mean_accepted_tokens, 4)}
        for name, (matches, positions, stats) in categories.items()
    }


def _target_along(forward: Any, prompt_ids: Sequence[int], answer: list[int], layers: Sequence[int] = (),
                  weights: Optional[TargetWeights] = None) -> Optional[Reference]:
    """One forward (`forward`: exact_setup.states_forward's) over prompt + answer: the target's distributions, its
    last hidden states and the states entering `layers` along it. With `weights`, its logits are read out of the
    last states AGREEMENT_ROWS rows at a time (LogitRows) instead of kept whole."""
    import torch

    if not answer:
        return None
    ids = torch.tensor([list(prompt_ids) + list(answer)])  # [1, n]
    start, end = len(prompt_ids) - 1, ids.shape[1] - 1  # position start predicts answer[0]
    with torch.inference_mode():
        out = forward.run(input_ids=ids.to(forward.device), position_ids=torch.arange(ids.shape[1])[None].to(
            forward.device), past_key_values=forward.new_cache(), use_cache=True, output_hidden_states=True,
            logits_to_keep=1 if weights else ids.shape[1] - start, **forward.layer_states(layers))
        last = out.hidden_states[-1][0].float().cpu()  # [n, H], normed
        states = {layer: out.hidden_states[layer][0].float().cpu() for layer in layers}  # [n, H] each
        logits: Any = out.logits[0, : end - start].float().cpu() if weights is None else \
            LogitRows(last[start:end], weights.logits, weights.vocab_size)  # [m, V]
    return Reference(ids, start, end, logits, last, states)


def _agreement(candidate: Candidate, reference: Optional[Reference]) -> tuple[int, float, int]:
    """(matching argmaxes, sum of TVDs, positions compared) of a candidate along the target's answer.

    With a restricted head, position i may predict the head's tokens and the tokens of ids[: i + 1], as the
    drafter would at that point of the conversation.
    """
    import torch

    if reference is None:
        return 0, 0.0, 0
    ids, start, end = reference.ids, reference.start, reference.end
    with torch.inference_mode():
        along = candidate.logits_along(reference)  # [m, V], or LogitRows made AGREEMENT_ROWS rows at a time
        if not isinstance(along, LogitRows):
            along = along.float().cpu()
        vocab = int(along.shape[-1])
        width = min(vocab, reference.target_logits.shape[-1])
        head_tokens = candidate.head_tokens
        if head_tokens:
            allowed_static = torch.zeros(vocab, dtype=torch.bool)
            allowed_static[[int(token) for token in head_tokens if 0 <= int(token) < vocab]] = True
            sequence = ids[0].cpu()
            first_seen = torch.full((vocab,), sequence.numel(), dtype=torch.long)  # first index of each token
            first_seen.scatter_reduce_(0, sequence, torch.arange(sequence.numel()), reduce="amin")
        matches, tvds = 0, []
        for first in range(0, end - start, AGREEMENT_ROWS):  # (each row alone: the same values in pieces)
            stop = min(first + AGREEMENT_ROWS, end - start)
            rows = _piece(along, first, stop)  # [r, V]
            if head_tokens:
                positions = torch.arange(start + first, start + stop).unsqueeze(1)  # [r, 1]
                allowed = allowed_static.unsqueeze(0) | (first_seen.unsqueeze(0) <= positions)  # [r, V]
                rows = rows.masked_fill(~allowed, float("-inf"))
            draft_probs = torch.softmax(rows, -1)
            target = _piece(reference.target_logits, first, stop)  # [r, V]
            matches += int((rows.argmax(-1) == target.argmax(-1)).sum())
            wanted = torch.softmax(target, -1)[:, :width]
            tvds.append(0.5 * (wanted - draft_probs[:, :width]).abs().sum(-1))  # [r]
        tvd = torch.cat(tvds)  # [m]
    return matches, float(tvd.sum()), int(end - start)


def _piece(logits: Any, first: int, stop: int) -> Any:
    """Rows first .. stop - 1 of logits [m, V] held whole or as LogitRows."""
    return logits.rows(first, stop) if isinstance(logits, LogitRows) else logits[first:stop]


def _device(model: Any) -> Any:
    return next(model.parameters()).device


# ---------------------------------------------------------------------------------------------- a draft directory


def evaluate_draft(
    target: Any,
    tokenizer: Any,
    target_name: str,
    draft_dir: str,
    prompts: Sequence[Conversation],
    *,
    baseline: bool = True,
    max_new_tokens: int = DEFAULT_EVAL_TOKENS,
    draft_max: int = 6,
    min_prob: float = 0.0,
    prompt_source: str = "",
    on_progress: Optional[Callable[[EvalProgress], None]] = None,
    on_status: Optional[Callable[[str], None]] = None,
) -> dict:
    """Score the draft in `draft_dir` (and its initialisation) and store the result in its report."""
    status = on_status or (lambda message: None)
    directory = Path(draft_dir).expanduser()
    info = target_info(target, tokenizer)
    model, _, meta = model_drafter.load_draft_model(str(directory), info)
    report = read_report(directory)
    drafts = {}
    spec = (report.get("student") or {}).get("init") or meta.get("init")
    if baseline and spec:
        status("Rebuilding the untrained initialisation…")
        drafts["before"] = build_student(target, spec, info.fingerprint, info.vocab_size)
    drafts["after"] = model
    started = time.perf_counter()
    head_tokens = meta.get("head_tokens")
    scores = score_drafts(target, tokenizer, prompts, drafts, max_new_tokens=max_new_tokens, draft_max=draft_max,
                          min_prob=min_prob, head_tokens=head_tokens, on_progress=on_progress)
    settings = {"max_new_tokens": max_new_tokens, "draft_max": draft_max, "draft_min_prob": min_prob,
                "decoding": "greedy", "head_tokens": len(head_tokens) if head_tokens else None}
    return store_evaluation(directory, report, target_name, info.fingerprint, len(prompts), prompt_source, settings,
                            time.perf_counter() - started, scores)


def store_evaluation(directory: Path, report: dict, target_name: str, fingerprint: str, prompts: int, source: str,
                     settings: dict, seconds: float, scores: dict) -> dict:
    """The evaluation record (settings, time, one DraftScore per label), written under "evaluation" in the
    directory's report."""
    evaluation = {
        "target": target_name, "fingerprint": fingerprint, "prompts": prompts, "source": source,
        "settings": settings, "seconds": round(seconds, 1),
        **{label: score.as_json() for label, score in scores.items()},
    }
    report = dict(report) if report else {"target": target_name, "fingerprint": fingerprint}
    report["evaluation"] = evaluation
    write_json_atomic(directory / REPORT, report)
    return evaluation
