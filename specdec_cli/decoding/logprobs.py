"""Log probabilities of the tokens a generation committed, read from the logits that chose them.

Each committed token was chosen from one row of a target forward: the prefill's last row, or in a step the row of
its parent in the verified draft (the root for the first). The log-softmax of that row, at the token and at the
row's best `top` tokens, is what `logprobs`/`top_logprobs` report. The rows are the target's own: where
verification is exact they are bit-identical to plain decoding's, so the numbers are the same with or without a
drafter. They are the model's raw distribution (before temperature, top-k, top-p or min-p), as vLLM reports by
default. Pure tensor functions; the engine calls them only when a generation asks (GenerationConfig.logprobs).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class TokenLogprob(NamedTuple):
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the row's likeliest tokens and their log probabilities, best first


def token_logprobs(rows: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """rows [m, vocab]: the logits row that chose each of `tokens` [m] -> their log probabilities and each row's
    `top` likeliest tokens."""
    if not tokens:
        return []
    logprobs = torch.log_softmax(rows[: len(tokens)].float(), dim=-1)  # [m, vocab]
    ids = torch.tensor(list(tokens), dtype=torch.long, device=logprobs.device)
    chosen = logprobs.gather(-1, ids[:, None])[:, 0].tolist()  # [m]
    best: list[tuple[tuple[int, float], ...]] = [() for _ in tokens]
    if top > 0:
        values, indices = torch.topk(logprobs, min(top, logprobs.shape[-1]), dim=-1)  # [m, top] each
        best = [tuple(zip(row_ids, row_values)) for row_ids, row_values in zip(indices.tolist(), values.tolist())]
    return [TokenLogprob(int(token), float(value), entries) for token, value, entries in zip(tokens, chosen, best)]


def choosing_rows(path: Sequence[int]) -> list[int]:
    """The verify block's rows that chose a step's committed tokens: the root's for the first, then each accepted
    node's (node i is row i + 1) for the token after it."""
    return [0, *(node + 1 for node in path)]
