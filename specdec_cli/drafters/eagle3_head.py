"""Draft heads in the layout EAGLE-3 checkpoints are published in, as vLLM and SGLang load them.

A directory with `config.json` (a Llama-shaped config: hidden_size, intermediate_size, num_attention_heads,
num_key_value_heads, rms_norm_eps, rope_theta and rope_scaling, vocab_size and draft_vocab_size) and
`model.safetensors` holding:

    fc.weight                   [H, 3 * H]   the target's three layers' states -> one state
    midlayer.*                  one decoder layer whose attention reads [input_layernorm(embedding), hidden_norm(h)]
                                (q/k/v_proj [., 2 * H]), then post_attention_layernorm and a gated MLP
    norm.weight, lm_head.weight [draft_vocab, H]: the head's own token read-out, over its own vocabulary
    d2t                         [draft_vocab] int64: target id = draft id + d2t[draft id]
    t2d                         [vocab] bool (which target ids are in the draft vocabulary; not needed to draft)

A committed position t feeds the head (the target's states entering three of its layers at t, concatenated, the
embedding of token t+1): fc maps the states to one H-wide state, the layer runs over it and the embedding at
position t, and its output (before `norm`) is the predicted state of t+1, which drafting feeds back in (without
fc) with the token read from it: lm_head(norm(state)), mapped to target ids by d2t. The three layers are the
config's `eagle_aux_hidden_state_layer_ids` (top level or under `eagle_config`), else EAGLE-3's (2, N/2, N-3) of
the target's N layers; the engine asks the target's forward for them (`Needs.feature_layers`).

This file reads such a directory into a module with drafters/eagle.py's head interface (`reduce`, the call, a
`HeadCache`) and an `OwnVocabulary` for its read-out; it refuses weights in pickle files (`pytorch_model.bin`),
shapes that do not fit the target, and a vocabulary that is not the target's (nor, for a head specdec trained,
another tokenizer: its distill_report.json names the fingerprint). It also writes the layout (`save_eagle3`, in
bfloat16 as checkpoints are published); training is distill/eagle3_train.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SpecdecError
from ..files import check_replaceable_dir, read_json
from .eagle_head import HeadCache, RMSNorm, attend

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
REPORT = "distill_report.json"  # a head specdec trained: its target, tokenizer fingerprint and training report
ARCHITECTURE = "LlamaForCausalLMEagle3"  # the name vLLM and SGLang load the layout by
PICKLED = ("pytorch_model.bin", "model.pt", "model.pth")
MIDLAYER = ("midlayer.", "layers.0.", "model.layers.0.", "model.midlayer.")  # names checkpoints give the layer


def is_eagle3_dir(directory: str | Path) -> bool:
    """Whether `directory` is an EAGLE-3 checkpoint: a config.json that names an EAGLE-3 architecture or has a
    draft vocabulary or EAGLE settings (a target model's directory is none of these)."""
    folder = Path(directory).expanduser()
    if not (folder / CONFIG).is_file() or (folder / "specdec_head.json").is_file():
        return False
    config = read_json(folder / CONFIG)
    names = config.get("architectures")
    names = names if isinstance(names, list) else []
    return (any("eagle" in str(name).lower() for name in names) or "draft_vocab_size" in config or
            "eagle_config" in config or "eagle_aux_hidden_state_layer_ids" in config)


def trained_here(directory: str | Path) -> bool:
    """Whether `directory` holds an EAGLE-3 head `specdec distill --kind eagle3` wrote (its report says so): one a
    later run may replace, unlike a downloaded checkpoint."""
    folder = Path(directory).expanduser()
    report = read_json(folder / REPORT) if (folder / REPORT).is_file() else {}
    return is_eagle3_dir(folder) and report.get("kind") == "eagle3" and bool(report.get("fingerprint"))


def check_eagle3_output(directory: str | Path) -> None:
    """Refuse to replace anything but an EAGLE-3 head specdec trained (writing a head replaces its directory)."""
    check_replaceable_dir(directory, trained_here, "an EAGLE-3 head `specdec distill` trained")


def read_eagle3_config(directory: str | Path) -> dict:
    """The checkpoint's config, checked for what the head needs (one-line errors), before any target loads."""
    folder = Path(directory).expanduser()
    config = read_json(folder / CONFIG)  # ({} when it is not a JSON object)
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SpecdecError(f"draft_model {directory}: {CONFIG} has no positive integer {key!r} (not an EAGLE-3 "
                               "head?)", setting="draft_model")
    if config["hidden_size"] % config["num_attention_heads"] and not config.get("head_dim"):
        raise SpecdecError(f"draft_model {directory}: hidden_size does not divide into the attention heads",
                           setting="draft_model")
    if not (folder / WEIGHTS).is_file():
        pickled = [name for name in PICKLED if (folder / name).is_file()]
        if pickled:
            raise SpecdecError(f"draft_model {directory}: the weights are in {pickled[0]}, a pickle file, which "
                               f"specdec does not load; convert them to {WEIGHTS} (safetensors) first",
                               setting="draft_model")
        raise SpecdecError(f"draft_model {directory}: no {WEIGHTS}", setting="draft_model")
    layers = _configured_layers(config)
    if layers is not None and (not isinstance(layers, list) or len(layers) != 3 or
                               not all(isinstance(layer, int) and layer >= 0 for layer in layers)):
        raise SpecdecError(f"draft_model {directory}: eagle_aux_hidden_state_layer_ids must be three layer numbers",
                           setting="draft_model")
    return config


def _configured_layers(config: dict) -> Any:
    """The config's `eagle_aux_hidden_state_layer_ids`, at the top level or under `eagle_config` (None: not set)."""
    nested = config.get("eagle_config")
    nested = nested if isinstance(nested, dict) else {}
    return config.get("eagle_aux_hidden_state_layer_ids", nested.get("eagle_aux_hidden_state_layer_ids"))


def feature_layers(config: dict, target_layers: int) -> tuple[int, ...]:
    """The target layers whose input states the head reads: the config's, else EAGLE-3's (2, N/2, N-3)."""
    layers = _configured_layers(config)
    if layers is None:
        layers = [min(2, target_layers - 1), target_layers // 2, max(0, target_layers - 3)]
    return tuple(int(layer) for layer in layers)


class _Rotary:
    """Rotary position embedding as the config asks (rope_theta, rope_scaling), through transformers' own tables."""

    def __init__(self, config: dict, head_dim: int) -> None:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        settings = {key: config[key] for key in ("rope_theta", "rope_scaling", "max_position_embeddings")
                    if config.get(key) is not None}
        llama = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, **settings)
        self.embedding = LlamaRotaryEmbedding(llama)

    def __call__(self, tensor: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tensor [B, heads, n, d], positions [n] -> rotated, rotate-half convention."""
        cos, sin = self.embedding(tensor, positions[None].to(tensor.device))  # [1, n, d] each
        cos, sin = cos[:, None].to(tensor.dtype), sin[:, None].to(tensor.dtype)
        half = tensor.shape[-1] // 2
        rotated = torch.cat([-tensor[..., half:], tensor[..., :half]], dim=-1)
        return tensor * cos + rotated * sin


class Eagle3Head(nn.Module):
    """The checkpoint's layers; drafters/eagle.py drives it as it drives specdec's own head (eagle_head.py)."""

    d2t: torch.Tensor  # [draft_vocab] int64 (a buffer): target id = draft id + d2t[draft id]
    lm_head: nn.Linear

    def __init__(self, config: dict, target_hidden: int) -> None:
        super().__init__()
        self.config = dict(config)
        size = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or size // self.heads)
        eps = float(config.get("rms_norm_eps") or 1e-5)
        ffn = int(config["intermediate_size"])
        self.fc = nn.Linear(3 * target_hidden, size, bias=False)
        self.input_layernorm = RMSNorm(size, eps)
        self.hidden_norm = RMSNorm(size, eps)
        self.q_proj = nn.Linear(2 * size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, size, bias=False)
        self.post_attention_layernorm = RMSNorm(size, eps)
        self.gate_proj = nn.Linear(size, ffn, bias=False)
        self.up_proj = nn.Linear(size, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, size, bias=False)
        self.norm = RMSNorm(size, eps)
        draft_vocab = int(config.get("draft_vocab_size") or config["vocab_size"])
        self.lm_head = nn.Linear(size, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.rotary = _Rotary(config, self.head_dim)

    def draft_ids(self) -> torch.Tensor:
        """The target ids of its draft vocabulary, in draft order [draft_vocab]."""
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def set_draft_ids(self, ids: torch.Tensor) -> None:
        """Make `ids` [draft_vocab] its draft vocabulary (d2t)."""
        with torch.no_grad():
            self.d2t.copy_(ids.to(self.d2t.device) - torch.arange(ids.shape[0], device=self.d2t.device))

    def reduce(self, states: torch.Tensor) -> torch.Tensor:
        """The target's three layers' states [..., 3 * H_target] -> the head's state [..., H]."""
        return self.fc(states)

    def forward(self, hidden: torch.Tensor, token_embeddings: torch.Tensor, positions: torch.Tensor,
                cache: Optional[HeadCache] = None, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """hidden [B, n, H] (fc's output, or the head's own earlier output) and token_embeddings [B, n, H] (of the
        next tokens), positions [n] -> the predicted next states [B, n, H], before `norm`. With a cache (B = 1),
        the rows follow the cached ones and attend causally, or as `mask` [n, cached + n] says."""
        batch, length, _ = hidden.shape
        joined = torch.cat([self.input_layernorm(token_embeddings), self.hidden_norm(hidden)], dim=-1)  # [B, n, 2H]
        query = self.q_proj(joined).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        key = self.k_proj(joined).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        value = self.v_proj(joined).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        query, key = self.rotary(query, positions), self.rotary(key, positions)  # [B, heads or kv, n, d]
        attended = attend(query, key, value, cache, mask)  # [B, heads, n, d]
        hidden = hidden + self.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))
        normed = self.post_attention_layernorm(hidden)
        return hidden + self.down_proj(F.silu(self.gate_proj(normed)) * self.up_proj(normed))


class OwnVocabulary:
    """The read-out of a head with its own LM head: logits over its draft vocabulary, `ids` their target ids."""

    def __init__(self, head: Any) -> None:
        """`head`: an Eagle3Head (its linear layers dense or in blocks)."""
        self.head = head
        self.ids = head.draft_ids()  # [K]

    def extend(self, tokens: Any) -> None:
        """(A fixed vocabulary: tokens seen in the context cannot join it.)"""

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """features [rows, H] -> float32 logits [rows, K]."""
        return self.head.lm_head(self.head.norm(features)).float()


def load_eagle3(directory: str | Path, target: Any) -> tuple[Eagle3Head, tuple[int, ...]]:
    """The head and the target layers it reads, refused (one line) unless it fits `target` (a TargetInfo)."""
    from safetensors import safe_open

    config = read_eagle3_config(directory)
    folder = Path(directory).expanduser()
    if target.hidden_size and config["hidden_size"] != target.hidden_size:
        raise SpecdecError(f"draft_model {directory}: the head is {config['hidden_size']} wide, the target "
                           f"{target.hidden_size} (the head reads the target's token embeddings)",
                           setting="draft_model")
    if config["vocab_size"] != target.vocab_size:
        raise SpecdecError(f"draft_model {directory}: the head's vocabulary ({config['vocab_size']}) is not the "
                           f"target's ({target.vocab_size}): an EAGLE-3 head made for another model",
                           setting="draft_model")
    trained_for = read_json(folder / REPORT).get("fingerprint") if (folder / REPORT).is_file() else None
    fingerprint = getattr(target, "fingerprint", "")
    if trained_for and fingerprint and trained_for != fingerprint:
        raise SpecdecError(f"draft_model {directory}: the head was trained for another tokenizer ({trained_for}, "
                           f"target {fingerprint})", setting="draft_model")
    if not target.num_layers:
        raise SpecdecError(f"draft_model {directory}: the target does not say how many layers it has",
                           setting="draft_model")
    layers = feature_layers(config, target.num_layers)
    if max(layers) >= target.num_layers:
        raise SpecdecError(f"draft_model {directory}: the head reads layer {max(layers)}, the target has "
                           f"{target.num_layers}", setting="draft_model")
    head = Eagle3Head(config, target.hidden_size or config["hidden_size"])
    wanted = head.state_dict()
    found: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(folder / WEIGHTS), framework="pt") as weights:
            for name in weights.keys():
                short = name
                for prefix in MIDLAYER:
                    if short.startswith(prefix):
                        short = short[len(prefix):].replace("self_attn.", "").replace("mlp.", "")
                        break
                short = short.removeprefix("model.")
                if short in wanted:
                    found[short] = weights.get_tensor(name)
    except Exception as error:  # a truncated or foreign file
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise SpecdecError(f"draft_model {directory}: cannot read {WEIGHTS}: {first}", setting="draft_model") from None
    if "d2t" not in found and head.lm_head.out_features == config["vocab_size"]:
        found["d2t"] = torch.zeros(config["vocab_size"], dtype=torch.long)  # the whole vocabulary: ids as they are
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise SpecdecError(f"draft_model {directory}: {WEIGHTS} lacks {', '.join(missing[:4])}"
                           f"{' ...' if len(missing) > 4 else ''}", setting="draft_model")
    for name, tensor in found.items():
        if tuple(tensor.shape) != tuple(wanted[name].shape):
            raise SpecdecError(f"draft_model {directory}: {name} is {list(tensor.shape)}, the config makes it "
                               f"{list(wanted[name].shape)}", setting="draft_model")
    targets = torch.arange(head.lm_head.out_features) + found["d2t"].long()
    if int(targets.min()) < 0 or int(targets.max()) >= target.vocab_size:
        raise SpecdecError(f"draft_model {directory}: d2t maps draft tokens outside the target's vocabulary",
                           setting="draft_model")
    head.load_state_dict({name: tensor.float() if tensor.is_floating_point() else tensor.long()
                          for name, tensor in found.items()})
    return head.eval(), layers


