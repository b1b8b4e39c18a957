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
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from . import native
from .cost_curve import CostCurve, load_or_measure, save_curve
from .defaults import DEFAULT_BUDGET
from .draft import Draft, FinishReason, StepEvent
from .drafters.base import Drafter
from .errors import SpecdecError
from .exact import ExactState, block_mismatch, current_state, exact_rows, install, suspended
from .kv_cache import KVCache
from .native import ROW_INVARIANT_ROWS
from .planner import DraftPlanner, Plan
from .sampling import check_sampling, sample, warp_probs
from .stats import GenerationStats, summarize
from .tree_mask import MASKED_KINDS, attention_kinds, tree_attention_mask, tree_layout
from .verify import children_of, greedy_accept, greedy_accept_tree, speculative_accept, speculative_accept_tree

EventCallback = Callable[[StepEvent], None]
SCORED_TOPK = 8  # each step event carries the target's top-8 tokens at every scored position
# Families whose attention takes 4-D custom masks with explicit position ids (tests/test_families.py), sliding-window
# layers included: those get a windowed tree mask (tree_attention_mask). Whatever the family, a loaded model's
# first tree is checked against sequential decoding (Engine._tree_mismatch); other families verify chains.
TREE_MODEL_TYPES = {"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "smollm3"}
CHECK_WINDOW = 4  # the tree self-check shortens sliding windows to this, so its 12-token prompt runs past them


@dataclass
class GenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy (exact); > 0 = speculative sampling (lossless)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: Optional[int] = None
    budget: int = DEFAULT_BUDGET  # per step: the most draft tokens (chain) or nodes (tree) the engine verifies
    stop: Sequence[str] = ()  # stop strings (need a tokenizer)
    eos_token_ids: Sequence[int] = ()
    cost_aware: bool = True  # verify only as much of each draft as is expected to pay off (planner.py)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check(self) -> None:
        check_sampling(self.temperature, self.top_p, self.top_k)
        if self.max_new_tokens < 1:
            raise SpecdecError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}", setting="max_new_tokens")
        if self.budget < 0:
            raise SpecdecError(f"draft_max must be >= 0 (0 = no drafting), got {self.budget}", setting="draft_max")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise SpecdecError(f"seed must be between 0 and 2^63 - 1, got {self.seed}", setting="seed")
        if any(not stop for stop in self.stop):
            raise SpecdecError("stop strings must not be empty", setting="stop")


@dataclass
class Generation:
    tokens: list[int]  # new tokens (EOS included when the target produced it, like transformers' generate)
    finish_reason: FinishReason
    stats: GenerationStats
    events: list[StepEvent] = field(default_factory=list)
    text_end: Optional[int] = None  # with a stop string: length of the decoded text before it


