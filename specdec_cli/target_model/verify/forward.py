"""The verifying forward: what the engine calls to score new tokens placed after the target's KV cache.

`VerifyForward` is the protocol the engine and its helpers use (the cost curve's timer, the tree self-check); it
declares everything they read, so no caller probes a forward for members. Three implementations, picked once per
loaded target by load/forward_choice.choose_forward: specdec's native decoder (native.py) and transformers' modules,
made row-invariant where asked (exact.py), which share `ModelForward` and its defaults; and the device engine
(device/forward.py), fixed-shape with one static cache. The first two build their inputs the same way: a chain sits
at positions start..start+n-1 under the causal mask; a token tree (`tree`: the parents of token_ids[1:],
token_ids[0] being the root) puts each node at start + depth, attending to the cached prefix, its ancestors and
itself only (tree_mask.py). A forward returns the logits and, when asked (`features`), the last hidden states (what
feature-level drafters read; other forwards do not request them). This file does not choose which forward runs
(load/forward_choice.py), choose tokens, roll the cache back (rollback.py) or time anything.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Optional, Protocol, Sequence, runtime_checkable

import torch

from .check_outcome import CheckOutcome
from .tree_mask import tree_attention_mask, tree_layout


class Scores(NamedTuple):
    """What one forward computed for its n new tokens."""

    logits: torch.Tensor  # [n, vocab] ([1, vocab] with last_only)
    features: Optional[torch.Tensor]  # the last hidden states [n, hidden] (after the final norm), if asked for


@runtime_checkable
class VerifyForward(Protocol):
    """One target's forward, chosen at load (load/forward_choice.choose_forward) and handed to the engine."""

    model: Any  # the loaded target (its config, its parameters' device and dtype)
    device: torch.device
    exact: bool  # whether verification is meant to be row-invariant
    outcome: CheckOutcome  # what came of it: off, not checked, on or failed
    has_own_kernels: bool  # whether `own_kernels()` runs other kernels than the forward's (the device engine: no)
    static_cache: bool  # one cache of the forward's own, refilled every generation (never kept between them)

    @property
    def rows(self) -> int:
        """The largest block verified row-invariantly (0: none); part of the cost curve's key."""

    @property
    def max_block(self) -> Optional[int]:
        """The most rows a verify block may have (None: any)."""

    @property
    def capacity(self) -> Optional[int]:
        """The most committed tokens the forward's cache holds (None: the model's context decides)."""

    def new_cache(self) -> Any:
        """An empty cache for this forward's calls."""

    def tree_outcome(self) -> Optional[CheckOutcome]:
        """How token trees verify, where the forward knows it itself (None: tree_check.py compares forwards)."""

    def __call__(self, token_ids: Sequence[int], cache: Any, start: int, last_only: bool = False,
                 tree: Optional[Sequence[int]] = None, features: bool = False,
                 feature_layers: Sequence[int] = ()) -> Scores:
        """Score token_ids placed after the `start` cached tokens, appending their entries to the cache; with
        `features`, the last hidden states too, or with `feature_layers` the states entering those layers."""

    def prepare(self, budget: int) -> Optional[int]:
        """Make blocks of this draft budget row-invariant (checked once); the largest such block, or None when
        verification is not exact."""

    def own_kernels(self) -> AbstractContextManager[None]:
        """A context in which forwards run the model's own kernels, as plain decoding outside specdec does."""

    def memory(self) -> Optional[dict[str, int]]:
        """Bytes the forward holds on its device, where it holds them itself (the device engine); else None."""


@runtime_checkable
class ManyForward(VerifyForward, Protocol):
    """A forward that also scores several sequences' chains in one call (the native decoder's, exact_setup.py)."""

    def many(self, blocks: Sequence[tuple[Sequence[int], Any, int]],
             keep: Optional[Sequence[int]] = None) -> list[Scores]:
        """Per (token ids, cache, tokens it holds), that block's Scores, as a forward of it alone computes them:
        the logits of its last `keep[i]` rows (default: all), every row's features."""


class ModelForward:
    """What both forwards share: the inputs of a chain or a tree, and `run` (transformers' keywords) to compute."""

    has_own_kernels = True
    static_cache = False
    max_block: Optional[int] = None
    capacity: Optional[int] = None

    def __init__(self, model: Any, exact: bool):
        self.model = model
        self.device = next(model.parameters()).device
        self.exact = exact
        self.outcome = CheckOutcome("not checked" if exact else "off")  # on or failed once prepared

    def new_cache(self) -> Any:
        """A KVCache for the model (kv_cache.new_kv_cache), kept or dropped by the caller."""
        from ..native.kv_cache import new_kv_cache

        return new_kv_cache(self.model)

    def tree_outcome(self) -> Optional[CheckOutcome]:
        return None

    def memory(self) -> Optional[dict[str, int]]:
        return None  # the model's own tensors, which the loader accounts for

    def run(self, **inputs: Any) -> Any:
        """One forward on transformers' keywords (input_ids, position_ids, past_key_values, ...)."""
        raise NotImplementedError

    def layer_states(self, layers: Sequence[int]) -> dict:
        """Keywords for `run` that make hidden_states[i] hold the state entering each of `layers` (transformers'
        output_hidden_states gives every layer's; the native decoder keeps only those asked for)."""
        return {}

    def __call__(self, token_ids: Sequence[int], cache: Any, start: int, last_only: bool = False,
                 tree: Optional[Sequence[int]] = None, features: bool = False,
                 feature_layers: Sequence[int] = ()) -> Scores:
        """Score token_ids placed after the `start` cached tokens (appending their entries to the cache); with
        `features`, return the last hidden states too (all n rows, also with last_only), or with `feature_layers`
        the states entering those layers side by side ([n, layers x hidden]: EAGLE-3's)."""
        input_ids = torch.tensor([list(token_ids)], device=self.device)  # [1, n]
        kwargs: dict = {"logits_to_keep": 1} if last_only else {}
        if tree is None:
            position_ids = torch.arange(start, start + len(token_ids), device=self.device).unsqueeze(0)  # [1, n]
        else:
            depth, ancestors = tree_layout(tree)  # [n], [n, n]
            position_ids = (start + depth).unsqueeze(0).to(self.device)  # [1, n]
            # [1, 1, n, start + n], or one such mask per layer kind
            kwargs["attention_mask"] = tree_attention_mask(self.model.config, start, depth, ancestors,
                                                           self.model.dtype, self.device)
        if features and feature_layers:
            kwargs.update(self.layer_states(feature_layers))
        out = self.run(input_ids=input_ids, position_ids=position_ids, past_key_values=cache, use_cache=True,
                       output_hidden_states=features, **kwargs)
        hidden = None
        if features and out.hidden_states:
            if feature_layers:  # hidden_states[i]: the state entering layer i (transformers' convention)
                hidden = torch.cat([out.hidden_states[layer][0] for layer in feature_layers], dim=-1)  # [n, 3H]
            else:
                hidden = out.hidden_states[-1][0]  # [n, hidden] (last, normed)
        return Scores(out.logits[0], hidden)  # logits [n, vocab] (or [1, vocab] with last_only)
