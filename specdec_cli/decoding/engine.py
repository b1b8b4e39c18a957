"""The draft-then-verify loop: prefill, then steps of draft -> one verify forward -> accept -> commit.

The engine owns the target model and its KV cache. Invariant between steps: the cache holds every committed
token except the newest one, which the next verify forward scores together with the draft. A drafter sees
the committed context and a length budget; it learns what happened from the `StepEvent` the engine emits
after every forward (the same events feed displays and statistics).

This file is the loop alone. Around it, one room each: in target_model/, the verifying forward, chosen once per
target with its row-invariant set-up (forward.py, exact_setup.py), rolling the cache back (rollback.py) and the
one-time tree self-check (tree_check.py); here in decoding/, the stored verify-cost curve (curve_store.py), what
to verify (planner.py), acceptance math (verify.py) and distribution warping (sampling.py). It does not format
prompts or print anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

import torch

from .. import kernels
from ..errors import SpecdecError
from ..target_model.verify.check_outcome import CheckOutcome
from ..target_model.verify.exact_setup import choose_forward
from ..target_model.verify.forward import VerifyForward, new_cache
from ..target_model.verify.rollback import keep_accepted
from ..target_model.verify.tree_check import check_trees
from .cost_curve import CostCurve
from .curve_store import CurveStore, cost_cache_file, forward_timer
from .draft import Draft, Drafter, FinishReason, StepEvent
from .generation_config import GenerationConfig
from .grammar import GRAMMAR_SOURCE, Constraint
from .logprobs import choosing_rows, token_logprobs
from .planner import DraftPlanner, Plan
from .prompt_cache import PromptCache
from .sampling import sample, warp_probs
from .stats import GenerationStats, summarize
from .verify import children_of, greedy_accept, greedy_accept_tree, speculative_accept, speculative_accept_tree

EventCallback = Callable[[StepEvent], None]
SCORED_TOPK = 8  # a drafter that needs scored_topk gets the target's top-8 tokens at every scored position
STOP_MARGIN = 16  # characters of earlier text decoded beyond the longest stop string (split characters, spaces)


@dataclass
class Generation:
    tokens: list[int]  # new tokens (EOS included when the target produced it, like transformers' generate)
    finish_reason: FinishReason
    stats: GenerationStats
    events: list[StepEvent] = field(default_factory=list)
    text_end: Optional[int] = None  # with a stop string: length of the decoded text before it
    cached_tokens: int = 0  # prompt tokens whose KV entries came from the prompt cache (not computed)


class Engine:
    """Speculative generation with one target model (batch size 1).

    `target` is the verifying forward chosen for the model (exact_setup.choose_forward: the native decoder or
    transformers' modules, row-invariant where exactness is on), or a model, given the forward chosen for it by
    default. The engine reads what it needs from it; callers ask `engine.forward` (its outcome, `prepare`,
    `own_kernels`)."""

    def __init__(self, target: Any, tokenizer: Any = None, planner: Optional[DraftPlanner] = None):
        self.forward: VerifyForward = target if isinstance(target, VerifyForward) else choose_forward(target)
        self.model = model = self.forward.model
        self.tokenizer = tokenizer  # only needed for stop strings
        self.device = self.forward.device
        self.curves = CurveStore(lambda: cost_cache_file(model, self.forward.rows),
                                 lambda: forward_timer(self.forward))
        # what to verify each step; lives as long as the engine, so a chat session keeps learning. Without one
        # given, the verify-cost curve is the one stored for this machine and model, else measured.
        self.planner = planner or DraftPlanner(self.curves.load_or_measure)
        self.tree_outcome = CheckOutcome("not checked")  # passed, failed or chains only once a tree was drafted

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
        config, limit = self._checked(prompt_ids, config)
        max_rows = self.forward.prepare(config.budget)  # row-invariant blocks up to this size (None: not exact)
        block_limit: Optional[int] = getattr(self.forward, "max_block", None)  # rows a verify block may have
        generator = generator_for(config)
        eos = set(config.eos_token_ids)
        events: list[StepEvent] = []
        context = list(prompt_ids)
        new_tokens: list[int] = []
        needs = drafter.needs  # what the drafter reads beyond tokens: computed for it alone
        static = hasattr(self.forward, "new_cache")  # a forward with one static cache (the device engine's)
        if config.cost_aware and static:  # the curve is measured (on that cache) now, not in the middle of this
            _ = self.planner.curve  # generation's
        cache, cached = new_cache(self.forward), 0  # the device engine's static cache, else a KVCache
        if prompt_cache is not None and not needs.features and not static:  # feature drafters read the whole
            held, cached = prompt_cache.take(prompt_ids)  # prompt's features; a static cache is not kept
            cache = cache if held is None else held

        def emit(event: StepEvent) -> None:
            events.append(event)
            drafter.observe(event)
            if on_event is not None:
                on_event(event)

        started = time.perf_counter()
        # Prefill: the prompt (what the cache does not hold yet); its last logits give the first new token.
        # [1, vocab], [prompt, hidden] or None
        logits, features = prefill(self.forward, context, cache, cached, needs.features, needs.feature_layers)
        constraint = None if config.grammar is None else Constraint(config.grammar, self.tokenizer,
                                                                    config.eos_token_ids)
        first = choose(allowed_only(logits[-1:], constraint, [])[0], generator, config)
        ttft = time.perf_counter() - started
        finish, committed, text_end = self._commit(context, new_tokens, [first], eos, config, constraint)
        emit(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=committed, verify_seconds=ttft,
                       prompt_tokens=tuple(prompt_ids), settings=config, finished=finish, features=features,
                       logprobs=None if config.logprobs is None else token_logprobs(logits[-1:], committed,
                                                                                    config.logprobs)))

        while finish is None:
            budget = min(config.budget, config.max_new_tokens - len(new_tokens) - 1)
            if block_limit is not None:  # a forward with a fixed block size (the device engine's)
                budget = min(budget, block_limit - 1)
            # 1. Draft: the drafter guesses up to `budget` tokens (chain) or nodes (tree) after the context;
            #    the planner keeps the part worth verifying and picks the forward's row count.
            t0 = time.perf_counter()
            asked = budget  # the planner's one call on whether drafting pays, and how much (planner.py)
            if config.cost_aware and budget > 0:
                asked = self.planner.draft_budget(drafter.name, budget)
            draft = drafter.propose(context, asked) if asked > 0 else Draft.empty(drafter.name)
            self.planner.observe_drafting(draft.source, len(draft), time.perf_counter() - t0)
            draft, plan = self._plan(draft, budget, config, constraint)
            t1 = time.perf_counter()
            # 2. Verify: score the newest committed token and every kept node in one forward (plus padding rows
            #    when a bigger forward is cheaper on this machine; their outputs and cache entries are dropped).
            past = len(context) - 1
            rows = plan.rows if limit is None else min(plan.rows, limit - past)  # padding stays inside the context
            rows = rows if max_rows is None else min(rows, max_rows)  # and inside the row-invariant sizes
            block, parents = pad_block([context[-1], *draft.tokens], draft.parents, rows)
            logits, features = self.forward(block, cache, past, tree=parents, features=needs.features,
                                            feature_layers=needs.feature_layers)  # [rows, vocab], [rows, .] or None
            raw = logits[: len(draft) + 1]  # [k+1, vocab]
            logits = raw if config.greedy else allowed_only(raw, constraint, draft.tokens)  # (a grammar's law)
            # 3. Accept: the longest acceptable path, then the target's own token after it. Greedy, what the
            #    step reads back from the target's device (the argmax, and the top tokens a drafter asks for) is
            #    one read: on a GPU, the step's one host synchronisation. Under a grammar, each row's best
            #    allowed token.
            read = read_back(logits, config.greedy, needs.scored_topk)
            if constraint is not None and read[0] is not None:
                read = (constraint.greedy_choices(raw, draft.tokens, read[0]), read[1])
            path, target_token = self._accept(draft, logits, config, generator, read[0])
            # 4. Commit the accepted drafts + the correction/bonus token; roll the cache back to match.
            finish, committed, text_end = self._commit(
                context, new_tokens, [*(draft.tokens[node] for node in path), target_token], eos, config, constraint
            )
            keep_accepted(cache, past, path, draft.is_chain, len(context) - 1)
            t2 = time.perf_counter()
            if config.cost_aware:
                self.planner.record(draft, len(path), len(committed), rows, t2 - t1, t1 - t0)
            topk = read[1]  # [k+1, 8] where the drafter asks for it
            if needs.scored_topk and topk is None:
                topk = torch.topk(logits, min(SCORED_TOPK, logits.shape[-1]), dim=-1).indices.tolist()
            if features is not None:  # the root's and the accepted path's rows: [1 + accepted, hidden]
                features = features[choosing_rows(path)]
            scored = None if config.logprobs is None else \
                token_logprobs(raw[choosing_rows(path)], committed, config.logprobs)
            emit(StepEvent(kind="step", draft=draft, committed=committed, accepted_path=path,
                           draft_seconds=t1 - t0, verify_seconds=t2 - t1, finished=finish, scored_topk=topk,
                           verify_rows=rows, features=features, logprobs=scored))

        wall = time.perf_counter() - started
        if self.planner.has_curve:  # what this engine's steps taught the curve: the next session's start
            self.curves.keep(self.planner.curve)
        stats = summarize(events, wall_seconds=wall, ttft_seconds=ttft)
        if prompt_cache is not None and not static:
            prompt_cache.keep(cache, context[:-1])  # the invariant: every committed token but the newest
        return Generation(new_tokens, finish, stats, events, text_end, cached)

    def _checked(self, prompt_ids: Sequence[int], config: GenerationConfig) -> tuple[GenerationConfig, Optional[int]]:
        """The settings checked, the answer bounded by the model's context; and that context's length, if known."""
        config.check()
        if not prompt_ids:
            raise SpecdecError("the prompt is empty")
        limit = context_limit(self.model.config)  # positions the model was trained for, if it says
        capacity = getattr(self.forward, "capacity", None)  # tokens the forward's cache holds (the device engine's)
        if capacity is not None:
            limit = capacity if limit is None else min(limit, capacity)
        if limit is not None:
            if len(prompt_ids) >= limit:
                raise SpecdecError(f"the prompt has {len(prompt_ids)} tokens, but this model reads at most {limit} "
                                   "(prompt and answer together): shorten it", setting="prompt")
            # the answer stops where the model's context ends (finish reason "length"), never past it
            config = replace(config, max_new_tokens=min(config.max_new_tokens, limit - len(prompt_ids)))
        if config.stop and self.tokenizer is None:
            raise SpecdecError("stop strings need the target's tokenizer")
        return config, limit

    def _plan(self, draft: Draft, budget: int, config: GenerationConfig,
              constraint: Optional[Constraint] = None) -> tuple[Draft, Plan]:
        """The part of the draft to verify and the verify forward's rows (trees become chains where needed; under
        a grammar, chains cut at their first token it forbids)."""
        if not draft.is_chain and (constraint is not None or not self.supports_trees):
            draft = first_branch(draft)
        if constraint is not None:
            forced = constraint.forced()[:budget]
            if forced and draft.tokens[: len(forced)] != forced[: len(draft.tokens)]:
                draft = Draft(forced, GRAMMAR_SOURCE)  # what the grammar forces, where the drafter guessed other
            draft = trim(draft, constraint.allowed(draft.tokens))
        if not config.cost_aware:
            draft = trim(draft, budget)
            return draft, Plan(len(draft), len(draft) + 1)
        plan = self.planner.plan(draft, budget)
        return trim(draft, plan.keep), plan

    def _accept(self, draft: Draft, logits: torch.Tensor, config: GenerationConfig,
                generator: Optional[torch.Generator], argmax: Optional[list[int]] = None) -> tuple[list[int], int]:
        """(accepted node indices, the target's own token) under greedy or speculative sampling; greedy, `argmax`
        is the logits' argmax per row when already read."""
        if config.greedy:
            target_argmax = argmax if argmax is not None else logits.argmax(dim=-1).tolist()  # [k+1]
            if draft.parents is None:  # a chain
                path = list(range(greedy_accept(draft.tokens, target_argmax)))
            else:
                path = greedy_accept_tree(draft.tokens, draft.parents, target_argmax)
            return path, target_argmax[path[-1] + 1 if path else 0]
        p_target = warp_probs(logits, config.temperature, config.top_k, config.top_p, config.min_p)  # [k+1, vocab]
        if draft.parents is not None:  # a tree
            return speculative_accept_tree(draft.tokens, draft.parents, p_target, generator)
        p_draft = None if draft.p_draft is None else draft.p_draft.to(p_target.device, torch.float32)
        accepted, target_token = speculative_accept(draft.tokens, p_target, p_draft, generator)
        return list(range(accepted)), target_token

    def _commit(
        self, context: list[int], new_tokens: list[int], tokens: list[int], eos: set[int], config: GenerationConfig,
        constraint: Optional[Constraint] = None,
    ) -> tuple[Optional[FinishReason], list[int], Optional[int]]:
        """Append tokens, cutting at EOS, at the token budget or at a stop string (and advance the grammar).

        Returns (finish reason or None, the tokens committed, the text length before a stop string or None)."""
        committed: list[int] = []
        finish: Optional[FinishReason] = None
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
        if constraint is not None:
            constraint.commit(committed)
        return finish, committed, text_end

    def _find_stop(self, before: list[int], committed: list[int], stops: Sequence[str]) -> tuple[int, Optional[int]]:
        """Where the first stop string begins in the decoded output, and how many committed tokens reach it.

        A step decodes only a tail window: the committed tokens after enough of the earlier ones to hold any stop
        string that began before them (and a margin for characters split across tokens). Only when a stop string
        shows there is the whole output decoded, once, to place it exactly."""
        if not self._stop_in_tail(before, committed, stops):
            return len(committed), None
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

    def _stop_in_tail(self, before: list[int], committed: list[int], stops: Sequence[str]) -> bool:
        """Whether a stop string shows in the text of the committed tokens after a tail of the earlier ones that
        decodes to at least the longest stop string plus STOP_MARGIN characters (or all of them)."""
        wanted = max(len(stop) for stop in stops) + STOP_MARGIN
        count = min(len(before), wanted)  # tokens of the tail; most decode to a character or more
        while count < len(before) and len(self.tokenizer.decode(before[-count:], skip_special_tokens=True)) < wanted:
            count = min(len(before), 2 * count)
        tail = before[len(before) - count :]
        text = self.tokenizer.decode(tail + committed, skip_special_tokens=True)
        return any(stop and stop in text for stop in stops)

    # -- set-up the loop relies on, each in its own room ---------------------------------------------------

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


def allowed_only(logits: torch.Tensor, constraint: Optional[Constraint], draft_tokens: Sequence[int]) -> torch.Tensor:
    """logits [k+1, vocab] with what the grammar forbids at each row (after the draft's tokens before it) at -inf;
    as they are without a grammar."""
    if constraint is None:
        return logits
    allowed = constraint.masks(draft_tokens, logits.shape[-1]).to(logits.device)  # [k+1, vocab]
    return logits.masked_fill(~allowed, float("-inf"))


def choose(logits: torch.Tensor, generator: Optional[torch.Generator], config: GenerationConfig) -> int:
    """The target's own choice from one row of logits [vocab], as plain decoding makes it."""
    if config.greedy:
        return int(logits.argmax())
    return sample(warp_probs(logits, config.temperature, config.top_k, config.top_p, config.min_p), generator)


def generator_for(config: GenerationConfig) -> Optional[torch.Generator]:
    """Sampling's random source, seeded from the settings (None when greedy)."""
    if config.greedy:
        return None
    generator = torch.Generator(device="cpu")
    generator.manual_seed(config.seed if config.seed is not None else torch.seed())
    return generator


def read_back(logits: torch.Tensor, greedy: bool, topk: bool) -> tuple[Optional[list[int]], Optional[list[list[int]]]]:
    """Greedy: (each row's argmax [k+1], each row's top SCORED_TOPK tokens [k+1, 8] where `topk`), read back from
    the logits' device in one transfer; sampling: (None, None), read by the sampling rules themselves."""
    if not greedy:
        return None, None
    if _kernel_reads(logits):  # the kernels' one pass: column 0 the argmax (the first maximum, as torch's)
        best = kernels.top_tokens(logits, SCORED_TOPK if topk else 1).tolist()  # [k+1, 8 or 1]
        return [row[0] for row in best], (best if topk else None)
    picked = logits.argmax(dim=-1, keepdim=True)  # [k+1, 1]
    if topk:
        picked = torch.cat([picked, torch.topk(logits, min(SCORED_TOPK, logits.shape[-1]), dim=-1).indices], dim=1)
    rows = picked.tolist()  # the one read
    return [row[0] for row in rows], ([row[1:] for row in rows] if topk else None)


def _kernel_reads(logits: torch.Tensor) -> bool:
    """Whether the kernels read this block's choices: float32 rows in CPU memory, a vocabulary of SCORED_TOPK or
    more (the GPU's, and other dtypes, are torch's)."""
    return (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
            and logits.shape[-1] >= SCORED_TOPK and logits.is_contiguous() and kernels.available())


def trim(draft: Draft, length: int) -> Draft:
    """The first `length` nodes of a draft (parents come first, so any prefix is a tree)."""
    if len(draft) <= length:
        return draft
    parents = None if draft.parents is None else draft.parents[:length]
    p_draft = None if draft.p_draft is None else draft.p_draft[:length]
    confidence = None if draft.confidence is None else draft.confidence[:length]
    return Draft(draft.tokens[:length], draft.source, parents, p_draft, draft.match_len, confidence)


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


def pad_block(block: list[int], parents: Optional[list[int]], rows: int) -> tuple[list[int], Optional[list[int]]]:
    """Fill a verify block [root, *drafted] up to `rows` rows by repeating its last token: a chain's padding
    continues the chain, a tree's hangs off the root; the engine drops their outputs and cache entries."""
    padding = rows - len(block)
    if padding <= 0:
        return block, parents
    block = [*block, *[block[-1]] * padding]
    return block, None if parents is None else [*parents, *[-1] * padding]


def first_branch(draft: Draft) -> Draft:
    """A tree's first root-to-leaf path (each node's first child), as a chain."""
    tokens, nodes, node = [], [], -1
    children = children_of(draft.parents or [])
    while children.get(node):
        node = children[node][0]
        tokens.append(draft.tokens[node])
        nodes.append(node)
    confidence = None if draft.confidence is None else [draft.confidence[node] for node in nodes]
    return Draft(tokens, draft.source, None, None, draft.match_len, confidence)
