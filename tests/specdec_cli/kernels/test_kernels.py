"""specdec's CPU kernels (kernels/_cpu.c) against plain torch references, and their row invariance.

Row invariance is what exact verification rests on: a row's output must not depend on how many rows share the
call, or on how many threads split it. Each such check below is bit for bit, never approximate, and runs on every
instruction-set path this CPU has (kernels.force_isa).
"""

from __future__ import annotations

import pytest
import torch

from specdec_cli import kernels

pytestmark = [pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled"),
              pytest.mark.usefixtures("kernel_settings")]  # threads and path restored after each test


def _quantized_rows(x: torch.Tensor) -> torch.Tensor:
    """What the kernel multiplies: each row rounded to 8 bits per block of 32 (scale = max |x| / 127)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    codes = torch.where(scale > 0, torch.round(blocks / scale), torch.zeros_like(blocks))
    return (codes * scale).reshape(x.shape)


def _random_blocks(kind: int, n: int, k: int, seed: int = 0):
    """(records, dense float32 [n, k], (codes, scales, offsets)) of random weights of `kind`."""
    info = kernels.kind_of(kind)
    generator = torch.Generator().manual_seed(seed)
    if info.bits >= 16:
        weights = (torch.randn(n, k, generator=generator) * 0.1).to(info.dtype)
        return kernels.pack_records(kind, weights), weights.float(), (weights, None, None)
    top = 16 if info.bits == 4 else 256 if info.zero == 128 else 2 * info.zero if info.zero else 32
    codes = torch.randint(0, top, (n, k), dtype=torch.uint8, generator=generator)
    scales = torch.rand(n, k // info.sub, generator=generator) * 0.05
    offsets = torch.randn(n, k // info.sub, generator=generator) * 0.1 if info.offsets else None
    dense = kernels.dequantize(kind, codes, scales, offsets)
    return kernels.pack_records(kind, codes, scales, offsets), dense, (codes, scales, offsets)


ALL_KINDS = sorted(set(kernels.KINDS) - set(kernels.PACKED))  # packed kinds: test_packed_kernels.py


def _reference(kind: int, x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """Float kinds multiply the rows as they are; block kinds their 8-bit rounding."""
    return (x if kernels.kind_of(kind).bits >= 16 else _quantized_rows(x)) @ dense.T


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_matmul_is_the_product_of_the_rounded_rows_and_the_blocks(kind):
    records, dense, _ = _random_blocks(kind, 80, 128)
    x = torch.randn(13, 128, generator=torch.Generator().manual_seed(1))
    reference = _reference(kind, x, dense)
    for path in kernels.isas():
        kernels.force_isa(path)
        out = kernels.matmul(x, kind, records, 80)
        assert torch.allclose(out, reference, rtol=1e-5, atol=1e-5 * float(reference.abs().max())), path


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_matmul_rows_do_not_depend_on_the_row_count_the_threads_or_the_path(kind):
    """Every row of a call equals its one-row call bit for bit, for 1-32 rows, 1-2 threads, on every instruction
    set this CPU has; and the paths agree with each other (each computes the same operations in the same order)."""
    records, _, _ = _random_blocks(kind, 70, 96, seed=2)  # 70 columns: 4 whole groups of 16 and a part one
    x = torch.randn(32, 96, generator=torch.Generator().manual_seed(3))
    kernels.set_threads(1)
    kernels.force_isa("portable")
    expected = torch.cat([kernels.matmul(x[row : row + 1], kind, records, 70) for row in range(32)])
    for path in kernels.isas():
        kernels.force_isa(path)
        for threads in (1, 2):
            kernels.set_threads(threads)
            for rows in (1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32):
                assert torch.equal(kernels.matmul(x[:rows], kind, records, 70), expected[:rows]), (path, threads, rows)
            one_by_one = torch.cat([kernels.matmul(x[row : row + 1], kind, records, 70) for row in range(32)])
            assert torch.equal(one_by_one, expected), (path, threads)


@pytest.mark.parametrize("kind", [kernels.KIND_Q4, kernels.KIND_Q8, kernels.KIND_Q8S, kernels.KIND_BF16])
def test_matmul_accumulates_into_a_strided_output(kind):
    records, _, _ = _random_blocks(kind, 40, 64, seed=4)
    kernels.set_threads(2)
    for path in kernels.isas():
        kernels.force_isa(path)
        for rows in (1, 5, 9):
            x = torch.randn(rows, 64)
            product = kernels.matmul(x, kind, records, 40)
            wide = torch.randn(rows, 100)
            expected = wide.clone()
            expected[:, 30:70] += product
            kernels.matmul(x, kind, records, out=wide[:, 30:70], accumulate=True)
            assert torch.equal(wide, expected), path  # columns 70.. untouched although the last group is padded


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_records_unpack_to_what_was_packed(kind):
    records, dense, (codes, scales, offsets) = _random_blocks(kind, 21, 64)
    assert records.shape == (kernels.groups(21), kernels.record_bytes(kind, 64))
    back = kernels.unpack_records(kind, records, 21)
    assert torch.equal(back[0], codes)
    for got, made in zip(back[1:], (scales, offsets)):
        assert (got is None) == (made is None) and (made is None or torch.equal(got, made))
    ids = torch.tensor([20, 3, 3, 17])
    picked = kernels.select_columns(kind, records, 21, ids)
    x = torch.randn(3, 64)
    assert torch.equal(kernels.matmul(x, kind, picked, 4), kernels.matmul(x, kind, records, 21)[:, ids])


def test_matmul_refuses_records_of_another_shape_and_unknown_paths():
    with pytest.raises(ValueError):
        kernels.matmul(torch.randn(2, 96), 4, _random_blocks(4, 8, 64)[0], 8)  # records for k=64, rows of k=96
    with pytest.raises(ValueError):
        kernels.matmul(torch.randn(2, 64), 4, _random_blocks(4, 8, 64)[0], 40)  # 8 columns' records, 40 asked
    with pytest.raises(ValueError):
        kernels.force_isa("sse9")
    assert kernels.isa() == kernels.isas()[-1]  # the best path unless forced
    kernels.force_isa("portable")
    assert kernels.isa() == "portable"


def test_the_256_bit_vnni_path_runs_wherever_a_vnni_instruction_does():
    """A CPU with AVX512-VNNI runs the avxvnni path too (vpdpbusd in its 256-bit AVX512 encoding), so its tiles are
    tested on this project's machines whether or not they have AVX-VNNI itself."""
    paths = kernels.isas()
    if "avx512vnni" in paths:
        assert "avxvnni" in paths
    if "avxvnni" in paths:
        assert kernels.peak("avxvnni", 0.01) > 0


