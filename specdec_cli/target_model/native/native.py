"""specdec's own forward on block weights: each decoder layer as a few calls into the CPU kernels.

In a small model's CPU decoding step, transformers' modelling code spends more time in Python and small torch
operations than the block matmuls themselves take (docs/measurements.md has the numbers). `NativeDecoder`
computes what transformers' layers of the native families (families.py) compute, with a few calls per layer into
the CPU kernels (kernels/) on buffers it keeps between forwards, each call's arguments checked and bound once per
row count (bound_steps.py: a step's Python then costs about 12 us a layer, was 33):

- every family: RMSNorm, rotary position embedding in the rotate-half convention, grouped-query attention over
  the KV cache, a gated MLP; q/k/v biases (qwen2);
- per family (`_Layout` reads them off the loaded model, not off its name): QK-norm on each head before the
  rotation (qwen3, gemma3); fused q/k/v and gate/up projections (phi3), and a rotation of only the first part of
  each head (partial rotary); layers without rotary embedding (smollm3's NoPE layers); Gemma's RMSNorm with
  (1 + weight), its embeddings scaled by sqrt(hidden) and GeLU-tanh gating; norms before and after attention and
  MLP (gemma2, gemma3); soft-capped attention scores and final logits (gemma2); per layer kind its own rotary
  base (gemma3's local and global layers) and sliding windows (mistral, phi3, gemma2, gemma3, hybrid qwen2/3).

Every step is computed row by row (norms, rotary), elementwise by one formula wherever an element sits
(activations, soft-capping) or row-invariantly (matmuls, attention over each row's own keys: its window of the
prefix and, in a tree, its ancestors within the window), so a verify block's rows equal one-row forwards bit for
bit, with no padding and no hooks. Each step is one kernel call for all the rows of a block (QK-norm, partial
rotary, GeLU-tanh, soft-capped scores and logits included), so that a block costs little more than a row where
the matmuls allow. Prompts longer than `ROW_INVARIANT_ROWS` take torch's SDPA (or, soft-capped, the eager
formula) for attention, the same for plain and speculative decoding.

It answers the subset of a transformers model's call the engine makes (input ids, positions, a KVCache, a tree
mask or one per layer kind, hidden states, logits_to_keep). Numbers differ from transformers' forward on the
same weights only by rounding (summation order); tests compare them. `decoder_for(model)` returns None, with
the reason in `native_support.unsupported(model)`, for anything else (another family, a dense layer, rope types
that change with the length); such models run transformers' forward.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from ... import kernels
from .. import families
from .bound_steps import bind_cache, bind_matmul, layer_steps
from .kv_cache import native_cache_dtype
from .native_support import activation_of, layer_kinds, rope_of, unsupported
from .quant import BlockLinear
from .row_keys import RowKeys, row_keys, window_keys

ROW_INVARIANT_ROWS = 32  # blocks up to this many rows attend through the row-invariant kernel


@dataclass
class Part:
    """One sequence's block in a forward (`NativeDecoder.many`): its new tokens after its own cache."""

    input_ids: torch.Tensor  # [n]
    position_ids: torch.Tensor  # [n]
    cache: Any  # its KVCache (kv_cache.py): the block's entries are appended to it
    attention_mask: Any = None  # None (causal), or its tree mask [1, 1, n, cached + n] (or one per layer kind)


def decoder_for(model: Any) -> Optional["NativeDecoder"]:
    """A native decoder of the model (a new one: whoever asks keeps it), or None where `unsupported` says why."""
    return NativeDecoder(model) if unsupported(model) is None else None


@dataclass
class _Linear:
    """One block layer as the kernels multiply it: its weight checked once (kernels.BlockMatrix), its bias."""

    matrix: Any  # kernels.BlockMatrix [out, in]
    bias: Optional[torch.Tensor]  # float32 [out] or None

    @staticmethod
    def of(layer: BlockLinear) -> "_Linear":
        from ...kernels import BlockMatrix

        return _Linear(BlockMatrix(layer.kind, layer.records, layer.in_features, layer.out_features), layer.bias)


