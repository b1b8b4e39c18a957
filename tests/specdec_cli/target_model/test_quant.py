"""Block weights (quant.py, gguf_decode.py, weights_cache.py): every GGUF type the kernels take decoded exactly
(against gguf's own dequantiser) and multiplied on every instruction-set path, blocks made on load, GGUF tensors
mapped onto a model's layers (llama's permuted q/k rows included), the cache, and BlockLinear against its dense
meaning."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import _tiny
from helpers import gguf_bytes as _gguf_bytes

from specdec_cli import kernels
from specdec_cli.target_model.gguf import gguf_decode
from specdec_cli.target_model.load import converted_blocks, weights_cache
from specdec_cli.target_model.native import quant

pytestmark = pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")

GGUF_TYPES = sorted([*gguf_decode.GGUF_BLOCKS, *gguf_decode.GGUF_FLOATS])
def _dequantized(type_name: str, raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    return np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(shape)


@pytest.mark.parametrize("type_name", GGUF_TYPES)
def test_gguf_blocks_decode_to_what_gguf_dequantizes(type_name):
    raw = _gguf_bytes(type_name, 24, 512)
    expected = _dequantized(type_name, raw, (24, 512))
    weights = gguf_decode.decode_gguf_blocks(type_name, raw, 24, 512)
    assert weights is not None and weights.origin == type_name
    assert np.array_equal(weights.dense().numpy(), expected)  # every weight exactly, from the type's own bits


@pytest.mark.parametrize("type_name", GGUF_TYPES)
def test_a_gguf_types_kernel_product_is_its_dense_product(type_name):
    """The kernel's product equals the dense product of the dequantised weight with the 8-bit rounded rows (one scale
    per 32 inputs, per 256 for the K-quants' packed kinds; float kinds: the rows as they are), on every instruction
    set this CPU has."""
    raw = _gguf_bytes(type_name, 40, 512, seed=1)
    dense = torch.from_numpy(_dequantized(type_name, raw, (40, 512)))
    layer = quant.BlockLinear(gguf_decode.decode_gguf_blocks(type_name, raw, 40, 512))
    x = torch.randn(9, 512, generator=torch.Generator().manual_seed(2))
    if kernels.kind_of(layer.kind).bits < 16:
        blocks = x.reshape(9, -1, kernels.kind_of(layer.kind).span)
        scale = blocks.abs().amax(-1, keepdim=True) / 127
        rows = (torch.round(blocks / scale) * scale).reshape(9, 512)
    else:
        rows = x
    reference = rows.double() @ dense.double().T
    try:
        for path in kernels.isas():
            kernels.force_isa(path)
            out = layer(x)
            assert torch.allclose(out.double(), reference, rtol=1e-5, atol=2e-6 * float(reference.abs().max())), path
    finally:
        kernels.force_isa(None)


def test_other_types_and_shapes_stay_dense():
    raw = _gguf_bytes("Q6_K", 4, 512)
    assert gguf_decode.decode_gguf_blocks("Q6_K", raw, 4, 500) is None  # not a whole number of blocks
    assert gguf_decode.decode_gguf_blocks("IQ2_XXS", raw, 4, 512) is None  # a type without a kernel


@pytest.mark.parametrize("kind", [kernels.KIND_Q4, kernels.KIND_Q8])
def test_blocks_made_on_load_round_to_the_nearest_code(kind):
    weight = torch.randn(48, 96, generator=torch.Generator().manual_seed(0))
    weights = quant.quantize_dense(weight, kind)
    _, scales, _ = weights.unpacked()
    step = scales.repeat_interleave(32, dim=1)  # [48, 96]
    assert ((weights.dense() - weight).abs() <= step / 2 + 1e-6).all()
    layer = quant.BlockLinear(weights)
    x = torch.randn(5, 96)
    blocks = x.reshape(5, 3, 32)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    rounded = (torch.round(blocks / scale) * scale).reshape(5, 96)  # the kernel's 8-bit activations
    assert torch.allclose(layer(x), rounded @ weights.dense().T, atol=1e-4)
    assert torch.equal(layer.weight, weights.dense())


def _tiny_gguf(tmp_path, model, types):
    """Write `model`'s linear layers to a GGUF in the given types (q/k rows permuted as llama.cpp writes them) and
    set the model's dense weights to what the file dequantizes to, as transformers' GGUF loader would."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    writer.add_block_count(config.num_hidden_layers)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for index, (name, module) in enumerate((n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)):
        type_name = types[index % len(types)]
        weight = module.weight.detach().to(torch.float32).numpy()
        gguf_name = name_map.get_name(name)
        order = None
        if gguf_name.endswith("attn_q") or gguf_name.endswith("attn_k"):
            heads = config.num_attention_heads if gguf_name.endswith("attn_q") else config.num_key_value_heads
            order = gguf_decode.permuted_rows(weight.shape[0], heads)  # hf = gguf[order]
            weight = weight[np.argsort(order)]
        qtype = getattr(gguf.GGMLQuantizationType, type_name)
        data = gguf.quants.quantize(weight, qtype)
        writer.add_tensor(f"{gguf_name}.weight", data, raw_dtype=qtype)
        dense = _dequantized(type_name, np.asarray(data).view(np.uint8), weight.shape)
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(dense[order] if order is not None else dense))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tmp_path / "tiny.gguf"


