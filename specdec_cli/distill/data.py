"""Training data for a draft: rows of the target's answers -> held-out split -> examples -> batches.

Rows come from `specdec distill generate` (generate.py reads and checks them). The split is by a hash of the
prompt, so it is stable across runs and data growth; batches are a seeded, deterministic order per epoch,
so a resumed run sees the very batches the interrupted one would have. No model here; torch only inside
`make_batch`.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..errors import SpecdecError


def prompt_hash(prompt: str) -> float:
    digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
    return int(digest[:8], 16) / float(1 << 32)


def split_rows(rows: Sequence[dict], holdout: float) -> tuple[list[dict], list[dict]]:
    """(train, held out): a row is held out when the hash of its prompt falls below `holdout`."""
    if holdout <= 0 or len(rows) < 2:
        return list(rows), []
    held = [row for row in rows if prompt_hash(str(row.get("prompt", ""))) < holdout]
    if not held:  # small files: still keep one row apart
        held = [min(rows, key=lambda row: prompt_hash(str(row.get("prompt", ""))))]
    held_ids = {id(row) for row in held}
    train = [row for row in rows if id(row) not in held_ids]
    if not train:
        raise SpecdecError(f"holdout {holdout} leaves no training rows", setting="holdout")
    return train, held


def items_digest(items: Iterable[Any]) -> str:
    """A short digest of JSON-able items, in order (what a checkpoint was trained on)."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(json.dumps(item).encode())
    return "sha256:" + digest.hexdigest()[:16]


def data_digest(rows: Sequence[dict]) -> str:
    return items_digest([row["prompt_ids"], row["answer_ids"]] for row in rows)


@dataclass
class Example:
    ids: list[int]
    start: int  # index of the first answer token in ids (>= 1): loss on ids[start:]


def make_examples(rows: Sequence[dict], max_len: int) -> list[Example]:
    examples = []
    for row in rows:
        prompt, answer = [int(t) for t in row["prompt_ids"]], [int(t) for t in row["answer_ids"]]
        if not answer or not prompt:
            continue
        if len(answer) >= max_len - 1:
            prompt, answer = prompt[-1:], answer[: max_len - 1]
        elif len(prompt) + len(answer) > max_len:
            prompt = prompt[-(max_len - len(answer)):]
        examples.append(Example(prompt + answer, len(prompt)))
    return examples


def epoch_batches(examples: Sequence[Example], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Seeded shuffle; within windows of 8 batches, similar lengths go together (less padding)."""
    rng = random.Random(f"{seed}:{epoch}")
    order = list(range(len(examples)))
    rng.shuffle(order)
    window = batch_size * 8
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda index: len(examples[index].ids))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


@dataclass
class Batch:
    """Padded examples ready for a forward. M = the number of selected positions."""

    input_ids: Any  # [b, T] token ids, padded with pad_id
    attention_mask: Any  # [b, T] 1 on real tokens
    select: Any  # [b, T] bool: positions whose next token is scored (the answer's, or all with all_positions)
    answer: Any  # [M] bool: which selected positions predict answer tokens
    labels: Any  # [M] the token that follows each selected position


def make_batch(examples: Sequence[Example], indices: Sequence[int], pad_id: int, all_positions: bool = False) -> Batch:
    """The examples at `indices`, padded to the longest; `all_positions` scores prompt positions too (for
    the divergence), cross-entropy still only the answer's."""
    import torch

    chosen = [examples[index] for index in indices]
    width = max(len(example.ids) for example in chosen)
    ids = torch.full((len(chosen), width), pad_id, dtype=torch.long)  # [b, T]
    mask = torch.zeros((len(chosen), width), dtype=torch.long)  # [b, T]
    select = torch.zeros((len(chosen), width), dtype=torch.bool)  # [b, T]
    answer = torch.zeros((len(chosen), width), dtype=torch.bool)  # [b, T]
    for row, example in enumerate(chosen):
        ids[row, : len(example.ids)] = torch.tensor(example.ids)
        mask[row, : len(example.ids)] = 1
        answer[row, example.start - 1 : len(example.ids) - 1] = True  # positions that predict answer tokens
        select[row, : len(example.ids) - 1] = True
    if not all_positions:
        select = answer
    following = torch.roll(ids, shifts=-1, dims=1)  # following[:, t] = ids[:, t + 1]
    return Batch(ids, mask, select, answer[select], following[select])  # answer, labels: [M]
