"""specdec's CPU kernels from Python: block-quantised matmuls and row-invariant attention (`_cpu.c`, `csrc/`).

`matmul` multiplies float32 rows by a weight held as records of 16 output columns in one of a small set of kinds
(`KINDS`): 4-bit or 8-bit codes with a float32 scale per 32 or 16 weights, an integer zero point and optionally a
float32 offset, into which quant.py repacks every GGUF type exactly (Q4_0 ... Q8_0, the K-quants, IQ4_NL/IQ4_XS), or the
packed kinds that keep a GGUF type's own fields (packed.py); or float32/float16/bfloat16 weights as they are. Block
kinds round each row to 8 bits per block of 32 (per 256 for the K-quants' and Q6_K's packed kinds, records.Kind.span)
first and multiply with integer dot products. `attention` computes each query row over its own keys (a float32 or
bfloat16 cache, filled by `store_rows`). Both return, for every row, exactly what a one-row call returns, whatever the
number of rows or threads, and matmul the same bits on every instruction-set path (csrc/matmul.c says how); `force_isa`
(or SPECDEC_ISA) picks a path for tests and timings. This module is the only door to the C extension: every call takes
tensors (or handles checked once when made: handles.py's Rows, Dense, BlockMatrix, KeyPositions) and checks what the C
code cannot (dtypes, devices, shapes, strides), raising a ValueError before C could misread a pointer; it owns the
worker threads' count. records.py and packed.py pack and unpack the records. None of them knows about models, GGUF files
or `--weights` (quant.py does). Beside them, not imported here: triton_layout.py, triton_gemm.py and triton_words_*.py:
the device engine's GEMMs at a GGUF's bits (Triton).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Optional, Sequence

import torch

from .handles import F32, I32, U8, BlockMatrix, Dense, KeyPositions, Rows, as_dense, as_rows, refuse
from .packed import KIND_OF_GGUF_TYPE, PACKED, Fields, pack_fields, unpack_fields
from .records import (
    BLOCK,
    GROUP,
    KIND_BF16,
    KIND_F16,
    KIND_F32,
    KIND_Q2S,
    KIND_Q4,
    KIND_Q4S,
    KIND_Q4Z,
    KIND_Q8,
    KIND_Q8S,
    KIND_U8,
    KINDS,
    PACKED_KINDS,
    Kind,
    dequantize,
    groups,
    kind_of,
    pack_records,
    record_bytes,
    select_columns,
    unpack_records,
)

__all__ = [  # the records' layout (records.py), and the typed calls into the C extension (here)
    "BLOCK", "GROUP", "KIND_BF16", "KIND_F16", "KIND_F32", "KIND_Q2S", "KIND_Q4", "KIND_Q4S", "KIND_Q4Z", "KIND_Q8",
    "KIND_Q8S", "KIND_U8", "KINDS", "PACKED_KINDS", "PACKED", "Fields", "KIND_OF_GGUF_TYPE", "pack_fields",
    "unpack_fields", "repack_gguf", "Kind", "dequantize", "groups", "kind_of", "pack_records", "record_bytes",
    "select_columns", "unpack_records", "MAX_THREADS", "available", "isa", "isas", "force_isa", "set_threads",
    "threads", "ensure_threads", "Rows", "Dense", "BlockMatrix", "matmul_into", "matmul", "KeyPositions", "attention",
    "rms_norm", "rms_norm_heads", "rope", "store_rows", "silu_mul", "gelu_tanh_mul", "soft_cap_", "peak", "build_file",
    "bind_matmul", "bind_rms_norm", "bind_silu_mul", "bind_attention", "bind_store_rows", "bind_rope",
]

MAX_THREADS = 64  # the pool's limit (MAX_THREADS in csrc/kernels.h)

try:  # built by `pip install` (setup.py); absent in a source tree nobody built
    from . import _cpu  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised only without a compiler
    _cpu = None

if _cpu is not None and os.environ.get("SPECDEC_ISA", "").strip():  # e.g. SPECDEC_ISA=avx2 to time that path
    try:
        _cpu.set_isa(os.environ["SPECDEC_ISA"].strip())
    except ValueError as exc:
        import warnings

        warnings.warn(f"SPECDEC_ISA ignored: {exc}", stacklevel=1)


def available() -> bool:
    """Whether the compiled kernels are importable."""
    return _cpu is not None


def isa() -> str:
    """The kernels' instruction set: avx512vnni, avxvnni, avx2 or portable (the best here, or force_isa's)."""
    return _cpu.isa() if _cpu is not None else "missing"


def build() -> str:  # the compiled extension's size and time: a rebuilt one measures its own cost curve
    return "missing" if _cpu is None else "{0.st_size}-{0.st_mtime_ns}".format(os.stat(_cpu.__file__))


def isas() -> list[str]:
    """The instruction-set paths this CPU can run, best last (empty when not compiled)."""
    return list(_cpu.isas()) if _cpu is not None else []


def force_isa(name: Optional[str]) -> None:
    """Run the kernels on path `name` (one of `isas()`; SPECDEC_ISA too), or the best with None: the same results."""
    _require().set_isa(name or "best")


def _require() -> Any:
    """The compiled extension, or a SpecdecError saying how to build it."""
    if _cpu is None:
        from ..errors import SpecdecError

        raise SpecdecError("specdec's CPU kernels (specdec_cli.kernels._cpu) are not compiled: run `pip install -e .`")
    return _cpu


def set_threads(count: int) -> None:
    """Threads the kernels split their work over, the calling thread included (at most MAX_THREADS)."""
    _require().set_threads(max(1, min(int(count), MAX_THREADS)))


def threads() -> int:
    return int(_require().threads())


_threads_chosen = False


def ensure_threads() -> None:
    """Before the first kernel call: as many threads as torch uses (`--threads` sets both)."""
    global _threads_chosen
    if not _threads_chosen:
        _threads_chosen = True
        if _cpu is not None and _cpu.threads() == 1 and torch.get_num_threads() > 1:
            _cpu.set_threads(torch.get_num_threads())


# -- the C calls, typed ---------------------------------------------------------------------------------------------
# Every call into _cpu goes through the functions below: they take tensors, check what C reads blindly (dtype,
# device, dimensions, unit stride along a row, shapes that agree) and raise ValueError naming the kernel and the
# argument. Values (rotary positions, key positions) are the caller's to keep in range. A tensor's checks cost 1-2 us
# a call; a step's 300-odd calls take handles checked once (Rows, Dense) and `bind_*` forms, checked once, that
# return the call bound to the buffers a step keeps (native.py); what changes between calls is checked at each.


def matmul_into(x: "torch.Tensor | Rows", matrix: BlockMatrix, out: "torch.Tensor | Rows",
                accumulate: bool = False) -> torch.Tensor:
    """out (+)= x @ W^T: x contiguous float32 [rows, k], out float32 [rows, n] (rows may be strided: a slice of a
    wider buffer), each a tensor or a checked Rows; W a checked BlockMatrix (matmul's product, with the records
    checked once). Returns out's tensor."""
    out = as_rows(out, "matmul_into", "out")
    bind_matmul(x, matrix, out, accumulate)()
    return out.tensor


