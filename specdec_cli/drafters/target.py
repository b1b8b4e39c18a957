"""What a drafter may know about the target without holding the model: its vocabulary, EOS ids, tokenizer
fingerprint, device, hidden width (`TargetInfo`), and, for heads that read tokens through the target's own layers,
its frozen embeddings and LM head (`TargetWeights`, taken from a loaded model by `target_weights`); `target_info`
reads all of it off a loaded model and its tokenizer (chat, bench and distill call it).

It does not load targets (target_model/ does) and imports torch only inside the functions that read tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from ..target_model.load.models import eos_token_ids
from ..texts.fingerprint import tokenizer_fingerprint

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..target_model.native.quant import BlockLinear


@dataclass(frozen=True)
class TargetWeights:
    """The target's frozen token embeddings and LM head, read (never trained) by feature-level heads (eagle)."""

    embedding: "Union[torch.Tensor, torch.nn.Embedding]"  # [vocab, hidden] rows, or a table that looks rows up
    lm_head: "Union[torch.Tensor, BlockLinear]"  # [vocab, hidden] dense rows, or the target's block layer (quant.py)
    lm_bias: Optional["torch.Tensor"] = None  # [vocab], when the LM head has one
    embed_scale: Optional[float] = None  # what the embedding layer multiplies looked-up rows by (Gemma 3's)

    def embed(self, ids: "torch.Tensor") -> "torch.Tensor":
        """Token ids [...] -> their embeddings [..., hidden], as the target's embedding layer gives them."""
        import torch

        if isinstance(self.embedding, torch.Tensor):
            rows = torch.nn.functional.embedding(ids, self.embedding)
        else:  # a GGUF's table left in the file (in_place/mapped_embedding.py): only these rows are read
            rows = self.embedding.rows(ids.reshape(-1)).reshape(*ids.shape, -1)  # type: ignore[operator]
        return rows if self.embed_scale is None else rows * torch.tensor(self.embed_scale, dtype=rows.dtype)

    @property
    def vocab_size(self) -> int:
        import torch

        embedding = self.embedding
        return int(embedding.shape[0] if isinstance(embedding, torch.Tensor) else embedding.num_embeddings)

    def logits(self, rows: "torch.Tensor") -> "torch.Tensor":
        """Last hidden states [m, hidden] -> the target's float32 logits [m, vocab], a block head read by the
        kernels (its dense weight is never made)."""
        import torch

        lm_head = self.lm_head
        if not isinstance(lm_head, torch.Tensor):
            return lm_head(rows.float())  # (the block layer adds its own bias)
        out = (rows.to(lm_head.device, lm_head.dtype) @ lm_head.T).float()
        return out if self.lm_bias is None else out + self.lm_bias.float()

    def dense_lm_head(self) -> "torch.Tensor":
        """The LM head's weight [vocab, hidden] as dense rows (a block head unpacked: a float32 copy)."""
        import torch

        lm_head = self.lm_head
        return lm_head if isinstance(lm_head, torch.Tensor) else lm_head.weight.detach()


def target_weights(model: Any) -> Optional[TargetWeights]:
    """The embeddings and LM head of a loaded target, or None when its logits are not a plain linear map of its last
    hidden states (a softcap) or its layers are not an embedding table and a linear (or block) head."""
    import torch

    from ..target_model.native.quant import BlockLinear

    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(embeddings, torch.nn.Embedding) or head is None:
        return None
    scale = getattr(embeddings, "embed_scale", None)  # (transformers' scaled embeddings keep it as a buffer)
    bias = getattr(head, "bias", None)
    bias = bias.detach() if isinstance(bias, torch.Tensor) else None
    if isinstance(head, BlockLinear):  # (its `weight` would unpack and keep a float32 copy: test the type first)
        lm_head: Union[torch.Tensor, BlockLinear] = head
    elif isinstance(getattr(head, "weight", None), torch.Tensor):
        lm_head = head.weight.detach()
    else:
        return None
    table = embeddings if hasattr(embeddings, "rows") else embeddings.weight.detach()  # (rows: read on demand)
    return TargetWeights(table, lm_head, bias, None if scale is None else float(scale))


@dataclass(frozen=True)
class TargetInfo:
    """What drafters may know about the target without holding the model."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    fingerprint: str = ""  # tokenizer fingerprint (see specdec_cli.texts.fingerprint)
    device: str = "cpu"  # where the target runs: a draft model is put there too
    hidden_size: int = 0  # width of the target's last hidden state (the features step events carry)
    num_layers: int = 0  # the target's decoder layers (an EAGLE-3 head reads three of them)
    weights: Optional[TargetWeights] = field(default=None, compare=False, repr=False)  # for feature-level heads


def target_info(model: Any, tokenizer: Any) -> TargetInfo:
    """What drafters may know of a loaded target (`model` and its `tokenizer`): the one place a TargetInfo is
    read off a model."""
    eos = eos_token_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer)
    vocab = max(len(tokenizer), int(getattr(model.config, "vocab_size", 0) or 0))
    device = str(next(model.parameters()).device)
    return TargetInfo(vocab_size=vocab, eos_token_ids=tuple(eos), fingerprint=tokenizer_fingerprint(tokenizer),
                      device=device, hidden_size=int(getattr(model.config, "hidden_size", 0) or 0),
                      num_layers=int(getattr(model.config, "num_hidden_layers", 0) or 0),
                      weights=target_weights(model))