def test_a_ggufs_blocks_map_onto_the_models_layers(tmp_path):
    model = _tiny("llama")
    path = _tiny_gguf(tmp_path, model, ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "F16", "BF16"])
    planned = dict(converted_blocks.gguf_blocks(model, path))
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    assert sorted(planned) == sorted(linear)  # every layer found, q and k un-permuted
    modules = dict(model.named_modules())
    for name, weights in planned.items():
        assert torch.allclose(weights.dense(), modules[name].weight.float(), atol=1e-6), name
    with torch.no_grad():  # a layer whose dense weight does not match its tensor is left dense
        modules["model.layers.0.mlp.up_proj"].weight.add_(1.0)
    assert "model.layers.0.mlp.up_proj" not in dict(converted_blocks.gguf_blocks(model, path))
    quant.install_blocks(model, planned)
    summary = quant.weights_summary(model)
    assert summary.endswith("block layers, 0 dense") and all(name in summary for name in ("Q4_0", "Q5_1", "BF16"))


def test_the_family_table_decides_whether_q_and_k_rows_are_interleaved(tmp_path, monkeypatch):
    """llama's q/k rows are put back in order because its row says llama.cpp interleaves them (no trial): a table
    that said otherwise leaves them dense (the check against the dense weight refuses the rows out of order)."""
    import dataclasses

    from specdec_cli.target_model import families

    model = _tiny("llama")
    path = _tiny_gguf(tmp_path, model, ["Q8_0"])
    monkeypatch.setitem(families.FAMILIES, "llama", dataclasses.replace(families.FAMILIES["llama"], permuted_qk=False))
    planned = dict(converted_blocks.gguf_blocks(model, path))
    assert not any(name.endswith(("q_proj", "k_proj")) for name in planned)
    assert any(name.endswith("v_proj") for name in planned)


def test_modes_choose_what_becomes_blocks(tmp_path):
    model = _tiny("llama")
    path = _tiny_gguf(tmp_path, model, ["Q4_1", "Q8_0"])
    gguf_plan = converted_blocks.plan_blocks(model, "gguf", path)
    assert {w.origin for w in gguf_plan.values()} == {"Q4_1", "Q8_0"}
    int4_plan = converted_blocks.plan_blocks(model, "int4", path)  # Q8_0 layers requantised to 4 bits
    assert {w.origin for w in int4_plan.values()} == {"Q4_1", "int4"}
    assert all(kernels.kind_of(w.kind).bits == 4 for w in int4_plan.values())
    hf_plan = converted_blocks.plan_blocks(_tiny("qwen2"), "int8", None)  # a Hugging Face model: all made on load
    assert {w.origin for w in hf_plan.values()} == {"int8"}


def test_converted_blocks_are_cached_and_a_corrupt_cache_is_rebuilt(tmp_path, monkeypatch):
    model = _tiny("qwen2")
    count = converted_blocks.convert(model, "int4", None, "tiny-qwen2", tmp_path)
    assert count == len(quant.block_layers(model)) > 0
    cached = weights_cache.cache_file(tmp_path, "tiny-qwen2", "int4")
    assert cached.is_file()
    reference = torch.randn(3, model.config.hidden_size)
    with torch.inference_mode():
        expected = model.model.layers[0].self_attn.q_proj(reference)

    def not_again(*args, **kwargs):
        raise AssertionError("converted again although cached")

    monkeypatch.setattr(converted_blocks, "plan_blocks", not_again)
    again = _tiny("qwen2")
    converted_blocks.convert(again, "int4", None, "tiny-qwen2", tmp_path)
    with torch.inference_mode():
        assert torch.equal(again.model.layers[0].self_attn.q_proj(reference), expected)  # biases kept too
    monkeypatch.undo()
    cached.write_bytes(b"not safetensors")
    third = _tiny("qwen2")
    assert converted_blocks.convert(third, "int4", None, "tiny-qwen2", tmp_path) == count
    assert weights_cache.load_cached(cached) is not None


def test_converted_weights_keep_tied_embeddings_under_the_name_every_tool_reads(tmp_path):
    """vLLM reads a tied embedding only as model.embed_tokens.weight (stored as lm_head.weight it loaded zeros and
    wrote token 0 forever); transformers re-ties it from the config."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from specdec_cli.target_model.load.converted import save_weights

    model = _tiny("llama")
    model.config.tie_word_embeddings = True
    model.tie_weights()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    save_weights(model, tmp_path / "model.safetensors")
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
        assert torch.equal(handle.get_tensor("model.embed_tokens.weight"), model.model.embed_tokens.weight)
    model.config.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)


@pytest.mark.parametrize("type_name", GGUF_TYPES)
def test_rows_read_by_their_groups_are_the_whole_matrix_rows(type_name):
    """BlockLinear.unpacked_rows reads only the 16-row groups holding the asked rows (a head's vocabulary of an
    LM head): packed back, in any order and across pieces joined, they are the records the whole matrix's rows
    give, and they multiply as those rows do."""
    raw = _gguf_bytes(type_name, 70, 512, seed=3)
    layer = quant.BlockLinear(gguf_decode.decode_gguf_blocks(type_name, raw, 70, 512))
    ids = torch.tensor([69, 3, 17, 16, 48, 5, 33])
    whole = layer.blocks().dense()[ids]  # [7, 512]
    records = layer.select_records(ids)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(4))
    assert torch.equal(kernels.matmul(x, layer.kind, records, len(ids)), layer(x)[:, ids])
    joined = quant.join_rows([layer.unpacked_rows(ids[:3]), layer.unpacked_rows(ids[3:])])
    assert torch.equal(layer.pack_rows(joined), records)
    assert torch.equal(quant.BlockLinear(quant.BlockWeights(layer.kind, records, len(ids), 512, "rows")).weight, whole)
    assert layer.select_records(ids[:0]).shape[0] == 0
