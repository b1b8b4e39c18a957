"""The kernels' typed facade (specdec_cli/kernels/): the only door to the C extension, and one that refuses what
the C code would read blindly (a wrong dtype, shape, stride or device) with a ValueError instead of a crash."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from specdec_cli import kernels

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")


def _extension_uses(path: Path) -> list[str]:
    """Where a file imports the C extension or reaches into it (`_cpu`, `kernels._require`), as 'line: what'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "_cpu" for alias in node.names):
            found.append(f"{node.lineno}: from {node.module or '.'} import _cpu")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_cpu"):
            found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import) and any(alias.name.endswith("_cpu") for alias in node.names):
            found.append(f"{node.lineno}: import ..._cpu")
        elif isinstance(node, ast.Attribute) and node.attr in ("_cpu", "_require"):
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id == "_cpu":
            found.append(f"{node.lineno}: _cpu")
    return found


def test_no_module_outside_the_facade_touches_the_c_extension():
    files = [*sorted((ROOT / "specdec_cli").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py")),
             *sorted((ROOT / "tests").glob("test_*.py"))]
    facade = ROOT / "specdec_cli" / "kernels"
    offenders = {str(path.relative_to(ROOT)): uses for path in files
                 if facade not in path.parents and path != Path(__file__).resolve() and (uses := _extension_uses(path))}
    assert not offenders, offenders
    assert _extension_uses(facade / "__init__.py")  # (the scan does see the facade's own uses)


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="meta")


def test_matmul_refuses_what_the_kernel_cannot_read():
    records = kernels.pack_records(kernels.KIND_Q8, torch.zeros(32, 64, dtype=torch.uint8) + 128,
                                   torch.ones(32, 2))  # 32 columns, k = 64
    x = torch.randn(3, 64)
    assert kernels.matmul(x, kernels.KIND_Q8, records).shape == (3, 32)
    wrong = [
        dict(x=x.double()),  # float64 rows
        dict(x=x[0]),  # one dimension
        dict(x=_meta(3, 64)),  # not on the CPU
        dict(records=records[:, :-1]),  # another record size
        dict(records=records.float()),  # not bytes
        dict(records=records.t()),  # not contiguous
        dict(out=torch.empty(3, 40)),  # wider than the records' columns
        dict(out=torch.empty(2, 32)),  # fewer rows than x
        dict(out=torch.empty(32, 3).t()),  # columns not side by side
        dict(out=torch.empty(3, 32, dtype=torch.bfloat16)),
        dict(accumulate=True),  # nothing to add to
    ]
    for change in wrong:
        arguments = dict(x=x, records=records, out=None, accumulate=False)
        arguments.update(change)
        with pytest.raises(ValueError, match="matmul"):
            kernels.matmul(arguments["x"], kernels.KIND_Q8, arguments["records"], out=arguments["out"],
                           accumulate=arguments["accumulate"])
    with pytest.raises(ValueError, match="unknown block kind"):
        kernels.matmul(x, 99, records)


def test_attention_refuses_mismatched_heads_dtypes_and_key_positions():
    rows, heads, kv_heads, dim, positions = 2, 4, 2, 16, 10
    query, keys, values = torch.randn(rows, heads, dim), torch.randn(kv_heads, positions, dim), \
        torch.randn(kv_heads, positions, dim)
    starts, stops = torch.zeros(rows, dtype=torch.int32), torch.tensor([9, 10], dtype=torch.int32)
    extra_start, extra_pos = torch.zeros(rows + 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)
    keys_of_rows = kernels.KeyPositions(starts, stops, extra_start, extra_pos)
    assert kernels.attention(query, keys, values, keys_of_rows, 0.25).shape == (rows, heads, dim)
    assert kernels.attention(query, keys[None], values[None], keys_of_rows, 0.25).shape == (rows, heads, dim)  # a cache
    good = [query, keys, values, keys_of_rows]
    wrong = {
        0: [query.double(), query[:, :, :8], query.transpose(1, 2), _meta(rows, heads, dim), query[:1]],
        1: [keys.bfloat16(), keys[:, :, :8], torch.randn(3, positions, dim), torch.randn(2, kv_heads, positions, dim)],
        2: [values[:, :5], values.transpose(1, 2).contiguous().transpose(1, 2)[:, :, :8]],
        3: [(starts, stops, extra_start, extra_pos)],  # positions not checked as KeyPositions
    }
    for place, tensors in wrong.items():
        for tensor in tensors:
            arguments = list(good)
            arguments[place] = tensor
            with pytest.raises(ValueError, match="attention"):
                kernels.attention(*arguments, 0.25)
    with pytest.raises(ValueError, match="attention: out"):
        kernels.attention(*good, 0.25, out=torch.empty(rows, heads * dim))
    for parts in ((starts.long(), stops, extra_start, extra_pos), (starts[:1], stops, extra_start, extra_pos),
                  (starts, torch.tensor([9.0, 10.0]), extra_start, extra_pos), (starts, stops, extra_start[:rows],
                                                                                extra_pos),
                  (starts, stops, extra_start, torch.zeros(2, 1, dtype=torch.int32)),
                  (starts, stops, torch.zeros(2 * rows + 2, dtype=torch.int32)[::2], extra_pos)):
        with pytest.raises(ValueError, match="KeyPositions"):
            kernels.KeyPositions(*parts)


