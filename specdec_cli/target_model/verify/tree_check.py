"""Whether a loaded model verifies token trees exactly, decided once per engine the first time a tree is drafted.

Three conditions, checked in order (`check_trees`): the family is one whose attention takes 4-D custom masks with
explicit position ids (families.Family.trees, tests/specdec_cli/target_model/test_families.py), sliding-window
layers included; its layers are all of kinds a tree mask is built for (tree_mask.MASKED_KINDS); and a small tree's
logits equal sequential decoding's on the model itself (`tree_mismatch`). The outcome is passed, failed or chains
only (check_outcome.py); anything but a pass is said once, as a warning, and the engine then verifies each tree's
first branch as a chain. This file does not build masks (tree_mask.py) nor accept drafts (verify.py).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch

from .. import families
from .check_outcome import CheckOutcome
from .forward import VerifyForward
from .rollback import truncate_cache
from .tree_mask import MASKED_KINDS, attention_kinds

CHECK_WINDOW = 4  # the self-check shortens sliding windows to this, so its 12-token prompt runs past them


def check_trees(model: Any, forward: VerifyForward) -> CheckOutcome:
    """Passed when the model verifies trees exactly, else chains only or failed with the reason, said once as
    a warning."""
    config = model.config
    model_type = getattr(config, "model_type", "") or "this model"
    other_kinds = sorted(attention_kinds(config) - set(MASKED_KINDS))
    if not families.takes_trees(model_type):  # others get no windowed tree mask (tree_mask.py)
        outcome = CheckOutcome("chains only", f"{model_type} is not a family checked with tree masks")
    elif other_kinds:
        outcome = CheckOutcome("chains only", f"no tree mask for {', '.join(other_kinds)} layers")
    else:
        known = forward.tree_outcome()  # a forward that checks its trees itself (device/)
        mismatch = None if known is not None else tree_mismatch(model, forward)
        outcome = known or (CheckOutcome("passed") if mismatch is None else CheckOutcome("failed", mismatch))
    if outcome.state != "passed":
        warnings.warn(f"{model_type}: token trees are verified as chains ({outcome.text()})", stacklevel=3)
    return outcome


@torch.inference_mode()
def tree_mismatch(model: Any, forward: VerifyForward) -> Optional[str]:
    """None when a 6-node tree's logits after a 12-token prompt equal sequential decoding's, else what differed.

    Sequential decoding is the model's own: each root-to-leaf path as a chain under the causal (and window)
    masks the model builds itself. Sliding windows are shortened to CHECK_WINDOW meanwhile (models build
    their window masks from the config at each forward), so the tree's window masks are compared with the
    model's past the window. Cost: five small forwards (prompt, tree, three leaf chains) on a throwaway cache.
    """
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (12,), generator=generator).tolist()
    tokens = torch.randint(3, vocab, (6,), generator=generator).tolist()
    parents = [-1, -1, 0, 0, 1, 3]  # two roots; depth up to 3
    past = len(prompt) - 1
    # rounding passes (a masked and a causal forward may run different kernels); a wrong mask moves whole units
    relative = 2e-3 if next(model.parameters()).dtype == torch.float32 else 3e-2
    try:
        with shortened_windows(model, CHECK_WINDOW):
            cache = forward.new_cache()
            forward(prompt[:-1], cache, 0, last_only=True)
            tree_logits = forward([prompt[-1], *tokens], cache, past, tree=parents).logits.float()  # [7, V]
            for leaf in sorted(set(range(len(tokens))) - set(parents)):
                path = _path_to(leaf, parents)
                truncate_cache(cache, past)
                chain = forward([prompt[-1], *(tokens[node] for node in path)], cache, past).logits.float()
                for row, reference in zip([0, *(node + 1 for node in path)], chain):  # [V] each
                    gap = float((tree_logits[row] - reference).abs().max())
                    tolerance = relative * (1 + float(reference.abs().max()))
                    if gap > tolerance:
                        return f"tree node {row}'s logits differ from sequential decoding by {gap:.3g}"
    except Exception as error:  # e.g. an attention implementation that refuses custom masks
        reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else ""
        return f"the tree forward raised {type(error).__name__}" + (f" ({reason})" if reason else "")
    return None


def _path_to(node: int, parents: list[int]) -> list[int]:
    """The nodes from a root down to `node`, root first."""
    path: list[int] = []
    while node >= 0:
        path.insert(0, node)
        node = parents[node]
    return path


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
