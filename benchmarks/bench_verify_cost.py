"""The cost of verifying a block of n rows: the block matmuls, exact attention and the whole forward.

Exact verification needs every row of a block to come out as a one-row forward would compute it. specdec's
kernels (kernels/_cpu.c) do that by construction; this script measures what it costs, on the default model
(block weights from its GGUF, the native decoder):

1. the GEMM: every block matmul of one forward (the layers' fused projections and the LM head) for n rows,
   as multiply-adds a second and as a share of the path's arithmetic peak (`kernels.peak`: one thread
   running only the path's multiplying instruction, vpdpbusd or vpmaddubsw, on registers, times the threads);
2. attention alone, per layer: the exact kernel against torch's batched `scaled_dot_product_attention` over
   the same block and cache (one call, causal within the block; what a non-exact verifier does), on the default
   model's attention shape (9 query heads, 3 key/value heads, 64 dims);
3. a whole forward of n rows after a context of L tokens, relative to a one-row forward at the same context
   (the verify-cost curve the planner sees).

    python benchmarks/bench_verify_cost.py [--contexts 64,512] [--rows 1,2,4,8,16,32] [--isa avx2,avx512vnni]
        [--target FILE.gguf]

`--isa` repeats the GEMM and the whole forward on each named instruction-set path (kernels.force_isa; default:
the best this CPU has). Numbers move with the machine's load; read them within one run (the timings are
interleaved, best of N). It measures; it does not assert anything.
"""

from __future__ import annotations

import argparse
import time

from specdec_cli.defaults import DEFAULT_TARGET


def best_ms(call, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return 1000 * best


def attention_alone(contexts: list[int], rows_list: list[int], repeats: int) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as with block weights (models.use_block_threads): the kernels take the threads
    try:
        attention_table(contexts, rows_list, repeats)
    finally:  # the model's parts below give the kernels torch's threads: one here would time them on one core
        torch.set_num_threads(threads)


def attention_table(contexts: list[int], rows_list: list[int], repeats: int) -> None:
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
    from specdec_cli.target_model.native.row_keys import row_keys

    heads, kv_heads, dim = 9, 3, 64  # SmolLM2-135M's attention
    total = context + rows
    keys = torch.randn(1, kv_heads, total, dim)  # [1, kv_heads, keys, dim]
    values = torch.randn(1, kv_heads, total, dim)
    query = torch.randn(rows, heads, dim)  # [rows, heads, dim]
    out = torch.empty(rows, heads * dim)
    keys_of_rows = row_keys(None, rows, total)
    out_heads = out.view(rows, heads, dim)
    scale = dim ** -0.5

    def exact() -> None:
        kernels.attention(query, keys, values, keys_of_rows.positions, scale, out=out_heads)

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


def load_decoder(target: str):
    from specdec_cli.target_model.load.models import load_target
    from specdec_cli.target_model.native.native import decoder_for

    loaded = load_target(target, weights="gguf", device="cpu")
    decoder = decoder_for(loaded.model)
    if decoder is None:
        print("the native decoder does not run this model; skipping the model's parts")
    return loaded, decoder


def gemm(decoder, rows_list: list[int], repeats: int) -> None:
    """Every block matmul of one forward, n rows: ms, multiply-adds a second, share of the path's peak."""
    import torch

    from specdec_cli import kernels

    shapes = []  # (kind, k, n, records)
    for layer in decoder.layers:
        for group in layer.qkv:
            shapes.append((group.kind, decoder.hidden, group.width, group.records))
        for group in layer.gate_up:
            shapes.append((group.kind, decoder.hidden, group.width, group.records))
        for single in (layer.out, layer.down):
            shapes.append((single.matrix.kind, single.matrix.k, single.matrix.n, single.matrix.records))
    head = decoder.head.matrix
    shapes.append((head.kind, head.k, head.n, head.records))
    macs_per_row = sum(k * n for _, k, n, _ in shapes)
    widest = max(n for _, _, n, _ in shapes)
    out = torch.empty(max(rows_list), widest)
    inputs = {k: torch.randn(max(rows_list), k) for _, k, _, _ in shapes}
    threads = kernels.threads()
    path = kernels.isa()
    peak = kernels.peak(path, 0.2) * threads if path != "portable" else float("nan")
    outs = {(rows, n): out.view(-1)[: rows * n].view(rows, n) for rows in rows_list for _, _, n, _ in shapes}
    rows_of = {(rows, k): inputs[k][:rows] for rows in rows_list for k in inputs}

    def run(rows: int) -> None:
        for kind, k, n, records in shapes:
            kernels.matmul(rows_of[rows, k], kind, records, out=outs[rows, n])

    times = {rows: float("inf") for rows in rows_list}
    for rows in rows_list:
        run(rows)  # warm
    for _ in range(repeats):
        for rows in rows_list:
            start = time.perf_counter()
            run(rows)
            times[rows] = min(times[rows], time.perf_counter() - start)
    print(f"\nGEMM on {path}, {threads} thread(s): every block matmul of one forward ({macs_per_row / 1e6:.0f} M "
          f"multiply-adds a row); peak {peak / 1e9:.0f} G multiply-adds/s = {threads} x one thread's run of the "
          f"path's multiplying instruction alone (kernels.peak)")
    print(f"{'rows':>5} {'ms':>8} {'GMAC/s':>8} {'of peak':>8}")
    for rows in rows_list:
        rate = rows * macs_per_row / times[rows]
        print(f"{rows:>5} {1000 * times[rows]:>8.2f} {rate / 1e9:>8.1f} {rate / peak:>8.1%}")


def whole_forward(decoder, vocab: int, contexts: list[int], rows_list: list[int], repeats: int) -> None:
    import torch

    from specdec_cli import kernels
    from specdec_cli.target_model.native.kv_cache import KVCache

    generator = torch.Generator().manual_seed(0)
    print(f"\nwhole forward of n rows after a context, ms (block weights, native decoder, {kernels.isa()}, "
          f"{kernels.threads()} thread(s)); t(n) / t(1)")
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
    parser.add_argument("--contexts", default="64,512")
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--isa", default="", help="comma-separated instruction-set paths (default: the best)")
    parser.add_argument("--threads", type=int, default=0, help="the kernels' threads (default: torch's)")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="a GGUF file or the default model's name")
    parser.add_argument("--skip-model", action="store_true", help="attention alone (no model load)")
    parser.add_argument("--skip-attention", action="store_true", help="the model's parts only")
    args = parser.parse_args()
    contexts = [int(value) for value in args.contexts.split(",")]
    rows_list = [int(value) for value in args.rows.split(",")]
    if not args.skip_attention:
        attention_alone(contexts, rows_list, args.repeats)
    if args.skip_model:
        return
    from specdec_cli import kernels

    loaded, decoder = load_decoder(args.target)
    if decoder is None:
        return
    if args.threads:
        kernels.set_threads(args.threads)
    for path in args.isa.split(",") if args.isa else [""]:
        if path:
            kernels.force_isa(path)
        gemm(decoder, rows_list, args.repeats)
        whole_forward(decoder, int(loaded.model.config.vocab_size), contexts, rows_list, args.repeats)
    if args.isa:
        kernels.force_isa(None)


if __name__ == "__main__":
    main()
