"""benchmarks/write_gguf.py: llama.cpp's Q4_K_M and IQ4_XS recipes per tensor, the random blocks' scale, and its
refusals."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from helpers import write_gguf_script


@pytest.fixture(scope="module")
def script():
    with write_gguf_script() as module:
        yield module


def test_more_bits_layers_follow_llama_cpp(script):
    assert [layer for layer in range(16) if script.more_bits(layer, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [layer for layer in range(18) if script.more_bits(layer, 18)] == [0, 1, 4, 7, 10, 13, 15, 16, 17]


def test_recipe_types(script):
    assert script.recipe_type("blk.3.attn_q.weight", 2048, 3, 16) == Q.Q4_K
    assert script.recipe_type("blk.4.attn_v.weight", 2048, 4, 16) == Q.Q6_K
    assert script.recipe_type("blk.5.ffn_down.weight", 8192, 5, 16) == Q.Q4_K
    assert script.recipe_type("blk.0.ffn_down.weight", 8192, 0, 16) == Q.Q6_K
    assert script.recipe_type("token_embd.weight", 2048, None, 16) == Q.Q6_K  # tied: the output matrix
    assert script.recipe_type("blk.2.attn_q.weight", 640, 2, 18) == Q.Q5_0  # rows of 640: legacy fallbacks
    assert script.recipe_type("blk.0.attn_v.weight", 640, 0, 18) == Q.Q8_0
    assert script.recipe_type("token_embd.weight", 640, None, 18) == Q.Q8_0
    assert script.recipe_type("blk.0.attn_output.weight", 1024, 0, 18) == Q.Q4_K
    assert script.recipe_type("blk.0.attn_norm.weight", 640, 0, 18) == Q.F32


def test_iq4_xs_recipe_types(script):
    assert script.recipe_type("blk.3.attn_q.weight", 2048, 3, 16, recipe="iq4_xs") == Q.IQ4_XS
    assert script.recipe_type("blk.0.attn_v.weight", 2048, 0, 16, recipe="iq4_xs") == Q.IQ4_XS
    assert script.recipe_type("token_embd.weight", 2048, None, 16, recipe="iq4_xs") == Q.Q6_K  # the output matrix
    assert script.recipe_type("blk.2.attn_q.weight", 576, 2, 30, recipe="iq4_xs") == Q.IQ4_NL  # rows of 576
    assert script.recipe_type("token_embd.weight", 576, None, 30, recipe="iq4_xs") == Q.Q8_0
    assert script.recipe_type("blk.0.attn_norm.weight", 576, 0, 30, recipe="iq4_xs") == Q.F32


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.IQ4_XS])
def test_random_iq4_blocks_have_the_asked_scale(script, qtype):
    weights = dequantize(script.iq4_blocks(np.random.default_rng(0), qtype, 64, 512, 0.02), qtype)
    assert weights.shape == (64, 512) and np.isfinite(weights).all()
    assert abs(float(weights.mean())) < 0.004 and 0.015 < float(weights.std()) < 0.026


@pytest.mark.parametrize("kind", ["q4_k", "q6_k"])
def test_random_k_quant_blocks_have_the_asked_scale(script, kind):
    rng = np.random.default_rng(0)
    blocks = getattr(script, f"{kind}_blocks")(rng, 64, 512, 0.02)
    weights = dequantize(blocks, Q.Q4_K if kind == "q4_k" else Q.Q6_K)
    assert weights.shape == (64, 512) and np.isfinite(weights).all()
    assert abs(float(weights.mean())) < 0.002 and 0.016 < float(weights.std()) < 0.024


def test_a_file_not_written_here_is_kept(script, tmp_path):
    other = tmp_path / "model.gguf"
    other.write_bytes(b"not ours")
    with pytest.raises(SystemExit, match="--force"):
        script.refuse_overwrite(other, force=False)
    script.refuse_overwrite(other, force=True)  # --force: no objection
    script.refuse_overwrite(tmp_path / "new.gguf", force=False)  # nothing there yet


def test_llama_8b_shape_is_llama_3_8b(script):
    shape = script.SHAPES["llama-8b"]
    assert (shape.arch, shape.hidden, shape.layers, shape.ffn) == ("llama", 4096, 32, 14336)
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (32, 8, 128)
    assert (shape.context, shape.rope_theta, shape.rms_eps) == (8192, 500000.0, 1e-5)
    assert shape.tied is False  # Llama-3-8B has its own output matrix
    plan = {name: (dims, layer) for name, dims, layer in script.tensor_plan(shape, 49152)}
    assert plan["output.weight"] == ((49152, 4096), None) and plan["token_embd.weight"] == ((49152, 4096), None)
    assert plan["blk.31.attn_k.weight"] == ((1024, 4096), 31) and plan["blk.0.ffn_down.weight"] == ((4096, 14336), 0)
    assert sum(rows * row for rows, row in (dims for dims, _ in plan.values())) == 7_382_241_280
    with_its_vocabulary = script.tensor_plan(shape, 128256)  # Llama-3's own tokenizer: its published count
    assert sum(rows * row for _, (rows, row), _ in with_its_vocabulary) == 8_030_261_248
    assert "output.weight" not in {name for name, _, _ in script.tensor_plan(script.SHAPES["llama-1b"], 49152)}


def test_an_untied_output_takes_q6_k_and_the_embedding_q4_k(script):
    assert script.recipe_type("output.weight", 4096, None, 32, tied=False) == Q.Q6_K
    assert script.recipe_type("token_embd.weight", 4096, None, 32, tied=False) == Q.Q4_K
    assert script.recipe_type("blk.27.ffn_down.weight", 14336, 27, 32, tied=False) == Q.Q6_K
    assert script.recipe_type("blk.26.ffn_down.weight", 14336, 26, 32, tied=False) == Q.Q4_K


def test_a_small_untied_file_streams_and_reads_back(script, tmp_path, monkeypatch):
    from gguf import GGUFReader, GGUFWriter

    tokenizer = tmp_path / "tokenizer.gguf"  # a tokenizer of 300 tokens is all write() copies from a GGUF
    writer = GGUFWriter(str(tokenizer), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{index}" for index in range(300)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shape = script.Shape("llama", 256, 2, 512, 2, 1, 128, 512, 10000.0, 1e-5, tied=False)
    monkeypatch.setitem(script.SHAPES, "tiny-untied", shape)
    paths = [tmp_path / "a.gguf", tmp_path / "b.gguf"]
    written = [script.write(path, "tiny-untied", 0, 0.02, str(tokenizer)) for path in paths]
    assert script.check_read_back(paths[0], "tiny-untied") == written[0]
    assert paths[0].read_bytes() == paths[1].read_bytes()  # the same seed, the same file
    types = {tensor.name: tensor.tensor_type for tensor in GGUFReader(str(paths[0])).tensors}
    assert types["output.weight"] == Q.Q6_K and types["token_embd.weight"] == Q.Q4_K
    assert [path.name for path in tmp_path.iterdir() if path.name.endswith(".tmp")] == []
