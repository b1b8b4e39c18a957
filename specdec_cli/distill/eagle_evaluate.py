"""Measuring an EAGLE head (eagle_head.py) against its target on held-out prompts, before and after training.

The target answers every prompt greedily through the engine with the head as the `eagle` drafter, drafting
EAGLE-2 trees (the drafter's default) and, for the trained head, chains as well; the answers are the target's
own (greedy verification is exact). Each run gives tokens per target forward (tau), the acceptance rate and
the acceptance per draft position (per tree depth for trees). Along that same answer, one target forward
gives the features the head reads; the head's teacher-forced prediction at every answer position gives the
top-1 agreement and 1 - TVD, as evaluate.py measures a student. "Before" is the untrained head the training
started from (rebuilt from the recorded seed), so that the report shows what training bought.

The numbers describe the head, not the scheduler: the engine's cost-aware trimming is off. Results go under
"evaluation" in the head directory's `distill_report.json`. This file does not train (eagle_train.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..defaults import DEFAULT_BUDGET
from ..drafters import target_info
from ..drafters.eagle import DEFAULT_TREE_DEPTH, DEFAULT_TREE_WIDTH, EagleDrafter, check_target
from ..texts.prompts import Conversation
from .eagle_train import initial_head
from .evaluate import (
    DEFAULT_EVAL_TOKENS,
    Candidate,
    EvalProgress,
    LogitRows,
    Reference,
    read_report,
    score_candidates,
    store_evaluation,
)

# (label, trained?, tree width): trees are what it drafts; the trained head's chains show its own per-position
# acceptance (an untrained head's chains add nothing: its trees already accept almost nothing)
EAGLE_RUNS = (("before", False, None), ("after", True, None), ("after_chain", True, 0))


def head_logits_along(head: Any, weights: Any) -> Callable[[Reference], LogitRows]:
    """The head's teacher-forced logits [m, V] at the answer positions: position p from (f_{p-1}, token p), read
    out through the target's LM head a few rows at a time."""
    import torch

    def logits(reference: Reference) -> LogitRows:
        features, ids = reference.features, reference.ids[0]  # [n, H], [n]
        dtype = next(head.parameters()).dtype
        device = next(head.parameters()).device
        with torch.inference_mode():
            embedded = weights.embed(ids[None, 1 : reference.end].to(device)).to(dtype)  # [1, end-1, H]
            predicted = head(features[None, : reference.end - 1].to(device, dtype), embedded,
                             torch.arange(reference.end - 1, device=device))[0]  # [end-1, H]: rows p-1 -> p
            rows = predicted[max(reference.start - 1, 0) : reference.end - 1]  # [m or m-1, H]
        # position 0 has no feature before it: no prediction there (a zero row)
        return LogitRows(rows, weights.logits, weights.vocab_size, zero_rows=int(reference.start == 0))

    return logits


def eagle3_logits_along(head: Any, embeddings: Any, layers: Sequence[int], vocab: int) -> Callable[[Reference], Any]:
    """An EAGLE-3 head's teacher-forced logits [m, V] at the answer positions (-inf outside its draft vocabulary):
    position p from (the states entering `layers` at p-1, token p), read out a few rows at a time."""
    import torch

    def read_out(rows: Any) -> Any:  # [r, H] -> [r, V]
        own = head.lm_head(head.norm(rows)).float()  # [r, K]
        out = torch.full((own.shape[0], vocab), float("-inf"))
        out[:, head.draft_ids()] = own
        return out

    def logits(reference: Reference) -> LogitRows:
        ids, end = reference.ids[0], reference.end
        dtype = next(head.parameters()).dtype
        with torch.inference_mode():
            states = torch.cat([reference.layer_states[layer][: end - 1] for layer in layers], dim=-1)  # [end-1, 3H]
            embedded = embeddings(ids[None, 1:end]).to(dtype)  # [1, end-1, H]
            predicted = head(head.reduce(states[None].to(dtype)), embedded, torch.arange(end - 1))[0]  # [end-1, H]
            rows = predicted[max(reference.start - 1, 0) : end - 1]
        return LogitRows(rows, read_out, vocab, zero_rows=int(reference.start == 0))

    return logits


def evaluate_head(
    target: Any,
    tokenizer: Any,
    target_name: str,
    head_dir: str,
    prompts: Sequence[Conversation],
    *,
    baseline: bool = True,
    max_new_tokens: int = DEFAULT_EVAL_TOKENS,
    draft_max: Optional[int] = None,
    prompt_source: str = "",
    on_progress: Optional[Callable[[EvalProgress], None]] = None,
) -> dict:
    """Score the head in `head_dir` (either layout; and its untrained start) and store the result in its report."""
    from ..drafters.eagle3_head import is_eagle3_dir, load_eagle3
    from ..drafters.eagle_head import load_head

    directory = Path(head_dir).expanduser()
    info = target_info(target, tokenizer)
    weights = check_target(info)
    report = read_report(directory)
    seed = int(((report.get("config") or {}).get("seed")) or 0)
    depth = draft_max or DEFAULT_TREE_DEPTH
    layers: tuple[int, ...] = ()
    head_tokens = None
    if is_eagle3_dir(directory):  # EAGLE-3's layout: its own read-out; "before" is distill's start for it
        from .eagle3_train import initial_head as initial_eagle3

        eagle3, layers = load_eagle3(directory, info)
        untrained = initial_eagle3(target, eagle3.draft_ids(), layers, seed).eval() if baseline else None
        trained: Any = eagle3
    else:
        trained, meta = load_head(directory, info)
        head_tokens = meta.get("head_tokens")
        start = str((report.get("config") or {}).get("head_init") or "random")  # (heads before 0.5.0's: random)
        untrained = initial_head(target, seed, trained.config.intermediate_size, start)[0].eval() if baseline else None
    heads = {True: trained, False: untrained}
    candidates = {}
    for label, is_trained, width in EAGLE_RUNS:
        head = heads[is_trained]
        if head is None:
            continue
        tree_width = DEFAULT_TREE_WIDTH if width is None else width
        # acceptance, not speed: trees grown whatever this machine's timings (expand_gain 0)
        drafter = EagleDrafter(head, weights, head_tokens=head_tokens, draft_max=depth,
                               eos_token_ids=info.eos_token_ids, tree_width=tree_width, feature_layers=layers,
                               expand_gain=0)
        along = (eagle3_logits_along(drafter.head, weights.embed, layers, info.vocab_size) if layers else
                 head_logits_along(drafter.head, weights))
        candidates[label] = Candidate(drafter, along, head_tokens)
    started = time.perf_counter()
    budget = max(DEFAULT_BUDGET, depth)  # tree nodes (or chain tokens) per step, as chat and bench verify
    scores = score_candidates(target, tokenizer, prompts, candidates, eos_token_ids=info.eos_token_ids,
                              max_new_tokens=max_new_tokens, budget=budget, on_progress=on_progress,
                              feature_layers=layers, weights=weights)
    settings = {"max_new_tokens": max_new_tokens, "draft_max": depth, "tree_width": DEFAULT_TREE_WIDTH,
                "tree_budget": budget, "decoding": "greedy", "head_tokens": len(head_tokens) if head_tokens else None}
    return store_evaluation(directory, report, target_name, info.fingerprint, len(prompts), prompt_source, settings,
                            time.perf_counter() - started, scores)
