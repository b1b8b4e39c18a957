"""Which models specdec's native decoder (native.py) computes, and the facts of a loaded model it reads to do so.

`unsupported(model)` says in one line why the native decoder cannot run a model (None: it can): a family outside
the table (families.py), a layer that is not on block weights, an activation, layer kind or rotary table it does
not compute (tables that change with the length). The readers of a loaded model's structure (`layer_kinds`,
`rope_of`, `projections`, `activation_of`) are shared with the device engine (device/), whose checks are the same
(`layers_reason`). Not here: computing anything (native.py).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ... import kernels
from .. import families
from .quant import BlockLinear

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")  # fixed tables (no dynamic rescaling)
LAYER_KINDS = ("full_attention", "sliding_attention")


def activation_of(mlp: Any) -> Optional[str]:
    """"silu" or "gelu_tanh" for the MLP's activation module, None for any other: transformers' (ACT2FN's
    SiLUActivation, GELUTanh) or stored.py's, told apart without importing transformers."""
    act = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
    if isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation":
        return "silu"
    gelu = getattr(act, "act", None)
    if type(act).__name__ in ("GELUTanh", "GeluTanh") and isinstance(gelu, functools.partial) and \
            gelu.func is F.gelu and gelu.keywords == {"approximate": "tanh"} and not gelu.args:
        return "gelu_tanh"  # F.gelu(approximate="tanh"), not the Python formula
    return None


def layer_kinds(config: Any) -> list[str]:
    """Each layer's attention kind as the model builds its masks: transformers' `layer_types` where the config has
    them, else a sliding window on every layer where the config sets one (mistral, phi3)."""
    count = int(config.num_hidden_layers)
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return list(kinds)[:count]
    windowed = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    return ["sliding_attention" if windowed else "full_attention"] * count


def rope_of(model: Any, index: int, kind: str) -> Optional[tuple[torch.Tensor, float, str]]:
    """Layer `index`'s (inv_freq, attention scaling, rope type), None for a layer without rotary embedding."""
    config = model.config
    no_rope = getattr(config, "no_rope_layers", None)
    if no_rope is not None and not no_rope[index]:  # smollm3: 0 = NoPE
        return None
    rotary = model.model.rotary_emb
    if isinstance(getattr(rotary, "rope_type", None), dict):  # gemma3: one table per layer kind
        return (getattr(rotary, f"{kind}_inv_freq"), float(getattr(rotary, f"{kind}_attention_scaling")),
                str(rotary.rope_type.get(kind, "default")))
    return rotary.inv_freq, float(getattr(rotary, "attention_scaling", 1.0)), str(getattr(rotary, "rope_type",
                                                                                       "default"))


def dynamic_rope(config: Any, rope_type: str) -> bool:
    """Whether the rotary tables change with the length of the input (then transformers recomputes them)."""
    if rope_type not in ROPE_TYPES:
        return True
    if rope_type == "longrope":  # the long factors take over past the original context
        parameters = getattr(config, "rope_parameters", None) or {}
        original = parameters.get("original_max_position_embeddings") if isinstance(parameters, dict) else None
        return original is not None and int(config.max_position_embeddings) > int(original)
    return False


def projections(layer: Any) -> list[tuple[str, Any]]:
    """A decoder layer's projections by name, attention's then the MLP's (fused where the model fuses them)."""
    attention, mlp = layer.self_attn, layer.mlp
    names: tuple[str, ...] = ("qkv_proj", "o_proj") if hasattr(attention, "qkv_proj") else \
        ("q_proj", "k_proj", "v_proj", "o_proj")
    found = [(name, getattr(attention, name, None)) for name in names]
    names = ("gate_up_proj", "down_proj") if hasattr(mlp, "gate_up_proj") else ("gate_proj", "up_proj", "down_proj")
    return found + [(name, getattr(mlp, name, None)) for name in names]


def layers_reason(model: Any, decoder: str) -> Optional[str]:
    """Why a decoder of the native families (`decoder` names it) cannot take this model's layer kinds and rotary
    tables (None: it can), in one line; native.py's and device/'s checks share it."""
    config = model.config
    kinds = layer_kinds(config)
    other = sorted(set(kinds) - set(LAYER_KINDS))
    if other:
        return f"{other[0]} layers"
    if "sliding_attention" in kinds and not getattr(config, "sliding_window", None):
        return "sliding layers without a window"
    for index in range(len(model.model.layers)):
        try:
            rope = rope_of(model, index, kinds[index])
        except AttributeError:
            return f"layer {index}'s rotary embedding is not one the {decoder} knows"
        if rope is not None and dynamic_rope(config, rope[2]):
            return f"rope type {rope[2]!r} changes with the length"
    return None


def unsupported(model: Any) -> Optional[str]:
    """Why `NativeDecoder` cannot run this model (None: it can), in one line."""
    config = model.config
    if not kernels.available():
        return "specdec's CPU kernels are not compiled"
    if not families.is_native(config.model_type):
        return f"{config.model_type} is not a family the native decoder implements ({families.native_list()})"
    if next(model.parameters()).device.type != "cpu":
        return "the model is not on the CPU"
    reason = layers_reason(model, "native decoder")
    if reason:
        return reason
    for index, layer in enumerate(model.model.layers):
        attention, mlp = layer.self_attn, layer.mlp
        for name, projection in projections(layer):
            if not isinstance(projection, BlockLinear):
                return f"layer {index}'s {name} is not a block layer"
        if getattr(attention.o_proj, "bias", None) is not None or getattr(mlp.down_proj, "bias", None) is not None:
            return "biases on output projections"
        if activation_of(mlp) is None:
            act = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
            return f"activation {type(act).__name__}"
    if not isinstance(model.lm_head, BlockLinear):
        return "the output head is not a block layer"
    return None
