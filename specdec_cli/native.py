"""specdec's own forward for Llama-style models on block weights: each layer as ten calls into the CPU kernels.

On a 2-core CPU, transformers' modelling code spends ~30 ms a token in Python and small torch operations for
SmolLM2-135M's 30 layers, three times what the block matmuls themselves cost. `NativeDecoder` computes what
transformers' Llama, Mistral and Qwen2 layers compute (RMSNorm, rotary position embedding in the rotate-half
convention, grouped-query attention, SiLU-gated MLP, q/k/v biases) with a few calls per layer into
kernels/_cpu.c on buffers it keeps between forwards. Every step is computed row by row (norms, rotary, SiLU) or
row-invariantly (matmuls, attention over each row's own keys), so a verify block's rows equal one-row forwards
bit for bit, with no padding and no hooks. Prompts longer than `ROW_INVARIANT_ROWS` take torch's SDPA for
attention, the same for plain and speculative decoding.

It answers the subset of a transformers model's call the engine makes (input ids, positions, a KVCache, a tree
mask, hidden states, logits_to_keep). Numbers differ from transformers' forward on the same weights only by
rounding (summation order); tests compare them. `decoder_for(model)` returns None, with the reason in
`unsupported(model)`, for anything else (another family, a dense layer, rope types that change with the
length, sliding windows shorter than the context); such models run transformers' forward.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional

import torch

from .exact import _row_keys
from .quant import BlockLinear

FAMILIES = ("llama", "mistral", "qwen2")
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")  # fixed tables (no dynamic rescaling)
ROW_INVARIANT_ROWS = 32  # blocks up to this many rows attend through the row-invariant kernel
_decoders: "weakref.WeakKeyDictionary[Any, NativeDecoder]" = weakref.WeakKeyDictionary()  # one per model


def unsupported(model: Any) -> Optional[str]:
    """Why `NativeDecoder` cannot run this model (None: it can)."""
    from . import kernels

    config = model.config
    if not kernels.available():
        return "specdec's CPU kernels are not compiled"
    if config.model_type not in FAMILIES:
        return f"{config.model_type} is not a family the native decoder implements ({', '.join(FAMILIES)})"
    if next(model.parameters()).device.type != "cpu":
        return "the model is not on the CPU"
    rope = getattr(model.model, "rotary_emb", None)
    if rope is None or getattr(rope, "rope_type", "default") not in ROPE_TYPES:
        return f"rope type {getattr(rope, 'rope_type', None)!r} changes with the length"
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    if window is not None and window < int(getattr(config, "max_position_embeddings", 0) or 0):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act}"
    for index, layer in enumerate(model.model.layers):
        attention, mlp = layer.self_attn, layer.mlp
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not isinstance(getattr(attention, name, None), BlockLinear):
                return f"layer {index}'s {name} is not a block layer"
        for name in ("gate_proj", "up_proj", "down_proj"):
            if not isinstance(getattr(mlp, name, None), BlockLinear):
                return f"layer {index}'s {name} is not a block layer"
        if getattr(attention.o_proj, "bias", None) is not None or getattr(mlp.down_proj, "bias", None) is not None:
            return "biases on output projections"
    if not isinstance(model.lm_head, BlockLinear):
        return "the output head is not a block layer"
    return None


def decoder_for(model: Any) -> Optional["NativeDecoder"]:
    """The model's native decoder (made once per model, dropped with it), or None where `unsupported` says why."""
    decoder = _decoders.get(model)
    if decoder is None and unsupported(model) is None:
        decoder = _decoders[model] = NativeDecoder(model)
    return decoder


