"""The words kernel (kernels/triton_words_layout.py, kernels/triton_words_gemm.py), on the CPU in Triton's
interpreter: Q4_K and Q6_K codes held in 32-bit words along the outputs give back the file's fields at the
packed layout's size, every weight read out of the kernel is gguf.quants.dequantize's bit for bit, products are
within 1e-5 of a float64 one, and a row's result is the same bits however many of the rows are real, unsplit or
with k cut into spans; the tiling is set by the matrix's shape, the device and the setting alone; Triton compiles
the kernel for sm_80 and sm_90 here, its bfloat16 products on the tensor cores."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from helpers import gguf_bytes

from specdec_cli.kernels import packed
from specdec_cli.kernels.triton_gemm import Tiling, available
from specdec_cli.kernels.triton_words_gemm import WORD_GPU_TILES, WORD_PROGRAMS, WORD_SPLIT, WordGemm, word_tiling
from specdec_cli.kernels.triton_words_layout import WordMatrix, word_takes

pytestmark = pytest.mark.skipif(not available() or os.environ.get("TRITON_INTERPRET") != "1",
                                reason="Triton is not installed, or not as an interpreter (conftest.py sets it)")

TYPES = ["Q4_K", "Q6_K"]
ROWS = 16  # the engine's padded step
SPLIT = Tiling(16, 64, 4)  # a GPU's kind of tiling on the interpreter: narrow programs, k cut into 4 spans


def _matrices(type_name: str, n: int, k: int, seed: int = 0) -> tuple[WordMatrix, "packed.Fields", np.ndarray]:
    """A random GGUF tensor of the type (random blocks, small float16 scales) in words on the CPU, its fields as
    the packed layout holds them, and gguf's own dequantisation of it [n, k]."""
    import gguf

    from specdec_cli.target_model.device.weights import packed_from_gguf

    raw = gguf_bytes(type_name, n, k, seed=seed)
    bytes_matrix = packed_from_gguf(type_name, raw, torch.device("cpu"))
    expected = np.asarray(gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, type_name)), np.float32)
    return WordMatrix.from_packed(bytes_matrix, chunk_rows=16), bytes_matrix.fields(), expected.reshape(n, k)


