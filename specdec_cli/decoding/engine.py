"""The draft-then-verify loop: prefill, then steps of draft -> one verify forward -> accept -> commit.

The engine owns the target model and its KV cache. Invariant between steps: the cache holds every committed
token except the newest one, which the next verify forward scores together with the draft. A drafter sees
the committed context and a length budget; it learns what happened from the `StepEvent` the engine emits
after every forward (the same events feed displays and statistics).

This file is the loop alone. Around it, one room each: in target_model/, the verifying forward, chosen once per
target (load/forward_choice.py) with its row-invariant set-up (forward.py, exact_setup.py), rolling the cache
back (rollback.py) and the one-time tree self-check (tree_check.py); here in decoding/, a generation's state and
result (run.py), the stored verify-cost curve (curve_store.py), what to verify (planner.py), acceptance math
(verify.py), distribution warping (sampling.py) and a step's pure parts (step_parts.py). It does not format
prompts or print anything.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Iterable, Optional, Sequence, cast

import torch

from ..errors import SpecdecError
from ..target_model.load.forward_choice import choose_forward
from ..target_model.verify.check_outcome import CheckOutcome
from ..target_model.verify.forward import ManyForward, VerifyForward
from ..target_model.verify.rollback import keep_accepted
from ..target_model.verify.tree_check import check_trees
from .batch_share import BatchShares, batch_share
from .cost_curve import CostCurve
from .curve_store import CurveStore
from .draft import Draft, Drafter, StepEvent
from .dry import breakers_for
from .generation_config import GenerationConfig
from .grammar import GRAMMAR_SOURCE, Constraint
from .logprobs import choosing_rows
from .planner import DraftPlanner, Plan
from .prompt_cache import PromptCache
from .run import EventCallback, Generation, Run
from .stats import summarize
from .step_parts import (
    SCORED_TOPK,
    allowed_only,
    choose,
    first_branch,
    generator_for,
    greedy_without_eos,
    pad_block,
    read_back,
    read_together,
    trim,
    without_eos,
)
from .stop_strings import find_stop
from .verify import accept_draft


class Engine:
    """Speculative generation with one target model (batch size 1).

    `target` is the verifying forward chosen for the model (load/forward_choice.choose_forward: the native decoder or
    transformers' modules, row-invariant where exactness is on), or a model, given the forward chosen for it by
    default. The engine reads what it needs from it; callers ask `engine.forward` (its outcome, `prepare`,
    `own_kernels`)."""

    def __init__(self, target: Any, tokenizer: Any = None, planner: Optional[DraftPlanner] = None):
        self.forward: VerifyForward = target if isinstance(target, VerifyForward) else choose_forward(target)
        self.model = model = self.forward.model
        self.tokenizer = tokenizer  # only needed for stop strings
        self.device = self.forward.device
        self.curves = CurveStore.of_forward(model, self.forward)
        # what to verify each step; lives as long as the engine, so a chat session keeps learning. Without one
        # given, the verify-cost curve is the one stored for this machine and model, else measured.
        self.planner = planner or DraftPlanner(self.curves.load_or_measure)
        self.tree_outcome = CheckOutcome("not checked")  # passed, failed or chains only once a tree was drafted
        self._many_of: tuple[Any, bool] = (None, False)  # (forward, whether it scores several sequences at once)
        self.batch_shares = BatchShares()  # whether drafts pay in this session's batched steps

    # -- the loop ------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        drafter: Drafter,
        config: GenerationConfig,
        on_event: Optional[EventCallback] = None,
        prompt_cache: Optional[PromptCache] = None,
    ) -> Generation:
        """Generate after `prompt_ids`. With a `prompt_cache`, the prompt's first tokens that the cache holds are
        not computed again, and the cache keeps this generation's entries when it finishes (prompt_cache.py)."""
        run = self.start(prompt_ids, drafter, config, on_event, prompt_cache)
        while run.finish is None:
            self.step(run)
        return self.close(run)

    @torch.inference_mode()
    def start(self, prompt_ids: Sequence[int], drafter: Drafter, config: GenerationConfig,
              on_event: Optional[EventCallback] = None, prompt_cache: Optional[PromptCache] = None) -> "Run":
        """A generation begun: the settings checked, the prompt computed (what the prompt cache does not hold) and
        the first new token chosen and committed. `step` goes on from here, `close` ends it (batch.py runs several
        side by side)."""
        run = self.begin(prompt_ids, drafter, config, on_event, prompt_cache)
        self.compute_prompt(run)
        return run

    @torch.inference_mode()  # (also Batch.add's, outside the other stages)
    def compute_prompt(self, run: "Run") -> None:
        """Prefill: the prompt (what the cache does not hold yet) in one go; its last logits give the first token."""
        needs = run.drafter.needs  # what the drafter reads beyond tokens: computed for it alone
        logits, features = prefill(self.forward, run.context, run.cache, run.computed or 0, needs.features,
                                   needs.feature_layers)  # [1, vocab], [prompt, hidden] or None
        self.first_token(run, logits, features)

    def first_token(self, run: "Run", logits: torch.Tensor, features: Any = None) -> None:
        """The prompt computed (its last row's logits [1, vocab]): the first new token chosen and committed."""
        logits = run.shaped(logits[-1:])  # [1, vocab]
        row = allowed_only(logits, run.constraint, [])  # [1, vocab]
        row = without_eos(row, run.eos, run.barred(Draft.empty("prefill")))
        first = choose(row[0], run.generator, run.config)
        run.ttft, run.computed, prompt = time.perf_counter() - run.started, None, tuple(run.context)
        committed = self._commit(run, [first])
        run.emit(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=committed,
                           verify_seconds=run.ttft, prompt_tokens=prompt, settings=run.config, finished=run.finish,
                           features=features, logprobs=run.logprobs(logits, committed)))

    @torch.inference_mode()
    def step(self, run: "Run") -> None:
        """One step of a generation: draft, verify in one forward, accept, commit."""
        needs = run.drafter.needs
        # 1. Draft: the drafter guesses up to a budget of tokens (chain) or nodes (tree) after the context;
        #    the planner keeps the part worth verifying and picks the forward's row count.
        t0 = time.perf_counter()
        draft, rows = self._draft(run)
        t1 = time.perf_counter()
        # 2. Verify: score the newest committed token and every kept node in one forward (plus padding rows
        #    when a bigger forward is cheaper on this machine; their outputs and cache entries are dropped).
        past = len(run.context) - 1
        tree = draft.parents if len(draft) else None  # nothing kept of a tree: the plain forward (a mask costs ~9%)
        block, parents = pad_block([run.context[-1], *draft.tokens], tree, rows)
        raw, features = self.forward(block, run.cache, past, tree=parents, features=needs.features,
                                     feature_layers=needs.feature_layers)  # [rows, vocab], [rows, .] or None
        raw = run.shaped(raw, draft)
        # 3. Accept: the longest acceptable path, then the target's own token after it.
        path, target_token, topk = self._accept_step(run, draft, raw[: len(draft) + 1])  # rows [k+1, vocab]
        # 4. Commit the accepted drafts + the correction/bonus token; roll the cache back to match.
        committed = self._commit(run, [*(draft.tokens[node] for node in path), target_token])
        keep_accepted(run.cache, past, path, draft.is_chain, len(run.context) - 1)
        t2 = time.perf_counter()
        if run.config.cost_aware:
            self.planner.record(draft, len(path), len(committed), rows, t2 - t1, t1 - t0)
        run.emit(StepEvent(kind="step", draft=draft, committed=committed, accepted_path=path,
                           draft_seconds=t1 - t0, verify_seconds=t2 - t1, finished=run.finish, scored_topk=topk,
                           verify_rows=rows, logprobs=run.logprobs(raw[choosing_rows(path)], committed),
                           features=None if features is None else features[choosing_rows(path)]))

    @torch.inference_mode()
    def step_many(self, runs: Sequence["Run"], prompts: Sequence["Run"] = ()) -> None:
        """One step of several generations in one forward (batch.py): each drafts a chain within its share of the
        forward's row-invariant rows, every sequence's block is scored after its own cache (`ManyForward.many`:
        each row's bits are those of its block alone), and each accepts and commits on its own. So every answer
        is the one it would be alone (greedy: plain decoding's). `prompts` (runs from `begin`, when `batches`)
        fill the rows left with the next pieces of their prompts, in order; a prompt's last piece commits its
        first token (a prompt's entries are the same bits in any pieces: `prefill`). The planner learns acceptance
        from the step, not the cost curve; its speed tells `batch_shares` whether drafts pay in a batch."""
        forward, rows = self.forward, self.forward.rows or 0
        together = self.batches(run.drafter for run in (*runs, *prompts))
        alone = not together or len(runs) >= rows  # (or no row left for a prompt's piece)
        if alone or not prompts and len(runs) == 1:
            for run in prompts:  # each computed whole
                self.compute_prompt(run)
            for run in runs:  # one at a time: the forward cannot score several sequences, or a drafter reads layers
                self.step(run)
            return
        # rows for the prompts' pieces: at least half of what the sequences' newest tokens leave
        reserve = min(max(1, (rows - len(runs)) // 2), sum(len(run.context) - (run.computed or 0) for run in prompts))
        timed = bool(runs) and any(run.config.cost_aware for run in runs)
        share = self.batch_shares.choose(len(runs), batch_share(self.planner.curve, rows - reserve, len(runs))) \
            if timed else (rows - reserve) // max(1, len(runs)) - 1  # draft tokens each sequence may verify
        # 1. Draft: each sequence's chain, within its share; the prompts' next pieces in the rows left.
        t0 = time.perf_counter()
        drafts = [self._draft(run, share)[0] for run in runs]
        pieces, left = [], rows - sum(len(draft) + 1 for draft in drafts)
        for run in prompts:
            start = run.computed or 0
            stop = min(len(run.context), start + left)
            if stop > start:
                pieces.append((run, start, stop))
                left -= stop - start
        t1 = time.perf_counter()
        # 2. Verify: every sequence's newest token and chain, and each piece, after its own cache, in one forward
        #    (logits of a prompt's last row only).
        blocks = [([run.context[-1], *draft.tokens], run.cache, len(run.context) - 1) for run, draft in
                  zip(runs, drafts)] + [(run.context[start:stop], run.cache, start) for run, start, stop in pieces]
        keep = [len(draft) + 1 for draft in drafts] + [int(stop == len(run.context)) for run, _, stop in pieces]
        scores = cast(ManyForward, forward).many(blocks, keep)
        scores = [score._replace(logits=run.shaped(score.logits, draft)) for run, score, draft in
                  zip(runs, scores, drafts)] + scores[len(runs) :]  # (a prompt's last row: shaped in first_token)
        verified, committed_all = time.perf_counter() - t1, 0
        reads = read_together(runs, scores)
        for run, draft, score, read in zip(runs, drafts, scores, reads):
            # 3. Accept and 4. commit, per sequence; its cache rolled back to its accepted tokens.
            past = len(run.context) - 1
            path, target_token, topk = self._accept_step(run, draft, score.logits, read)
            committed = self._commit(run, [*(draft.tokens[node] for node in path), target_token])
            committed_all += len(committed)
            keep_accepted(run.cache, past, path, True, len(run.context) - 1)
            self.planner.learn(draft, len(path))
            features = None if score.features is None or not run.drafter.needs.features else \
                score.features[choosing_rows(path)]
            run.emit(StepEvent(kind="step", draft=draft, committed=committed, accepted_path=path,
                               draft_seconds=(t1 - t0) / len(runs), verify_seconds=verified / len(runs),
                               finished=run.finish, scored_topk=topk, verify_rows=len(draft) + 1, features=features,
                               logprobs=run.logprobs(score.logits[choosing_rows(path)], committed)))
        if timed and not pieces:  # (a prompt's piece would be timed too)
            self.batch_shares.record(len(runs), share > 0, committed_all, time.perf_counter() - t0)
        for (run, _, stop), score in zip(pieces, scores[len(runs) :]):
            run.computed = stop
            if run.drafter.needs.features and score.features is not None:  # (a copy: the buffers are used again)
                run.prompt_features.append(score.features.clone())  # [piece, hidden]
            if stop == len(run.context):  # the prompt computed: its first token (and its features, where read)
                self.first_token(run, score.logits, torch.cat(run.prompt_features) if run.prompt_features else None)
                run.prompt_features.clear()

    @torch.inference_mode()
    def compute_ahead(self, prompt_cache: PromptCache, tokens: Sequence[int], at_least: int, most: int) -> int:
        """The held context that `tokens` continue (sharing at least `at_least` of them: PromptCache.continued_by)
        computed on by at most `most` of them, as its next prompt would compute them (`prefill`'s row-invariant
        blocks: the same entries in any pieces), so that prompt computes only the rest. How many were computed:
        none where nothing held is continued, or where the forward is not row-invariant (pieces would round
        differently) or keeps one cache of its own."""
        if not self.forward.rows or self.forward.static_cache:
            return 0
        upto = len(tokens) if self.context is None else min(len(tokens), self.context - 1)
        found = prompt_cache.continued_by(tokens[:upto], at_least)
        if found is None:
            return 0
        cache, held = found
        upto = min(upto, held + most)
        prefill(self.forward, tokens[:upto], cache, held)
        prompt_cache.grown(cache, tokens[:upto])
        return upto - held

    def batches(self, drafters: Iterable[Drafter]) -> bool:
        """Whether one forward can score sequences drafted by these together: a forward that scores several (the
        native decoder's) with row-invariant blocks, and no drafter reading the target's layer states."""
        forward = self.forward
        if self._many_of[0] is not forward:  # (a Protocol's isinstance is slow: once per forward)
            self._many_of = (forward, isinstance(forward, ManyForward))
        return self._many_of[1] and bool(forward.rows) and not any(drafter.needs.feature_layers
                                                                   for drafter in drafters)

    # -- the loop's stages ---------------------------------------------------------------------------------

    def begin(self, prompt_ids: Sequence[int], drafter: Drafter, config: GenerationConfig,
              on_event: Optional[EventCallback] = None, prompt_cache: Optional[PromptCache] = None) -> "Run":
        """A generation's state, its prompt not computed yet (`start` computes it whole; a batch in pieces,
        `step_many`): the settings checked, the forward prepared, the cache (from the prompt cache where it holds
        the prompt's beginning), the grammar's matcher."""
        config, limit = self._checked(prompt_ids, config)
        max_rows = self.forward.prepare(config.budget)  # row-invariant blocks up to this size (None: not exact)
        static = self.forward.static_cache  # one cache of the forward's own (the device engine's): never kept
        if config.cost_aware and static:  # the curve is measured (on that cache) now, not in the middle of this
            _ = self.planner.curve  # generation's
        cache, cached = self.forward.new_cache(), 0
        if prompt_cache is not None and not drafter.needs.features and not static:  # feature drafters read the
            held, cached = prompt_cache.take(prompt_ids)  # whole prompt's features
            cache = cache if held is None else held
        constraint = None if config.grammar is None else Constraint(config.grammar, self.tokenizer,
                                                                    config.eos_token_ids)
        breakers = breakers_for(self.tokenizer, config.dry.breakers) if config.dry and config.dry.on else None
        return Run(config, drafter, on_event, limit, max_rows, list(prompt_ids), cache, cached, constraint,
                   generator_for(config), set(config.eos_token_ids), time.perf_counter(), prompt_cache, computed=cached,
                   dry_breakers=breakers)

    def _draft(self, run: "Run", most: Optional[int] = None) -> tuple[Draft, int]:
        """This step's draft, cut to what is verified, and the verify forward's rows; `most`: a batched step's
        share (a chain of at most that many tokens)."""
        config = run.config
        budget = min(config.budget, config.max_new_tokens - len(run.new_tokens) - 1)
        if most is not None:
            budget = min(budget, most)
        if self.forward.max_block is not None:  # a forward with a fixed block size (the device engine's)
            budget = min(budget, self.forward.max_block - 1)
        asked = budget  # the planner's one call on whether drafting pays, and how much (planner.py)
        if config.cost_aware and budget > 0:
            asked = self.planner.draft_budget(run.drafter.name, budget)
        started = time.perf_counter()
        draft = run.drafter.propose(run.context, asked) if asked > 0 else Draft.empty(run.drafter.name)
        self.planner.observe_drafting(draft.source, len(draft), time.perf_counter() - started)
        draft, plan = self._plan(draft, budget, config, run.constraint)
        if most is not None:
            return trim(draft if draft.is_chain else first_branch(draft), most), len(draft) + 1
        past = len(run.context) - 1
        rows = plan.rows if run.limit is None else min(plan.rows, run.limit - past)  # padding inside the context
        return draft, rows if run.max_rows is None else min(rows, run.max_rows)  # and the row-invariant sizes

    def _accept_step(self, run: "Run", draft: Draft, raw: torch.Tensor,
                     read: Optional[tuple] = None) -> tuple[list[int], int, Optional[list[list[int]]]]:
        """(accepted node indices, the target's own token, the rows' top tokens where the drafter reads them)
        from the verified rows' logits `raw` [k+1, vocab]. Greedy, what the step reads back from the target's
        device (the argmax, and the top tokens a drafter asks for) is one read: on a GPU, the step's one host
        synchronisation (`read`: that read, made for several sequences at once). Under a grammar, each row's best
        allowed token (sampling: the grammar's law)."""
        config, constraint, needs, barred = run.config, run.constraint, run.drafter.needs, run.barred(draft)
        logits = raw if config.greedy else allowed_only(without_eos(raw, run.eos, barred), constraint, draft.tokens)
        argmax, topk = read if read is not None else read_back(logits, config.greedy, needs.scored_topk)
        if constraint is not None and argmax is not None:
            argmax = constraint.greedy_choices(raw, draft.tokens, argmax)
        if barred and argmax is not None:  # before min_new_tokens: a row's best token other than end-of-text
            argmax = greedy_without_eos(raw, argmax, run.eos, barred)
        path, target_token = accept_draft(draft, logits, config, run.generator, argmax)
        if needs.scored_topk and topk is None:
            topk = torch.topk(logits, min(SCORED_TOPK, logits.shape[-1]), dim=-1).indices.tolist()  # [k+1, 8]
        return path, target_token, topk

    def close(self, run: "Run") -> Generation:
        """The generation's result; the prompt cache (where it had one) keeps its entries."""
        wall = time.perf_counter() - run.started
        if self.planner.has_curve:  # what this engine's steps taught the curve: the next session's start
            self.curves.keep(self.planner.curve)
        stats = summarize(run.events, wall_seconds=wall, ttft_seconds=run.ttft)
        if run.prompt_cache is not None and not self.forward.static_cache:
            run.prompt_cache.keep(run.cache, run.context[:-1])  # the invariant: every committed token but the newest
        return Generation(run.new_tokens, run.finish or "length", stats, run.events, run.text_end, run.cached)

    def _checked(self, prompt_ids: Sequence[int], config: GenerationConfig) -> tuple[GenerationConfig, Optional[int]]:
        """The settings checked, the answer bounded by the model's context; and that context's length, if known."""
        config.check()
        if not prompt_ids:
            raise SpecdecError("the prompt is empty")
        limit = self.context
        if limit is not None:
            if len(prompt_ids) >= limit:
                raise SpecdecError(f"the prompt has {len(prompt_ids)} tokens, but this model reads at most {limit} "
                                   "(prompt and answer together): shorten it", setting="prompt")
            # the answer stops where the model's context ends (finish reason "length"), never past it
            config = replace(config, max_new_tokens=min(config.max_new_tokens, limit - len(prompt_ids)))
        if (config.stop or config.dry is not None) and self.tokenizer is None:
            raise SpecdecError(f"{'stop strings' if config.stop else 'DRY sequence breakers'} need the target's "
                               "tokenizer")
        vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
        if isinstance(vocab, int) and any(token >= vocab for token, _ in config.logit_bias):
            raise SpecdecError(f"logit_bias names a token past this model's vocabulary ({vocab} tokens)",
                               setting="logit_bias")
        return config, limit

    def _plan(self, draft: Draft, budget: int, config: GenerationConfig,
              constraint: Optional[Constraint] = None) -> tuple[Draft, Plan]:
        """The part of the draft to verify and the verify forward's rows (trees become chains where needed; under
        a grammar, chains cut at their first token it forbids)."""
        if not draft.is_chain and (constraint is not None or not self.supports_trees):
            draft = first_branch(draft)
        if constraint is not None:
            forced = constraint.forced()[:budget]
            if forced and draft.tokens[: len(forced)] != forced:  # the drafter guessed other, less or nothing:
                draft = Draft(forced, GRAMMAR_SOURCE)  # what the grammar forces (a draft past it is kept whole)
            draft = trim(draft, constraint.allowed(draft.tokens))
        if not config.cost_aware:
            draft = trim(draft, budget)
            return draft, Plan(len(draft), len(draft) + 1)
        plan = self.planner.plan(draft, budget)
        return trim(draft, plan.keep), plan

    def _commit(self, run: "Run", tokens: list[int]) -> list[int]:
        """Append tokens, cutting at EOS, at the token budget or at a stop string (and advance the grammar); the
        tokens committed. Sets the run's finish reason, and the text length before a stop string."""
        committed: list[int] = []
        for token in tokens:
            committed.append(token)
            if token in run.eos:
                run.finish = "eos"
                break
            if len(run.new_tokens) + len(committed) >= run.config.max_new_tokens:
                run.finish = "length"
                break
        if run.config.stop:
            keep, text_end = find_stop(self.tokenizer, run.new_tokens, committed, run.config.stop)
            if text_end is not None:
                committed, run.finish, run.text_end = committed[:keep], "stop", text_end
        run.context.extend(committed)
        run.new_tokens.extend(committed)
        if run.constraint is not None:
            run.constraint.commit(committed)
        return committed

    # -- set-up the loop relies on, each in its own room ---------------------------------------------------

    @property
    def context(self) -> Optional[int]:
        """The longest sequence (prompt and answer) this engine generates, if known: the positions the model was
        made for, within what the forward's cache holds (the device engine's). The one place it is decided."""
        limit, capacity = context_limit(self.model.config), self.forward.capacity
        if capacity is not None:
            limit = capacity if limit is None else min(limit, capacity)
        return limit

    @property
    def tree_check(self) -> str:
        """`tree_outcome` as displays and bench JSON show it ("passed", "chains only: ...", "failed: ...")."""
        return self.tree_outcome.text()

    @property
    def supports_trees(self) -> bool:
        """Whether this model verifies token trees exactly (else trees fall back to their first branch): decided
        once per engine, the first time a tree is drafted (tree_check.py); the outcome is in `tree_outcome`."""
        if self.tree_outcome.state == "not checked":
            self.tree_outcome = check_trees(self.model, self.forward)
        return self.tree_outcome.state == "passed"

    def forget(self) -> None:
        """Drop what the planner learned about drafters (the machine's cost curve stays)."""
        self.planner.forget()

    def cost_curve(self) -> CostCurve:
        """t(rows) for this model on this machine (the planner's; measured now if not known yet)."""
        return self.planner.curve


def prefill(forward: Any, prompt: Sequence[int], cache: Any, cached: int = 0,
            features: bool = False, feature_layers: Sequence[int] = ()) -> tuple[torch.Tensor, Any]:
    """The prompt after its `cached` first tokens; the last row's logits [1, vocab] and, when asked, the features
    of the rows computed. Where the forward is row-invariant (exact verification), in blocks of at most its
    row-invariant size, from the first token or after the cached ones: every entry is then the one any block
    computes, so an answer depends on its tokens alone, never on what a prompt cache held nor on which command
    asked (a long prompt's one forward rounds otherwise: its attention is torch's, not the kernels'). Elsewhere,
    in one forward."""
    prompt = list(prompt)
    size = forward.rows
    if not cached and not size:
        return forward(prompt, cache, 0, last_only=True, features=features, feature_layers=feature_layers)
    size = size or len(prompt)
    rows: list[torch.Tensor] = []
    for start in range(cached, len(prompt), size):
        logits, hidden = forward(prompt[start : start + size], cache, start, last_only=True, features=features,
                                 feature_layers=feature_layers)
        if hidden is not None:
            rows.append(hidden)
    return logits, torch.cat(rows) if rows else None


def context_limit(config: Any) -> Optional[int]:
    """The longest sequence (prompt and answer) the model was made for, when its config says."""
    limit = getattr(config, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None
