"""Where an EAGLE-style head's training starts: at random, or from the target's own last decoder layer.

A head (drafters/eagle_head.py) is one pre-norm decoder block, shaped like one of the target's. Started from a copy
of the target's last block (`--head-init layer`), it begins with attention and MLP weights that already read the
target's hidden states, and learns faster from little data: on the real Qwen2.5-Coder-0.5B, after 300 steps on 42 k
tokens, held-out top-1 36.4% against 28.8% from a random start. On the pipeline's 229 k tokens it ends level with the
default random start (55.5% against 54.2%, no faster in the bench) in 1.7x the training time, its MLP being the
target's whole width: so random stays the default (docs/measurements.md). The copy, for a block in the Llama layout
(q, k, v, o; gate, up, down; two RMS norms; SiLU):

- the norms' multipliers (families.norm_plus_one: 1 + weight where the family's norms multiply so);
- q, o as they are; k and v repeated to every query head they serve (the head has no grouped keys);
- gate, up and down whole: a head started so has the target's MLP width (a narrower head of the neurons with
  the largest |down column| x |up row| started worse than a random one: 25.7% against 28.1% after 300 steps);
- the fusing map as [I | I]: the token's embedding plus the feature, the block's input as a sum of both.

Not copied: the target's q/k/v biases (Qwen2's; the head has none) and any part a block of another layout has
(QK norms, extra norms), nor a head of another MLP width: such a head starts at random, and the training report
says which start it had. This module only sets weights; training is eagle_train.py's.
"""

from __future__ import annotations

from typing import Any, Optional

INITS = ("layer", "random")
COPIED = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_COPIED = ("gate_proj", "up_proj", "down_proj")
UNCOPIED = ("q_norm", "k_norm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def dense_weight(linear: Any) -> Any:
    """A linear layer's weight [out, in] in float32: a block layer's unpacked (not kept on it), else its own."""
    from ..target_model.native.quant import BlockLinear

    if isinstance(linear, BlockLinear):
        return linear.blocks().dense().float()
    return linear.weight.detach().float()


def copyable_layer(target: Any) -> Optional[Any]:
    """The target's last decoder layer if a head can start from it (the Llama layout, SiLU gating), else None."""
    layers = getattr(getattr(target, "model", None), "layers", None)
    if not layers:
        return None
    layer = layers[-1]
    attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attention is None or mlp is None or getattr(target.config, "hidden_act", "silu") != "silu":
        return None
    if not all(hasattr(attention, name) for name in COPIED) or not all(hasattr(mlp, name) for name in MLP_COPIED):
        return None
    if any(hasattr(layer, name) or hasattr(attention, name) for name in UNCOPIED):
        return None
    if not (hasattr(layer, "input_layernorm") and hasattr(layer, "post_attention_layernorm")):
        return None
    return layer


def start_from_layer(head: Any, target: Any) -> bool:
    """Set `head`'s weights from the target's last layer (the module docstring's copy); False (the head left as it
    was) where that layer is not one a head can start from or its shapes differ from the head's."""
    import torch

    from ..target_model import families
    from ..target_model.native.native import norm_multiplier

    layer = copyable_layer(target)
    if layer is None:
        return False
    config, size = target.config, head.config.hidden_size
    heads = head.config.num_heads
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    dim = size // heads
    attention, mlp = layer.self_attn, layer.mlp
    query, key, value, out = (dense_weight(getattr(attention, name)) for name in COPIED)
    if query.shape != (size, size) or key.shape != (kv_heads * dim, size) or heads % kv_heads:
        return False
    key, value = (part.view(kv_heads, dim, size).repeat_interleave(heads // kv_heads, dim=0).reshape(size, size)
                  for part in (key, value))  # [H, H]: each query head's keys and values
    if head.down.weight.shape[1] != int(mlp.gate_proj.out_features):
        return False  # (a narrower MLP of the most important neurons started worse than a random one)
    gate, up, down = (dense_weight(getattr(mlp, name)) for name in MLP_COPIED)  # [F, H], [F, H], [H, F]
    plus_one = families.norm_plus_one(getattr(config, "model_type", ""))
    eye = torch.eye(size)
    with torch.no_grad():
        head.fuse.weight.copy_(torch.cat([eye, eye], dim=1))  # [H, 2H]: embedding + feature
        head.attention_norm.weight.copy_(norm_multiplier(layer.input_layernorm, plus_one))
        head.qkv.weight.copy_(torch.cat([query, key, value]))  # [3H, H]
        head.out.weight.copy_(out)
        head.mlp_norm.weight.copy_(norm_multiplier(layer.post_attention_layernorm, plus_one))
        head.gate_up.weight.copy_(torch.cat([gate, up]))  # [2F, H]: gate first (EagleHead.forward)
        head.down.weight.copy_(down)
    return True
