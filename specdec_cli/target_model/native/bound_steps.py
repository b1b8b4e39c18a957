"""A native forward's scratch buffers, and each layer's kernel calls bound to them once per row count.

A decoding step makes some 300 kernel calls (native.py's layer loop). Called through the checked facade
(kernels/__init__.py) each re-checks its tensors, a few microseconds apiece; bound here (`kernels.bind_*`), each
is checked once when a row count's buffers are first used and then called with its arguments as they are: the
norms, the fused projections with their biases, the residual products (with gemma's post-norms), the activation,
and, bound again whenever a layer's cache buffers are new or grown (`bind_cache`: known by weak references, so no
cache is kept alive), storing the block's keys and values and the attention. The calls are the same kernels with
the same arguments as unbound, so every answer is the same bits. Not here: the forward itself (native.py), which
keeps the buffers (`NativeDecoder._rows`) and drops these bindings whenever it makes a buffer again.
"""

from __future__ import annotations

import functools
import weakref
from types import SimpleNamespace
from typing import Any, Callable, Optional

from ... import kernels

# Every row count a step or a prompt block uses (up to native.ROW_INVARIANT_ROWS) stays bound: binding a count's calls
# costs a forward's third on the default model (~1.5 ms), and with 8 counts kept, a run's prompt tails, probes and
# steps evicted each other (a probe of 2 or 3 rows was timed binding). A longer forward, a whole prompt's for training
# or scoring, binds its own buffers for itself alone and keeps neither.
BOUND_CACHES = 64  # per layer and row count, the caches whose calls are kept bound (the oldest out first)


def buffers_of(decoder: Any, rows: int, keep: bool = True) -> SimpleNamespace:
    """The scratch buffers of an n-row forward (NativeDecoder._rows: kept, or with `keep` False its own), and the
    views of them the steps read."""
    q_width, kv_width = decoder.heads * decoder.head_dim, decoder.kv_heads * decoder.head_dim

    def buffer(name: str, width: int) -> kernels.Rows:
        return decoder._rows(name, rows, width, keep)

    qkv = buffer("qkv", q_width + 2 * kv_width)  # [n, q | k | v]
    return SimpleNamespace(
        residual=buffer("residual", decoder.hidden), normed=buffer("normed", decoder.hidden),
        qkv=qkv, q_part=kernels.Rows(qkv.tensor[:, :q_width]),  # [n, q_width]
        new_keys=kernels.Rows(qkv.tensor[:, q_width : q_width + kv_width]),  # [n, kv_width]
        new_values=kernels.Rows(qkv.tensor[:, q_width + kv_width :]),  # [n, kv_width]
        attended=buffer("attended", q_width), gate_up=buffer("gate_up", 2 * decoder.ffn),
        act=buffer("act", decoder.ffn),
        branch=buffer("branch", decoder.hidden))  # gemma2/3: a half's output before its post-norm


def layer_steps(decoder: Any, rows: int, *, keep: bool) -> tuple[SimpleNamespace, list[SimpleNamespace]]:
    """An n-row forward's buffers, and per layer its norms, projections and activation as calls bound to them
    (checked once: a decoding step then calls them with no checks to repeat; its cache calls are bound on first
    use, per cache, `bind_cache`). With `keep`, kept per row count until a buffer is made again
    (NativeDecoder._rows), which drops them all; else (a long prompt's buffers, made for it alone) not kept."""
    bound = decoder._bound.get(rows) if keep else None
    if bound is not None:
        return bound
    buffers = buffers_of(decoder, rows, keep)
    residual, h, act = buffers.residual, buffers.normed, buffers.act
    steps = []
    for layer in decoder.layers:
        activation = (kernels.bind_silu_mul(buffers.gate_up, act) if layer.act == "silu" else
                      # GeLU-tanh, every element by one formula (torch's vectorised and scalar tails differ)
                      functools.partial(kernels.gelu_tanh_mul, buffers.gate_up, act))
        steps.append(SimpleNamespace(
            attn_norm=kernels.bind_rms_norm(residual, layer.attn_norm, layer.attn_eps, h),
            qkv=bind_project(h, layer.qkv, buffers.qkv),
            attn_out=bind_residual(buffers.attended, layer.out, layer.post_attn_norm, buffers, decoder.eps),
            mlp_norm=kernels.bind_rms_norm(residual, layer.mlp_norm, layer.mlp_eps, h),
            gate_up=bind_project(h, layer.gate_up, buffers.gate_up),
            act=activation,
            down=bind_residual(act, layer.down, layer.post_mlp_norm, buffers, decoder.eps),
            cache_calls={}))
    if keep:
        decoder._bound[rows] = buffers, steps
    return buffers, steps


