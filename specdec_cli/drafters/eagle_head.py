"""A feature-level draft head (EAGLE-style): one decoder block that predicts the target's next last-hidden-state.

Input at position t: the target's feature f_t (its last hidden state after the final norm, what its LM head
reads) and the embedding of token t+1 (the target's own frozen embeddings), fused by one linear map
[2H -> H]; then one pre-norm decoder block (causal self-attention with rotary positions, SwiGLU MLP) with its
own small KV cache; the output is the predicted feature f_{t+1}, read as tokens through the target's frozen
LM head (restricted to `head_tokens`, the tokens that matter, to keep the largest matrix small on a CPU).
Drafting k tokens feeds each predicted feature back in with the token it chose.

The head's files: `head.safetensors` (its own weights only; the embeddings and LM head are the target's),
`specdec_head.json` (format, kind "eagle", hidden size, heads, tokenizer fingerprint, vocabulary, head
tokens, training report) and `distill_report.json` (the report alone). This file defines the module, its
cache, its files, its 8-bit block form for drafting (`head_on_blocks`) and the one ready head that drafters alive
on one target share (`shared_head`); training is distill/eagle_train.py's, drafting drafters/eagle.py's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SpecdecError
from ..files import atomic_directory, check_replaceable_dir, read_json

HEAD_FORMAT = 1
HEAD_META = "specdec_head.json"
HEAD_WEIGHTS = "head.safetensors"


# The widest MLP a head gets by default, in hidden sizes. On the real Qwen2.5-Coder-0.5B (896 wide, its MLP 4,864)
# a 1,792-wide head drafted as fast as a full-width one on Spec-Bench (1.00x plain both), 1.8 points lower held-out
# agreement, in two thirds of the training time and half the training memory (docs/distill.md).
MLP_PER_HIDDEN = 2


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int  # the target's
    num_heads: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(hidden.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (hidden.float() * scale).to(hidden.dtype) * self.weight


def rotation(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Rotary position embedding's (cos, sin) [n, d/2] for positions [n], computed once for queries and keys."""
    half = head_dim // 2
    frequencies = theta ** (-torch.arange(half, dtype=torch.float32, device=positions.device) / half)  # [d/2]
    angles = positions.float()[:, None] * frequencies[None, :]  # [n, d/2]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(tensor: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding: tensor [B, heads, n, d] turned by (cos, sin) [n, d/2] -> same shape."""
    half = tensor.shape[-1] // 2
    first, second = tensor[..., :half], tensor[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class HeadCache:
    """The head block's keys and values for the positions fed so far: [1, heads, n, d] each."""

    def __init__(self) -> None:
        self.keys: Optional[torch.Tensor] = None
        self.values: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    def crop(self, length: int) -> None:
        if self.keys is not None and self.values is not None:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache: Optional[HeadCache],
           mask: Optional[torch.Tensor]) -> torch.Tensor:
    """A head block's attention: query [B, heads, n, d] over the cache's keys and values (appended to it: B = 1)
    and the new ones [B, kv_heads, n, d], causally or as `mask` [n, cached + n] (bool, True = attend) says ->
    [B, heads, n, d]. Keys may serve groups of query heads (kv_heads dividing heads)."""
    length, past = query.shape[2], 0
    if cache is not None:
        past = len(cache)
        if cache.keys is not None and cache.values is not None:
            key, value = torch.cat([cache.keys, key], dim=2), torch.cat([cache.values, value], dim=2)
        cache.keys, cache.values = key, value
    scale, gqa = 1 / math.sqrt(query.shape[-1]), query.shape[1] != key.shape[1]
    if mask is None and past == 0:  # (training's whole pieces: the causal kernel, no mask made; the same bits)
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale, enable_gqa=gqa)
    if mask is None:
        mask = torch.ones(length, past + length, dtype=torch.bool, device=query.device).tril(past)  # [n, past+n]
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale, enable_gqa=gqa)


