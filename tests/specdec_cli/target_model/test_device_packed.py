"""The device engine at the file's bits (kernels/triton_layout.py, kernels/triton_gemm.py), on the CPU in
Triton's interpreter: every packed GGUF type decoded as gguf.quants.dequantize decodes it and multiplied as a
float64 product would be, a row's result bit for bit the same however many of the 16 rows are real, the layout
no bigger than the file, and every drafter token-identical to plain decoding on a model held that way."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from helpers import EOS, PROMPTS, family_model, gguf_bytes, write_gguf_script

from specdec_cli.decoding.generation_config import GenerationConfig
from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter
from specdec_cli.kernels import packed
from specdec_cli.kernels.triton_gemm import PackedGemm, available
from specdec_cli.kernels.triton_layout import PackedMatrix, takes
from specdec_cli.target_model.device import ROWS
from specdec_cli.target_model.device.forward import DeviceForward
from specdec_cli.target_model.device.weights import packed_from_gguf, packed_wanted
from specdec_cli.target_model.gguf import gguf_decode
from specdec_cli.target_model.native import quant

pytestmark = pytest.mark.skipif(not available() or os.environ.get("TRITON_INTERPRET") != "1",
                                reason="Triton is not installed, or not as an interpreter (conftest.py sets it)")

TYPES = sorted(packed.KIND_OF_GGUF_TYPE)  # Q4_0 ... IQ4_XS: every type the packed kernel takes


def _matrix(type_name: str, n: int, k: int, seed: int = 0) -> tuple[PackedMatrix, np.ndarray]:
    """A random GGUF tensor of the type as a PackedMatrix on the CPU, and gguf's own dequantisation of it."""
    import gguf

    raw = gguf_bytes(type_name, n, k, seed=seed)
    matrix = packed_from_gguf(type_name, raw, torch.device("cpu"))
    expected = np.asarray(gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, type_name)), np.float32)
    return matrix, expected.reshape(n, k)


@pytest.mark.parametrize("type_name", TYPES)
def test_each_type_decodes_as_gguf_and_multiplies_as_float64(type_name):
    n, k = 37, 512  # n not a multiple of the kernel's columns: the last program's columns are masked
    matrix, expected = _matrix(type_name, n, k, seed=3)
    assert np.array_equal(matrix.dequantize().numpy(), expected)  # every weight, bit for bit
    assert matrix.nbytes <= 1.03 * gguf_bytes(type_name, n, k, seed=3).nbytes  # the file's bits (Q4_K: +2.8%)
    rows = torch.randn(ROWS, k, generator=torch.Generator().manual_seed(1))
    out = PackedGemm(matrix)(rows)
    reference = rows.double() @ torch.from_numpy(expected).double().T
    assert torch.allclose(out.double(), reference, rtol=0, atol=1e-5 * float(reference.abs().max()))
    # one-hot rows read single weights out of the kernel: each as gguf decodes it, bit for bit
    picked = torch.randperm(k, generator=torch.Generator().manual_seed(4))[:ROWS]
    out = PackedGemm(matrix)(torch.eye(k)[picked].contiguous())
    assert torch.equal(out, torch.from_numpy(expected)[:, picked].T)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q5_0", "IQ4_XS"])
def test_a_rows_result_is_the_same_bits_however_many_rows_are_real(type_name):
    """Rows 1..16 real, the rest padding of any value (zeros, other tokens' rows, huge): the real rows' outputs
    equal bit for bit those of a block of 16 real rows."""
    n, k = 40, 512
    matrix, _ = _matrix(type_name, n, k)
    generator = torch.Generator().manual_seed(2)
    rows = torch.randn(ROWS, k, generator=generator)
    gemm = PackedGemm(matrix)
    whole = gemm(rows)
    for real in range(1, ROWS + 1):
        padded = rows.clone()
        padded[real:] = torch.randn(ROWS - real, k, generator=generator) * (1e4 if real % 2 else 0.0)
        assert torch.equal(gemm(padded)[:real], whole[:real]), real