@dataclass
class _Projections:
    """Linear layers that read the same input, run as one fused matmul where their block kinds agree."""

    kind: int
    records: torch.Tensor  # uint8 [sum of outputs, record bytes]
    width: int  # sum of outputs
    bias: Optional[torch.Tensor]  # float32 [width] or None

    @staticmethod
    def of(*layers: BlockLinear) -> list["_Projections"]:
        from .kernels import GROUP

        groups: list[list[BlockLinear]] = []
        for layer in layers:  # records hold GROUP outputs each: a layer joins one that ends on a whole record
            if groups and groups[-1][0].kind == layer.kind and groups[-1][-1].out_features % GROUP == 0:
                groups[-1].append(layer)
            else:
                groups.append([layer])
        fused = []
        for group in groups:
            biases = [layer.bias if layer.bias is not None else torch.zeros(layer.out_features) for layer in group]
            has_bias = any(layer.bias is not None for layer in group)
            records = torch.cat([layer.records for layer in group]).contiguous()
            start = 0
            for layer in group:  # the layers keep views of the fused records: no second copy of the weights
                layer.records = records[start // GROUP : (start + layer.out_features + GROUP - 1) // GROUP]
                start += layer.out_features
            bias = torch.cat(biases).contiguous() if has_bias else None
            fused.append(_Projections(group[0].kind, records, start, bias))
        return fused


class NativeDecoder:
    """A Llama-style model's forward on block weights (see the module docstring)."""

    def __init__(self, model: Any):
        from . import kernels

        kernels.ensure_threads()
        self._cpu = kernels._require()
        config = model.config  # (the model itself is not held: its decoder lives as long as it does)
        self.config = config
        self.hidden = int(config.hidden_size)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or self.hidden // self.heads)
        self.ffn = int(config.intermediate_size)
        self.vocab = int(model.lm_head.out_features)
        self.embeddings = model.model.embed_tokens.weight.detach()  # [vocab, hidden]
        if self.embeddings.dtype != torch.float32:
            raise ValueError("the native decoder computes in float32")
        self.eps = float(getattr(config, "rms_norm_eps", 1e-6))
        self.scaling = float(model.model.layers[0].self_attn.scaling)
        self.layers = []
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            self.layers.append(SimpleNamespace(
                attn_norm=layer.input_layernorm.weight.detach().contiguous(),
                qkv=_Projections.of(attention.q_proj, attention.k_proj, attention.v_proj),
                out=attention.o_proj,
                mlp_norm=layer.post_attention_layernorm.weight.detach().contiguous(),
                gate_up=_Projections.of(mlp.gate_proj, mlp.up_proj),
                down=mlp.down_proj,
            ))
        self.final_norm = model.model.norm.weight.detach().contiguous()
        self.head = model.lm_head
        rope = model.model.rotary_emb
        self.inv_freq = rope.inv_freq.detach().to(torch.float32)
        self.rope_scaling = float(getattr(rope, "attention_scaling", 1.0))
        self.cos = self.sin = torch.empty(0, self.head_dim // 2)
        self._scratch: dict[str, torch.Tensor] = {}

    # -- buffers ----------------------------------------------------------------------------------------------

    def _buffer(self, name: str, rows: int, width: int) -> torch.Tensor:
        """A float32 [rows, width] scratch buffer kept between forwards (grown, never shrunk)."""
        held = self._scratch.get(name)
        if held is None or held.shape[0] < rows or held.shape[1] != width:
            held = torch.empty(max(rows, 16), width, dtype=torch.float32)
            self._scratch[name] = held
        return held[:rows]

    def _rope_tables(self, positions: int) -> None:
        """cos/sin [positions, head_dim/2] as transformers computes them (position * inv_freq in float32)."""
        if self.cos.shape[0] >= positions:
            return
        count = max(positions, 2 * self.cos.shape[0], 512)
        freqs = torch.arange(count, dtype=torch.float32)[:, None] * self.inv_freq[None, :]  # [count, half]
        self.cos = (freqs.cos() * self.rope_scaling).contiguous()
        self.sin = (freqs.sin() * self.rope_scaling).contiguous()

    # -- the forward -------------------------------------------------------------------------------------------

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, past_key_values: Any,
                 attention_mask: Optional[torch.Tensor] = None, output_hidden_states: bool = False,
                 logits_to_keep: int = 0, use_cache: bool = True, **unused: Any) -> SimpleNamespace:
        """input_ids, position_ids [1, n]; past_key_values a KVCache (kv_cache.py); attention_mask None (causal)
        or a boolean tree mask [1, 1, n, cached + n]. Returns .logits [1, n or logits_to_keep, vocab] and, with
        output_hidden_states, .hidden_states[-1] = the final normed states [1, n, hidden]."""
        cpu = self._cpu
        rows = int(input_ids.shape[1])
        positions = position_ids[0].to(torch.int32).contiguous()  # [n]
        self._rope_tables(int(positions.max()) + 1)
        x = self.embeddings.index_select(0, input_ids[0]).contiguous()  # [n, hidden], the residual stream
        h = self._buffer("normed", rows, self.hidden)
        qkv_width = (self.heads + 2 * self.kv_heads) * self.head_dim
        qkv = self._buffer("qkv", rows, qkv_width)
        attended = self._buffer("attended", rows, self.heads * self.head_dim)
        gate_up = self._buffer("gate_up", rows, 2 * self.ffn)
        act = self._buffer("act", rows, self.ffn)
        past = past_key_values.get_seq_length()
        row_keys = None
        if rows <= ROW_INVARIANT_ROWS:
            if attention_mask is not None and attention_mask.dtype != torch.bool:  # an additive (eager) mask
                attention_mask = attention_mask == 0
            row_keys = _row_keys(attention_mask, rows, past + rows)
        elif attention_mask is not None or past:
            raise ValueError("the native decoder's long forwards are prompts on an empty cache")
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for index, layer in enumerate(self.layers):
            cpu.rms_norm(x.data_ptr(), rows, self.hidden, self.hidden, layer.attn_norm.data_ptr(), self.eps,
                         h.data_ptr(), self.hidden)
            self._project(h, layer.qkv, qkv)
            cpu.rope(qkv.data_ptr(), rows, qkv_width, self.heads + self.kv_heads, self.head_dim, positions.data_ptr(),
                     self.cos.data_ptr(), self.sin.data_ptr())
            cache = past_key_values.native_layer(index, self.kv_heads, self.head_dim, rows)
            keys, values = cache.key_buffer, cache.value_buffer  # [1, kv_heads, capacity, head_dim]
            for buffer, offset in ((keys, q_width), (values, q_width + kv_width)):
                cpu.store_rows(qkv.data_ptr() + 4 * offset, rows, qkv_width, self.kv_heads, self.head_dim,
                               buffer.data_ptr(), buffer.stride(1), buffer.stride(2), past)
            cache.advance(rows)
            if row_keys is not None:
                query = qkv[:, :q_width].view(rows, self.heads, self.head_dim)
                cpu.attention(rows, self.heads, self.kv_heads, self.head_dim, query.data_ptr(), query.stride(0),
                              query.stride(1), keys.data_ptr(), values.data_ptr(), False, keys.stride(1),
                              keys.stride(2), values.stride(1), values.stride(2),
                              *(array.data_ptr() for array in row_keys.arrays), self.scaling, attended.data_ptr(),
                              q_width, self.head_dim)
            else:  # a prompt: torch's SDPA over the whole causal block
                query = qkv[:, :q_width].view(1, rows, self.heads, self.head_dim).transpose(1, 2)
                out = torch.nn.functional.scaled_dot_product_attention(
                    query, keys[:, :, :rows], values[:, :, :rows], is_causal=True, scale=self.scaling,
                    enable_gqa=self.heads != self.kv_heads)  # [1, heads, n, head_dim]
                attended.copy_(out[0].transpose(0, 1).reshape(rows, q_width))
            self._matmul(attended, layer.out, x, accumulate=True)  # x += attended @ o_proj
            cpu.rms_norm(x.data_ptr(), rows, self.hidden, self.hidden, layer.mlp_norm.data_ptr(), self.eps,
                         h.data_ptr(), self.hidden)
            self._project(h, layer.gate_up, gate_up)
            cpu.silu_mul(gate_up.data_ptr(), rows, self.ffn, act.data_ptr())
            self._matmul(act, layer.down, x, accumulate=True)  # x += act @ down_proj
        final = torch.empty(rows, self.hidden, dtype=torch.float32)
        cpu.rms_norm(x.data_ptr(), rows, self.hidden, self.hidden, self.final_norm.data_ptr(), self.eps,
                     final.data_ptr(), self.hidden)
        keep = rows if not logits_to_keep else min(int(logits_to_keep), rows)
        logits = torch.empty(keep, self.vocab, dtype=torch.float32)
        self._matmul(final[rows - keep :], self.head, logits)
        hidden_states = (final.unsqueeze(0),) if output_hidden_states else None
        return SimpleNamespace(logits=logits.unsqueeze(0), hidden_states=hidden_states)

    def _matmul(self, source: torch.Tensor, layer: BlockLinear, out: torch.Tensor, accumulate: bool = False) -> None:
        """out (+)= source @ layer's weight, both float32 and contiguous."""
        self._cpu.matmul(layer.kind, source.data_ptr(), source.shape[0], layer.in_features, layer.out_features,
                         layer.records.data_ptr(), out.data_ptr(), out.stride(0), accumulate)
        if layer.bias is not None:
            out += layer.bias

    def _project(self, source: torch.Tensor, groups: list[_Projections], out: torch.Tensor) -> None:
        """out[:, :] = source @ the fused projections, side by side."""
        column = 0
        for group in groups:
            self._cpu.matmul(group.kind, source.data_ptr(), source.shape[0], source.shape[1], group.width,
                             group.records.data_ptr(), out.data_ptr() + 4 * column, out.stride(0), False)
            if group.bias is not None:
                out[:, column : column + group.width] += group.bias
            column += group.width