def _key_positions(runs, extras):
    """The kernel's KeyPositions for per-row runs and extra positions."""
    starts = torch.tensor([start for start, _ in runs], dtype=torch.int32)
    stops = torch.tensor([stop for _, stop in runs], dtype=torch.int32)
    offsets = [0]
    for positions in extras:
        offsets.append(offsets[-1] + len(positions))
    flat = torch.tensor([p for positions in extras for p in positions], dtype=torch.int32)
    return kernels.KeyPositions(starts, stops, torch.tensor(offsets, dtype=torch.int32), flat)


@pytest.mark.parametrize("path", kernels.isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_matches_sdpa_and_each_row_equals_its_own_call(dtype, path):
    kernels.force_isa(path)
    generator = torch.Generator().manual_seed(5)
    heads, kv_heads, dim, cached = 6, 2, 64, 37
    keys = torch.randn(kv_heads, 60, dim, generator=generator).to(dtype)
    values = torch.randn(kv_heads, 60, dim, generator=generator).to(dtype)
    query = torch.randn(5, heads, dim, generator=generator)
    runs = [(0, cached + row + 1) for row in range(5)]  # a causal chain after `cached` tokens
    out = kernels.attention(query, keys, values, _key_positions(runs, [[]] * 5), dim ** -0.5)
    for row, (start, stop) in enumerate(runs):
        expected = torch.nn.functional.scaled_dot_product_attention(
            query[row][:, None], keys[:, start:stop].float().repeat_interleave(3, 0),
            values[:, start:stop].float().repeat_interleave(3, 0))[:, 0]  # [heads, dim]
        assert torch.allclose(out[row], expected, atol=1e-5)
        alone = kernels.attention(query[row : row + 1], keys, values, _key_positions([runs[row]], [[]]), dim ** -0.5)
        assert torch.equal(alone[0], out[row])


@pytest.mark.parametrize("path", kernels.isas())
@pytest.mark.parametrize("kv_heads", [1, 2, 4, 8])
def test_a_row_is_the_same_bits_whatever_the_units_and_threads(kv_heads, path):
    """One row's heads go to the threads a key/value head's group at a time (cut in parts where there are fewer
    key/value heads than threads), several rows' in tiles of rows: every way of cutting gives each row and head
    the same bits, with one thread or two, alone or among other rows."""
    kernels.force_isa(path)
    generator = torch.Generator().manual_seed(8)
    heads, dim, cached, rows = 8, 64, 150, 5
    keys = torch.randn(kv_heads, cached + rows, dim, generator=generator)
    values = torch.randn(kv_heads, cached + rows, dim, generator=generator)
    query = torch.randn(rows, heads, dim, generator=generator)
    runs = [(0, cached + row + 1) for row in range(rows)]
    before = kernels.threads()
    try:
        results = []
        for count in (1, 2):
            kernels.set_threads(count)
            together = kernels.attention(query, keys, values, _key_positions(runs, [[]] * rows), dim ** -0.5)
            alone = [kernels.attention(query[row : row + 1], keys, values, _key_positions([runs[row]], [[]]),
                                       dim ** -0.5)[0] for row in range(rows)]
            results.append((together, torch.stack(alone)))
    finally:
        kernels.set_threads(before)
    for together, alone in results:
        assert torch.equal(together, results[0][0])
        assert torch.equal(alone, results[0][0])


@pytest.mark.parametrize("path", kernels.isas())
def test_several_attention_calls_at_once_give_each_calls_own_bits(path):
    """A batched step's sequences, each over its own cache (its own length, dtype, head size, rows and tree keys),
    in one `attention_many`: each output equals its own call's bit for bit, on every path (the vector paths run their
    units in one call of the pool, the others one call after another)."""
    kernels.force_isa(path)
    generator = torch.Generator().manual_seed(13)
    calls, outs, expected, held = [], [], [], []  # (a bound call holds addresses: its tensors are kept here)
    for index, (rows, cached, dim, dtype) in enumerate([(1, 300, 64, torch.float32), (4, 37, 64, torch.float32),
                                                        (1, 5, 64, torch.bfloat16), (3, 130, 128, torch.float32),
                                                        (2, 70, 48, torch.float32)]):  # 48: no vector steps
        heads, kv_heads = 9, 3
        keys = torch.randn(kv_heads, cached + rows + 2, dim, generator=generator).to(dtype)
        values = torch.randn(kv_heads, cached + rows + 2, dim, generator=generator).to(dtype)
        query = torch.randn(rows, heads, dim, generator=generator)
        extras = [[cached + rows + 1] if (row + index) % 2 else [] for row in range(rows)]
        positions = _key_positions([(0, cached + row + 1) for row in range(rows)], extras)
        expected.append(kernels.attention(query, keys, values, positions, dim ** -0.5))
        outs.append(torch.full_like(query, float("nan")))
        calls.append((kernels.bind_attention(query, keys, values, dim ** -0.5, 0.0, outs[-1]), positions, 0))
        held.append((query, keys, values))
    kernels.attention_many(calls[:4])  # head sizes the vector steps take: one call of the pool
    kernels.attention_many(calls[2:])  # with one they do not take: each call alone (the first again: the same)
    for out, alone in zip(outs, expected):
        assert torch.equal(out, alone)


def test_bound_cache_calls_take_any_rows_of_their_buffers():
    """A batched step's sequence moves within the forward's rows from step to step (its neighbours' drafts): calls
    bound once to the whole buffers, given the sequence's first row, store and attend exactly as calls bound to its
    rows alone; rows outside the bound buffers are refused."""
    generator = torch.Generator().manual_seed(21)
    heads, kv_heads, dim, cached = 6, 2, 64, 40
    new_keys = torch.randn(8, kv_heads * dim, generator=generator)
    query = torch.randn(8, heads, dim, generator=generator)
    for first, count in [(0, 8), (3, 2), (7, 1)]:
        whole_cache, alone_cache = (torch.zeros(1, kv_heads, 64, dim) for _ in range(2))
        kernels.bind_store_rows(new_keys, whole_cache)(cached, first, count)
        kernels.bind_store_rows(new_keys[first : first + count], alone_cache)(cached)
        assert torch.equal(whole_cache, alone_cache)
        keys, values = torch.randn(kv_heads, 64, dim, generator=generator), torch.randn(kv_heads, 64, dim,
                                                                                        generator=generator)
        positions = _key_positions([(0, cached + row + 1) for row in range(count)], [[] for _ in range(count)])
        whole_out, alone_out = torch.full_like(query, float("nan")), torch.full((count, heads, dim), float("nan"))
        kernels.bind_attention(query, keys, values, dim ** -0.5, 0.0, whole_out)(positions, first)
        alone_query = query[first : first + count].clone()  # (a bound call holds addresses: kept alive here)
        kernels.bind_attention(alone_query, keys, values, dim ** -0.5, 0.0, alone_out)(positions)
        assert torch.equal(whole_out[first : first + count], alone_out)
        assert torch.isnan(whole_out[:first]).all() and torch.isnan(whole_out[first + count :]).all()
    with pytest.raises(ValueError):
        kernels.bind_store_rows(new_keys, whole_cache)(0, 7, 2)
    with pytest.raises(ValueError):
        kernels.bind_attention(query, keys, values, 1.0, 0.0, whole_out)(_key_positions([(0, 1), (0, 2)], [[], []]),
                                                                          7)


@pytest.mark.parametrize("path", kernels.isas())
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 13])
@pytest.mark.parametrize("dim", [64, 256])  # 256: the Gemmas' head size
def test_long_contexts_span_key_blocks_and_rows_still_equal_their_own_calls(rows, path, dim):
    """Past 64 keys the kernel works in key blocks shared by a unit's heads and rows (one read of the cache per
    block); each row must still equal its own one-row call bit for bit, tree rows with gathered keys included, on
    every instruction-set path (each with its own order)."""
    kernels.force_isa(path)
    generator = torch.Generator().manual_seed(8)
    heads, kv_heads, cached = 9, 3, 301
    total = cached + rows + 4
    keys = torch.randn(kv_heads, total, dim, generator=generator)
    values = torch.randn(kv_heads, total, dim, generator=generator)
    query = torch.randn(rows, heads, dim, generator=generator)
    runs = [(0, cached + row + 1) for row in range(rows)]
    extras = [[cached + rows + 1, cached + rows + 3] if row % 2 else [] for row in range(rows)]  # tree-like rows
    out = kernels.attention(query, keys, values, _key_positions(runs, extras), dim ** -0.5)
    for row in range(rows):
        picked = torch.tensor([*range(*runs[row]), *extras[row]])
        expected = torch.nn.functional.scaled_dot_product_attention(
            query[row][:, None], keys[:, picked].repeat_interleave(3, 0), values[:, picked].repeat_interleave(3, 0),
            scale=dim ** -0.5)[:, 0]  # [heads, dim]
        assert torch.allclose(out[row], expected, atol=1e-5)
        alone = kernels.attention(query[row : row + 1], keys, values, _key_positions([runs[row]], [extras[row]]),
                                  dim ** -0.5)
        assert torch.equal(alone[0], out[row])