def bind_matmul(x: "torch.Tensor | Rows", matrix: BlockMatrix, out: "torch.Tensor | Rows",
                accumulate: bool = False) -> Callable[[], Any]:
    """matmul_into's call on these buffers, checked now: calling it computes out (+)= x @ W^T on what they hold
    then (a decoding step repeats its calls on the buffers it keeps: native.py). The caller keeps x's and out's
    tensors alive, unmoved, while it holds the call."""
    kernel = _require()
    if type(matrix) is not BlockMatrix:
        raise refuse("matmul_into", f"the weight must be a BlockMatrix, got {type(matrix).__name__}")
    x, out = as_rows(x, "matmul_into", "x"), as_rows(out, "matmul_into", "out")
    if not x.contiguous:
        raise refuse("matmul_into", "x must be contiguous rows [rows, k]", x.tensor)
    if x.width != matrix.k or out.width != matrix.n or out.rows != x.rows:
        raise refuse("matmul_into", f"x [rows, {matrix.k}] and out [rows, {matrix.n}] must have the same rows",
                      out.tensor)
    if not x.rows:
        return _nothing
    return functools.partial(kernel.matmul, matrix.kind, x.address, x.rows, x.width, matrix.n, matrix._address,
                             out.address, out.row_stride, accumulate)


def _nothing() -> None:
    return None