def test_a_checked_matrix_multiplies_rows_as_matmul_does_and_refuses_others():
    codes, scales = torch.randint(0, 256, (40, 64), dtype=torch.uint8), torch.rand(40, 2)
    records = kernels.pack_records(kernels.KIND_Q8, codes, scales)
    matrix = kernels.BlockMatrix(kernels.KIND_Q8, records, 64, 40)
    x = torch.randn(3, 64)
    wide = torch.zeros(3, 50)
    kernels.matmul_into(x, matrix, wide[:, 5:45])
    assert torch.equal(wide[:, 5:45], kernels.matmul(x, kernels.KIND_Q8, records, 40))
    for call in (lambda: kernels.BlockMatrix(kernels.KIND_Q8, records, 96, 40),
                 lambda: kernels.BlockMatrix(kernels.KIND_Q8, records, 64, 50),
                 lambda: kernels.BlockMatrix(kernels.KIND_Q8, records.t(), 64, 40),
                 lambda: kernels.matmul_into(x[:, :32], matrix, torch.empty(3, 40)),
                 lambda: kernels.matmul_into(x, matrix, torch.empty(3, 41)),
                 lambda: kernels.matmul_into(x, matrix, torch.empty(2, 40)),
                 lambda: kernels.matmul_into(x.t().contiguous().t(), matrix, torch.empty(3, 40)),
                 lambda: kernels.matmul_into(x, (kernels.KIND_Q8, records), torch.empty(3, 40))):
        with pytest.raises(ValueError):
            call()


def test_the_decoders_steps_refuse_wrong_shapes_and_dtypes():
    x, weight = torch.randn(3, 32), torch.randn(32)
    for call in (lambda: kernels.rms_norm(x.double(), weight, 1e-6),
                 lambda: kernels.rms_norm(x, weight[:16], 1e-6),
                 lambda: kernels.rms_norm(x, weight, 1e-6, out=torch.empty(3, 16)),
                 lambda: kernels.rms_norm(x.t(), weight, 1e-6),
                 lambda: kernels.rms_norm_heads(x, 12, torch.randn(12), 1e-6),  # 32 is not whole heads of 12
                 lambda: kernels.rms_norm_heads(x, 16, weight, 1e-6),
                 lambda: kernels.silu_mul(torch.randn(3, 33)),
                 lambda: kernels.silu_mul(x, out=torch.empty(3, 15)),
                 lambda: kernels.gelu_tanh_mul(x.bfloat16()),
                 lambda: kernels.soft_cap_(x.half(), 30.0),
                 lambda: kernels.soft_cap_(x.t(), 30.0)):
        with pytest.raises(ValueError):
            call()
    cos = sin = torch.randn(8, 4)
    positions = torch.tensor([1, 2, 3], dtype=torch.int32)
    kernels.rope(x.clone(), 2, 16, positions, cos, sin)
    for call in (lambda: kernels.rope(x, 3, 16, positions, cos, sin),  # more heads than the row holds
                 lambda: kernels.rope(x, 2, 16, positions.long(), cos, sin),
                 lambda: kernels.rope(x, 2, 16, positions[:2], cos, sin),
                 lambda: kernels.rope(x, 2, 16, positions, cos, sin[:, :2]),
                 lambda: kernels.rope(x, 2, 16, positions, torch.randn(8, 9), torch.randn(8, 9))):  # half past 16/2
        with pytest.raises(ValueError, match="rope"):
            call()
    cache = torch.zeros(1, 2, 5, 16)
    kernels.store_rows(x, cache, 2)
    assert torch.equal(cache[0, :, 2:5], x.view(3, 2, 16).transpose(0, 1))
    for call in (lambda: kernels.store_rows(x, cache, 3),  # past the cache's 5 positions
                 lambda: kernels.store_rows(x, torch.zeros(1, 3, 5, 16), 0),
                 lambda: kernels.store_rows(x, cache.half(), 0),  # float16: not a cache the attention reads
                 lambda: kernels.store_rows(x[:, :30], cache, 0)):
        with pytest.raises(ValueError, match="store_rows"):
            call()