@pytest.mark.parametrize("path", kernels.isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [64, 128, 256])
def test_grouped_query_heads_equal_each_head_and_row_alone(path, dtype, dim):
    """On the 512-bit path the query heads of one key/value head in one row share each key and value load (up
    to 4 at a time, as many as fit in registers); every (row, head) must still equal the same head computed
    alone (a one-row, one-head call, which takes the one-item steps) bit for bit, whatever the group size, the
    rows, the threads and the tree rows' unequal key counts."""
    kernels.force_isa(path)
    generator = torch.Generator().manual_seed(16 + dim)
    cases = [(1, 1, 9), (1, 3, 1), (3, 3, 32), (2, 4, 5), (1, 5, 3), (2, 7, 2), (4, 1, 17), (3, 3, 16), (3, 3, 8)]
    for case, (kv_heads, group, rows) in enumerate(cases):
        heads, cached = kv_heads * group, [0, 5, 63, 64, 130, 301][case % 6]
        total = cached + rows + 8
        keys = torch.randn(kv_heads, total, dim, generator=generator).to(dtype)
        values = torch.randn(kv_heads, total, dim, generator=generator).to(dtype)
        query = torch.randn(rows, heads, dim, generator=generator)
        lengths = torch.randint(0, rows + 1, (rows,), generator=generator).tolist()
        runs = [(0, cached + (row + 1 if case % 2 else lengths[row]) or 1) for row in range(rows)]
        extras = [sorted(torch.randperm(rows + 8, generator=generator)[: row % 5].add(cached).tolist())
                  for row in range(rows)]  # tree rows: their own extra positions, unequal key counts
        kernels.set_threads(1 + case % 2)
        out = kernels.attention(query, keys, values, _key_positions(runs, extras), dim ** -0.5)
        for row in range(rows):
            positions = _key_positions([runs[row]], [extras[row]])
            for head in range(heads):
                kv = head // group
                alone = kernels.attention(query[row : row + 1, head : head + 1], keys[kv : kv + 1],
                                          values[kv : kv + 1], positions, dim ** -0.5)
                assert torch.equal(alone[0, 0], out[row, head]), (path, dtype, dim, case, row, head)