def matmul(x: torch.Tensor, kind: int, records: torch.Tensor, n: Optional[int] = None,
           out: Optional[torch.Tensor] = None, accumulate: bool = False) -> torch.Tensor:
    """x [rows, k] float32 @ W^T -> [rows, n] float32, W as packed records (pack_records; n defaults to every
    column the records hold, or to out's width). Block kinds round each row of x to 8 bits per `span` inputs first
    (kernels/csrc/blocks.c). With `out` (float32 [rows, n], rows may be strided: a slice of a wider buffer) the
    product is written there, or added to it with `accumulate`; returns out. matmul_into's checks, on handles made
    here."""
    if x.dtype is not F32 or not x.is_cpu or x.ndim != 2:
        raise refuse("matmul", "x must be float32 CPU rows [rows, k]", x)
    x = x.contiguous()
    if out is None:
        if accumulate:
            raise refuse("matmul", "accumulate needs an out to add to")
        out = torch.empty(x.shape[0], records.shape[0] * GROUP if n is None else int(n), dtype=torch.float32)
    elif n is not None and out.ndim == 2 and out.shape[1] != n:
        raise refuse("matmul", f"out must be [{x.shape[0]}, {n}]", out)
    target = Rows(out, "matmul", "out")
    try:
        matrix = BlockMatrix(kind, records, x.shape[1], target.width)
    except ValueError as exc:
        raise ValueError(str(exc).replace("BlockMatrix:", "matmul:", 1)) from None
    return matmul_into(x, matrix, target, accumulate)


def repack_gguf(kind: int, rows: Any, k: int) -> torch.Tensor:
    """A GGUF tensor's rows (a uint8 numpy array or tensor [n, bytes per row], ggml's blocks as they lie in the
    file; a read-only view of the mapped file will do) as records of the packed kind for that type (csrc/repack.c;
    the same bytes packed.pack_fields makes of the rows' fields). Raises ArithmeticError naming the first row whose
    scale (d, m or dmin) is NaN or infinite."""
    import numpy as np

    kernel = _require()
    if isinstance(rows, torch.Tensor):
        if rows.ndim != 2:
            raise refuse("repack_gguf", "rows must be a contiguous uint8 CPU matrix [n, bytes per row]", rows)
        address, (n, width) = Dense(rows, U8, "repack_gguf", "rows").address, rows.shape
    elif isinstance(rows, np.ndarray) and rows.dtype == np.uint8 and rows.ndim == 2 and rows.flags.c_contiguous:
        address, (n, width) = rows.ctypes.data, rows.shape
    else:
        raise refuse("repack_gguf", "rows must be a contiguous uint8 matrix [n, bytes per row]")
    records = torch.empty(groups(n), record_bytes(kind, k), dtype=torch.uint8)
    kernel.repack_gguf(kind, address, n, width, k, records.data_ptr())
    return records


def attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: KeyPositions, scale: float,
              cap: float = 0.0, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Each query row attends to its own keys (`positions`: KeyPositions). cap > 0 soft-caps the scores
    (score * scale) before the softmax: cap * tanh(score / cap) (gemma2).

    query [rows, heads, dim] float32 (any strides, unit stride along dim); keys/values [kv_heads, positions, dim]
    or [1, kv_heads, positions, dim] (a KV cache's buffers), float32 or bfloat16, unit stride along dim. Writes
    [rows, heads, dim] float32 into `out` (unit stride along dim) or a new tensor, and returns it."""
    out = torch.empty(query.shape, dtype=torch.float32) if out is None else out  # (bind_attention checks query)
    bind_attention(query, keys, values, scale, cap, out)(positions)
    return out


def bind_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, cap: float,
                   out: Optional[torch.Tensor]) -> "BoundAttention":
    """attention's call on these buffers, checked now (as bind_matmul): calling it with a row's KeyPositions
    computes out on what the buffers hold then."""
    kernel = _require()
    if query.dtype is not F32 or not query.is_cpu or query.ndim != 3 or query.stride()[2] != 1:
        raise refuse("attention", "query must be float32 CPU [rows, heads, dim] with unit stride along dim", query)
    rows, heads, dim = query.shape
    key_strides, value_strides = keys.stride(), values.stride()
    key_shape = keys.shape
    if (keys.dtype not in (F32, torch.bfloat16) or values.dtype is not keys.dtype or not keys.is_cpu or
            not values.is_cpu or key_shape != values.shape or key_shape[-1] != dim or key_strides[-1] != 1 or
            value_strides[-1] != 1 or not (len(key_shape) == 3 or (len(key_shape) == 4 and key_shape[0] == 1))):
        raise refuse("attention", f"keys and values must be float32 or bfloat16 CPU [(1,) kv_heads, positions, {dim}] "
                      "alike with unit stride along dim", values)
    kv_heads = key_shape[-3]
    if heads % kv_heads:
        raise refuse("attention", f"{heads} query heads do not share {kv_heads} key/value heads evenly")
    if out is None or out.dtype is not F32 or not out.is_cpu or out.shape != query.shape or out.stride()[2] != 1:
        raise refuse("attention", f"out must be float32 CPU [{rows}, {heads}, {dim}] with unit stride along dim", out)
    out_strides, query_strides = out.stride(), query.stride()
    before = (rows, heads, kv_heads, dim, query.data_ptr(), query_strides[0], query_strides[1], keys.data_ptr(),
              values.data_ptr(), keys.dtype is torch.bfloat16, key_strides[-3], key_strides[-2], value_strides[-3],
              value_strides[-2])
    after = (float(scale), out.data_ptr(), out_strides[0], out_strides[1], float(cap))

    return BoundAttention(kernel, rows, before, after)


class BoundAttention:
    """`bind_attention`'s call: with KeyPositions for query rows from `first` (default: all) it computes out on
    what the buffers hold then; `arguments` are the kernel's for them (`attention_many` passes several at once)."""

    def __init__(self, kernel: Any, rows: int, before: tuple, after: tuple):
        self.kernel, self.rows, self.before, self.after = kernel, rows, before, after

    def arguments(self, positions: KeyPositions, first: int = 0) -> tuple:
        if type(positions) is not KeyPositions or first < 0 or first + positions.rows > self.rows:
            raise refuse("attention", f"positions must be KeyPositions of rows from `first` within {self.rows}")
        before, after = self.before, self.after
        if first or positions.rows != self.rows:  # the rows from `first`: query's and out's addresses moved on
            before = (positions.rows, *before[1:4], before[4] + 4 * first * before[5], *before[5:])
            after = (after[0], after[1] + 4 * first * after[2], *after[2:])
        return (*before, *positions._addresses, *after)

    def __call__(self, positions: KeyPositions, first: int = 0) -> None:
        self.kernel.attention(*self.arguments(positions, first))


def attention_many(calls: Sequence[tuple[BoundAttention, KeyPositions, int]]) -> None:
    """Bound attention calls (`bind_attention`'s, each with its rows' KeyPositions and first query row: a batched
    step's sequences, each over its own cache), each computed as alone (the same bits), their work given to the
    kernels' threads in one call (a call of the pool each was half a one-row attention's time). Positions are read
    now: the KeyPositions must stay alive until this returns."""
    _require().attention_many(tuple(attend.arguments(positions, first) for attend, positions, first in calls))


def rms_norm(x: "torch.Tensor | Rows", weight: "torch.Tensor | Dense", eps: float,
             out: "torch.Tensor | Rows | None" = None) -> torch.Tensor:
    """RMSNorm of each row: out = weight * x / sqrt(mean(x^2) + eps). x, out float32 [rows, dim] (rows may be
    strided; out may be x), tensors or Rows; weight float32 [dim]. Returns out's tensor (a new one if not given)."""
    x = as_rows(x, "rms_norm", "x")
    out = Rows(torch.empty(x.rows, x.width, dtype=torch.float32)) if out is None else as_rows(out, "rms_norm", "out")
    bind_rms_norm(x, weight, eps, out)()
    return out.tensor


def bind_rms_norm(x: "torch.Tensor | Rows", weight: "torch.Tensor | Dense", eps: float,
                  out: "torch.Tensor | Rows") -> Callable[[], Any]:
    """rms_norm's call on these buffers, checked now (as bind_matmul)."""
    kernel = _require()
    x, weight = as_rows(x, "rms_norm", "x"), as_dense(weight, "rms_norm", "weight")
    if weight.shape != (x.width,):
        raise refuse("rms_norm", f"weight must be [{x.width}]", weight.tensor)
    out = as_rows(out, "rms_norm", "out")
    if out.rows != x.rows or out.width != x.width:
        raise refuse("rms_norm", f"out must be [{x.rows}, {x.width}]", out.tensor)
    return functools.partial(kernel.rms_norm, x.address, x.rows, x.width, x.row_stride, weight.address, float(eps),
                             out.address, out.row_stride)


def rms_norm_heads(x: "torch.Tensor | Rows", head_dim: int, weight: "torch.Tensor | Dense", eps: float) -> None:
    """In place: RMSNorm of each head of head_dim in every row of x [rows, heads * head_dim] (float32, rows may be
    strided: q's or k's columns of fused q/k/v rows), each head as rms_norm computes it (QK-norm)."""
    kernel = _require()
    x, weight = as_rows(x, "rms_norm_heads", "x"), as_dense(weight, "rms_norm_heads", "weight")
    if x.width % head_dim:
        raise refuse("rms_norm_heads", f"x must hold whole heads of {head_dim}", x.tensor)
    if weight.shape != (head_dim,):
        raise refuse("rms_norm_heads", f"weight must be [{head_dim}]", weight.tensor)
    kernel.rms_norm_heads(x.address, x.rows, x.row_stride, x.width // head_dim, head_dim, weight.address, float(eps))


def rope(x: "torch.Tensor | Rows", heads: int, head_dim: int, positions: "torch.Tensor | Dense",
         cos: "torch.Tensor | Dense", sin: "torch.Tensor | Dense") -> None:
    """In place: the rotary embedding (rotate-half) of the first `heads` heads of each row of x [rows, width]
    (float32, rows may be strided), row r at positions[r] (int32 [rows]); cos/sin float32 [positions, half] tables
    turn the first 2 * half dimensions of each head (half < head_dim / 2: a partial rotary). Positions must lie
    within the tables."""
    bind_rope(x, heads, head_dim, positions, cos, sin)()


def bind_rope(x: "torch.Tensor | Rows", heads: int, head_dim: int, positions: "torch.Tensor | Dense",
              cos: "torch.Tensor | Dense", sin: "torch.Tensor | Dense") -> Callable[[], Any]:
    """rope's call on these buffers, checked now (as bind_matmul)."""
    kernel = _require()
    x = as_rows(x, "rope", "x")
    if x.width < heads * head_dim:
        raise refuse("rope", f"x must hold {heads} heads of {head_dim} a row", x.tensor)
    positions = as_dense(positions, "rope", "positions", I32)
    if positions.shape != (x.rows,):
        raise refuse("rope", f"positions must be [{x.rows}]", positions.tensor)
    cos, sin = as_dense(cos, "rope", "cos"), as_dense(sin, "rope", "sin")
    table = cos.shape
    if len(table) != 2 or sin.shape != table or 2 * table[1] > head_dim:
        raise refuse("rope", f"cos and sin must be [positions, half] alike, half <= {head_dim // 2}", sin.tensor)
    return functools.partial(kernel.rope, x.address, x.rows, x.row_stride, heads, head_dim, positions.address,
                             cos.address, sin.address, table[1])


def store_rows(rows: "torch.Tensor | Rows", cache: torch.Tensor, start: int) -> None:
    """Rows [n, heads * dim] (float32, strided: k or v of q|k|v) into an f32/bf16 cache [(1,) heads, capacity, dim]."""
    bind_store_rows(rows, cache)(start)


def bind_store_rows(rows: "torch.Tensor | Rows", cache: torch.Tensor) -> Callable[..., None]:
    """store_rows's call on these buffers, checked now (as bind_matmul): `store(start, first=0, count=all)` copies
    what rows first .. first + count - 1 hold then to positions start .., checked to lie within both."""
    kernel, rows, shape, strides = _require(), as_rows(rows, "store_rows", "rows"), cache.shape, cache.stride()
    if (cache.dtype not in (F32, torch.bfloat16) or not cache.is_cpu or strides[-1] != 1 or
            shape[-3] * shape[-1] != rows.width or not (len(shape) == 3 or (len(shape) == 4 and shape[0] == 1))):
        raise refuse("store_rows", "cache must be a float32 or bfloat16 CPU buffer [(1,) heads, capacity, dim] for "
                      f"rows of {rows.width}", cache)
    held, capacity, address, row_stride = rows.rows, shape[-2], rows.address, rows.row_stride
    store_rows, after = kernel.store_rows, (row_stride, shape[-3], shape[-1], cache.data_ptr(), *strides[-3:-1],
                                            cache.dtype is torch.bfloat16)  # (bfloat16: rounded, ties to even)

    def store(start: int, first: int = 0, count: Optional[int] = None) -> None:
        count = held - first if count is None else count
        if first < 0 or count < 0 or first + count > held or start < 0 or start + count > capacity:
            raise refuse("store_rows", f"{count} rows from {first} of {held} past them or the cache's {capacity}")
        store_rows(address + 4 * first * row_stride, count, int(start), *after)

    return store


def _gated(name: str, gate_up: "torch.Tensor | Rows", out: "torch.Tensor | Rows | None") -> tuple[Any, Rows, Rows]:
    """The kernel, the input and the output of a gated activation, checked (both contiguous)."""
    kernel = _require()
    gate_up = as_rows(gate_up, name, "gate_up")
    if not gate_up.contiguous or gate_up.width % 2:
        raise refuse(name, "gate_up must be contiguous [rows, 2 * ffn]", gate_up.tensor)
    rows, ffn = gate_up.rows, gate_up.width // 2
    out = Rows(torch.empty(rows, ffn, dtype=torch.float32)) if out is None else as_rows(out, name, "out")
    if not out.contiguous or out.rows != rows or out.width != ffn:
        raise refuse(name, f"out must be contiguous [{rows}, {ffn}]", out.tensor)
    return kernel, gate_up, out


def silu_mul(gate_up: "torch.Tensor | Rows", out: "torch.Tensor | Rows | None" = None) -> torch.Tensor:
    """gate_up [rows, 2 * ffn] float32 -> SiLU(gate) * up [rows, ffn] (into `out` where given); returns out's
    tensor."""
    kernel, gate_up, out = _gated("silu_mul", gate_up, out)
    kernel.silu_mul(gate_up.address, gate_up.rows, out.width, out.address)
    return out.tensor


def bind_silu_mul(gate_up: "torch.Tensor | Rows", out: "torch.Tensor | Rows") -> Callable[[], Any]:
    """silu_mul's call on these buffers, checked now (as bind_matmul)."""
    kernel, gate_up, out = _gated("silu_mul", gate_up, out)
    return functools.partial(kernel.silu_mul, gate_up.address, gate_up.rows, out.width, out.address)


def gelu_tanh_mul(gate_up: "torch.Tensor | Rows", out: "torch.Tensor | Rows | None" = None) -> torch.Tensor:
    """gate_up [rows, 2 * ffn] float32 -> GeLU-tanh(gate) * up [rows, ffn] (into `out` where given): torch's
    F.gelu(approximate="tanh") within a few ulp, every element by one formula on every instruction-set path
    (kernels/csrc/elementwise.c). Returns out's tensor."""
    if isinstance(gate_up, torch.Tensor):
        if gate_up.dtype is not F32 or not gate_up.is_cpu:
            raise refuse("gelu_tanh_mul", "gate_up must be float32 on the CPU", gate_up)
        gate_up = gate_up.contiguous()
    kernel, gate_up, out = _gated("gelu_tanh_mul", gate_up, out)
    kernel.gelu_tanh_mul(gate_up.address, gate_up.rows, out.width, out.address)
    return out.tensor


def soft_cap_(x: torch.Tensor, cap: float) -> torch.Tensor:
    """In place: x = cap * tanh(x / cap) of contiguous float32 x, every element by one formula on every path."""
    kernel = _require()
    x_dense = Dense(x, F32, "soft_cap", "x")
    kernel.soft_cap(x_dense.address, x.numel(), float(cap))
    return x


def top_tokens(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's `k` (1-16) largest logits' ids, largest first, ties to the lower id and NaN largest, as int64
    [rows, k]: column 0 is `logits.argmax(-1)`, the first maximum. logits: contiguous float32 [rows, vocab]."""
    kernel = _require()
    if logits.dim() != 2:
        raise refuse("top_tokens", "logits must be [rows, vocab]", logits)
    dense = Dense(logits, F32, "top_tokens", "logits")
    rows, vocab = dense.shape
    out = torch.empty(rows, k, dtype=torch.int32)
    kernel.top_tokens(dense.address, rows, vocab, k, out.data_ptr())
    return out.long()


def peak(path: str, seconds: float = 0.05) -> float:
    """One thread's multiply-adds a second on path `path`'s dot-product instruction alone (for benchmarks); nan
    where the build has no such measure."""
    kernel = _require()
    return float(kernel.peak(path, seconds)) if hasattr(kernel, "peak") else float("nan")


def build_file() -> Optional[str]:
    """The compiled extension's file (None when not compiled): its time stamp says which build computed."""
    return getattr(_cpu, "__file__", None) if _cpu is not None else None