def bind_cache(decoder: Any, step: SimpleNamespace, buffers: SimpleNamespace, layer: Any,
               cache: Any) -> SimpleNamespace:
    """The cache calls of the block's rows into `cache` (one sequence's, in a forward over several: native.py
    `many`): storing their keys and values in its buffers and their attention over them, each called with the first
    of the sequence's rows in the block (`store_keys(position, first, count)`, `attend(keys, first)`). Bound once
    per cache and kept in the step, known by weak references to the buffers, so a cache dropped or grown is bound
    again and never kept alive; the row range is an argument, not a binding (in a batch, drafts of varying lengths
    move a sequence's rows from step to step: bound per range, 4 sequences of the default model spent 1.6 ms a step
    binding again)."""
    keys, values = cache.key_buffer, cache.value_buffer  # [1, kv_heads, capacity, head_dim]
    calls = step.cache_calls.get(id(keys))
    if calls is not None and calls.keys() is keys and calls.values() is values:
        return calls
    if len(step.cache_calls) >= BOUND_CACHES:
        del step.cache_calls[next(iter(step.cache_calls))]  # the oldest bound
    rows = buffers.q_part.rows
    query = buffers.q_part.tensor.view(rows, decoder.heads, decoder.head_dim)  # [n, heads, head_dim]
    attended = buffers.attended.tensor.view(rows, decoder.heads, decoder.head_dim)
    calls = step.cache_calls[id(keys)] = SimpleNamespace(
        store_keys=kernels.bind_store_rows(buffers.new_keys, keys),
        store_values=kernels.bind_store_rows(buffers.new_values, values),
        attend=kernels.bind_attention(query, keys, values, layer.scaling, float(decoder.attn_cap or 0.0), attended),
        keys=weakref.ref(keys), values=weakref.ref(values))
    return calls


def bind_residual(source: kernels.Rows, layer: Any, post_norm: Optional[kernels.Dense],
                  buffers: SimpleNamespace, eps: float) -> Callable[[], None]:
    """x += source @ layer (native._Linear); with a post-norm (gemma2/3), x += norm(source @ layer)."""
    x = buffers.residual
    if post_norm is None:
        return bind_matmul(source, layer, x, accumulate=True)
    product = bind_matmul(source, layer, buffers.branch)
    norm = kernels.bind_rms_norm(buffers.branch, post_norm, eps, buffers.normed)
    x_tensor, normed = x.tensor, buffers.normed.tensor

    def step() -> None:
        product()
        norm()
        x_tensor.add_(normed)

    return step


def bind_matmul(source: kernels.Rows, layer: Any, out: kernels.Rows,
                accumulate: bool = False) -> Callable[[], None]:
    """out (+)= source @ layer's weight (+ its bias; a native._Linear or _Projections): source contiguous, out
    [rows, layer's outputs]."""
    product, bias = kernels.bind_matmul(source, layer.matrix, out, accumulate), layer.bias
    if bias is None:
        return product
    out_tensor = out.tensor

    def step() -> None:
        product()
        out_tensor.add_(bias)

    return step


def bind_project(source: kernels.Rows, groups: list[Any], out: kernels.Rows) -> Callable[[], None]:
    """out[:, :] = source @ the fused projections, side by side."""
    if len(groups) == 1:  # one fused matmul fills the row
        return bind_matmul(source, groups[0], out)
    parts, column = [], 0
    for group in groups:
        parts.append(bind_matmul(source, group, kernels.Rows(out.tensor[:, column : column + group.width])))
        column += group.width  # [n, width] each

    def step() -> None:
        for part in parts:
            part()

    return step