def test_a_tree_row_over_gathered_keys_equals_a_contiguous_row_with_the_same_keys():
    generator = torch.Generator().manual_seed(6)
    keys, values = torch.randn(2, 50, 16, generator=generator), torch.randn(2, 50, 16, generator=generator)
    query = torch.randn(1, 4, 16, generator=generator)
    tree = kernels.attention(query, keys, values, _key_positions([(0, 30)], [[33, 35, 36]]), 0.25)
    picked = torch.tensor([*range(30), 33, 35, 36])
    gathered_keys, gathered_values = keys[:, picked].contiguous(), values[:, picked].contiguous()
    chain = kernels.attention(query, gathered_keys, gathered_values, _key_positions([(0, 33)], [[]]), 0.25)
    assert torch.equal(tree, chain)
    # a window: a run that does not start at 0
    window = kernels.attention(query, keys, values, _key_positions([(10, 30)], [[]]), 0.25)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query[0][:, None], keys[:, 10:30].repeat_interleave(2, 0), values[:, 10:30].repeat_interleave(2, 0),
        scale=0.25)[:, 0]
    assert torch.allclose(window[0], expected, atol=1e-5)


def test_the_decoders_row_steps_match_torch():
    generator = torch.Generator().manual_seed(7)
    x, weight = torch.randn(3, 96, generator=generator), torch.randn(96, generator=generator)
    normed = kernels.rms_norm(x, weight, 1e-5)
    expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.allclose(normed, expected, atol=1e-5)

    heads, head_dim = 3, 16
    base = torch.randn(2, heads * head_dim, generator=generator)
    positions = torch.tensor([4, 9], dtype=torch.int32)
    freqs = torch.arange(12, dtype=torch.float32)[:, None] * (1.0 / 10000 ** (torch.arange(0, 16, 2) / 16))[None]
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    rotated = base.clone()
    kernels.rope(rotated, heads, head_dim, positions, cos, sin)
    heads_view = base.view(2, heads, head_dim)
    full_cos = torch.cat([cos, cos], -1)[positions.long()][:, None]  # [2, 1, 16]
    full_sin = torch.cat([sin, sin], -1)[positions.long()][:, None]
    half = head_dim // 2
    rotate_half = torch.cat([-heads_view[..., half:], heads_view[..., :half]], -1)
    assert torch.equal(rotated.view(2, heads, head_dim), heads_view * full_cos + rotate_half * full_sin)

    gate_up = torch.randn(4, 2 * 40, generator=generator) * 4
    act = kernels.silu_mul(gate_up)
    assert torch.allclose(act, torch.nn.functional.silu(gate_up[:, :40]) * gate_up[:, 40:], rtol=1e-5, atol=1e-6)


