"""What a GGUF of a family the native decoder computes must hold, and where each tensor goes.

`expected_tensors(config, architecture, tensor_names)` lists, in the order the blocks cache stores them, every tensor
such a file holds: its GGUF name, the shape its metadata implies ([rows, columns] as torch orders them), the module
name transformers gives the same weight, and whether it is a matrix (repacked for the kernels) or a vector (norms,
biases: read as float32). `check_tensors` compares that list with the file (gguf_file.py) and refuses, in one line,
the first missing tensor, unexpected tensor, wrong shape or unknown type. What llama.cpp's converter did to the
weights, undone as transformers' loader undoes it: llama's and smollm3's q/k rows interleaved per head (`heads`
below), the Gemmas' norms stored as 1 + weight. Which family holds which tensors, and what its converter did, is
the family table's (families.py). Nothing is read or computed here.

`check_metadata` comes first, before any config is made from the metadata (transformers' configs build per-layer
lists, so a `block_count` of 2^32 - 1 would cost gigabytes): the layer count the file's own tensor table bears out,
integers where integers belong, and sane ranges for the hyperparameters the families use, each refused in one line
naming the key and its value. Its cost is proportional to the tensor table, never to a number the file declares.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional

from ...errors import SpecdecError
from .. import families
from .gguf_file import GGUFFile


@dataclass(frozen=True)
class Expected:
    """One tensor a family's file holds."""

    gguf_name: str
    shape: tuple[int, ...]
    module: str  # transformers' name of the weight's module ("model.layers.0.self_attn.q_proj")
    matrix: bool  # repacked for the kernels (else a float32 vector)
    heads: int = 0  # rows interleaved per head for this many heads (families.Family.permuted_qk), else 0
    optional: bool = False


# hyperparameters under `ARCH.`: integers, and floats that must be positive and finite
INTEGER_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "attention.key_length", "attention.value_length", "rope.dimension_count",
                "vocab_size", "attention.sliding_window", "rope.scaling.original_context_length", "expert_count",
                "expert_used_count")
POSITIVE_FLOAT_KEYS = ("rope.freq_base", "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon",
                       "rope.scaling.factor", "attn_logit_softcapping", "final_logit_softcapping")
TOKEN_ID_KEYS = tuple(f"tokenizer.ggml.{name}_token_id" for name in ("bos", "eos", "padding", "unknown"))
REQUIRED_KEYS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")
_LAYER = re.compile(r"blk\.(\d+)\.")