@dataclass
class _Projections:
    """Linear layers that read the same input, run as one fused matmul where their block kinds agree."""

    kind: int
    records: torch.Tensor  # uint8 [sum of outputs, record bytes]
    width: int  # sum of outputs
    bias: Optional[torch.Tensor]  # float32 [width] or None
    matrix: Any  # kernels.BlockMatrix of the records: [width, in]

    @staticmethod
    def of(*layers: BlockLinear) -> list["_Projections"]:
        from ...kernels import GROUP, BlockMatrix

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
            adjacent = _adjacent(group) if len(group) > 1 else group[0].records
            records = (adjacent if adjacent is not None else torch.cat([layer.records for layer in group])).contiguous()
            start = 0
            for layer in group:  # the layers keep views of the fused records: no second copy of the weights
                layer.records = records[start // GROUP : (start + layer.out_features + GROUP - 1) // GROUP]
                start += layer.out_features
            bias = torch.cat(biases).contiguous() if has_bias else None
            matrix = BlockMatrix(group[0].kind, records, group[0].in_features, start)
            fused.append(_Projections(group[0].kind, records, start, bias, matrix))
        return fused


def _adjacent(layers: list[BlockLinear]) -> Optional[torch.Tensor]:
    """The layers' records as one tensor when they already lie side by side in one storage (a GGUF's blocks cache
    stores q, k, v and gate, up so: gguf_blocks.py), a view with no copy; else None."""
    first = layers[0].records
    storage, offset = first.untyped_storage(), first.storage_offset()
    for layer in layers:
        records = layer.records
        if (records.untyped_storage().data_ptr() != storage.data_ptr() or records.storage_offset() != offset or
                not records.is_contiguous() or records.shape[1] != first.shape[1]):
            return None
        offset += records.numel()
    count = sum(layer.records.shape[0] for layer in layers)
    fused = torch.empty(0, dtype=torch.uint8)
    return fused.set_(storage, first.storage_offset(), (count, first.shape[1]))  # type: ignore[call-overload]


class _Rope:
    """One rotary table: cos/sin [positions, rotated/2] as transformers computes them (position * inv_freq in
    float32, times the attention scaling), grown as positions come."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float):
        self.inv_freq = inv_freq.detach().to(torch.float32)
        self.scaling = scaling
        self.half = int(self.inv_freq.numel())
        self.cos = self.sin = kernels.Dense(torch.empty(0, self.half))  # checked once per table (kernels.Dense)

    def tables(self, positions: int) -> None:
        if self.cos.shape[0] >= positions:
            return
        count = max(positions, 2 * self.cos.shape[0], 512)
        freqs = torch.arange(count, dtype=torch.float32)[:, None] * self.inv_freq[None, :]  # [count, half]
        self.cos = kernels.Dense((freqs.cos() * self.scaling).contiguous())
        self.sin = kernels.Dense((freqs.sin() * self.scaling).contiguous())


def norm_multiplier(norm: Any, plus_one: bool) -> torch.Tensor:
    """What an RMSNorm multiplies by, float32 [dim]: a GGUF's norm holds it (gguf_model's `multiplier`), a
    transformers norm its weight, times which a `plus_one` family (families.py) multiplies by 1 + weight."""
    if getattr(norm, "multiplier", None) is not None:
        return norm.multiplier.detach().to(torch.float32)
    weight = norm.weight.detach().to(torch.float32)
    return 1.0 + weight if plus_one else weight


def _norm_weight(norm: Any, plus_one: bool) -> kernels.Dense:
    return kernels.Dense(norm_multiplier(norm, plus_one).contiguous())  # checked once


def _eps(norm: Any, default: float) -> float:
    return float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or default)


class NativeDecoder:
    """A supported family's forward on block weights (see the module docstring)."""

    native_cache = True  # its forward takes a plain KVCache (kv_cache.new_kv_cache)

    def __init__(self, model: Any):
        kernels.ensure_threads()
        if not kernels.available():
            kernels.set_threads(1)  # raises the one-line "not compiled" error
        config = model.config  # (the model itself is not held: whoever holds the decoder holds the model)
        self.config = config
        self.hidden = int(config.hidden_size)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or self.hidden // self.heads)
        self.ffn = int(config.intermediate_size)
        self.vocab = int(model.lm_head.out_features)
        embed = model.model.embed_tokens
        rows = getattr(embed, "rows", None)  # a GGUF's mapped table (in_place/mapped_embedding.py): rows on demand
        if rows is None:
            table = embed.weight.detach()  # [vocab, hidden]
            if table.dtype != torch.float32:
                raise ValueError("the native decoder computes in float32")
            rows = functools.partial(torch.index_select, table, 0)
        self.embedding_rows = rows  # ids [n] -> float32 [n, hidden], unscaled
        self.cache_dtype = native_cache_dtype()  # the KV cache's (SPECDEC_KV_CACHE: float32 by default)
        scale = getattr(embed, "embed_scale", None)  # gemma: sqrt(hidden), as a float32 scalar tensor
        self.embed_scale = None if scale is None else torch.as_tensor(scale).detach().to(torch.float32)
        offset = families.norm_plus_one(config.model_type)  # RMSNorm times (1 + weight)
        self.eps = float(getattr(config, "rms_norm_eps", 1e-6))
        self.attn_cap = getattr(config, "attn_logit_softcapping", None)
        self.final_cap = getattr(config, "final_logit_softcapping", None)
        ropes: dict[tuple[int, float], _Rope] = {}  # one table per distinct inv_freq (gemma3: local, global)
        kinds = layer_kinds(config)
        self.layers = []
        for index, layer in enumerate(model.model.layers):
            attention, mlp = layer.self_attn, layer.mlp
            if hasattr(attention, "qkv_proj"):  # phi3: q, k and v as one layer
                qkv = _Projections.of(attention.qkv_proj)
            else:
                qkv = _Projections.of(attention.q_proj, attention.k_proj, attention.v_proj)
            gate_up = _Projections.of(mlp.gate_up_proj) if hasattr(mlp, "gate_up_proj") else \
                _Projections.of(mlp.gate_proj, mlp.up_proj)
            rope = None
            found = rope_of(model, index, kinds[index])
            if found is not None:
                key = (found[0].data_ptr(), found[1])
                rope = ropes.setdefault(key, _Rope(found[0], found[1]))
            sandwich = hasattr(layer, "pre_feedforward_layernorm")  # gemma2, gemma3: norms around both halves
            q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
            self.layers.append(SimpleNamespace(
                attn_norm=_norm_weight(layer.input_layernorm, offset),
                attn_eps=_eps(layer.input_layernorm, self.eps),
                qkv=qkv,
                q_norm=None if q_norm is None else _norm_weight(q_norm, offset),
                k_norm=None if k_norm is None else _norm_weight(k_norm, offset),
                qk_eps=self.eps if q_norm is None else _eps(q_norm, self.eps),
                rope=rope,
                kind=kinds[index],
                scaling=float(attention.scaling),
                out=_Linear.of(attention.o_proj),
                post_attn_norm=_norm_weight(layer.post_attention_layernorm, offset) if sandwich else None,
                mlp_norm=_norm_weight(layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm,
                                      offset),
                mlp_eps=_eps(layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm,
                             self.eps),
                gate_up=gate_up,
                act=activation_of(mlp),
                down=_Linear.of(mlp.down_proj),
                post_mlp_norm=_norm_weight(layer.post_feedforward_layernorm, offset) if sandwich else None,
            ))
        self.ropes = list(ropes.values())
        self.kinds = sorted(set(kinds))
        self.final_norm = _norm_weight(model.model.norm, offset)
        self.final_eps = _eps(model.model.norm, self.eps)
        self.head = _Linear.of(model.lm_head)
        self._scratch: dict[str, torch.Tensor] = {}
        self._checked: dict[tuple[str, int], kernels.Rows] = {}  # (buffer, rows) -> its first rows, checked
        self._bound: dict[int, tuple] = {}  # rows -> the buffers and each layer's calls on them (bound_steps.py)

    def distinct_layers(self) -> "NativeDecoder":
        """A decoder sharing this one's weights and head that runs only the first layer of each distinct
        signature (kernel kinds and shapes of its matrices, attention kind, the steps it takes), in order: what the
        end-to-end row-invariance check needs to run. A row's result at each kernel depends only on that row's
        inputs and the kernel path its kind, shape and row count choose, so two layers of one signature are
        row-invariant together or not at all (an 8B file's 32 layers are 2 or 3 signatures)."""
        def linear(part: Any) -> tuple:
            return part.matrix.kind, part.matrix.n, part.matrix.k, part.bias is not None

        first: dict[tuple, int] = {}
        for index, layer in enumerate(self.layers):
            signature = (layer.kind, tuple(map(linear, layer.qkv)), linear(layer.out),
                         tuple(map(linear, layer.gate_up)), linear(layer.down), layer.q_norm is not None,
                         layer.rope is not None, layer.post_attn_norm is not None, layer.act)
            first.setdefault(signature, index)
        twin = copy.copy(self)
        twin.layers = [self.layers[index] for index in sorted(first.values())]
        twin._scratch, twin._checked, twin._bound = {}, {}, {}
        return twin

    # -- buffers ----------------------------------------------------------------------------------------------

    def _rows(self, name: str, rows: int, width: int, keep: bool = True) -> kernels.Rows:
        """The float32 scratch buffer `name`'s first `rows` rows [rows, width], kept between forwards (grown, never
        shrunk) and checked once per row count (kernels.Rows: the kernels then compare integers at each call); not
        `keep`: a buffer of its own, freed with the forward (a whole prompt's, for training or scoring)."""
        if not keep:
            return kernels.Rows(torch.empty(rows, width, dtype=torch.float32))
        checked = self._checked.get((name, rows))
        if checked is not None:
            return checked
        held = self._scratch.get(name)
        if held is None or held.shape[0] < rows or held.shape[1] != width:
            held = self._scratch[name] = torch.empty(max(rows, 16), width, dtype=torch.float32)
            self._checked = {key: value for key, value in self._checked.items() if key[0] != name}
            self._bound.clear()  # calls bound to the buffer made before
        checked = self._checked[(name, rows)] = kernels.Rows(held[:rows])
        return checked

    def _windows(self) -> dict[str, Optional[int]]:
        """The window of each layer kind, read from the config at each forward (the tree self-check shortens it for
        the while)."""
        return {"full_attention": None, "sliding_attention": int(getattr(self.config, "sliding_window", 0) or 0)}

    def _keys_by_kind(self, attention_mask: Any, rows: int, past: int) -> dict[str, RowKeys]:
        """Per layer kind, each row's keys: from the tree mask (one, or one per kind), else causal (and windowed)."""
        keys, windows = {}, self._windows()
        for kind in self.kinds:
            mask = attention_mask.get(kind) if isinstance(attention_mask, dict) else attention_mask
            if mask is not None and mask.dtype != torch.bool:  # an additive (eager) mask
                mask = mask == 0
            window = windows[kind]
            if mask is None and window:
                keys[kind] = window_keys(rows, past, window)
            else:
                keys[kind] = row_keys(mask, rows, past + rows)
        return keys

    # -- the forward -------------------------------------------------------------------------------------------

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, past_key_values: Any,
                 attention_mask: Any = None, output_hidden_states: bool = False,
                 logits_to_keep: int = 0, use_cache: bool = True, hidden_layers: Sequence[int] = (),
                 **unused: Any) -> SimpleNamespace:
        """input_ids, position_ids [1, n]; past_key_values a KVCache (kv_cache.py); attention_mask None (causal)
        or a boolean tree mask [1, 1, n, cached + n] (or a dict of them by layer kind). Returns .logits
        [1, n or logits_to_keep, vocab] and, with output_hidden_states, .hidden_states[-1] = the final normed
        states [1, n, hidden] and .hidden_states[i] = the residual stream entering layer i [1, n, hidden] for each
        i of `hidden_layers` (transformers' places; the others None)."""
        rows = int(input_ids.shape[1])
        keep = rows if not logits_to_keep else min(int(logits_to_keep), rows)
        part = Part(input_ids[0], position_ids[0], past_key_values, attention_mask)
        captured: dict[int, torch.Tensor] = {layer: torch.empty(0) for layer in hidden_layers}
        logits, final = self._forward([part], [keep], captured)
        hidden_states = None
        if output_hidden_states:
            states: list[Optional[torch.Tensor]] = [None] * len(self.layers) + [final.unsqueeze(0)]
            for layer, state in captured.items():
                states[layer] = state.unsqueeze(0)
            hidden_states = tuple(states)
        return SimpleNamespace(logits=logits.unsqueeze(0), hidden_states=hidden_states)

    def many(self, parts: "list[Part]", keep: Optional[Sequence[int]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over several sequences' blocks, each after its own cache: the logits of each part's last
        `keep[i]` rows (default: all its rows) [sum of keep, vocab], parts in order, and every row's final normed
        states [n, hidden]. Each part's rows attend over its own cache only, and every other step is row-invariant,
        so a part's rows are the bits a forward of that part alone computes (tests/specdec_cli/decoding/
        test_plain_many.py). Blocks up to ROW_INVARIANT_ROWS rows in all; a longer prompt is computed alone
        (`__call__`)."""
        sizes = [int(part.input_ids.shape[0]) for part in parts]
        if sum(sizes) > ROW_INVARIANT_ROWS:
            raise ValueError(f"a forward over several sequences takes at most {ROW_INVARIANT_ROWS} rows in all")
        if keep is not None and (len(keep) != len(parts) or any(not 0 <= k <= n for k, n in zip(keep, sizes))):
            raise ValueError("keep needs one count per part, each within its part's rows")
        return self._forward(parts, list(sizes if keep is None else keep))

    def _forward(self, parts: "list[Part]", keep: list[int],
                 captured: Optional[dict[int, torch.Tensor]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer loop over every part's rows: logits of each part's last `keep[i]` rows and the final states;
        `captured`'s keys name layers whose entering residual stream [n, hidden] is copied into it."""
        sizes = [int(part.input_ids.shape[0]) for part in parts]
        rows = sum(sizes)
        ranges = [(sum(sizes[:index]), sum(sizes[: index + 1])) for index in range(len(parts))]
        ids = parts[0].input_ids if len(parts) == 1 else torch.cat([part.input_ids for part in parts])  # [n]
        position_ids = parts[0].position_ids if len(parts) == 1 else torch.cat([part.position_ids for part in parts])
        positions = kernels.Dense(position_ids.to(torch.int32).contiguous(), torch.int32)  # [n]
        for rope in self.ropes:
            rope.tables(int(positions.tensor.max()) + 1)
        x = self.embedding_rows(ids).contiguous()  # [n, hidden]
        if self.embed_scale is not None:
            x.mul_(self.embed_scale)
        buffers, steps = layer_steps(self, rows, keep=rows <= ROW_INVARIANT_ROWS)  # each layer's calls bound once
        residual, qkv, q_part, new_keys = buffers.residual, buffers.qkv, buffers.q_part, buffers.new_keys
        residual.tensor.copy_(x)  # [n, hidden], the residual stream
        pasts = [part.cache.get_seq_length() for part in parts]
        keys_by_part: list[Optional[dict[str, RowKeys]]] = [None]  # per part, each layer kind's keys per row
        if rows <= ROW_INVARIANT_ROWS:
            keys_by_part = [self._keys_by_kind(part.attention_mask, size, past)
                            for part, size, past in zip(parts, sizes, pasts)]
        elif parts[0].attention_mask is not None or pasts[0]:
            raise ValueError("the native decoder's long forwards are prompts on an empty cache")
        rotate = {id(rope): kernels.bind_rope(qkv, self.heads + self.kv_heads, self.head_dim, positions, rope.cos,
                                              rope.sin) for rope in self.ropes}  # q's and k's heads, each row
        for index, (layer, step) in enumerate(zip(self.layers, steps)):
            if captured and index in captured:
                captured[index] = residual.tensor.clone()  # [n, hidden], the state entering this layer
            step.attn_norm()  # h = norm(residual)
            step.qkv()  # qkv = h @ [q | k | v] (+ biases)
            if layer.q_norm is not None:  # QK-norm: each head of q and k over its head_dim, every row in one call
                kernels.rms_norm_heads(q_part, self.head_dim, layer.q_norm, layer.qk_eps)
                kernels.rms_norm_heads(new_keys, self.head_dim, layer.k_norm, layer.qk_eps)
            if layer.rope is not None:  # the rotary embedding of q's and k's heads, side by side in each row
                rotate[id(layer.rope)]()
            attending = []  # (bound call, key positions, first row) of each part: several in one call of the kernels
            for part, (first, stop), past, keys_by_kind in zip(parts, ranges, pasts, keys_by_part):
                cache = part.cache.native_layer(index, self.kv_heads, self.head_dim, stop - first, self.cache_dtype)
                calls = bind_cache(self, step, buffers, layer, cache)  # bound once per cache
                calls.store_keys(past, first, stop - first)  # the part's keys and values at positions past ..
                calls.store_values(past, first, stop - first)  # past + n - 1
                cache.advance(stop - first)
                if keys_by_kind is None:  # a prompt: torch's attention over the whole causal block
                    self._prompt_attention(qkv.tensor, cache.key_buffer, cache.value_buffer, rows, layer,
                                           self._windows()[layer.kind], buffers.attended.tensor)
                else:  # soft-capped scores (gemma2) in the kernel too
                    attending.append((calls.attend, keys_by_kind[layer.kind].positions, first))
            if len(attending) == 1:
                attending[0][0](attending[0][1], attending[0][2])  # attended = each row over its own keys
            elif attending:
                kernels.attention_many(attending)  # each part's rows as they are alone, in one call
            step.attn_out()  # residual += attended @ o (gemma2/3: its post-norm first)
            step.mlp_norm()  # h = norm(residual)
            step.gate_up()  # gate_up = h @ [gate | up]
            step.act()  # act = SiLU or GeLU-tanh(gate) * up
            step.down()  # residual += act @ down (gemma2/3: its post-norm first)
        final = kernels.rms_norm(residual, self.final_norm, self.final_eps)  # [n, hidden]
        if keep == sizes:
            read = final  # every row's logits
        elif len(parts) == 1:
            read = final[rows - keep[0] :]
        else:  # each part's last rows, gathered (row-invariant: a row's logits are the same bits read alone)
            read = final[torch.cat([torch.arange(stop - kept, stop) for (_, stop), kept in zip(ranges, keep)])]
        logits = torch.empty(int(read.shape[0]), self.vocab, dtype=torch.float32)  # [kept rows, vocab]
        if read.shape[0]:
            bind_matmul(kernels.Rows(read.contiguous()), self.head, kernels.Rows(logits))()
        if self.final_cap is not None:  # gemma2: cap * tanh(logits / cap), every element by one formula
            kernels.soft_cap_(logits, float(self.final_cap))
        return logits, final  # [keep, vocab], [n, hidden]

    # -- steps ----------------------------------------------------------------------------------------------------

    def _prompt_attention(self, qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rows: int, layer: Any,
                          window: Optional[int], out: torch.Tensor) -> None:
        """A prompt's attention on an empty cache, causal (and windowed): SDPA, or the eager formula soft-capped."""
        q_width = self.heads * self.head_dim
        query = qkv[:, :q_width].view(1, rows, self.heads, self.head_dim).transpose(1, 2)  # [1, heads, n, d]
        block_keys, block_values = keys[:, :, :rows].float(), values[:, :, :rows].float()  # as the steps read them
        mask = None
        if window or self.attn_cap is not None:
            position = torch.arange(rows)
            mask = position[None, :] <= position[:, None]  # [n, n]
            if window:
                mask &= position[None, :] > position[:, None] - window
        if self.attn_cap is None:
            result = F.scaled_dot_product_attention(query, block_keys, block_values, attn_mask=mask,
                                                    is_causal=mask is None, scale=layer.scaling,
                                                    enable_gqa=self.heads != self.kv_heads)  # [1, heads, n, d]
        else:
            group, cap = self.heads // self.kv_heads, float(self.attn_cap)
            expanded_keys = block_keys.repeat_interleave(group, dim=1)  # [1, heads, n, d]
            expanded_values = block_values.repeat_interleave(group, dim=1)
            scores = torch.matmul(query, expanded_keys.transpose(2, 3)) * layer.scaling  # [1, heads, n, n]
            scores = torch.tanh(scores / cap) * cap
            if mask is not None:
                scores = scores.masked_fill(~mask, -math.inf)
            result = torch.matmul(torch.softmax(scores, dim=-1), expanded_values)
        out.copy_(result[0].transpose(0, 1).reshape(rows, q_width))
