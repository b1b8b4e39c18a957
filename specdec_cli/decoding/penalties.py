"""Repetition penalties as a verify block's rows read them: which tokens each row counts, and its logits less the
penalties for them. Row r of a block chooses the token after the context and the draft's path to node r - 1 (row
0: after the context alone), so it counts that path's tokens too, and a drafted row is judged as plain decoding
judges the same position.

Two conventions, as `GenerationConfig.penalty_last_n` chooses:
- transformers', vLLM's and OpenAI's (None): the repetition penalty counts every token of the prompt and the answer,
  presence and frequency penalties the answer's alone;
- llama.cpp's (`repeat_last_n` = n): all three count the last n tokens of the prompt and the answer together, a
  window that slides along a row's path (-1: every token; 0: no penalty).
A counted token's logit is divided by the repetition penalty where positive and multiplied by it where not, then
less `presence` once and `frequency` per occurrence (the order of vLLM's and llama.cpp's samplers).

Pure functions over token lists and tensors; run.py's `Run.shaped` calls `penalised`. Only the columns of tokens
counted are read or written, never a dense [rows, vocab] count.
"""

from __future__ import annotations

from typing import Optional, Sequence, cast

import torch

from .draft import Draft
from .generation_config import GenerationConfig


def in_effect(config: GenerationConfig) -> bool:
    """Whether `config` sets a penalty that changes a logit (llama.cpp's window of 0 turns them all off)."""
    return config.penalty_last_n != 0 and (bool(config.presence_penalty or config.frequency_penalty)
                                           or config.repetition_penalty != 1.0)


def penalised(logits: torch.Tensor, config: GenerationConfig, context: Sequence[int], answer: Sequence[int],
              draft: Optional[Draft]) -> torch.Tensor:
    """`logits` [rows, vocab] less the penalties `config` sets (`in_effect`), for a block after `context` (the prompt
    and the answer so far; `answer` its tail after the prompt) and `draft`'s paths. Writes into `logits` (a caller's
    copy)."""
    rows = logits.shape[0]
    if config.penalty_last_n is not None:  # llama.cpp: one window for all three
        window = None if config.penalty_last_n == -1 else config.penalty_last_n
        columns, counts = counted(context, draft, rows, window)
        return _subtract(_repeat(logits, columns, counts, config.repetition_penalty), columns, counts, config)
    if config.repetition_penalty != 1.0:
        columns, counts = counted(context, draft, rows)
        logits = _repeat(logits, columns, counts, config.repetition_penalty)
    if config.presence_penalty or config.frequency_penalty:
        columns, counts = counted(answer, draft, rows)
        logits = _subtract(logits, columns, counts, config)
    return logits


def counted(history: Sequence[int], draft: Optional[Draft], rows: int,
            window: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens counted by any row ([used] ids, ascending) and how often each row counts each ([rows, used]): row
    r counts `history` followed by the draft's path to node r - 1, its last `window` tokens where one is given;
    rows past the draft (padding) count as row 0."""
    drafted = [] if draft is None else [int(token) for token in draft.tokens]
    kept = list(history) if window is None else list(history[max(0, len(history) - window) :])
    columns = torch.unique(torch.tensor(kept + drafted, dtype=torch.long))  # [used], sorted
    counts = torch.zeros(rows, len(columns))  # [rows, used]
    if kept:
        counts[:] = torch.bincount(torch.searchsorted(columns, torch.tensor(kept, dtype=torch.long)),
                                   minlength=len(columns))
    if not drafted:
        return columns, counts
    where = {token: column for column, token in enumerate(columns.tolist())}
    for row, path in enumerate(cast(Draft, draft).row_paths()[1:rows], start=1):  # row 0's counts, and its path...
        left = len(kept) if window is None else max(0, min(len(kept), window - len(path)))
        for token in path if window is None else path[-window:]:
            counts[row, where[token]] += 1
        for token in kept[: len(kept) - left]:  # ...less the history that leaves the window as the path grows
            counts[row, where[int(token)]] -= 1
    return columns, counts


def _repeat(logits: torch.Tensor, columns: torch.Tensor, counts: torch.Tensor, penalty: float) -> torch.Tensor:
    if penalty == 1.0 or not len(columns):
        return logits
    index = columns.to(logits.device)
    picked = logits[:, index]  # [rows, used]
    repeated = torch.where(picked > 0, picked / penalty, picked * penalty)
    logits[:, index] = torch.where(counts.to(logits.device) > 0, repeated, picked)
    return logits


def _subtract(logits: torch.Tensor, columns: torch.Tensor, counts: torch.Tensor,
              config: GenerationConfig) -> torch.Tensor:
    if not (config.presence_penalty or config.frequency_penalty) or not len(columns):
        return logits
    penalty = config.frequency_penalty * counts + config.presence_penalty * (counts > 0)  # [rows, used]
    index = columns.to(logits.device)
    logits[:, index] = logits[:, index] - penalty.to(logits.device, logits.dtype)
    return logits