# -- elementwise steps: GeLU-tanh gating and soft-capping (gemma, gemma2, gemma3) -------------------------------

def _gelu_tanh_f64(x: torch.Tensor) -> torch.Tensor:
    """GeLU-tanh in float64, written as x * sigmoid(2u) (no cancellation for negative x)."""
    x = x.double()
    inner = (2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)
    return x * torch.sigmoid(2 * inner)


def _elementwise_values(count: int, seed: int, spread: float) -> torch.Tensor:
    """Random values, a sweep through the regions where the formulas switch, and special values."""
    generator = torch.Generator().manual_seed(seed)
    special = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30, float("inf"), -float("inf"), 0.625, -0.625])
    sweep = torch.linspace(-12, 12, 997) * spread / 4
    return torch.cat([torch.randn(count, generator=generator) * spread, sweep, special])


@pytest.mark.parametrize("path", kernels.isas())
def test_gelu_tanh_mul_is_the_float64_formula_and_torchs_gelu(path):
    kernels.force_isa(path)
    gate = _elementwise_values(3000, 9, 3.0)
    gate = gate[gate.isfinite() & (gate.abs() < 1e6)]
    ffn = gate.numel()
    up = torch.randn(ffn, generator=torch.Generator().manual_seed(10))
    out = kernels.gelu_tanh_mul(torch.cat([gate, up])[None])[0]
    expected = _gelu_tanh_f64(gate) * up.double()
    assert torch.allclose(out.double(), expected, rtol=2e-6, atol=1e-7)
    torchs = torch.nn.functional.gelu(gate, approximate="tanh") * up
    scale = gate.abs().clamp(min=1) * up.abs()
    assert bool(((out - torchs).abs() <= 1e-6 * scale).all())  # torch rounds 1 + tanh(u): ~1e-7 of |x| apart


