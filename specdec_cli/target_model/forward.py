"""One forward of the target model over new tokens placed after its KV cache: how the engine runs the model.

A chain sits at positions start..start+n-1 under the causal mask. A token tree (`tree`: the parents of
token_ids[1:], token_ids[0] being the root) puts each node at start + depth, attending to the cached prefix,
its ancestors and itself only (tree_mask.py). A forward returns the logits and, when asked (`features`), the
last hidden states (what feature-level drafters read; other forwards do not request them). Which forward runs,
specdec's native decoder or the model's own, is exact_setup.py's choice. This file does not choose tokens, roll
the cache back (rollback.py) or time anything.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import torch

from .exact_setup import ExactSetup
from .tree_mask import tree_attention_mask, tree_layout


class Scores(NamedTuple):
    """What one forward computed for its n new tokens."""

    logits: torch.Tensor  # [n, vocab] ([1, vocab] with last_only)
    features: Optional[torch.Tensor]  # the last hidden states [n, hidden] (after the final norm), if asked for


class TargetForward:
    """`forward(token_ids, cache, start, last_only, tree, features)` -> Scores, on the forward `exactness` chooses."""

    def __init__(self, model: Any, exactness: ExactSetup):
        self.model = model
        self.exactness = exactness
        self.device = next(model.parameters()).device

    def __call__(self, token_ids: Sequence[int], cache: Any, start: int, last_only: bool = False,
                 tree: Optional[Sequence[int]] = None, features: bool = False) -> Scores:
        """Score token_ids placed after the `start` cached tokens (appending their entries to the cache); with
        `features`, return the last hidden states too (all n rows, also with last_only)."""
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
        out = self.exactness.forward(input_ids=input_ids, position_ids=position_ids, past_key_values=cache,
                                     use_cache=True, output_hidden_states=features, **kwargs)
        hidden = out.hidden_states[-1][0] if features and out.hidden_states else None  # [n, hidden] (last, normed)
        return Scores(out.logits[0], hidden)  # logits [n, vocab] (or [1, vocab] with last_only)
