"""Row-invariant verification: a token's logits do not depend on how many tokens share its forward.

A verify forward scores k+1 tokens at once where plain decoding scores them one per forward. Two things make
the rows of a block round differently from one-row forwards on CPUs: matrix kernels pick their reduction order
by the number of rows, and a block's attention reduces over the whole block under a mask. In float32 the
differences only flip near-ties; in bfloat16 they flip greedy choices (how often: docs/methods.md, section 10).
This file removes both causes for one loaded model:

- attention (`rowwise_attention`): each row of a small block attends, in its own call, over exactly the keys its
  mask allows (its prefix; for a tree node, the prefix and its ancestors), gathered into the same contiguous
  layout a one-row step sees;
- linear layers (`install`): every distinct weight shape is checked for row invariance at each row count up to
  `rows`; a shape whose rows round differently with the count runs every small call padded to `rows` rows
  (at a fixed row count a row's result does not depend on its place, which is checked too).

`install` finds what to pad and ends with an end-to-end check on the model (a chain and a tree block against
one-row forwards, bit for bit), refusing exactness where it fails; it returns an `ExactState` and leaves the model
as it was. `forward` runs one forward with that state: a block of up to `rows` tokens inside `row_invariant`,
which switches the model to the row-invariant attention and pads the linear layers for that call only and puts
everything back after it; longer forwards (a prompt's prefill, the same for plain and speculative decoding) run
the model as it is. So between forwards the model carries nothing of specdec's: no attribute, no hook, its own
attention implementation. Nothing here changes what a model computes, only which kernels compute it.

transformers' attention layers look their attention function up by name (the config's `_attn_implementation`)
in a process-wide registry, with no way to pass one in a call; `register_rowwise_attention` therefore registers
`rowwise_attention` under ATTENTION_NAME, once, and the forward object that uses it (exact_setup.py) calls it
when it is made.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F

from ...defaults import VERIFY_ROW_COUNTS
from ..native.row_keys import row_keys
from .tree_mask import tree_attention_mask, tree_layout

ATTENTION_NAME = "specdec_rowwise"  # rowwise_attention's name in transformers' registries (register_rowwise_attention)
CHECK_ROWS = (1, 2, 3, 4, 5, 6, 7, 8)  # row counts the end-to-end check compares (within `rows`)
CHECKED_OUTPUTS = 1_000_000  # outputs compared per row count when checking a linear layer
UNSUPPORTED_ATTENTION = ("softcap", "s_aux", "sinks", "position_bias")  # attention kwargs rowwise cannot honour


def exact_rows(budget: int) -> int:
    """The block size to make row-invariant for a draft budget: its rows (budget + 1) rounded up to the next
    row count the cost curve measures, since the planner may pad a block up to that size."""
    return min((size for size in VERIFY_ROW_COUNTS if size >= budget + 1), default=budget + 1)


@dataclass(frozen=True)
class ExactState:
    """What `install` found for a model: the largest row-invariant block and which linear layers run padded."""

    rows: int  # blocks up to this many rows are computed row-invariantly
    padded_shapes: list[tuple[int, int]]  # (in, out) weight shapes whose calls run padded to `rows`
    padded: list[Any]  # the linear layers with those shapes
    configs: list[Any]  # the model's configs whose attention implementation `row_invariant` switches


def rowwise_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None,
                      dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention whose every row equals a one-row call over that row's allowed keys (transformers' signature).

    query [1, heads, q, d]; key/value [1, kv_heads, kv, d]; attention_mask [1, 1, q, kv] bool or None (causal).
    Returns ([1, q, heads, d], None); a batch of more than one runs SDPA as a whole. With specdec's CPU kernels
    (kernels/_cpu.c) all rows go in one call that computes each row over its own keys; otherwise each row gets its
    own SDPA call over a view (or a gather) of its keys.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len = query.shape[2]
    if query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    for name in UNSUPPORTED_ATTENTION:
        if kwargs.get(name) is not None:
            raise ValueError(f"row-invariant attention does not support {name}")
    keys_of_rows = row_keys(attention_mask, q_len, key.shape[2])
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if _kernel_attention(query, key):
        from ... import kernels

        out = kernels.attention(query[0].transpose(0, 1).to(torch.float32), key[0], value[0], keys_of_rows.positions,
                                scale)  # [q, heads, d] float32
        return out.to(query.dtype).unsqueeze(0), None  # [1, q, heads, d]
    heads, kv_heads = query.shape[1], key.shape[1]
    group = heads // kv_heads
    outputs = []
    for row, (start, stop, picked) in enumerate(keys_of_rows.runs):
        if picked is None:  # a contiguous run of keys (a chain, a window): a view, as a one-row step reads it
            row_key, row_value = key[:, :, start:stop], value[:, :, start:stop]  # [1, kv_heads, n, d]
        else:  # a tree node: the run, then its ancestors and itself, gathered
            row_key, row_value = key.index_select(2, picked), value.index_select(2, picked)
        # the row's heads grouped by the key/value head they share: [1, kv_heads, group, d]
        row_query = query[:, :, row].reshape(1, kv_heads, group, query.shape[-1])
        out = F.scaled_dot_product_attention(row_query, row_key, row_value, scale=scale)  # [1, kv_heads, group, d]
        outputs.append(out.reshape(1, heads, query.shape[-1]))
    return torch.stack(outputs, dim=1), None  # [1, q, heads, d]


def _kernel_attention(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether specdec's CPU attention kernel takes these tensors (CPU, float32 or bfloat16 keys)."""
    from ... import kernels

    return (kernels.available() and query.device.type == "cpu" and query.dtype in (torch.float32, torch.bfloat16)
            and key.dtype in (torch.float32, torch.bfloat16) and key.stride(-1) == 1)