@pytest.mark.parametrize("path", kernels.isas())
def test_soft_cap_is_the_float64_formula(path):
    kernels.force_isa(path)
    x = _elementwise_values(5000, 11, 40.0)
    for cap in (30.0, 50.0):
        out = kernels.soft_cap_(x.clone(), cap)
        expected = cap * torch.tanh(x.double() / cap)
        assert torch.allclose(out.double(), expected, rtol=1e-6, atol=0), cap  # ~3 ulp at worst
        assert torch.equal(out.abs() <= cap, torch.ones_like(out, dtype=torch.bool))
    assert kernels.soft_cap_(torch.tensor([float("nan")]), 30.0).isnan().all()


@pytest.mark.parametrize("ffn", [1, 7, 8, 1000, 1027])
def test_gelu_tanh_mul_rows_and_elements_do_not_depend_on_the_call_threads_or_path(ffn):
    """Row r of a call of n rows (1..32) is the same bits as row r alone, on 1 or 2 threads and on every path; and
    every element the same bits wherever it sits relative to a vector boundary (here: alone, in a 1-wide call)."""
    generator = torch.Generator().manual_seed(12)
    gate_up = torch.randn(32, 2 * ffn, generator=generator) * 3
    kernels.force_isa("portable")
    kernels.set_threads(1)
    alone = torch.cat([kernels.gelu_tanh_mul(gate_up[row : row + 1]) for row in range(32)])
    gate, up = gate_up[:, :ffn].reshape(-1, 1), gate_up[:, ffn:].reshape(-1, 1)
    one_by_one = kernels.gelu_tanh_mul(torch.cat([gate, up], 1)).reshape(32, ffn)  # every element in a masked tail
    assert torch.equal(one_by_one, alone)
    for path in kernels.isas():
        kernels.force_isa(path)
        for threads in (1, 2):
            kernels.set_threads(threads)
            for rows in (1, 2, 3, 5, 8, 13, 16, 31, 32):
                assert torch.equal(kernels.gelu_tanh_mul(gate_up[:rows]), alone[:rows]), (path, threads, rows)
            assert torch.equal(kernels.gelu_tanh_mul(torch.cat([gate, up], 1)).reshape(32, ffn), alone), path