class Engine:
    """Speculative generation with one target model (batch size 1)."""

    def __init__(self, model: Any, tokenizer: Any = None, planner: Optional[DraftPlanner] = None,
                 exact: Optional[bool] = None):
        self.model = model
        self.tokenizer = tokenizer  # only needed for stop strings
        self.device = next(model.parameters()).device
        # what to verify each step; lives as long as the engine, so a chat session keeps learning. Without one
        # given, the verify-cost curve is the one stored for this machine and model, else measured (~1-2 s).
        self.planner = planner or DraftPlanner(self._stored_or_measured_curve)
        self._saved_observations = 0
        # reduced precision or block weights: verify row-invariantly (exact.py), so speculative output equals
        # plain decoding's
        self.exact = exact_by_default(model) if exact is None else exact
        self._exact_state: Optional[ExactState] = None
        self.exact_check = "off" if not self.exact else "not checked"  # "on: ...", "failed: ..." once installed
        # block weights of a Llama-style model: specdec's own forward (native.py), row-invariant by construction
        self.native = native.decoder_for(model) if self.exact else None
        self._own_kernels = False  # inside native_kernels(): transformers' forward on the model's own kernels
        self._tree_ok: Optional[bool] = None
        self._features: Optional[torch.Tensor] = None  # the last forward's last hidden states [n, hidden]
        self.tree_check = "not checked"  # "passed", "failed: ...", or "chains only: ..." once a tree was drafted

    # -- the model, one forward at a time ------------------------------------------------------------------

    def _forward(
        self, token_ids: Sequence[int], cache: Any, start: int, last_only: bool = False,
        tree: Optional[Sequence[int]] = None,
    ) -> torch.Tensor:
        """Score token_ids placed after the `start` cached tokens; returns logits [n, vocab].

        A chain sits at positions start..start+n-1 under the causal mask. With `tree` (parents of
        token_ids[1:], token_ids[0] being the root) each node sits at start + depth and attends to the cached
        prefix, its ancestors and itself only.
        """
        input_ids = torch.tensor([list(token_ids)], device=self.device)  # [1, n]
        kwargs: dict = {"logits_to_keep": 1} if last_only else {}
        if tree is None:
            position_ids = torch.arange(start, start + len(token_ids), device=self.device).unsqueeze(0)  # [1, n]
        else:
            depth, ancestors = tree_layout(tree)  # [n], [n, n]
            position_ids = (start + depth).unsqueeze(0).to(self.device)  # [1, n]
            kwargs["attention_mask"] = tree_attention_mask(self.model.config, start, depth, ancestors,
                                                           self.model.dtype, self.device)
        forward = self.native if self.native is not None and not self._own_kernels else self.model
        out = forward(input_ids=input_ids, position_ids=position_ids, past_key_values=cache, use_cache=True,
                      output_hidden_states=True, **kwargs)
        self._features = out.hidden_states[-1][0] if out.hidden_states else None  # [n, hidden] (last layer, normed)
        return out.logits[0]  # [n, vocab] (or [1, vocab] with last_only)

    @staticmethod
    def _keep_in_cache(cache: KVCache, past: int, path: Sequence[int], is_chain: bool, length: int) -> None:
        """Keep the prefix, the root and the accepted path's entries; drop the rest of the block."""
        if not is_chain and list(path) != list(range(len(path))):  # a tree path: gather it into place
            check_rollback(cache)
            cache.keep([*range(past + 1), *(past + 1 + node for node in path)])
        Engine._truncate_cache(cache, length)

    @staticmethod
    def _truncate_cache(cache: Any, length: int) -> None:
        """Roll the KV cache back to `length` tokens (drop the rejected drafts)."""
        extra = cache.get_seq_length() - length
        if extra > 0:
            check_rollback(cache)
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
        config.check()
        if not prompt_ids:
            raise SpecdecError("the prompt is empty")
        limit = context_limit(self.model.config)  # positions the model was trained for, if it says
        if limit is not None:
            if len(prompt_ids) >= limit:
                raise SpecdecError(f"the prompt has {len(prompt_ids)} tokens, but this model reads at most {limit} "
                                   "(prompt and answer together): shorten it", setting="prompt")
            # the answer stops where the model's context ends (finish reason "length"), never past it
            config = replace(config, max_new_tokens=min(config.max_new_tokens, limit - len(prompt_ids)))
        if config.stop and self.tokenizer is None:
            raise SpecdecError("stop strings need the target's tokenizer")
        max_rows = self.prepare(config.budget)  # row-invariant blocks up to this size (None: not exact)
        generator = None
        if not config.greedy:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(config.seed if config.seed is not None else torch.seed())
        eos = set(config.eos_token_ids)
        events: list[StepEvent] = []
        context = list(prompt_ids)
        new_tokens: list[int] = []
        cache = KVCache()

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
                       verify_seconds=ttft, prompt_tokens=tuple(prompt_ids), settings=config, finished=finish,
                       features=self._features))

        while finish is None:
            budget = min(config.budget, config.max_new_tokens - len(new_tokens) - 1)
            # 1. Draft: the drafter guesses up to `budget` tokens (chain) or nodes (tree) after the context;
            #    the planner keeps the part worth verifying and picks the forward's row count.
            t0 = time.perf_counter()
            draft = drafter.propose(context, budget) if budget > 0 else Draft.empty(drafter.name)
            self.planner.observe_drafting(draft.source, len(draft), time.perf_counter() - t0)
            draft, plan = self._plan(draft, budget, config)
            t1 = time.perf_counter()
            # 2. Verify: score the newest committed token and every kept node in one forward (plus padding rows
            #    when a bigger forward is cheaper on this machine; their outputs and cache entries are dropped).
            past = len(context) - 1
            rows = plan.rows if limit is None else min(plan.rows, limit - past)  # padding stays inside the context
            rows = rows if max_rows is None else min(rows, max_rows)  # and inside the row-invariant sizes
            block, parents = pad_block([context[-1], *draft.tokens], draft.parents, rows)
            logits = self._forward(block, cache, past, tree=parents)[: len(draft) + 1]  # [k+1, vocab]
            features = self._features
            # 3. Accept: the longest acceptable path, then the target's own token after it.
            path, target_token = self._accept(draft, logits, config, generator)
            # 4. Commit the accepted drafts + the correction/bonus token; roll the cache back to match.
            finish, committed, text_end = self._commit(
                context, new_tokens, [*(draft.tokens[node] for node in path), target_token], eos, config
            )
            self._keep_in_cache(cache, past, path, draft.is_chain, len(context) - 1)
            t2 = time.perf_counter()
            if config.cost_aware:
                self.planner.record(draft, len(path), len(committed), rows, t2 - t1, t1 - t0)
            topk = torch.topk(logits, min(SCORED_TOPK, logits.shape[-1]), dim=-1).indices.tolist()  # [k+1, 8]
            if features is not None:  # the root's and the accepted path's rows: [1 + accepted, hidden]
                features = features[[0, *(node + 1 for node in path)]]
            emit(StepEvent("step", draft, len(path), committed, target_token, path, len(context),
                           draft_seconds=t1 - t0, verify_seconds=t2 - t1, finished=finish, scored_topk=topk,
                           verify_rows=rows, features=features))

        wall = time.perf_counter() - started
        self._save_curve()
        stats = summarize(events, wall_seconds=wall, ttft_seconds=ttft)
        return Generation(new_tokens, finish, stats, events, text_end)

    def _plan(self, draft: Draft, budget: int, config: GenerationConfig) -> tuple[Draft, Plan]:
        """The part of the draft to verify and the verify forward's rows (trees become chains where needed)."""
        if not draft.is_chain and not self.supports_trees:
            draft = first_branch(draft)
        if not config.cost_aware:
            draft = trim(draft, budget)
            return draft, Plan(len(draft), len(draft) + 1)
        plan = self.planner.plan(draft, budget)
        return trim(draft, plan.keep), plan

    def _accept(self, draft: Draft, logits: torch.Tensor, config: GenerationConfig,
                generator: Optional[torch.Generator]) -> tuple[list[int], int]:
        """(accepted node indices, the target's own token) under greedy or speculative sampling."""
        if config.greedy:
            target_argmax = logits.argmax(dim=-1).tolist()  # [k+1]
            if draft.parents is None:  # a chain
                path = list(range(greedy_accept(draft.tokens, target_argmax)))
            else:
                path = greedy_accept_tree(draft.tokens, draft.parents, target_argmax)
            return path, target_argmax[path[-1] + 1 if path else 0]
        p_target = warp_probs(logits, config.temperature, config.top_k, config.top_p)  # [k+1, vocab]
        if draft.parents is not None:  # a tree
            return speculative_accept_tree(draft.tokens, draft.parents, p_target, generator)
        p_draft = None if draft.p_draft is None else draft.p_draft.to(p_target.device, torch.float32)
        accepted, target_token = speculative_accept(draft.tokens, p_target, p_draft, generator)
        return list(range(accepted)), target_token

    def prepare(self, budget: int) -> Optional[int]:
        """Install row-invariant verification for blocks of this budget (once; again for a bigger budget).

        Each generation does it; a session calls it at load, so the check's ~2 s is part of loading. Returns the
        largest row-invariant block, or None when verification is not exact (off, or the check failed: said once
        as a warning, the reason kept in `exact_check`)."""
        if not self.exact:
            return None
        if self.native is not None:
            return self._prepare_native()
        rows = exact_rows(budget)
        current = current_state(self.model)
        if current is not None and current.suspended:  # inside native_kernels: the model's own kernels
            return None
        state = self._exact_state
        if state is not None and state.rows >= rows and state.applied(self.model):
            return state.rows
        if self.exact_check.startswith("failed"):
            return None
        try:  # (the model keeps its state: another engine's install is reused, a smaller one replaced)
            self._exact_state = state = install(self.model, max(rows, state.rows if state is not None else 0))
        except ValueError as error:
            self._exact_state = None
            self.exact_check = f"failed: {error}"
            warnings.warn(f"verification is not row-invariant on this model and machine ({error}): speculative "
                          "output may differ from plain decoding where rounding decides", stacklevel=3)
            return None
        padded = ", ".join(f"{inputs}x{outputs}" for inputs, outputs in state.padded_shapes) or "none"
        self.exact_check = f"on: blocks up to {state.rows} rows; linear shapes padded: {padded}"
        return state.rows

    def _prepare_native(self) -> Optional[int]:
        """The native decoder needs no set-up; its row invariance is checked end to end once per engine."""
        if self._own_kernels:
            return None
        if self.exact_check == "not checked":
            mismatch = block_mismatch(self.native, self.model.config, self.device, ROW_INVARIANT_ROWS)
            self.exact_check = (f"on: specdec's native decoder, blocks up to {ROW_INVARIANT_ROWS} rows"
                                if mismatch is None else f"failed: {mismatch}")
            if mismatch is not None:
                warnings.warn(f"verification is not row-invariant on this model and machine ({mismatch}): speculative "
                              "output may differ from plain decoding where rounding decides", stacklevel=3)
        return ROW_INVARIANT_ROWS if self.exact_check.startswith("on") else None

    def native_kernels(self) -> Any:
        """A context in which the model runs its own kernels (exact verification suspended): transformers'
        forward, with the native decoder (if any) set aside."""
        if self.native is not None:
            return self._set_aside_native()
        return suspended(self.model, current_state(self.model) if self._exact_state is not None else None)

    @contextmanager
    def _set_aside_native(self) -> Iterator[None]:
        saved, self._own_kernels = self._own_kernels, True
        try:
            yield
        finally:
            self._own_kernels = saved

    @property
    def supports_trees(self) -> bool:
        """Whether this model verifies token trees exactly (else trees fall back to their first branch).

        Decided once per engine, the first time a tree is drafted: the family must be one whose attention takes
        4-D masks (TREE_MODEL_TYPES) with layers of kinds a tree mask is built for, and a small tree's logits
        must match sequential decoding (`_tree_mismatch`). The outcome is in `tree_check`: "passed",
        "failed: ..." or "chains only: ..."; anything but "passed" is said once, as a warning.
        """
        if self._tree_ok is None:
            config = self.model.config
            model_type = getattr(config, "model_type", "") or "this model"
            other_kinds = sorted(attention_kinds(config) - set(MASKED_KINDS))
            if model_type not in TREE_MODEL_TYPES:
                self.tree_check = f"chains only: {model_type} is not a family checked with tree masks"
            elif other_kinds:
                self.tree_check = f"chains only: no tree mask for {', '.join(other_kinds)} layers"
            else:
                mismatch = self._tree_mismatch()
                self.tree_check = "passed" if mismatch is None else f"failed: {mismatch}"
            self._tree_ok = self.tree_check == "passed"
            if not self._tree_ok:
                warnings.warn(f"{model_type}: token trees are verified as chains ({self.tree_check})", stacklevel=2)
        return self._tree_ok

    @torch.inference_mode()
    def _tree_mismatch(self) -> Optional[str]:
        """None when a 6-node tree's logits after a 12-token prompt equal sequential decoding's, else what differed.

        Sequential decoding is the model's own: each root-to-leaf path as a chain under the causal (and window)
        masks the model builds itself. Sliding windows are shortened to CHECK_WINDOW meanwhile (models build
        their window masks from the config at each forward), so the tree's window masks are compared with the
        model's past the window. Cost: five small forwards (prompt, tree, three leaf chains) on a throwaway cache.
        """
        vocab = int(self.model.config.vocab_size)
        generator = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, vocab, (12,), generator=generator).tolist()
        tokens = torch.randint(3, vocab, (6,), generator=generator).tolist()
        parents = [-1, -1, 0, 0, 1, 3]  # two roots; depth up to 3
        past = len(prompt) - 1
        # rounding passes (a masked and a causal forward may run different kernels); a wrong mask moves whole units
        relative = 2e-3 if next(self.model.parameters()).dtype == torch.float32 else 3e-2
        try:
            with shortened_windows(self.model, CHECK_WINDOW):
                cache = KVCache()
                self._forward(prompt[:-1], cache, 0, last_only=True)
                tree_logits = self._forward([prompt[-1], *tokens], cache, past, tree=parents).float()  # [7, V]
                for leaf in sorted(set(range(len(tokens))) - set(parents)):
                    path: list[int] = []
                    node = leaf
                    while node >= 0:
                        path.insert(0, node)
                        node = parents[node]
                    self._truncate_cache(cache, past)
                    chain = self._forward([prompt[-1], *(tokens[node] for node in path)], cache, past).float()
                    for row, reference in zip([0, *(node + 1 for node in path)], chain):  # [V] each
                        gap = float((tree_logits[row] - reference).abs().max())
                        tolerance = relative * (1 + float(reference.abs().max()))
                        if gap > tolerance:
                            return f"tree node {row}'s logits differ from sequential decoding by {gap:.3g}"
        except Exception as error:  # e.g. an attention implementation that refuses custom masks
            reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else ""
            return f"the tree forward raised {type(error).__name__}" + (f" ({reason})" if reason else "")
        return None

    def forget(self) -> None:
        """Drop what the planner learned about drafters (the machine's cost curve stays)."""
        self.planner.forget()

    def cost_curve(self) -> CostCurve:
        """t(rows) for this model on this machine (the planner's; measured now if not known yet)."""
        return self.planner.curve

    def _stored_or_measured_curve(self) -> CostCurve:
        return load_or_measure(self._cost_cache_file(), self._forward_timer)

    def _save_curve(self) -> None:
        """Store what this engine's steps taught the curve, as the next session's starting point."""
        if not self.planner.has_curve:
            return
        curve = self.planner.curve
        if curve.learn and curve.observations - self._saved_observations >= 16:
            self._saved_observations = curve.observations
            try:
                save_curve(self._cost_cache_file(), curve)
            except SpecdecError:
                pass  # a read-only cache is no reason to fail a generation

    def _cost_cache_file(self):
        """$SPECDEC_HOME/costs/KEY.json, KEY from the model, device, CPU, dtype, threads and torch version."""
        import hashlib

        from .machine import cpu_model
        from .models import specdec_home

        name = getattr(self.model.config, "_name_or_path", "") or ""
        if not name:  # an in-memory model (tests): measure, but do not cache on disk
            return None
        from .quant import block_layers, weights_summary

        params = sum(p.numel() for p in self.model.parameters())
        dtype = next(self.model.parameters()).dtype
        exact = self._exact_state.rows if self._exact_state is not None else ROW_INVARIANT_ROWS if self.native else 0
        blocks = f"|{weights_summary(self.model)}" if block_layers(self.model) else ""
        key = (f"{name}|{params}|{self.device}|{cpu_model()}|{dtype}|{torch.get_num_threads()}|"
               f"{torch.__version__}" + (f"|exact{exact}" if exact else "") + blocks)
        return specdec_home() / "costs" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"

    def _forward_timer(self, prefix: int = 256) -> Callable[[int], float]:
        """A function n -> seconds of one forward of n new tokens after a `prefix`-token cache."""
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, self.model.config.vocab_size, (prefix + 64,), generator=generator).tolist()
        cache = KVCache()
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
    ) -> tuple[Optional[FinishReason], list[int], Optional[int]]:
        """Append tokens, cutting at EOS, at the token budget or at a stop string.

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


def exact_by_default(model: Any) -> bool:
    """Whether verification is made row-invariant by default: in a 16-bit float type (where a block's rounding
    flips greedy choices within a hundred tokens) and on block weights (whose kernels make it nearly free)."""
    from .quant import block_layers

    return next(model.parameters()).dtype in (torch.bfloat16, torch.float16) or bool(block_layers(model))


def trim(draft: Draft, length: int) -> Draft:
    """The first `length` nodes of a draft (parents come first, so any prefix is a tree)."""
    if len(draft) <= length:
        return draft
    parents = None if draft.parents is None else draft.parents[:length]
    p_draft = None if draft.p_draft is None else draft.p_draft[:length]
    return Draft(draft.tokens[:length], draft.source, parents, p_draft, draft.match_len)


def context_limit(config: Any) -> Optional[int]:
    """The longest sequence (prompt and answer) the model was made for, when its config says."""
    limit = getattr(config, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


@contextmanager
def shortened_windows(model: Any, window: int) -> Iterator[None]:
    """Shorten every sliding window longer than `window` in the model's config(s), for the while."""
    configs = {id(module.config): module.config for module in model.modules()
               if isinstance(getattr(getattr(module, "config", None), "sliding_window", None), int)}
    saved = {key: config.sliding_window for key, config in configs.items()}
    try:
        for config in configs.values():
            config.sliding_window = min(config.sliding_window, window)
        yield
    finally:
        for key, config in configs.items():
            config.sliding_window = saved[key]


def check_rollback(cache: Any) -> None:
    """Refuse a cache that cannot be rolled back or gathered: one with layers that do not keep an entry for every
    cached token (transformers' sliding-window layers keep the last window - 1; a recurrent state keeps none)."""
    length = cache.get_seq_length()
    for index, layer in enumerate(getattr(cache, "layers", ())):
        if not getattr(layer, "is_initialized", True):
            continue  # a layer that shares another's entries
        held = getattr(layer, "keys", None)
        if getattr(layer, "is_sliding", False) or held is None or held.dim() < 2 or held.shape[-2] != length:
            raise SpecdecError(f"the KV cache's layer {index} ({type(layer).__name__}) does not keep every token, so "
                               "rejected drafts cannot be rolled back: use a plain DynamicCache()")


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
    tokens, node = [], -1
    children = children_of(draft.parents or [])
    while children.get(node):
        node = children[node][0]
        tokens.append(draft.tokens[node])
    return Draft(tokens, draft.source, None, None, draft.match_len)