def check_metadata(gguf: GGUFFile) -> None:
    """The hyperparameters the metadata declares, checked against the file's own tensors before any config is made
    from them (see the module docstring); SpecdecError naming the key and its value, the path first."""
    architecture = gguf.architecture
    metadata = gguf.metadata
    native = families.is_native_architecture(architecture)

    def refuse(message: str) -> SpecdecError:
        return SpecdecError(f"{gguf.path}: {message}")

    for suffix in INTEGER_KEYS if native else ("block_count",):  # (other families may hold per-layer arrays)
        key = f"{architecture}.{suffix}"
        if key in metadata and (isinstance(metadata[key], bool) or not isinstance(metadata[key], int)):
            raise refuse(f"{key} is {_described(metadata[key])}, not an integer")
    for key in TOKEN_ID_KEYS:
        value = metadata.get(key)
        if key in metadata and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise refuse(f"{key} is {_described(value)}, not a token id")
    for suffix in POSITIVE_FLOAT_KEYS:
        key = f"{architecture}.{suffix}"
        if key not in metadata:
            continue
        value = metadata[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise refuse(f"{key} is {_described(value)}, not a number")
        if not math.isfinite(value) or value <= 0:
            raise refuse(f"{key} is {value!r}; it must be a positive finite number")
    if native:
        for suffix in REQUIRED_KEYS:
            key = f"{architecture}.{suffix}"
            if key not in metadata:
                others = sorted({name.split(".")[0] for name in metadata if name.endswith("." + suffix)
                                 and not name.startswith(architecture + ".")})
                hint = f" (its keys are {others[0]}.*: a {others[0]} file labelled {architecture}?)" if others else ""
                raise refuse(f"the file is labelled {architecture} but has no {key}{hint}")
    for suffix, least in (("embedding_length", 1), ("feed_forward_length", 1), ("context_length", 1),
                          ("attention.head_count", 1), ("attention.head_count_kv", 1), ("attention.key_length", 1),
                          ("attention.value_length", 1), ("vocab_size", 1), ("block_count", 0)):
        key = f"{architecture}.{suffix}"
        if (native or suffix == "block_count") and key in metadata and metadata[key] < least:
            raise refuse(f"{key} is {metadata[key]}; it must be at least {least}")
    _check_layers(gguf, refuse, native)
    if native:
        _check_widths(gguf, refuse)


def _check_layers(gguf: GGUFFile, refuse: Any, native: bool) -> None:
    """A layer count the tensor table bears out: as many `blk.N.` layers as `block_count` says (for a family
    transformers converts, which may keep layers elsewhere: no more layers than the file has tensors, which is what
    would cost memory)."""
    key = f"{gguf.architecture}.block_count"
    if key not in gguf.metadata:
        return
    declared = gguf.metadata[key]
    layers = {int(found.group(1)) for found in map(_LAYER.match, gguf.tensors) if found is not None}
    if declared == len(layers) or (not native and declared <= len(gguf.tensors)):
        return
    held = f"{len(layers)} layers" + (f" (blk.{min(layers)} to blk.{max(layers)})" if layers else "")
    raise refuse(f"{key} is {declared:,}, but the file's tensors hold {held}")


def _check_widths(gguf: GGUFFile, refuse: Any) -> None:
    """Heads that divide the width (unless the file gives the head size), kv heads that divide the heads, and a
    width and query rows that match the tensors."""
    architecture, metadata, tensors = gguf.architecture, gguf.metadata, gguf.tensors
    prefix = architecture + "."
    hidden = metadata[prefix + "embedding_length"]
    heads = metadata[prefix + "attention.head_count"]
    kv_heads = metadata.get(prefix + "attention.head_count_kv", heads)
    key_length = metadata.get(prefix + "attention.key_length")
    embeddings = tensors.get("token_embd.weight")
    if embeddings is not None and len(embeddings.shape) == 2 and embeddings.shape[1] != hidden:
        implied = _shape((embeddings.shape[0], hidden))
        raise refuse(f"{prefix}embedding_length is {hidden}: tensor token_embd.weight is {_shape(embeddings.shape)}, "
                     f"its metadata implies {implied}")
    if key_length is None and hidden % heads:
        raise refuse(f"{prefix}attention.head_count is {heads}, which does not divide {prefix}embedding_length "
                     f"{hidden}")
    head_dim = key_length or hidden // heads
    query = tensors.get("blk.0.attn_q.weight")
    fused = tensors.get("blk.0.attn_qkv.weight")
    rows, wanted, what = None, heads * head_dim, "query rows"
    if query is not None and len(query.shape) == 2:
        rows, name = query.shape[0], "blk.0.attn_q.weight"
    elif fused is not None and len(fused.shape) == 2:
        rows, name, wanted, what = fused.shape[0], "blk.0.attn_qkv.weight", (heads + 2 * kv_heads) * head_dim, \
            "query, key and value rows"
    if rows is not None and rows != wanted:
        raise refuse(f"{prefix}attention.head_count is {heads}: {heads} heads of {head_dim} make {wanted:,} {what}, "
                     f"tensor {name} has {rows:,}")
    if heads % kv_heads:
        raise refuse(f"{prefix}attention.head_count_kv is {kv_heads}, which does not divide "
                     f"{prefix}attention.head_count {heads}")


def _described(value: Any) -> str:
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, (list, tuple)) or hasattr(value, "shape"):
        return f"an array of {len(value):,} items"
    return repr(value)


def _dims(config: Any) -> tuple[int, int, int, int, int, int, int]:
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return hidden, heads, kv_heads, head_dim, int(config.intermediate_size), int(config.vocab_size), \
        int(config.num_hidden_layers)