@pytest.mark.parametrize("ffn", [7, 1027])
def test_silu_mul_rows_do_not_depend_on_the_call_or_threads(ffn):
    """On each path, row r of a call of n rows (the pool splits a block by rows) is the same bits as row r alone, on
    1 or 2 threads."""
    generator = torch.Generator().manual_seed(13)
    gate_up = torch.randn(16, 2 * ffn, generator=generator) * 3
    for path in kernels.isas():
        kernels.force_isa(path)
        kernels.set_threads(1)
        alone = torch.cat([kernels.silu_mul(gate_up[row : row + 1]) for row in range(16)])
        for threads in (1, 2):
            kernels.set_threads(threads)
            for rows in (2, 3, 8, 16):
                assert torch.equal(kernels.silu_mul(gate_up[:rows]), alone[:rows]), (path, threads, rows)


def test_soft_cap_elements_do_not_depend_on_the_call_threads_or_path():
    """Logits of 32 rows capped in one call: each row the same bits as alone, each element as alone, on every path
    and thread count (the pool splits the call into pieces; a vector loop takes its tail masked)."""
    vocab = 20011  # past one piece of the pool (16384)
    logits = torch.randn(32, vocab, generator=torch.Generator().manual_seed(13)) * 40
    kernels.force_isa("portable")
    kernels.set_threads(1)
    alone = torch.cat([kernels.soft_cap_(logits[row : row + 1].clone(), 30.0) for row in range(32)])
    single = torch.stack([kernels.soft_cap_(logits[0, i : i + 1].clone(), 30.0)[0] for i in range(0, vocab, 7)])
    assert torch.equal(single, alone[0, ::7])
    for path in kernels.isas():
        kernels.force_isa(path)
        for threads in (1, 2):
            kernels.set_threads(threads)
            for rows in (1, 2, 4, 7, 8, 16, 32):
                assert torch.equal(kernels.soft_cap_(logits[:rows].clone(), 30.0), alone[:rows]), (path, threads, rows)
            assert torch.equal(kernels.soft_cap_(logits[0, 5:].clone(), 30.0), alone[0, 5:]), path  # shifted by 5


def _capped_reference(query, keys, values, picked, scale, cap):
    """Eager soft-capped attention (transformers' gemma2) over the keys `picked`, float64: [heads, dim]."""
    group = query.shape[0] // keys.shape[0]
    k = keys[:, picked].double().repeat_interleave(group, 0)  # [heads, n, dim]
    v = values[:, picked].double().repeat_interleave(group, 0)
    scores = (query.double()[:, None] @ k.transpose(1, 2))[:, 0] * scale  # [heads, n]
    scores = cap * torch.tanh(scores / cap)
    return (torch.softmax(scores, -1)[:, None] @ v)[:, 0]