def test_rows_stored_in_a_bfloat16_cache_are_rounded_as_torch_rounds():
    """A bfloat16 KV cache (the native decoder's default) holds each value as torch's float32 -> bfloat16 conversion
    gives it: rounded to the nearest, ties to even (both ways), infinities kept, a NaN still a NaN."""
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F807FFF, 0x7F7FFFFF, 0xFF800000, 0x00000001,
                         0x80008000], dtype=torch.int64).to(torch.int32)  # ties (even, odd), near ties, max, -inf, tiny
    values = torch.cat([bits.view(torch.float32), torch.randn(24, generator=torch.Generator().manual_seed(3))])
    rows = values.view(2, 16)  # 2 rows of 1 head x 16
    cache = torch.zeros(1, 1, 4, 16, dtype=torch.bfloat16)
    kernels.store_rows(rows, cache, 1)
    assert torch.equal(cache[0, 0, 1:3].view(torch.int16), rows.to(torch.bfloat16).view(torch.int16))
    assert not cache[0, 0, 0].any() and not cache[0, 0, 3].any()  # nothing else written
    with_nan = rows.clone()
    with_nan[0, 5] = float("nan")
    kernels.store_rows(with_nan, cache, 0)
    assert torch.isnan(cache[0, 0, 0, 5]) and torch.equal(cache[0, 0, 1], rows[1].to(torch.bfloat16))


def test_checked_rows_and_dense_give_what_tensors_give_and_refuse_the_same():
    """A decoding step checks its buffers once (kernels.Rows, kernels.Dense) and hands those to every call: the
    results are the tensors' calls' bit for bit, and what a tensor call refuses, making the handle refuses."""
    x, weight = torch.randn(3, 32), torch.randn(32)
    wide = torch.zeros(3, 40)
    out = kernels.Rows(wide[:, 4:36])  # a slice of a wider buffer: strided rows
    returned = kernels.rms_norm(kernels.Rows(x), kernels.Dense(weight), 1e-6, out=out)
    assert returned is out.tensor and torch.equal(wide[:, 4:36], kernels.rms_norm(x, weight, 1e-6))
    gate_up = torch.randn(3, 64)
    assert torch.equal(kernels.silu_mul(kernels.Rows(gate_up), out=kernels.Rows(torch.empty(3, 32))),
                       kernels.silu_mul(gate_up))
    rotated, expected = x.clone(), x.clone()
    cos, sin, positions = torch.randn(8, 4), torch.randn(8, 4), torch.tensor([1, 2, 3], dtype=torch.int32)
    kernels.rope(kernels.Rows(rotated), 2, 16, kernels.Dense(positions, torch.int32), kernels.Dense(cos),
                 kernels.Dense(sin))
    kernels.rope(expected, 2, 16, positions, cos, sin)
    assert torch.equal(rotated, expected)
    for call in (lambda: kernels.Rows(x.double()), lambda: kernels.Rows(x.t()), lambda: kernels.Rows(x[0]),
                 lambda: kernels.Rows(_meta(3, 32)), lambda: kernels.Dense(x.t()),
                 lambda: kernels.Dense(positions, torch.float32), lambda: kernels.Dense(positions.long(), torch.int32),
                 lambda: kernels.rms_norm(kernels.Rows(x), kernels.Dense(weight[:16]), 1e-6),
                 lambda: kernels.rms_norm(kernels.Rows(x), weight, 1e-6, out=kernels.Rows(torch.empty(2, 32))),
                 lambda: kernels.silu_mul(kernels.Rows(wide[:, 4:36])),  # rows not contiguous
                 lambda: kernels.rope(kernels.Rows(x), 2, 16, kernels.Dense(positions[:2], torch.int32), cos, sin)):
        with pytest.raises(ValueError):
            call()