def expected_tensors(config: Any, architecture: str, tensor_names: set[str]) -> list[Expected]:
    """Every tensor a native-family file of this config holds, in cache order (see the module docstring)."""
    hidden, heads, kv_heads, head_dim, ffn, vocab, layers = _dims(config)
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    family = families.of_architecture(architecture)
    if family is None:  # pragma: no cover - native_reason refuses such a file first
        raise ValueError(f"no family in specdec's table is labelled {architecture!r}")
    permuted = family.permuted_qk
    found: list[Expected] = [Expected("token_embd.weight", (vocab, hidden), "model.embed_tokens", False)]
    for index in range(layers):
        blk, mod = f"blk.{index}.", f"model.layers.{index}."
        attn, mlp = mod + "self_attn.", mod + "mlp."
        found.append(Expected(blk + "attn_norm.weight", (hidden,), mod + "input_layernorm", False))
        if family.fused:
            found.append(Expected(blk + "attn_qkv.weight", (q_rows + 2 * kv_rows, hidden), attn + "qkv_proj", True))
        else:
            found += [Expected(blk + "attn_q.weight", (q_rows, hidden), attn + "q_proj", True,
                               heads if permuted else 0),
                      Expected(blk + "attn_k.weight", (kv_rows, hidden), attn + "k_proj", True,
                               kv_heads if permuted else 0),
                      Expected(blk + "attn_v.weight", (kv_rows, hidden), attn + "v_proj", True)]
        if family.qkv_bias:
            found += [Expected(blk + f"attn_{part}.bias", (rows,), attn + f"{part}_proj", False)
                      for part, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))]
        found.append(Expected(blk + "attn_output.weight", (hidden, q_rows), attn + "o_proj", True))
        if family.qk_norm:
            found += [Expected(blk + "attn_q_norm.weight", (head_dim,), attn + "q_norm", False),
                      Expected(blk + "attn_k_norm.weight", (head_dim,), attn + "k_norm", False)]
        if family.sandwich_norms:
            found += [Expected(blk + "post_attention_norm.weight", (hidden,), mod + "post_attention_layernorm", False),
                      Expected(blk + "ffn_norm.weight", (hidden,), mod + "pre_feedforward_layernorm", False),
                      Expected(blk + "post_ffw_norm.weight", (hidden,), mod + "post_feedforward_layernorm", False)]
        else:
            found.append(Expected(blk + "ffn_norm.weight", (hidden,), mod + "post_attention_layernorm", False))
        if family.fused:
            found.append(Expected(blk + "ffn_up.weight", (2 * ffn, hidden), mlp + "gate_up_proj", True))
        else:
            found += [Expected(blk + "ffn_gate.weight", (ffn, hidden), mlp + "gate_proj", True),
                      Expected(blk + "ffn_up.weight", (ffn, hidden), mlp + "up_proj", True)]
        found.append(Expected(blk + "ffn_down.weight", (hidden, ffn), mlp + "down_proj", True))
    found.append(Expected("output_norm.weight", (hidden,), "model.norm", False))
    if "output.weight" in tensor_names:
        found.append(Expected("output.weight", (vocab, hidden), "lm_head", True))
    if family.rope_factors:  # llama 3's rotary frequency factors (llama.cpp divides the frequencies by them)
        found.append(Expected("rope_freqs.weight", (head_dim // 2,), "rope_freqs", False, optional=True))
    return found


def check_tensors(gguf: GGUFFile, config: Any) -> list[Expected]:
    """The file's tensors against what its metadata implies; returns the expected list (present optional ones
    only). SpecdecError naming the first fault, the file's path first."""
    from .gguf_decode import GGUF_BLOCKS, GGUF_FLOATS

    expected = expected_tensors(config, gguf.architecture, set(gguf.tensors))
    present = [item for item in expected if not (item.optional and item.gguf_name not in gguf.tensors)]
    wanted = {item.gguf_name for item in present}
    for item in present:
        info = gguf.tensors.get(item.gguf_name)
        if info is None:
            raise SpecdecError(f"{gguf.path}: missing tensor {item.gguf_name} (a {gguf.architecture} file of "
                               f"{config.num_hidden_layers} layers holds it)")
        if info.shape != item.shape:
            raise SpecdecError(f"{gguf.path}: tensor {item.gguf_name} is {_shape(info.shape)}, its metadata implies "
                               f"{_shape(item.shape)}")
        if len(item.shape) == 1 and info.type_name not in GGUF_FLOATS:
            raise SpecdecError(f"{gguf.path}: tensor {item.gguf_name} is {info.type_name}; vectors are F32, F16 or "
                               f"BF16 in a GGUF")
        if len(item.shape) == 2 and info.type_name not in GGUF_BLOCKS and info.type_name not in GGUF_FLOATS \
                and not dequantisable(info.type_name):
            raise SpecdecError(f"{gguf.path}: tensor {item.gguf_name} is {info.type_name}, a type specdec cannot "
                               f"read")
    extra = sorted(set(gguf.tensors) - wanted)
    if extra:
        raise SpecdecError(f"{gguf.path}: unexpected tensor {extra[0]} for a {gguf.architecture} model"
                           + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    return present


def dequantisable(type_name: str) -> bool:
    """Whether the gguf package dequantises this type (then a matrix of it is held as float32 rows)."""
    import gguf
    from gguf import quants

    kind = getattr(gguf.GGMLQuantizationType, type_name, None)
    return kind is not None and kind in getattr(quants, "_type_traits", {})


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(size) for size in shape) + "]"


def native_reason(gguf: GGUFFile, config: Optional[Any]) -> Optional[str]:
    """Why the native decoder cannot compute this file in place (None: it can): the family, a row length the
    kernels' blocks do not divide, an activation or rotary type it does not implement."""
    from ..native.native_support import ROPE_TYPES

    if not families.is_native_architecture(gguf.architecture) or config is None:
        return f"{gguf.architecture or 'unlabelled'} is not a family specdec's native decoder computes"
    if not families.is_native(config.model_type):
        return f"{config.model_type} is not a family specdec's native decoder computes"
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if act not in ("silu", "gelu_pytorch_tanh"):
        return f"activation {act}"
    parameters = getattr(config, "rope_parameters", None) or {}
    types = {value.get("rope_type", "default") for value in parameters.values() if isinstance(value, dict)} or \
        {parameters.get("rope_type", "default") if isinstance(parameters, dict) else "default"}
    other = sorted(types - set(ROPE_TYPES))
    if other:
        return f"rope type {other[0]}"
    hidden, heads, kv_heads, head_dim, ffn, vocab, layers = _dims(config)
    for width in (hidden, ffn, heads * head_dim):
        if width % 32:
            return f"rows of {width} weights (the kernels take multiples of 32)"
    return None