@pytest.mark.parametrize("path", kernels.isas())
@pytest.mark.parametrize("dim", [48, 64, 256])  # 48: the portable loop on every path
def test_soft_capped_attention_is_the_eager_formula_and_rows_equal_their_own_calls(path, dim):
    kernels.force_isa(path)
    generator = torch.Generator().manual_seed(14)
    heads, kv_heads, cached, rows = 8, 2, 90, 6
    total = cached + rows + 4
    keys = torch.randn(kv_heads, total, dim, generator=generator) * 2
    values = torch.randn(kv_heads, total, dim, generator=generator)
    query = torch.randn(rows, heads, dim, generator=generator) * 2
    runs = [(0, cached + row + 1) for row in range(rows)]
    extras = [[cached + rows + 1, cached + rows + 3] if row % 2 else [] for row in range(rows)]
    scale, cap = dim ** -0.5, 5.0  # a small cap, so that it bites
    positions = _key_positions(runs, extras)
    out = kernels.attention(query, keys, values, positions, scale, cap)
    uncapped = kernels.attention(query, keys, values, positions, scale)
    assert torch.equal(kernels.attention(query, keys, values, positions, scale, 0.0), uncapped)
    assert not torch.allclose(out, uncapped, atol=1e-3)
    for row in range(rows):
        picked = torch.tensor([*range(*runs[row]), *extras[row]])
        expected = _capped_reference(query[row], keys, values, picked, scale, cap)
        assert torch.allclose(out[row].double(), expected, atol=1e-5), (path, row)
        alone = kernels.attention(query[row : row + 1], keys, values, _key_positions([runs[row]], [extras[row]]),
                                  scale, cap)
        assert torch.equal(alone[0], out[row]), (path, row)


def test_qk_norm_of_every_row_in_one_call_equals_the_per_row_calls():
    """rms_norm_heads (each head of q or k in every row of the fused q/k/v rows, in place) is bit for bit what
    rms_norm computes head by head, row by row."""
    generator = torch.Generator().manual_seed(15)
    rows, heads, kv_heads, dim = 13, 4, 2, 256
    width = (heads + 2 * kv_heads) * dim
    qkv = torch.randn(rows, width, generator=generator) * 3
    q_weight, k_weight = torch.randn(dim, generator=generator), torch.randn(dim, generator=generator)
    expected = qkv.clone()
    q_columns, k_columns = slice(0, heads * dim), slice(heads * dim, (heads + kv_heads) * dim)
    for row in range(rows):  # each row's heads as the rows of one rms_norm call, in place
        q_heads, k_heads = expected[row, q_columns].view(heads, dim), expected[row, k_columns].view(kv_heads, dim)
        kernels.rms_norm(q_heads, q_weight, 1e-6, out=q_heads)
        kernels.rms_norm(k_heads, k_weight, 1e-6, out=k_heads)
    ours = qkv.clone()
    kernels.rms_norm_heads(ours[:, q_columns], dim, q_weight, 1e-6)
    kernels.rms_norm_heads(ours[:, k_columns], dim, k_weight, 1e-6)
    assert torch.equal(ours, expected)
    heads_view = qkv[:, : heads * dim].view(rows, heads, dim)
    reference = q_weight * (heads_view * torch.rsqrt(heads_view.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.allclose(ours[:, : heads * dim].view(rows, heads, dim), reference, atol=1e-5)


def test_a_partial_rotary_in_the_kernel_is_torchs_elementwise_formula_bit_for_bit():
    generator = torch.Generator().manual_seed(16)
    rows, heads, dim, half = 5, 3, 32, 8  # rotates the first 16 of each head's 32 dimensions
    base = torch.randn(rows, heads * dim + 7, generator=generator)  # a row stride past the heads
    positions = torch.tensor([3, 4, 5, 9, 11], dtype=torch.int32)
    freqs = torch.arange(16, dtype=torch.float32)[:, None] * (1.0 / 10000 ** (torch.arange(0, 16, 2) / 16))[None]
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()  # [positions, half]
    rotated = base.clone()
    kernels.rope(rotated, heads, dim, positions, cos, sin)  # half = the tables' width
    expected = base.clone()
    view = expected[:, : heads * dim].view(rows, heads, dim)
    c, s = cos[positions.long()][:, None], sin[positions.long()][:, None]
    first, second = view[..., :half].clone(), view[..., half : 2 * half].clone()
    view[..., :half] = first * c - second * s
    view[..., half : 2 * half] = second * c + first * s
    assert torch.equal(rotated, expected)
    wide = torch.zeros(16, dim)  # tables turning 2 * dim dimensions of a head of dim
    with pytest.raises(ValueError):
        kernels.rope(rotated, heads, dim, positions, wide, wide)
