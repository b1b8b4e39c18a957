"""Turning target logits into the distribution that plain sampling would draw from.

`warp_probs` applies temperature, then top-k, then top-p, then min-p (transformers' order), exactly as plain
sampling does, so that
speculative sampling (verify.py) accepts against the very distribution the target alone would sample
from. Pure tensor functions: no model, no state. Greedy decoding does not come through here.
"""

from __future__ import annotations

import torch

from ..errors import SpecdecError


def check_sampling(temperature: float, top_p: float, top_k: int, min_p: float = 0.0) -> None:
    """Reject settings plain sampling could not honour, with one clear line."""
    if not 0.0 <= temperature < float("inf"):  # also catches NaN
        raise SpecdecError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}",
                           setting="temperature")
    if not 0.0 < top_p <= 1.0:
        raise SpecdecError(f"top_p must be in (0, 1], got {top_p}", setting="top_p")
    if top_k < 0:
        raise SpecdecError(f"top_k must be >= 0 (0 = off), got {top_k}", setting="top_k")
    if not 0.0 <= min_p <= 1.0:  # (NaN fails too)
        raise SpecdecError(f"min_p must be in [0, 1] (0 = off), got {min_p}", setting="min_p")


TOP_P_CANDIDATES = 256  # top-p looks for its cut among the likeliest this many tokens first (then 4x as many)


def warp_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
               min_p: float = 0.0) -> torch.Tensor:
    """logits [..., vocab] -> probabilities [..., vocab] (float32) after temperature, top-k, top-p, min-p (tokens
    less likely than min_p times the likeliest are dropped)."""
    scores = logits.float() / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth_best = torch.topk(scores, top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        probs = probs.masked_fill(~_top_p_kept(probs, top_p), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _top_p_kept(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which tokens top-p keeps [..., vocab] (bool): in order of probability, each token while the mass of the better
    ones is below top_p (the best always). The cut is looked for among the likeliest TOP_P_CANDIDATES tokens, then 4x
    as many, up to the whole vocabulary: a partial top-k instead of sorting 150,000 probabilities (15 ms a row on a
    CPU, more than a small model's forward)."""
    vocab = probs.shape[-1]
    count = min(vocab, TOP_P_CANDIDATES)
    while True:
        best, order = torch.topk(probs, count, dim=-1)  # [..., count], best first
        mass_before = torch.cumsum(best, dim=-1) - best  # mass of strictly better tokens
        dropped = mass_before >= top_p  # the best token always stays (mass_before = 0)
        if count == vocab or bool(dropped[..., -1].all()):  # every row's cut lies among these
            return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, ~dropped)
        count = min(vocab, 4 * count)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs [vocab] (on the generator's device: the engine's seeded generator is the CPU's,
    the target's probabilities may be on a GPU): one uniform number placed on the cumulative sums (float64), the
    token whose interval holds it. torch.multinomial takes 4-5 ms over 150,000 probabilities on a CPU; this ~0.3."""
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    cumulative = torch.cumsum(probs.double(), dim=-1)  # [vocab]
    point = torch.rand((1,), generator=generator, dtype=torch.float64, device=probs.device) * cumulative[-1]
    index = int(torch.searchsorted(cumulative, point, right=True))
    if index >= probs.shape[-1] or float(probs[index]) <= 0.0:  # (rounding at the very top: the last possible one)
        index = int(torch.nonzero(probs > 0).max())
    return index
