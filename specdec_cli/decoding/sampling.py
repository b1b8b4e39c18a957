"""Turning target logits into the distribution that plain sampling would draw from.

`warp_probs` applies temperature, then top-k, then top-p, exactly as plain sampling does, so that
speculative sampling (verify.py) accepts against the very distribution the target alone would sample
from. Pure tensor functions: no model, no state. Greedy decoding does not come through here.
"""

from __future__ import annotations

import torch

from ..errors import SpecdecError


def check_sampling(temperature: float, top_p: float, top_k: int) -> None:
    """Reject settings plain sampling could not honour, with one clear line."""
    if not 0.0 <= temperature < float("inf"):  # also catches NaN
        raise SpecdecError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}",
                           setting="temperature")
    if not 0.0 < top_p <= 1.0:
        raise SpecdecError(f"top_p must be in (0, 1], got {top_p}", setting="top_p")
    if top_k < 0:
        raise SpecdecError(f"top_k must be >= 0 (0 = off), got {top_k}", setting="top_k")


def warp_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [..., vocab] -> probabilities [..., vocab] (float32) after temperature, top-k, top-p."""
    scores = logits.float() / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth_best = torch.topk(scores, top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of strictly better tokens
        drop_sorted = mass_before >= top_p  # the best token always stays (mass_before = 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs [vocab] (on the generator's device: the engine's seeded generator is the CPU's,
    the target's probabilities may be on a GPU)."""
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator).item())
