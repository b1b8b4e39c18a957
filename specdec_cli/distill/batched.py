"""Greedy answers for many prompts at once: one target forward per step for a whole batch (Seq-KD data).

On a CPU a forward over many rows costs little more than over one (the weights are read once), so answering
16-32 prompts together writes many times the tokens per second of answering them one by one. On block weights
(the native decoder) the batch is decoding/plain_many.py's: every answer bit-identical to one by one, at
most 32 open at once. On a transformers model (dense weights), prompts of a
batch are left-padded to one length; an attention mask hides the padding and explicit position ids start each
prompt at 0, so every row computes what it would alone up to rounding: a matrix product over more rows may
sum in another order, and at a near-tie of two tokens the argmax can differ from one-by-one decoding (both are
greedy decodings of the same model; tests/specdec_cli/distill/test_distill_batched.py measures how often on the real
model).

With `keep_features` (the native decoder only), each answer carries the target's last hidden states along it, which
an EAGLE head trains on (answer_features.py); a transformers model's answers carry none.

What it does not do: sampling (a batch is greedy), speculative drafting (the batch is the speedup here), or
writing rows (generate.py does, one per finished answer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from ..decoding.plain_many import BatchAnswer


def greedy_batches(model: Any, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, eos_token_ids: Sequence[int],
                   batch_size: int, on_answer: Optional[Callable[[BatchAnswer], None]] = None,
                   keep_features: bool = False) -> list[BatchAnswer]:
    """Answer every prompt greedily, `batch_size` at a time; `on_answer` is called for each answer as it is done
    (on the native decoder, each as it ends; on a transformers model, a batch of prompts of similar length at a
    time, in prompt order within the batch)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    from ..decoding.generation_config import GenerationConfig
    from ..decoding.plain_many import MAX_WIDTH, BatchAnswer, plain_many
    from ..target_model.load.forward_choice import choose_forward
    from ..target_model.verify.forward import ManyForward

    forward = choose_forward(model)
    if isinstance(forward, ManyForward):  # the native decoder: answers join and leave, each exact
        config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos_token_ids))
        return plain_many(forward, prompts, config, width=min(batch_size, MAX_WIDTH), on_answer=on_answer,
                          keep_features=keep_features)
    order = sorted(range(len(prompts)), key=lambda index: len(prompts[index]))  # little padding per batch
    answers: list[BatchAnswer] = []
    for start in range(0, len(order), batch_size):
        chunk = sorted(order[start : start + batch_size])
        for answer in _greedy_batch(model, [prompts[index] for index in chunk], max_new_tokens, eos_token_ids):
            answer = BatchAnswer(chunk[answer.index], answer.tokens, answer.finish_reason)
            answers.append(answer)
            if on_answer is not None:
                on_answer(answer)
    return answers


def _greedy_batch(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  eos_token_ids: Sequence[int]) -> list[BatchAnswer]:
    import torch
    from transformers import DynamicCache

    from ..decoding.plain_many import BatchAnswer

    device = next(model.parameters()).device
    rows, longest = len(prompts), max(len(prompt) for prompt in prompts)
    input_ids = torch.zeros(rows, longest, dtype=torch.long)  # [rows, longest], left padding (id 0, masked)
    mask = torch.zeros(rows, longest, dtype=torch.long)  # [rows, longest], 1 = a real token
    for row, prompt in enumerate(prompts):
        input_ids[row, longest - len(prompt) :] = torch.tensor(list(prompt))
        mask[row, longest - len(prompt) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [rows, longest]: each prompt's own positions from 0
    eos = set(int(token) for token in eos_token_ids)
    answers: list[list[int]] = [[] for _ in range(rows)]
    finished: list[Optional[str]] = [None] * rows
    cache = DynamicCache()
    with torch.inference_mode():
        out = model(input_ids=input_ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        for _ in range(max_new_tokens):
            chosen = out.logits[:, -1].argmax(-1).tolist()  # [rows]
            for row, token in enumerate(chosen):
                if finished[row] is None:
                    answers[row].append(int(token))
                    if int(token) in eos:
                        finished[row] = "eos"
                    elif len(answers[row]) >= max_new_tokens:
                        finished[row] = "length"
            if all(reason is not None for reason in finished):
                break
            mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long)], dim=1)  # [rows, length + 1]
            positions = positions[:, -1:] + 1  # [rows, 1]
            step_ids = torch.tensor(chosen, dtype=torch.long).unsqueeze(1)  # [rows, 1] (finished rows: ignored)
            out = model(input_ids=step_ids.to(device), attention_mask=mask.to(device),
                        position_ids=positions.to(device), past_key_values=cache, use_cache=True)
    return [BatchAnswer(row, answers[row], finished[row] or "length") for row in range(rows)]
