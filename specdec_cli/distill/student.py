"""The student: a small draft model that shares the target's tokenizer, and the tokens its head covers.

It starts as (a) the target cut down to its embeddings, first N blocks, final norm and head
(`init="target"`, the default), (b) a fresh model of the target's family with hidden size H and N blocks,
its embeddings initialised from the target's reduced by SVD to H dimensions (`init="config"`), or (c) an
existing model directory with the same tokenizer (`init="student"`). The draft's head covers `draft_vocab`
tokens (`choose_head_tokens`: the most frequent tokens of the training data, then those the target itself
predicts most along it, then the lowest ids). Construction only: training is train.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..drafters import model as model_drafter
from ..errors import SpecdecError

DEFAULT_LAYERS = 4
MAX_LAYERS = 256  # a student's blocks at most, before any target is read (Llama-3.1-405B has 126)
INITS = ("target", "config", "student")
DEFAULT_DRAFT_VOCAB = 16384
MARGINAL_ROWS = 24  # rows the target scores to rank tokens by its own predictions


def _config_dict(config: Any) -> dict:
    return {key: value for key, value in config.to_dict().items() if not key.startswith("_")}


def _with(config: Any, **changes: Any) -> Any:
    values = _config_dict(config)
    values.update(changes)
    layers = values.get("num_hidden_layers")
    for key in ("layer_types",):
        if isinstance(values.get(key), list) and layers is not None:
            values[key] = values[key][:layers]
    if "max_window_layers" in values and layers is not None:
        values["max_window_layers"] = min(int(values["max_window_layers"] or layers), layers)
    from ..target_model.in_place.stored import config_class  # (torch behind it)

    return config_class(config).from_dict(values)


def build_student(target: Any, spec: dict, target_fingerprint: str = "", target_vocab: int = 0) -> Any:
    """The untrained student for an init spec (also rebuilt by evaluate.py for the 'before' numbers)."""
    import torch
    from transformers import AutoModelForCausalLM

    kind = spec["kind"]
    if kind == "student":
        model, _, _ = model_drafter.load_draft_model(spec["path"], _TargetView(target_vocab, target_fingerprint))
        return model.float()
    base = target.config
    total = int(getattr(base, "num_hidden_layers", 0) or 0)
    layers = int(spec["layers"])
    if kind == "target":
        if layers > total:
            raise SpecdecError(f"layers {layers}: the target has only {total} blocks", setting="layers")
        state = kept_weights(target, layers)
        tied = _tied(target, state)
        if tied and "lm_head.weight" in state:  # one tensor, the embeddings (as a dense target holds it)
            state["lm_head.weight"] = target.get_input_embeddings().weight.detach().float()
        config = _with(base, num_hidden_layers=layers, tie_word_embeddings=tied)
        student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = student.load_state_dict(state, strict=False)
        missing = [name for name in missing if "rotary" not in name]
        if missing or unexpected:
            raise SpecdecError(
                f"cannot cut this target down to a student (missing {missing[:3]}, unexpected {unexpected[:3]}); "
                "use --init config"
            )
        return student
    # kind == "config": the target's family, smaller, embeddings from the target's by SVD
    hidden = int(spec.get("hidden") or base.hidden_size)
    head_dim = int(getattr(base, "head_dim", 0) or base.hidden_size // base.num_attention_heads)
    if hidden % head_dim:
        raise SpecdecError(f"hidden {hidden} must be a multiple of the target's head size {head_dim}", setting="hidden")
    heads = hidden // head_dim
    kv_heads_of_target = int(getattr(base, "num_key_value_heads", base.num_attention_heads))
    kv_ratio = max(1, int(base.num_attention_heads) // kv_heads_of_target)
    kv_heads = heads // kv_ratio if heads % kv_ratio == 0 and heads >= kv_ratio else heads
    ratio = float(getattr(base, "intermediate_size", 4 * base.hidden_size)) / float(base.hidden_size)
    intermediate = max(16, int(round(hidden * ratio / 16.0)) * 16)
    config = _with(base, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                   num_key_value_heads=kv_heads, intermediate_size=intermediate, head_dim=head_dim)
    torch.manual_seed(int(spec.get("seed", 0)))
    student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        embedding = target.get_input_embeddings().weight.detach().float()  # [vocab, D]
        if hidden == embedding.shape[1]:
            reduced = embedding.clone()
        else:
            _, _, basis = torch.linalg.svd(embedding, full_matrices=False)  # basis [D, D]
            reduced = embedding @ basis[:hidden].T  # [vocab, hidden]
        student.get_input_embeddings().weight.copy_(reduced[: student.get_input_embeddings().weight.shape[0]])
        head = student.get_output_embeddings()
        target_head = target.get_output_embeddings()
        if head is not None and target_head is not None and head.weight is not student.get_input_embeddings().weight:
            weight = target_head.weight.detach().float()
            if hidden == weight.shape[1]:
                head.weight.copy_(weight)
            else:
                _, _, basis = torch.linalg.svd(weight, full_matrices=False)
                head.weight.copy_(weight @ basis[:hidden].T)
    return student


def kept_weights(target: Any, layers: int) -> dict:
    """The target's weights a student of its first `layers` blocks keeps, float32 under their state-dict names.
    Block layers (`--weights gguf`, `int8`, `int4`: quant.BlockLinear, whose blocks are not in the state dict)
    are dequantised: the student starts from the target as it runs, whatever its weights."""
    import torch

    from ..target_model.native.quant import BlockLinear

    def kept(name: str) -> bool:
        parts = name.split(".")
        if "layers" in parts:
            index = parts.index("layers")
            if index + 1 < len(parts) and parts[index + 1].isdigit() and int(parts[index + 1]) >= layers:
                return False
        return True

    state = {name: tensor.detach().float() for name, tensor in target.state_dict().items() if kept(name)}
    for name, module in target.named_modules():
        if isinstance(module, torch.nn.Embedding) and hasattr(module, "rows") and kept(f"{name}.weight"):
            # a GGUF's table left in the file (in_place/mapped_embedding.py): dequantised here, alone
            state[f"{name}.weight"] = module.rows(torch.arange(module.num_embeddings))  # type: ignore[operator]
        if isinstance(module, BlockLinear) and kept(f"{name}.weight"):
            state[f"{name}.weight"] = module.blocks().dense()  # [out, in] (not `.weight`: it keeps a copy)
            if module.bias is not None:
                state[f"{name}.bias"] = module.bias.detach().float()
    return state


def _tied(target: Any, state: dict) -> bool:
    """Whether the student ties its head to its embeddings: as the target's config says, or, where the target's
    head became a block layer (quant.install_blocks unties it), when that head holds the embeddings (a GGUF's
    tied head is the same tensor)."""
    tied = bool(getattr(target.config, "tie_word_embeddings", False))
    head = state.get("lm_head.weight")
    embeddings = state.get("model.embed_tokens.weight")
    if embeddings is None:
        embeddings = target.get_input_embeddings().weight.detach().float()
    if tied or head is None or head.shape != embeddings.shape:
        return tied
    tolerance = 1e-5 * (1.0 + float(embeddings.abs().max()))
    return bool((head - embeddings).abs().max() <= tolerance)


@dataclass(frozen=True)
class _TargetView:
    vocab_size: int
    fingerprint: str


def count_parameters(model: Any) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def choose_head_tokens(target: Any, rows: Sequence[dict], size: int, vocab: int,
                       always: Sequence[int] = ()) -> Optional[list[int]]:
    """The draft head's tokens: data counts, then the target's own predictions along the data, then low ids."""
    import collections

    import torch

    if size <= 0 or size >= vocab:
        return None
    chosen: dict[int, None] = {int(token): None for token in always if 0 <= int(token) < vocab}
    counts: collections.Counter = collections.Counter()
    for row in rows:
        counts.update(int(token) for token in row["answer_ids"])
        counts.update(int(token) for token in row["prompt_ids"])
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if 0 <= token < vocab:
            chosen.setdefault(token, None)
    if len(chosen) < size:
        marginal = torch.zeros(vocab)
        device = next(target.parameters()).device
        with torch.inference_mode():
            for row in list(rows)[:MARGINAL_ROWS]:
                ids = torch.tensor([list(row["prompt_ids"]) + list(row["answer_ids"])], device=device)
                logits = target(input_ids=ids).logits[0].float().cpu()  # [n, V']
                marginal[: logits.shape[-1]] += torch.softmax(logits, -1)[:, :vocab].sum(0)
        for token in torch.argsort(marginal, descending=True).tolist():
            if len(chosen) >= size or marginal[token] <= 0:
                break
            chosen.setdefault(int(token), None)
    token = 0
    while len(chosen) < size:
        chosen.setdefault(token, None)
        token += 1
    return sorted(chosen)