class EagleHead(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        size = config.hidden_size
        self.config = config
        self.fuse = nn.Linear(2 * size, size, bias=False)
        self.attention_norm = RMSNorm(size, config.rms_eps)
        self.qkv = nn.Linear(size, 3 * size, bias=False)
        self.out = nn.Linear(size, size, bias=False)
        self.mlp_norm = RMSNorm(size, config.rms_eps)
        self.gate_up = nn.Linear(size, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, size, bias=False)

    def forward(self, features: torch.Tensor, token_embeddings: torch.Tensor, positions: torch.Tensor,
                cache: Optional[HeadCache] = None, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """features, token_embeddings [B, n, H] (f_t and embed(x_{t+1})), positions [n] -> predicted f_{t+1}
        [B, n, H]. With a cache (B = 1), the n new rows follow the cached ones and attend causally, or as
        `mask` [n, cached + n] (bool, True = attend) says: a draft tree's rows see only their ancestors."""
        heads = self.config.num_heads
        batch, length, size = features.shape
        hidden = self.fuse(torch.cat([token_embeddings, features], dim=-1))  # [B, n, H]
        query, key, value = self.qkv(self.attention_norm(hidden)).split(size, dim=-1)  # [B, n, H] each
        shape = (batch, length, heads, size // heads)
        query, key, value = (part.view(shape).transpose(1, 2) for part in (query, key, value))  # [B, heads, n, d]
        cos, sin = rotation(positions, size // heads, self.config.rope_theta, query.dtype)  # [n, d/2] each
        query, key = rotate(query, cos, sin), rotate(key, cos, sin)
        attended = attend(query, key, value, cache, mask)  # [B, heads, n, d]
        hidden = hidden + self.out(attended.transpose(1, 2).reshape(batch, length, size))
        gate, up = self.gate_up(self.mlp_norm(hidden)).chunk(2, dim=-1)
        return hidden + self.down(F.silu(gate) * up)  # [B, n, H]


def head_on_blocks(head: nn.Module) -> Any:
    """The head for drafting on a block target: its linear layers quantised to 8-bit blocks as `--weights int8`
    quantises a target's (quant.py; float32 rows in and out), so a head forward reads a quarter of its float32
    weights. Drafts need not be exact (the target verifies them). In place."""
    from ..target_model.load import converted_blocks
    from ..target_model.native import quant

    quant.install_blocks(head, converted_blocks.plan_blocks(head, "int8", None))
    return head


def head_config_for(target_config: Any, mlp: int = 0) -> HeadConfig:
    """A head sized like one block of the target, its MLP `mlp` wide where given (0: the target's width, at most
    MLP_PER_HIDDEN times its hidden size)."""
    hidden = int(target_config.hidden_size)
    return HeadConfig(
        hidden_size=hidden,
        num_heads=int(target_config.num_attention_heads),
        intermediate_size=mlp or min(int(getattr(target_config, "intermediate_size", 4 * hidden)),
                                     MLP_PER_HIDDEN * hidden),
        rope_theta=float(getattr(target_config, "rope_theta", None) or 10000.0),
        rms_eps=float(getattr(target_config, "rms_norm_eps", None) or 1e-5),
    )


def check_head_output(directory: Path) -> None:
    """Refuse to replace anything but an earlier head: writing a head replaces its directory."""
    check_replaceable_dir(directory, lambda folder: (folder / HEAD_META).is_file(), "an EAGLE head directory")


def save_head(directory: Path, head: EagleHead, meta: dict) -> None:
    """Write the head's weights and metadata into `directory` atomically (a folder renamed into place)."""
    import json

    from safetensors.torch import save_file

    check_head_output(directory)
    with atomic_directory(directory) as folder:
        state = {name: tensor.detach().float().contiguous().cpu() for name, tensor in head.state_dict().items()}
        save_file(state, str(folder / HEAD_WEIGHTS))
        document = {"format": HEAD_FORMAT, "kind": "eagle", "config": asdict(head.config), **meta}
        (folder / HEAD_META).write_text(json.dumps(document, indent=1), encoding="utf-8")
        if meta.get("report"):  # the training report alone, where `specdec distill` puts a student's
            (folder / "distill_report.json").write_text(json.dumps(meta["report"], indent=1), encoding="utf-8")


def read_head_meta(directory: str | Path) -> dict:
    """The head's metadata; one-line errors for a missing, foreign or newer directory."""
    folder = Path(directory).expanduser()
    if not folder.is_dir():
        raise SpecdecError(f"draft_model {directory}: no such directory", setting="draft_model")
    if not (folder / HEAD_META).is_file():
        raise SpecdecError(f"draft_model {directory}: not an EAGLE head (no {HEAD_META}, nor an EAGLE-3 "
                           "config.json; make one with `specdec distill train --kind eagle`)", setting="draft_model")
    meta = read_json(folder / HEAD_META)
    if meta.get("kind") != "eagle" or not isinstance(meta.get("config"), dict):
        raise SpecdecError(f"draft_model {directory}: {HEAD_META} does not describe an EAGLE head",
                           setting="draft_model")
    if meta.get("format") != HEAD_FORMAT:
        raise SpecdecError(f"draft_model {directory}: head format {meta.get('format')} is not {HEAD_FORMAT} "
                           "(made by another specdec version)", setting="draft_model")
    return meta


def load_head(directory: str | Path, target: Any) -> tuple[EagleHead, dict]:
    """The head and its metadata, refused unless it was trained for this target's tokenizer and hidden size
    (`target`: TargetInfo)."""
    from safetensors.torch import load_file

    meta = check_head(directory, target)
    config = HeadConfig(**meta["config"])
    with torch.device("meta"):  # no random init of weights about to be replaced (28 ms a head on the 0.5B)
        head = EagleHead(config)
    try:
        head.load_state_dict(load_file(str(Path(directory).expanduser() / HEAD_WEIGHTS)), assign=True)
    except Exception as error:  # a truncated or foreign weights file
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise SpecdecError(f"draft_model {directory}: cannot load {HEAD_WEIGHTS}: {first}",
                           setting="draft_model") from None
    return head.eval(), meta


def check_head(directory: str | Path, target: Any) -> dict:
    """The head's metadata, refused unless it was trained for this target's tokenizer and hidden size."""
    meta = read_head_meta(directory)
    try:
        config = HeadConfig(**meta["config"])
    except TypeError as error:
        raise SpecdecError(f"draft_model {directory}: bad head config ({error})", setting="draft_model") from None
    fingerprint = getattr(target, "fingerprint", "")
    if meta.get("fingerprint") and fingerprint and meta["fingerprint"] != fingerprint:
        raise SpecdecError(f"draft_model {directory}: the head was trained for another tokenizer "
                           f"({meta['fingerprint']}, target {fingerprint})", setting="draft_model")
    if int(meta.get("vocab_size", -1)) != int(target.vocab_size):
        raise SpecdecError(f"draft_model {directory}: the head's vocabulary ({meta.get('vocab_size')}) is not the "
                           f"target's ({target.vocab_size})", setting="draft_model")
    if target.hidden_size and config.hidden_size != target.hidden_size:
        raise SpecdecError(f"draft_model {directory}: the head reads {config.hidden_size}-wide features, the target "
                           f"has {target.hidden_size}", setting="draft_model")
    return meta


# head file -> (the target's LM head, a drafter's head made ready for it), by weak references: drafters alive on
# the same target share one head (a server's slots each hold a drafter, not each a copy of the head)
_SHARED: dict[tuple, tuple[Any, Any]] = {}


def _head_key(directory: str | Path) -> tuple:
    path = Path(directory).expanduser().resolve() / HEAD_WEIGHTS
    stat = path.stat()
    return str(path), stat.st_mtime_ns, stat.st_size


def shared_head(directory: str | Path, lm_head: Any) -> Any:
    """A live drafter's head read from this head file (unchanged since) for the target whose LM head is `lm_head`,
    as that drafter made it ready (read only while drafting), or None."""
    try:
        held = _SHARED.get(_head_key(directory))
    except OSError:  # no weights file: load_head says so in one line
        return None
    return held[1]() if held is not None and held[0]() is lm_head else None


def share_head(directory: str | Path, lm_head: Any, head: Any) -> None:
    """Offer a drafter's ready head to the next drafters of this head file on this target (kept alive by them)."""
    import weakref

    _SHARED[_head_key(directory)] = (weakref.ref(lm_head), weakref.ref(head))