def eagle3_config_for(target_config: Any, draft_vocab: int, layers: Sequence[int]) -> dict:
    """The config.json of a head for a target with `target_config`: one Llama layer the target's width, heads and
    MLP size, its rotary settings, a draft vocabulary of `draft_vocab` tokens, reading `layers`."""
    size = int(target_config.hidden_size)
    heads = int(target_config.num_attention_heads)
    rope_theta = getattr(target_config, "rope_theta", None) or \
        (getattr(target_config, "rope_parameters", None) or {}).get("rope_theta") or 10000.0
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": size,
        "intermediate_size": int(getattr(target_config, "intermediate_size", None) or 4 * size),
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(target_config, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(target_config, "head_dim", None) or size // heads),
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": float(getattr(target_config, "rms_norm_eps", None) or 1e-5),
        "rope_theta": float(rope_theta),
        "rope_scaling": None,
        "max_position_embeddings": int(getattr(target_config, "max_position_embeddings", None) or 4096),
        "tie_word_embeddings": False,
        "vocab_size": int(target_config.vocab_size),
        "draft_vocab_size": int(draft_vocab),
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [int(layer) for layer in layers]},
    }


def save_eagle3(directory: str | Path, head: "Eagle3Head", report: dict) -> None:
    """Write `head` in the published layout (config.json, model.safetensors with `midlayer.*` names, d2t, t2d)
    and `report` (its training, with "target" and "fingerprint") as distill_report.json, atomically."""
    import json

    from safetensors.torch import save_file

    from ..files import atomic_directory

    check_eagle3_output(directory)
    layer_names = {"q_proj": "self_attn.", "k_proj": "self_attn.", "v_proj": "self_attn.", "o_proj": "self_attn.",
                   "gate_proj": "mlp.", "up_proj": "mlp.", "down_proj": "mlp.", "input_layernorm": "",
                   "hidden_norm": "", "post_attention_layernorm": ""}
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in head.state_dict().items():
        module = name.split(".")[0]
        key = f"midlayer.{layer_names[module]}{name}" if module in layer_names else name
        tensors[key] = tensor.detach().to(torch.bfloat16).contiguous() if tensor.is_floating_point() else \
            tensor.detach().long().contiguous()
    draft_ids = head.draft_ids()
    in_draft = torch.zeros(head.config["vocab_size"], dtype=torch.bool)
    in_draft[draft_ids] = True
    tensors["t2d"] = in_draft
    with atomic_directory(directory) as folder:
        save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
        (folder / CONFIG).write_text(json.dumps(head.config, indent=1), encoding="utf-8")
        (folder / REPORT).write_text(json.dumps(report, indent=1), encoding="utf-8")
