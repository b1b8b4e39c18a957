"""The cost of verifying a block at long contexts: exact (row-invariant) attention against one batched call.

Exact verification needs every row of a block to see exactly the keys a one-row step would see, reduced in
the same order. specdec's attention kernel (kernels/_cpu.c) does that in one call for the whole block: each
(row, head) pair is one work item over its own keys. This script measures, on the default model's attention
shape (9 query heads, 3 key/value heads, 64 dims) and on the whole model with block weights:

1. attention alone, per layer: the exact kernel against torch's batched `scaled_dot_product_attention` over
   the same block and cache (one call, causal within the block; what a non-exact verifier does), for
   contexts of 128 to 4096 tokens and blocks of 1 to 16 rows;
2. a whole forward of n rows after a context of L tokens, relative to a one-row forward at the same context
   (the verify-cost curve a long prompt gives the planner).

    python benchmarks/bench_verify_cost.py [--contexts 128,1024,2048,4096] [--rows 1,4,8,16]

Numbers move with the machine's load; read them within one run (the timings are interleaved, best of N).
It measures; it does not assert anything.
"""

from __future__ import annotations

import argparse
import time


def best_ms(call, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return 1000 * best


def attention_alone(contexts: list[int], rows_list: list[int], repeats: int) -> None:
    import torch

    torch.set_num_threads(1)  # as with block weights (models.use_block_threads): the kernels take the threads
    print("attention of one layer, ms: the exact kernel; torch's SDPA over the block; the same as two batched")
    print("matrix products (keys expanded to every query head beforehand); ratio = exact / the faster batched one")
    print(f"{'context':>8} {'rows':>5} {'exact':>8} {'sdpa':>8} {'matmuls':>8} {'ratio':>6}")
    for context in contexts:
        for rows in rows_list:
            exact_ms, sdpa_ms, matmul_ms = attention_times(context, rows, repeats)
            print(f"{context:>8} {rows:>5} {exact_ms:>8.3f} {sdpa_ms:>8.3f} {matmul_ms:>8.3f} "
                  f"{exact_ms / min(sdpa_ms, matmul_ms):>6.2f}")


def attention_times(context: int, rows: int, repeats: int) -> tuple[float, float, float]:
    """ms of one layer's attention for `rows` new rows after `context` cached keys: exact kernel, SDPA, matmuls."""
    import torch

    from specdec_cli import kernels
    from specdec_cli.exact import _row_keys

    cpu = kernels._require()
    heads, kv_heads, dim = 9, 3, 64  # SmolLM2-135M's attention
    total = context + rows
    keys = torch.randn(1, kv_heads, total, dim)  # [1, kv_heads, keys, dim]
    values = torch.randn(1, kv_heads, total, dim)
    query = torch.randn(rows, heads, dim)  # [rows, heads, dim]
    out = torch.empty(rows, heads * dim)
    row_keys = _row_keys(None, rows, total)
    scale = dim ** -0.5

    def exact() -> None:
        cpu.attention(rows, heads, kv_heads, dim, query.data_ptr(), query.stride(0), query.stride(1),
                      keys.data_ptr(), values.data_ptr(), False, keys.stride(1), keys.stride(2),
                      values.stride(1), values.stride(2), *(a.data_ptr() for a in row_keys.arrays),
                      scale, out.data_ptr(), heads * dim, dim)

    mask = torch.ones(rows, total, dtype=torch.bool).tril(diagonal=context)  # [rows, keys]
    batched_query = query.transpose(0, 1).unsqueeze(0)  # [1, heads, rows, dim]

    def sdpa() -> None:
        torch.nn.functional.scaled_dot_product_attention(batched_query, keys, values, attn_mask=mask, scale=scale,
                                                         enable_gqa=True)

    wide_keys = keys.repeat_interleave(heads // kv_heads, dim=1)  # [1, heads, keys, dim]
    wide_values = values.repeat_interleave(heads // kv_heads, dim=1)
    additive = torch.zeros(rows, total).masked_fill(~mask, float("-inf"))  # [rows, keys]

    def matmuls() -> None:  # the same attention as two batched matrix products
        scores = batched_query @ wide_keys.transpose(-1, -2) * scale + additive  # [1, heads, rows, keys]
        torch.softmax(scores, dim=-1) @ wide_values

    exact(), sdpa(), matmuls()  # warm
    exact_ms, sdpa_ms, matmul_ms = (best_ms(call, repeats) for call in (exact, sdpa, matmuls))
    return exact_ms, sdpa_ms, matmul_ms


def whole_forward(contexts: list[int], rows_list: list[int], repeats: int) -> None:
    import torch

    from specdec_cli.kv_cache import KVCache
    from specdec_cli.models import load_target
    from specdec_cli.native import decoder_for

    loaded = load_target(weights="gguf", device="cpu")
    decoder = decoder_for(loaded.model)
    if decoder is None:
        print("the native decoder does not run this model; skipping the whole-forward part")
        return
    generator = torch.Generator().manual_seed(0)
    vocab = int(loaded.model.config.vocab_size)
    print("\nwhole forward of n rows after a context, ms (block weights, native decoder); t(n) / t(1)")
    print(f"{'context':>8} " + " ".join(f"{'t(' + str(rows) + ')':>8}" for rows in rows_list) + "   ratios")
    for context in contexts:
        cache = KVCache()
        prompt = torch.randint(0, vocab, (1, context), generator=generator)
        decoder(prompt, torch.arange(context).unsqueeze(0), cache, logits_to_keep=1)
        times = {rows: float("inf") for rows in rows_list}
        for _ in range(repeats):  # interleaved: load changes hit every size alike
            for rows in rows_list:
                block = torch.randint(0, vocab, (1, rows), generator=generator)
                positions = torch.arange(context, context + rows).unsqueeze(0)
                start = time.perf_counter()
                decoder(block, positions, cache)
                times[rows] = min(times[rows], time.perf_counter() - start)
                cache.crop(-rows)
        cells = " ".join(f"{1000 * times[rows]:>8.1f}" for rows in rows_list)
        ratios = " ".join(f"{times[rows] / times[rows_list[0]]:.2f}" for rows in rows_list)
        print(f"{context:>8} {cells}   {ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="128,1024,2048,4096")
    parser.add_argument("--rows", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-model", action="store_true", help="attention alone (no model load)")
    args = parser.parse_args()
    contexts = [int(value) for value in args.contexts.split(",")]
    rows_list = [int(value) for value in args.rows.split(",")]
    attention_alone(contexts, rows_list, args.repeats)
    if not args.skip_model:
        whole_forward(contexts, rows_list, args.repeats)


if __name__ == "__main__":
    main()