@pytest.mark.parametrize("type_name", TYPES)
def test_words_hold_the_files_fields_at_the_packed_layouts_size(type_name):
    n, k = 37, 512  # 37: chunks of 16 output rows and a part one
    matrix, fields, expected = _matrices(type_name, n, k, seed=1)
    back = matrix.fields()
    for name in ("codes", "d", "m", "scales", "minimums"):
        made, got = getattr(fields, name), getattr(back, name)
        assert (made is None) == (got is None), name
        if made is not None:
            assert torch.equal(made.view(torch.uint8), got.view(torch.uint8)), name
    assert np.array_equal(matrix.dequantize().numpy(), expected)
    ids = torch.tensor([36, 0, 5, 5])
    assert torch.equal(matrix.dequantize(ids), torch.from_numpy(expected)[ids])
    per_super = {"Q4_K": 148, "Q6_K": 210}[type_name]  # bytes per 256 weights (the file: 144 and 210)
    assert matrix.nbytes == n * k // 256 * per_super
    assert matrix.low.shape == (k // 8, n) and matrix.low.dtype == torch.int32  # the output dimension contiguous
    assert word_takes(matrix.kind, 256) and not word_takes(matrix.kind, 128)
    assert not word_takes(packed.KIND_OF_GGUF_TYPE["Q4_0"], 256) and not word_takes(packed.KIND_PQ5_K, 256)


@pytest.mark.parametrize("cut", [None, SPLIT], ids=["unsplit", "spans"])
@pytest.mark.parametrize("type_name", TYPES)
def test_every_weight_reads_as_gguf_and_products_as_float64(type_name, cut):
    """One-hot rows (the identity: one call of k rows) read every weight out of the kernel as gguf decodes it, bit
    for bit; random rows multiply within 1e-5 of the float64 product."""
    n, k = 40, 256  # n not a multiple of 16: the last program's columns are masked
    matrix, _, expected = _matrices(type_name, n, k, seed=3)
    gemm = WordGemm(matrix, cut)
    assert torch.equal(gemm(torch.eye(k)), torch.from_numpy(expected).T)
    rows = torch.randn(ROWS, k, generator=torch.Generator().manual_seed(1))
    reference = rows.double() @ torch.from_numpy(expected).double().T
    assert torch.allclose(gemm(rows).double(), reference, rtol=0, atol=1e-5 * float(reference.abs().max()))


@pytest.mark.parametrize("cut", [None, SPLIT], ids=["unsplit", "spans"])
@pytest.mark.parametrize("type_name", TYPES)
def test_a_rows_result_is_the_same_bits_however_many_rows_are_real(type_name, cut):
    """Rows 1..16 real, the rest padding (zeros or huge values): the real rows' outputs equal bit for bit those of
    a block of 16 real rows."""
    n, k = 48, 512
    matrix, _, _ = _matrices(type_name, n, k, seed=2)
    generator = torch.Generator().manual_seed(2)
    rows = torch.randn(ROWS, k, generator=generator)
    gemm = WordGemm(matrix, cut)
    whole = gemm(rows)
    for real in range(1, ROWS + 1):
        padded = rows.clone()
        padded[real:] = torch.randn(ROWS - real, k, generator=generator) * (1e4 if real % 2 else 0.0)
        assert torch.equal(gemm(padded)[:real], whole[:real]), real


def test_the_word_tiling_is_set_by_the_shape_the_device_and_the_setting_alone(monkeypatch):
    from specdec_cli.errors import SpecdecError

    monkeypatch.delenv("SPECDEC_DEVICE_WORD_TILES", raising=False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    block_n, block_k = WORD_GPU_TILES
    assert word_tiling(28672, 4096, cuda) == Tiling(block_n, block_k, 1)  # gate|up: programs enough along n
    narrow = word_tiling(1024, 4096, cuda)  # attn_v: k cut until the programs reach WORD_PROGRAMS (or WORD_SPLIT)
    assert 1 < narrow.split <= WORD_SPLIT and -(-1024 // block_n) * narrow.split <= WORD_PROGRAMS
    assert word_tiling(1024, 256, cuda).split * block_k <= 256  # whole tiles a span
    assert word_tiling(4096, 512, cpu) == Tiling(512, 256, 1)  # the interpreter: wide programs, never split
    monkeypatch.setenv("SPECDEC_DEVICE_WORD_TILES", "128x128x8")
    assert word_tiling(4096, 4096, cuda) == Tiling(128, 128, 8) and word_tiling(4096, 512, cuda) == Tiling(128, 128, 4)
    assert word_tiling(4096, 4096, cpu) == Tiling(512, 256, 1)
    monkeypatch.setenv("SPECDEC_DEVICE_WORD_TILES", "32x64")
    assert word_tiling(1024, 4096, cuda) == Tiling(32, 64, 1)  # set: unsplit unless said
    monkeypatch.setenv("SPECDEC_DEVICE_TILES", "16x32x2")  # the packed kernel's setting is not this one's
    assert word_tiling(1024, 4096, cuda) == Tiling(32, 64, 1)
    for wrong in ("64", "8x64", "64x48", "64x64x3"):
        monkeypatch.setenv("SPECDEC_DEVICE_WORD_TILES", wrong)
        with pytest.raises(SpecdecError, match="SPECDEC_DEVICE_WORD_TILES"):
            word_tiling(4096, 4096, cuda)


def test_a_call_or_a_matrix_the_kernel_cannot_take_is_refused():
    matrix, _, _ = _matrices("Q4_K", 16, 256)
    with pytest.raises(ValueError):
        WordGemm(matrix)(torch.randn(12, 256))  # not a power of two of at least 16 rows
    with pytest.raises(ValueError):
        WordGemm(matrix)(torch.randn(16, 512)[:, ::2])  # not row-major
    with pytest.raises(ValueError, match="does not cut"):
        WordGemm(matrix, Tiling(16, 128, 4))  # 4 spans of 128 do not make 256
    with pytest.raises(ValueError, match="does not cut"):
        WordGemm(_matrices("Q6_K", 16, 256)[0], Tiling(16, 8, 1))  # a tile shorter than a sub-block
    with pytest.raises(ValueError, match="not held in words"):
        WordMatrix.allocate(packed.KIND_OF_GGUF_TYPE["Q8_0"], 4, 256, torch.device("cpu"))


def test_the_kernel_setting_is_checked_before_a_model_loads(monkeypatch):
    from specdec_cli.errors import SpecdecError
    from specdec_cli.target_model.device.weights import kernel_setting, packed_setting

    monkeypatch.delenv("SPECDEC_DEVICE_KERNEL", raising=False)
    assert kernel_setting() == "bytes"
    monkeypatch.setenv("SPECDEC_DEVICE_KERNEL", "Words")
    assert kernel_setting() == "words"
    monkeypatch.setenv("SPECDEC_DEVICE_KERNEL", "nibbles")
    with pytest.raises(SpecdecError, match="SPECDEC_DEVICE_KERNEL must be one of bytes, words"):
        packed_setting()


def test_bench_packed_times_the_words_kernel_beside_the_packed_one(tmp_path):
    """benchmarks/bench_packed.py's dry run (the path, in the interpreter): each Q4_K and Q6_K matrix timed by the
    words kernel beside the packed one, the same products, and the packed kernel's fastest left as it was."""
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_packed.py"
    spec = importlib.util.spec_from_file_location("bench_packed", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--dry-run", "--out", str(tmp_path / "packed.json")]) == 0
    document = json.loads((tmp_path / "packed.json").read_text())
    assert document["fastest"] in ("16x128", "32x64") and document["fastest_words"] == "default"
    for row in document["results"]:
        assert row["words_bytes"] == row["packed_bytes"] and row["best_words"] == "default"
        assert row["words"]["default"]["max_relative_difference"] < 1e-5  # float32 rows: the same product


COMPILE_FOR_GPUS = r'''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specdec_cli.kernels.triton_words_gemm import _kernel

kernel = _kernel(False)  # the kernel as a GPU runs it, not the interpreter's
for capability in (80, 90):  # A100; H100 and H200
    for six_bit in (False, True):  # Q4_K, Q6_K
        # a step's 16 bfloat16 rows; on sm_90 a prompt chunk's 128 and float32 rows too
        more = ((128, "bf16", 64, 128), (16, "fp32", 32, 64)) if capability == 90 else ()
        for rows, dtype, block_n, block_k in ((16, "bf16", 64, 128), *more):
            signature = {"x_ptr": "*" + dtype, "out_ptr": "*fp32", "low_ptr": "*i32", "high_ptr": "*i32",
                         "d_ptr": "*fp16", "dmin_ptr": "*i32" if six_bit else "*fp16",
                         "scales_ptr": "*i8" if six_bit else "*u8", "minimums_ptr": "*i32" if six_bit else "*u8",
                         "n": "i32", "span": "i32", "x_stride": "i32", "out_stride": "i32"}
            constants = dict(ROWS=rows, SIX_BIT=six_bit, SUB=16 if six_bit else 32, IEEE=dtype == "fp32",
                             BLOCK_N=block_n, BLOCK_K=block_k)
            signature.update({key: "constexpr" for key in constants})
            names = list(signature)
            source = ASTSource(fn=kernel, signature=signature,
                               constexprs={(names.index(key),): value for key, value in constants.items()},
                               attrs={(index,): [["tt.divisibility", 16]] for index in range(12)})
            compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
            tensor_cores = "mma.sync" in compiled.asm["ptx"] or "wgmma" in compiled.asm["ptx"]
            assert tensor_cores or dtype == "fp32", (six_bit, capability, rows)  # (IEEE float32: the FMA units)
            assert compiled.metadata.shared <= 160 * 1024, (six_bit, capability, rows, compiled.metadata.shared)
print("compiled")
'''


@pytest.mark.slow
def test_the_kernel_compiles_for_a_gpu_here(tmp_path):
    """The interpreter forgives what a GPU's compiler refuses: Triton compiles the words kernel for sm_80 and sm_90
    (PTX through its own ptxas) without a GPU, Q4_K and Q6_K at a step's 16 bfloat16 rows (and on sm_90 a prompt
    chunk's 128 and float32 rows), a bfloat16 product on the tensor cores (mma), in shared memory an A100 has."""
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # (Triton 3.9 warns where unset; products are exact either way)
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPUS], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
