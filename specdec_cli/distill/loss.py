"""The distillation losses: logits over a subset of the vocabulary, and the divergence between the target's
next-token distribution and the student's (forward KL, reverse KL, or total variation: 1 - TVD is the
per-token acceptance of speculative sampling). Pure tensor functions; the loop that uses them is train.py.
"""

from __future__ import annotations

from typing import Any

from ..drafters.model import split_model

KD_LOSSES = ("fkl", "rkl", "tvd")


def restricted_logits(model: Any, input_ids: Any, attention_mask: Any, select: Any, columns: Any = None) -> Any:
    """Logits [M, C] at the selected positions (bool [b, T]) over `columns` (token ids; None = all).

    The head runs only at the selected positions and only for the chosen columns when the model allows it.
    """
    base, head = split_model(model)
    if base is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[select]
        return logits if columns is None else logits[:, columns]
    hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[select]  # [M, H]
    if columns is None:
        return head(hidden)
    logits = hidden @ head.weight[columns].T  # [M, C]
    bias = getattr(head, "bias", None)
    return logits if bias is None else logits + bias[columns]


def divergence(kind: str, student_logits: Any, target_logits: Any) -> Any:
    """Sum over positions of the chosen divergence between p_target and p_draft (float32)."""
    import torch

    log_draft = torch.log_softmax(student_logits.float(), dim=-1)  # [M, V]
    log_target = torch.log_softmax(target_logits.float(), dim=-1)  # [M, V]
    if kind == "fkl":
        return (log_target.exp() * (log_target - log_draft)).sum()
    if kind == "rkl":
        return (log_draft.exp() * (log_draft - log_target)).sum()
    return 0.5 * (log_target.exp() - log_draft.exp()).abs().sum()