def test_a_call_the_kernel_cannot_take_is_refused():
    matrix, _ = _matrix("Q4_0", 16, 64)
    with pytest.raises(ValueError):
        PackedGemm(matrix)(torch.randn(12, 64))  # not a power of two of at least 16 rows
    with pytest.raises(ValueError):
        PackedGemm(matrix)(torch.randn(16, 128)[:, ::2])  # not row-major
    assert not takes(packed.KIND_OF_GGUF_TYPE["Q4_K"], 288) and takes(packed.KIND_OF_GGUF_TYPE["Q4_0"], 288)
    with pytest.raises(ValueError):
        PackedMatrix.allocate(packed.KIND_OF_GGUF_TYPE["Q6_K"], 4, 288, torch.device("cpu"))


def test_the_tiling_is_set_by_the_row_length_the_device_and_the_setting_alone(monkeypatch):
    from specdec_cli.errors import SpecdecError
    from specdec_cli.kernels.triton_gemm import GPU_TILES, Tiling, tiling

    monkeypatch.delenv("SPECDEC_DEVICE_TILES", raising=False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert tiling(4096, cuda) == Tiling(*GPU_TILES, 1) and tiling(896, cuda) == Tiling(GPU_TILES[0], 128, 1)
    assert tiling(576, cuda).block_k == 64 and tiling(32 * 7, cuda).block_k == 32
    assert tiling(512, cpu) == Tiling(512, 256, 1)  # the interpreter: wide programs, never split
    monkeypatch.setenv("SPECDEC_DEVICE_TILES", "32x64")
    assert tiling(4096, cuda) == Tiling(32, 64, 1)
    monkeypatch.setenv("SPECDEC_DEVICE_TILES", "64x128x4")
    assert tiling(4096, cuda) == Tiling(64, 128, 4) and tiling(1024, cuda) == Tiling(64, 128, 4)
    assert tiling(256, cuda) == Tiling(64, 128, 2) and tiling(4096, cpu) == Tiling(512, 256, 1)  # whole tiles a span
    for wrong in ("32", "8x64", "32x48", "axb", "32x16", "32x64x3", "32x64x0", "1x2x3x4"):
        monkeypatch.setenv("SPECDEC_DEVICE_TILES", wrong)
        with pytest.raises(SpecdecError, match="SPECDEC_DEVICE_TILES"):
            tiling(4096, cuda)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q4_1", "IQ4_NL"])
def test_a_split_k_reads_each_weight_exactly_and_keeps_rows_apart(type_name):
    """A GPU's tiling on the interpreter: narrow programs, k cut into spans summed after the launch. One-hot rows
    still read every weight as gguf decodes it, products stay within float64's, and a row's result is the same bits
    whether 1 or 16 rows are real."""
    from specdec_cli.kernels.triton_gemm import Tiling

    n, k = 40, 512
    matrix, expected = _matrix(type_name, n, k, seed=5)
    gemm = PackedGemm(matrix, Tiling(16, 64, 4))
    picked = torch.randperm(k, generator=torch.Generator().manual_seed(6))[:ROWS]
    assert torch.equal(gemm(torch.eye(k)[picked].contiguous()), torch.from_numpy(expected)[:, picked].T)
    generator = torch.Generator().manual_seed(7)
    rows = torch.randn(ROWS, k, generator=generator)
    whole = gemm(rows)
    reference = rows.double() @ torch.from_numpy(expected).double().T
    assert torch.allclose(whole.double(), reference, rtol=0, atol=1e-5 * float(reference.abs().max()))
    for real in (1, 5, 15):
        padded = rows.clone()
        padded[real:] = torch.randn(ROWS - real, k, generator=generator) * 1e4
        assert torch.equal(gemm(padded)[:real], whole[:real]), real
    with pytest.raises(ValueError, match="does not cut"):
        PackedGemm(matrix, Tiling(16, 128, 8))  # 8 spans of 128 do not make 512


def test_packed_weights_are_chosen_by_the_setting_alone(monkeypatch):
    monkeypatch.delenv("SPECDEC_DEVICE_PACKED", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    # dequantised by default, on an H200 too: there the dense GEMM ran an 8B 2.7x faster (docs/gpu.md)
    assert not packed_wanted(torch.device("cuda")) and not packed_wanted(torch.device("cpu"))
    monkeypatch.setenv("SPECDEC_DEVICE_PACKED", "1")
    assert packed_wanted(torch.device("cuda"))
    from specdec_cli.decoding import cost_curve

    monkeypatch.setattr(cost_curve, "MEASURE_ROUNDS", (1, 1))  # one timed round: the interpreter is slow
    assert packed_wanted(torch.device("cpu"))
    monkeypatch.setenv("SPECDEC_DEVICE_PACKED", "0")
    assert not packed_wanted(torch.device("cuda"))
    from specdec_cli.errors import SpecdecError
    from specdec_cli.kernels import triton_gemm

    monkeypatch.setenv("SPECDEC_DEVICE_PACKED", "yes")
    with pytest.raises(SpecdecError, match="must be 0 .* or 1"):
        packed_wanted(torch.device("cuda"))
    monkeypatch.setattr(triton_gemm, "available", lambda: False)
    monkeypatch.setenv("SPECDEC_DEVICE_PACKED", "1")
    with pytest.raises(SpecdecError, match="needs Triton"):
        packed_wanted(torch.device("cpu"))
    monkeypatch.delenv("SPECDEC_DEVICE_PACKED")
    assert not packed_wanted(torch.device("cuda"))  # (no Triton: dense)


def test_a_model_whose_dense_weights_would_not_fit_the_gpu_stays_at_its_bits(monkeypatch):
    """Unset, the setting leaves a model dequantised where the GPU's free memory holds it, and at the file's bits
    where it would not (and the kernel can run there): the model loads at all."""
    from specdec_cli.kernels import triton_gemm
    from specdec_cli.target_model.device.weights import DENSE_FITS, dense_bytes

    monkeypatch.delenv("SPECDEC_DEVICE_PACKED", raising=False)
    model = _packed_model()
    needed = dense_bytes(model, torch.bfloat16)  # every matrix of MIX's types, as bfloat16
    assert needed == 2 * sum(module.weight.numel() if hasattr(module, "weight") else
                             int(module.out_features) * int(module.in_features) for name, module in
                             model.named_modules() if name.rpartition(".")[2] in MIX)
    cuda = torch.device("cuda")
    monkeypatch.setattr(triton_gemm, "available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for free, at_bits in ((needed * 2, False), (int(needed / DENSE_FITS) + 1, False), (needed, True)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, free=free: (free, 10 * needed))
        assert packed_wanted(cuda, model) is at_bits, free
        assert not packed_wanted(torch.device("cpu"), model)  # (a CPU: only when asked)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # no bfloat16 tl.dot
    assert not packed_wanted(cuda, model)
    monkeypatch.setenv("SPECDEC_DEVICE_PACKED", "0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert not packed_wanted(cuda, model)  # asked for dense: dense (and out of memory, said as such)


# a Q4_K_M file's mix and the rest: (type, layer) for a llama of hidden 256, FFN 512
MIX = {"q_proj": "Q4_K", "k_proj": "Q4_K", "v_proj": "Q6_K", "o_proj": "Q4_0", "gate_proj": "IQ4_XS",
       "up_proj": "Q5_1", "down_proj": "Q8_0", "lm_head": "Q6_K"}


def _numpy_matmul_is_slot_invariant() -> bool:
    """Whether numpy's float32 matmul (Triton's interpreter's tl.dot) gives a row the same bits in any slot of a
    16-row block: OpenBLAS's AVX2 (Haswell) sgemm does not (a row in slot 6 and in slot 0 differ in the last bit),
    so on such a CPU the interpreter cannot show the kernels' row invariance that a GPU's tiles have."""
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((32, 512)).astype(np.float32)
    rows = rng.standard_normal((16, 32)).astype(np.float32)
    alone = np.zeros_like(rows)
    alone[0] = rows[6]
    return bool(np.array_equal(np.matmul(rows, weights)[6], np.matmul(alone, weights)[0]))


def _packed_model():
    """A tiny llama whose every matrix is a GGUF block layer of MIX's types (K-quant and IQ4 blocks random, with
    write_gguf.py's scales; the legacy types quantised from the model's own weights)."""
    from gguf import GGMLQuantizationType

    model = family_model("llama", hidden_size=256, intermediate_size=512, head_dim=64, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=False)
    rng = np.random.default_rng(0)
    planned = {}
    with write_gguf_script() as script:
        for name, module in model.named_modules():
            type_name = MIX.get(name.rpartition(".")[2])
            if type_name is None:
                continue
            n, k = module.weight.shape
            qtype = getattr(GGMLQuantizationType, type_name)
            raw = script.random_tensor(rng, qtype, n, k, 0.08) if type_name.endswith("_K") or "IQ" in type_name \
                else gguf_bytes(type_name, n, k, seed=len(planned))
            planned[name] = gguf_decode.decode_gguf_blocks(type_name, np.asarray(raw).reshape(n, -1), n, k)
    assert quant.install_blocks(model, planned) == 2 * 7 + 1
    return model


@pytest.mark.slow
def test_every_drafter_is_token_identical_to_plain_decoding_at_the_files_bits(one_torch_thread):
    from test_device import _drafters, _engine

    model = _packed_model()
    forward = DeviceForward(model, "cpu", slots=128, packed=True)
    assert forward.weights.packed and "at the file's bits" in forward.describe()
    qkv = forward.weights.layers[0].qkv  # q|k (both Q4_K) one matrix, one launch; v (Q6_K) its own
    assert [part.matrix.kind for part in qkv.parts] == [packed.KIND_OF_GGUF_TYPE[name] for name in ("Q4_K", "Q6_K")]
    dense = DeviceForward(model, "cpu", slots=128, packed=False)
    assert forward.weights.nbytes < 0.4 * dense.weights.nbytes  # float32 dense: 4 bytes a weight
    ids = PROMPTS[0]
    for one, other in ((forward, dense),):  # the same weights, another summation order: close, not equal
        got = one(ids, one.new_cache(), 0).logits
        want = other(ids, other.new_cache(), 0).logits
        assert torch.allclose(got, want, rtol=0, atol=1e-4 * float(want.abs().max()))
    engine = _engine(forward)
    assert forward.prepare(8) == ROWS and forward.outcome.state == "on", forward.outcome
    config = GenerationConfig(max_new_tokens=16, eos_token_ids=())  # (random blocks: EOS may come first)
    for prompt in PROMPTS[:1]:  # (Triton's interpreter: about 0.3 s a step)
        plain = engine.generate(prompt, make_drafter("none", DrafterOptions(), TargetInfo(64, (EOS,))), config)
        assert len(plain.tokens) == 16 and len(set(plain.tokens)) > 3
        for name, drafter in _drafters(model, 64, plain.tokens, prompt).items():
            drafter.reset()
            assert engine.generate(prompt, drafter, config).tokens == plain.tokens, (name, prompt)
    assert engine.tree_check == "passed"


@pytest.mark.slow
@pytest.mark.skipif(not _numpy_matmul_is_slot_invariant(),
                    reason="numpy's matmul (Triton's interpreter's dot) sums a row by its slot on this CPU")
def test_the_words_kernel_holds_q4_k_and_q6_k_and_speculation_stays_exact(monkeypatch, one_torch_thread):
    """SPECDEC_DEVICE_KERNEL=words: the Q4_K and Q6_K matrices in 32-bit words (kernels/triton_words_gemm.py), the
    other types with the packed kernel as before; logits are the dense engine's up to the summation order, the
    one-time exact check passes, and a tree drafter's answer is plain decoding's token for token."""
    from test_device import _engine

    from specdec_cli.kernels.triton_words_gemm import WordGemm

    monkeypatch.setenv("SPECDEC_DEVICE_KERNEL", "words")
    model = _packed_model()
    forward = DeviceForward(model, "cpu", slots=128, packed=True)
    layer = forward.weights.layers[0]
    assert [type(part) for part in layer.qkv.parts] == [WordGemm, WordGemm]  # q|k (Q4_K) one matrix; v (Q6_K)
    assert [part.matrix.n for part in layer.qkv.parts] == [256 + 128, 128]
    assert type(layer.out.parts[0]) is PackedGemm and type(forward.weights.head.parts[0]) is WordGemm  # Q4_0; Q6_K
    dense = DeviceForward(model, "cpu", slots=128, packed=False)
    assert forward.weights.nbytes < 0.4 * dense.weights.nbytes
    ids = PROMPTS[0]
    got, want = (one(ids, one.new_cache(), 0).logits for one in (forward, dense))
    assert torch.allclose(got, want, rtol=0, atol=1e-4 * float(want.abs().max()))
    assert forward.prepare(8) == ROWS and forward.outcome.state == "on", forward.outcome
    engine = _engine(forward)
    config = GenerationConfig(max_new_tokens=8, eos_token_ids=())
    info = TargetInfo(64, (EOS,))
    plain = engine.generate(PROMPTS[1], make_drafter("none", DrafterOptions(), info), config)
    assert engine.generate(PROMPTS[1], make_drafter("recycle", DrafterOptions(), info), config).tokens == plain.tokens


def _tiny_gguf(tmp_path, monkeypatch):
    from helpers import write_family_gguf

    path = tmp_path / "tiny.gguf"  # Q4_0/Q4_1/Q8_0 blocks, a model context of 256
    write_family_gguf(path, family_model("llama", seed=5), "llama", "llama")
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    return path


def test_a_gguf_loaded_in_place_is_held_at_its_bits(tmp_path, monkeypatch):
    """A GGUF opened in place: its blocks and its token embeddings go to the device at the file's size (not 4 bytes a
    weight), and its logits are the dense engine's up to the summation order; the one-time check passes."""
    from specdec_cli.target_model.load import models

    path = _tiny_gguf(tmp_path, monkeypatch)
    model = models.load_target(str(path), device="cpu").model
    at_bits, dense = DeviceForward(model, "cpu", slots=320, packed=True), DeviceForward(model, "cpu", slots=320)
    assert at_bits.weights.packed and not dense.weights.packed
    ids = torch.tensor([0, 5, 63, 5, 17])  # the token embeddings at the file's bits too: rows decoded as gguf decodes
    assert at_bits.weights.embedding.packed is not None
    assert torch.equal(at_bits.weights.embedding(ids), model.model.embed_tokens.rows(ids))
    assert at_bits.memory()["weights_bytes"] < 1.5 * path.stat().st_size < 0.4 * dense.memory()["weights_bytes"]
    ids = PROMPTS[1]
    got, want = (forward(ids, forward.new_cache(), 0).logits for forward in (at_bits, dense))
    assert torch.allclose(got, want, rtol=0, atol=1e-4 * float(want.abs().max()))
    assert at_bits.prepare(8) == ROWS, at_bits.outcome


def test_bench_reports_the_device_engines_bytes(tmp_path, monkeypatch):
    """`specdec bench --decoder device` on a GGUF whose context (256) is shorter than the verify-cost timer's prompt
    and block: the timer shortens its prompt (it failed with an internal error), and the report gives the bytes
    on the device."""
    import json

    from conftest import invoke

    path = _tiny_gguf(tmp_path, monkeypatch)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"category": "copy", "turns": ["abc abc abc abc"]}) + "\n")
    result = invoke("bench", "--target", str(path), "--prompts", str(prompts), "--drafters", "none,pld",
                    "--decoder", "device", "--device", "cpu", "--max-new-tokens", "6", "--no-warmup", "--json", "--raw")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert "weights dequantised" in document["settings"]["exact_check"]  # (packed: cuda, or SPECDEC_DEVICE_PACKED=1)
    assert all(row["identical"] == row["compared"] == 1 for row in document["results"] if row["category"] == "overall")
    memory = document["settings"]["device_memory"]
    assert memory["weights_bytes"] > 0 and memory["kv_cache_bytes"] > 0 and "peak_allocated_bytes" not in memory


@pytest.mark.slow
def test_a_compiled_step_keeps_the_packed_gemm_whole_and_exact(monkeypatch, one_torch_thread):
    """torch.compile over a layer of packed GEMMs (as on cuda): the GEMM is one operator it does not trace into, so
    the layer compiles (it fell back to eager, tracing Triton's launch), and speculation stays exact."""
    from test_device import _engine

    from specdec_cli.target_model.device.capture import compile_wanted

    monkeypatch.setenv("SPECDEC_DEVICE_COMPILE", "1")
    assert compile_wanted(torch.device("cpu"))
    model = _packed_model()
    forward = DeviceForward(model, "cpu", slots=128, packed=True)
    assert forward.prepare(8) == ROWS, forward.outcome
    assert "step compiled" in forward.describe() and "not compiled" not in forward.describe(), forward.describe()
    engine = _engine(forward)
    config = GenerationConfig(max_new_tokens=8, eos_token_ids=())
    info = TargetInfo(64, (EOS,))
    plain = engine.generate(PROMPTS[1], make_drafter("none", DrafterOptions(), info), config)
    assert engine.generate(PROMPTS[1], make_drafter("recycle", DrafterOptions(), info), config).tokens == plain.tokens


COMPILE_FOR_GPUS = r'''
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specdec_cli.kernels.packed import KIND_OF_GGUF_TYPE, PACKED
from specdec_cli.kernels.triton_gemm import _kernel

kernel = _kernel(False)  # the kernel as a GPU runs it, not the interpreter's
for capability in (80, 90):  # A100; H100 and H200
    for name, kind in KIND_OF_GGUF_TYPE.items():
        # every type at a step's 16 bfloat16 rows; on sm_90 a prompt chunk's 128 and float32 rows of three types
        more = capability == 90 and name in ("Q4_K", "Q6_K", "Q8_0")
        for rows, dtype in ((16, "bf16"), *(((128, "bf16"), (16, "fp32")) if more else ())):
            info = PACKED[kind]
            signature = {"x_ptr": "*" + dtype, "out_ptr": "*fp32", "codes_ptr": "*i8" if info.bits == 8 else "*u8",
                         "plane_ptr": "*u8", "d_ptr": "*fp16", "m_ptr": "*fp16" if info.offsets else "*u8",
                         "scales_ptr": "*i8" if info.form == 3 else "*u8", "minimums_ptr": "*u8",
                         "table_ptr": "*fp32", "n": "i32", "k": "i32", "span": "i32", "x_stride": "i32",
                         "out_stride": "i32"}
            constants = dict(ROWS=rows, BITS=info.bits, ZERO=info.zero, SUB=info.sub, SUPER=info.super_block,
                             FORM=info.form, OFFSETS=info.offsets, TABLE=info.table, IEEE=dtype == "fp32",
                             BLOCK_N=32, BLOCK_K=128)
            signature.update({key: "constexpr" for key in constants})
            names = list(signature)
            source = ASTSource(fn=kernel, signature=signature,
                               constexprs={(names.index(key),): value for key, value in constants.items()},
                               attrs={(index,): [["tt.divisibility", 16]] for index in range(14)})
            compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
            tensor_cores = "mma.sync" in compiled.asm["ptx"] or "wgmma" in compiled.asm["ptx"]
            assert tensor_cores or dtype == "fp32", (name, capability)  # (IEEE float32: the FMA units)
print("compiled")
'''


@pytest.mark.slow
def test_the_kernel_compiles_for_a_gpu_here(tmp_path):
    """The interpreter forgives what a GPU's compiler refuses (layouts, types of tl.dot): Triton compiles the kernel
    for sm_80 and sm_90 (PTX through its own ptxas) without a GPU, for every type at a step's 16 bfloat16 rows (and
    a prompt chunk's 128 and float32 rows for three), and a bfloat16 product runs on the tensor cores (mma)."""
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # (Triton 3.9 warns where unset; products are exact either way)
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPUS], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]


def test_a_packed_setting_the_engine_cannot_take_is_one_line_before_the_model_loads(tiny_llama_dir, monkeypatch):
    from conftest import assert_one_line_error, invoke

    from specdec_cli.target_model.load import models

    monkeypatch.setattr(models, "model_location", lambda *a, **k: pytest.fail("the model loaded before the check"))
    result = invoke("chat", "--target", str(tiny_llama_dir), "--decoder", "device", "--device", "cpu", "--prompt",
                    "abc", "-n", "4", env_extra={"SPECDEC_DEVICE_PACKED": "on"})
    assert_one_line_error(result, "SPECDEC_DEVICE_PACKED must be 0 (weights dequantised) or 1 (at the file's bits), "
                                  "got 'on'", code=1)