def register_rowwise_attention() -> None:
    """Register `rowwise_attention` (and SDPA's boolean masks) under ATTENTION_NAME with transformers: its attention
    layers find their function by that name only (the module docstring). Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, rowwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)  # boolean masks, as SDPA's


def rows_vary(weight: torch.Tensor, rows: int) -> bool:
    """Whether a linear layer with this weight rounds a row differently depending on the call's row count.

    A different reduction order changes a reduced-precision output only where its float32 accumulation lands
    near a rounding boundary, which is rare (docs/methods.md, section 10, has a measured rate), so the check
    compares enough outputs (CHECKED_OUTPUTS per row count) for such a rate to show dozens of times.
    """
    generator = torch.Generator().manual_seed(0)
    checked = max(16, -(-CHECKED_OUTPUTS // weight.shape[0]))  # rows of random input
    inputs = torch.randn(checked, weight.shape[1], generator=generator).to(weight.dtype).to(weight.device)
    with torch.inference_mode():
        alone = torch.cat([F.linear(inputs[row : row + 1], weight) for row in range(checked)])  # [checked, out]
        for count in range(2, rows + 1):
            covered = checked // count * count
            blocks = torch.cat([F.linear(inputs[start : start + count], weight)
                                for start in range(0, covered, count)])  # [covered, out]
            if not torch.equal(blocks, alone[:covered]):
                return True
    return False


def _pad_rows(rows: int) -> tuple[Any, Any]:
    """Forward hooks running a linear layer's calls of <= rows tokens at exactly `rows` rows."""
    real: list[int] = []

    def before(module: Any, args: tuple) -> Optional[tuple]:
        hidden = args[0]  # [..., n, in]
        count = hidden.shape[-2]
        real.append(count)
        if count >= rows or hidden.dim() != 3 or hidden.shape[0] != 1:
            return None
        padding = hidden.new_zeros(1, rows - count, hidden.shape[-1])
        return (torch.cat([hidden, padding], dim=1), *args[1:])  # [1, rows, in]

    def after(module: Any, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output[:, : real.pop()]  # [1, n, out]

    return before, after


def install(model: Any, rows: int) -> ExactState:
    """What makes blocks of up to `rows` tokens row-invariant on `model`: which linear layers run padded, after an
    end-to-end check with them (`forward`). Raises ValueError with the reason where that cannot be had (an
    attention this file cannot reproduce, or the check failing). The model is left as it was."""
    before = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if before != "sdpa":
        raise ValueError(f"row-invariant attention replaces SDPA attention; this model uses {before}")
    register_rowwise_attention()
    varying: dict[tuple, bool] = {}
    padded = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            shape = (module.in_features, module.out_features, module.weight.dtype, module.bias is not None)
            if shape not in varying:
                varying[shape] = rows_vary(module.weight, rows)
            if varying[shape]:
                padded.append(module)
    model.set_attn_implementation(ATTENTION_NAME)  # once: transformers checks that the model takes it
    try:  # (and sets it on every config its layers read: the ones a forward switches, cheaply, by itself)
        configs = list({id(config): config for module in model.modules()
                        if getattr(config := getattr(module, "config", None), "_attn_implementation", None)
                        == ATTENTION_NAME}.values())
    finally:
        model.set_attn_implementation(before)
    state = ExactState(rows, [(shape[0], shape[1]) for shape, vary in varying.items() if vary], padded, configs)
    try:
        mismatch = block_mismatch(lambda **inputs: forward(model, state, **inputs), model.config,
                                  next(model.parameters()).device, rows)
    except Exception as error:  # e.g. an attention argument rowwise_attention cannot honour
        mismatch = f"the check raised {type(error).__name__}: {str(error).strip()[:120]}"
    if mismatch is not None:
        raise ValueError(mismatch)
    return state


def forward(model: Any, state: ExactState, **inputs: Any) -> Any:
    """The model's forward on `inputs` (transformers' keywords), row-invariant for a block of up to `state.rows`
    tokens; a longer one (a prompt) as the model runs it."""
    if inputs["input_ids"].shape[1] > state.rows:
        return model(**inputs)
    with row_invariant(model, state):
        return model(**inputs)


@contextmanager
def row_invariant(model: Any, state: ExactState) -> Iterator[None]:
    """For the while: the model's attention is `rowwise_attention` and the padded layers' calls run at state.rows
    rows; after it, the model's own attention and no hook, whatever happened inside. (The configs' implementation
    is set directly, as transformers' set_attn_implementation does after its checks, which install made: those
    checks walk every module, about a millisecond on a 30-layer model, and a forward switches twice.)"""
    before = [config._attn_implementation_internal for config in state.configs]
    handles = []
    try:
        for module in state.padded:
            pad, unpad = _pad_rows(state.rows)
            handles += [module.register_forward_pre_hook(pad), module.register_forward_hook(unpad)]
        for config in state.configs:
            config._attn_implementation_internal = ATTENTION_NAME
        yield
    finally:
        for handle in handles:
            handle.remove()
        for config, implementation in zip(state.configs, before):
            config._attn_implementation_internal = implementation


@torch.inference_mode()
def block_mismatch(model: Any, config: Any, device: Any, rows: int) -> Optional[str]:
    """None when blocks of 1..min(rows, 8) tokens, chains and a tree, give the same logits bit for bit as
    one-row forwards of the same tokens after a 24-token prompt; else what differed. `model` is what computes
    (the model, the native decoder, or exact.forward with a state), called as transformers models are."""
    from ..native.kv_cache import new_kv_cache

    vocab = int(config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, vocab, (24 + max(CHECK_ROWS),), generator=generator).tolist()
    prompt = 24

    def forward(ids: list[int], cache: Any, start: int, mask: Any = None, positions: Any = None) -> torch.Tensor:
        input_ids = torch.tensor([ids], device=device)
        if positions is None:
            positions = torch.arange(start, start + len(ids))
        extra = {} if mask is None else {"attention_mask": mask}
        out = model(input_ids=input_ids, position_ids=positions[None].to(device), past_key_values=cache,
                    use_cache=True, **extra)
        return out.logits[0]  # [n, vocab]

    cache = new_kv_cache(model)
    forward(tokens[:prompt], cache, 0)
    one_row = []  # logits of tokens[prompt + i], each from its own one-row forward
    for index in range(max(CHECK_ROWS)):
        one_row.append(forward([tokens[prompt + index]], cache, prompt + index)[0])
    for count in CHECK_ROWS:
        if count > rows:
            break
        cache.crop(prompt - cache.get_seq_length())
        block = forward(tokens[prompt : prompt + count], cache, prompt)  # [count, vocab]
        for index in range(count):
            if not torch.equal(block[index], one_row[index]):
                return f"row {index} of a {count}-token block differs from a one-row forward"
    if rows >= 4:  # a tree whose last node skips a sibling: its keys are gathered, not sliced
        cache.crop(prompt - cache.get_seq_length())
        parents = [-1, -1, 0]  # node 0 and node 1 under the root, node 2 under node 0
        ids = [tokens[prompt], tokens[prompt + 1], 7, tokens[prompt + 2]]  # root -> node 0 -> node 2 = the chain
        depth, ancestors = tree_layout(parents)
        mask = tree_attention_mask(config, prompt, depth, ancestors, device=device)
        block = forward(ids, cache, prompt, mask, prompt + depth)
        for row, index in ((0, 0), (1, 1), (3, 2)):
            if not torch.equal(block[row], one_row[index]):
                return f"tree node {row} differs from a one-row forward"
    return None
