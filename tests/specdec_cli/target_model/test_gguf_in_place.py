"""GGUF files loaded in place (target_model/in_place/gguf_model.py): no transformers model and no dense copy, the
same logits bit for bit as the file's blocks installed into transformers' model of it (the path before), greedy
speculation equal to plain decoding, the repacked cache made once and mapped after; and every hostile file refused
in one line, exit 1, with nothing cached."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from conftest import assert_one_line_error, fixed_engine, invoke
from helpers import (
    EOS,
    GGUF_FAMILIES,
    OWN_LOADER,
    PROMPTS,
    family_drafter,
    family_model,
    split_logits,
    write_family_gguf,
    write_gguf_script,
)

from specdec_cli import kernels
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.target_model.gguf import gguf_decode
from specdec_cli.target_model.in_place import gguf_blocks, gguf_check
from specdec_cli.target_model.load import converted_blocks
from specdec_cli.target_model.native import native, quant
from specdec_cli.target_model.verify.exact_setup import NativeForward

pytestmark = pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")

FAMILIES = {**{family: (arch, "", settings) for family, (arch, settings) in GGUF_FAMILIES.items()}, **OWN_LOADER}


def _source(family: str):
    architecture, tokenizer, settings = FAMILIES[family]
    source = family_model(family, seed=5, **settings)
    if family.startswith("gemma"):  # tied and scaled by sqrt(hidden): tiny embeddings would drown the layers
        with torch.no_grad():
            source.model.embed_tokens.weight.mul_(source.config.hidden_size ** -0.5)
            for name, parameter in source.named_parameters():  # stored 1 + weight, under 0.5 too (families.py)
                if "norm" in name:
                    parameter.uniform_(-0.9, 0.6)
    return source, architecture, tokenizer or "gpt2"


def _in_place(path, home, monkeypatch):
    from specdec_cli.target_model.load import models

    monkeypatch.setenv("SPECDEC_HOME", str(home))
    return models.load_target(str(path), device="cpu")


def _before(path, family):
    """The file's blocks installed into transformers' model of it, as specdec loaded a GGUF before."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from specdec_cli.target_model.gguf import gguf_families

    logging.disable_progress_bar()
    if gguf_families.handles(path):
        model = gguf_families.load(path)[0]
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32).eval()
    quant.install_blocks(model, converted_blocks.plan_blocks(model, "gguf", path))
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_in_place_computes_what_the_converted_blocks_computed_bit_for_bit(family, tmp_path, monkeypatch):
    """Every family the native decoder computes: the model is specdec's own (no transformers model, no dense layer,
    the embeddings left in the file), its logits equal bit for bit those of the same blocks installed into
    transformers' model of the file, and greedy speculation (chains, trees, prompt lookup) equals plain decoding."""
    from transformers import PreTrainedModel

    source, architecture, tokenizer = _source(family)
    path = tmp_path / f"tiny-{family}.gguf"
    write_family_gguf(path, source, architecture, tokenizer)
    loaded = _in_place(path, tmp_path / "home", monkeypatch)
    model = loaded.model
    assert not isinstance(model, PreTrainedModel) and loaded.weights == "gguf"
    assert not any(isinstance(module, torch.nn.Linear) for module in model.modules())
    assert model.config.model_type == family and loaded.tokenizer.eos_token_id == EOS
    before = _before(path, family)
    with torch.inference_mode():
        for prompt in PROMPTS:
            assert torch.equal(split_logits(model, prompt), split_logits(native.decoder_for(before), prompt)), family
    engine = fixed_engine(model)
    assert isinstance(engine.forward, NativeForward)
    config = GenerationConfig(max_new_tokens=24, draft_max=7, eos_token_ids=(EOS,))
    case = type("Family", (), {"name": family, "model": model, "vocab": model.config.vocab_size, "references": []})
    for index, prompt in enumerate(PROMPTS):
        plain = engine.generate(prompt, NoDrafter(), config).tokens
        case.references.append(plain)
        for kind in ("chain", "tree", "pld"):
            speculative = fixed_engine(model)
            assert speculative.generate(prompt, family_drafter(kind, case, index), config).tokens == plain, kind
            assert kind != "tree" or speculative.tree_outcome.state == "passed", speculative.tree_check
    assert engine.forward.outcome.state == "on", engine.forward.outcome.text()
    assert model.model.embed_tokens._dense is None  # rows were dequantised as asked, never the whole table


def test_the_cache_is_made_once_then_mapped_and_remade_when_damaged(tmp_path, monkeypatch):
    from safetensors import safe_open

    source, architecture, tokenizer = _source("llama")
    path = tmp_path / "tiny.gguf"
    write_family_gguf(path, source, architecture, tokenizer)
    first = _in_place(path, tmp_path / "home", monkeypatch)
    cache = first.model.source.cache
    assert first.model.source.repacked and "repacked now" in first.load_line
    blocks = cache / gguf_model_blocks()
    with safe_open(str(blocks), framework="pt") as handle:  # any safetensors reader reads it
        assert "model.layers.0.self_attn.q_proj.records" in handle.keys()
    from specdec_cli.target_model.load import models

    gguf_check._checked.clear()
    again = models.load_target(str(path), device="cpu")
    assert not again.model.source.repacked and "mapped" in again.load_line
    q_proj = again.model.model.layers[0].self_attn.q_proj
    assert q_proj.records.untyped_storage().nbytes() == blocks.stat().st_size  # a view of the mapped file
    with torch.inference_mode():
        want = split_logits(first.model, PROMPTS[0])
        assert torch.equal(want, split_logits(again.model, PROMPTS[0]))
    first_check, again_check = fixed_engine(first.model), fixed_engine(again.model)
    first_check.forward.prepare(8)
    again_check.forward.prepare(8)  # the row-invariance check passed for this file on this machine: remembered
    assert first_check.forward.outcome.text().startswith("on: specdec's native decoder")
    remembered = again_check.forward.outcome.text()
    assert remembered.endswith("(checked on this machine before)"), remembered
    with open(blocks, "r+b") as handle:  # cut short: made again, with the same result
        handle.truncate(blocks.stat().st_size - 100)
    gguf_check._checked.clear()
    remade = models.load_target(str(path), device="cpu")
    assert remade.model.source.repacked
    with torch.inference_mode():
        assert torch.equal(want, split_logits(remade.model, PROMPTS[0]))
    with open(blocks, "r+b") as handle:  # its header overwritten, its size the same: made again too
        handle.write(b"\xff" * 16)
    gguf_check._checked.clear()
    assert models.load_target(str(path), device="cpu").model.source.repacked


def test_a_side_file_failing_while_the_blocks_are_written_stops_the_writer_and_leaves_nothing(tmp_path, monkeypatch):
    """The blocks are written on their own thread while the tokenizer and config are built: when those fail, the
    writer stops at its next slice, the error is the load's, and no folder (nor a temporary one) is left."""
    import threading

    from specdec_cli.errors import SpecdecError
    from specdec_cli.target_model.in_place import gguf_model

    source, architecture, tokenizer = _source("llama")
    path = tmp_path / "tiny.gguf"
    write_family_gguf(path, source, architecture, tokenizer)
    slices, started = [], threading.Event()
    records = gguf_blocks._records

    def slow_records(*args):
        started.set()
        slices.append(args[1].module)
        threading.Event().wait(0.05)
        return records(*args)

    def failing_side_files(gguf, folder):
        assert started.wait(10)  # the writer is at work
        raise SpecdecError(f"{gguf.path}: its tokenizer metadata cannot be read (planted)")

    monkeypatch.setattr(gguf_blocks, "_records", slow_records)
    monkeypatch.setattr(gguf_model, "write_native_side_files", failing_side_files)
    with pytest.raises(SpecdecError, match="planted"):
        _in_place(path, tmp_path / "home", monkeypatch)
    gguf, planned = _plan(path)
    assert 0 < len(slices) < len(planned)  # stopped early, not written to the end
    assert not any((tmp_path / "home" / "models").iterdir())
    stop = threading.Event()
    stop.set()
    with pytest.raises(InterruptedError):
        gguf_blocks.write_blocks(gguf, planned, tmp_path / "blocks", stop=stop)


def _plan(path):
    """(the opened file, its matrices planned as a load plans them)."""
    from specdec_cli.target_model.gguf.gguf_config import hf_config
    from specdec_cli.target_model.gguf.gguf_file import open_gguf
    from specdec_cli.target_model.gguf.gguf_layout import check_tensors

    gguf = open_gguf(path)
    expected = check_tensors(gguf, hf_config(gguf))
    return gguf, gguf_blocks.plan_matrices(gguf, expected, tied="output.weight" not in gguf.tensors)


def gguf_model_blocks() -> str:
    from specdec_cli.target_model.in_place.gguf_model import BLOCKS_FILE

    return BLOCKS_FILE


def _mapped_resident_kb(path) -> int:
    """This process's resident kilobytes of its mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as handle:
        for line in handle:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" not in fields[0]:  # a mapping's first line
                inside = len(fields) >= 6 and fields[5] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads /proc/self/smaps (Linux)")
def test_released_pages_leave_the_process_and_come_back_when_read(tmp_path, monkeypatch):
    """`release_pages` lets the mapped file's and cache's pages go from this process (a head training on stored
    features holds only what it reads), the embedding table's alone too; the next forward reads them again and
    computes the same bits."""
    source, architecture, tokenizer = _source("qwen2")
    path = tmp_path / "tiny.gguf"
    write_family_gguf(path, source, architecture, tokenizer)
    model = _in_place(path, tmp_path / "home", monkeypatch).model
    cache = model.source.cache / gguf_model_blocks()
    with torch.inference_mode():
        before = split_logits(model, PROMPTS[0])
    assert _mapped_resident_kb(cache) > 0 and _mapped_resident_kb(path) > 0
    file_kb, cache_kb = _mapped_resident_kb(path), _mapped_resident_kb(cache)
    model.model.embed_tokens.release_pages()  # the table's alone (a head training reads a few rows a step)
    assert _mapped_resident_kb(path) < file_kb and _mapped_resident_kb(cache) == cache_kb
    model.release_pages()
    assert _mapped_resident_kb(cache) == 0 and _mapped_resident_kb(path) == 0
    with torch.inference_mode():
        assert torch.equal(split_logits(model, PROMPTS[0]), before)
    assert _mapped_resident_kb(cache) > 0


def test_q_k_and_v_are_fused_as_views_of_the_mapped_cache(tmp_path, monkeypatch):
    """Matrices that read the same input lie side by side in the cache: the decoder multiplies them as one, with no
    copy of their records."""
    source, architecture, tokenizer = _source("qwen2")
    path = tmp_path / "tiny.gguf"
    write_family_gguf(path, source, architecture, tokenizer)
    model = _in_place(path, tmp_path / "home", monkeypatch).model
    decoder = native.decoder_for(model)
    layer = model.model.layers[0]
    for group, projections in ((decoder.layers[0].gate_up, (layer.mlp.gate_proj, layer.mlp.up_proj)),):
        fused = group[0]
        assert fused.records.untyped_storage().data_ptr() == projections[0].records.untyped_storage().data_ptr()


def test_repacking_decodes_every_type_as_gguf_dequantises_it(tmp_path):
    """The blocks cache holds each matrix exactly as the gguf package dequantises it, in transformers' row order."""
    import gguf
    import numpy as np

    from specdec_cli.target_model.gguf.gguf_file import open_gguf

    source, architecture, tokenizer = _source("llama")
    path = tmp_path / "tiny.gguf"
    write_family_gguf(path, source, architecture, tokenizer)
    opened = open_gguf(path)
    from specdec_cli.target_model.gguf.gguf_config import hf_config
    from specdec_cli.target_model.gguf.gguf_layout import check_tensors

    config = hf_config(opened)
    expected = check_tensors(opened, config)
    planned = gguf_blocks.plan_matrices(opened, expected, tied="output.weight" not in opened.tensors)
    gguf_blocks.write_blocks(opened, planned, tmp_path / "blocks.safetensors")
    mapped = gguf_blocks.map_blocks(tmp_path / "blocks.safetensors")
    assert mapped is not None
    for matrix in planned:
        info = opened.tensors[matrix.gguf_name]
        reference = gguf.quants.dequantize(opened.raw(matrix.gguf_name).reshape(info.shape[0], -1),
                                           gguf.GGMLQuantizationType[info.type_name]).astype(np.float32)
        if matrix.heads:
            reference = reference[gguf_decode.permuted_rows(matrix.out_features, matrix.heads)]
        held = mapped[matrix.module]
        weights = quant.BlockWeights(held.kind, held.records, held.out_features, held.in_features, held.origin)
        assert torch.equal(weights.dense(), torch.from_numpy(np.ascontiguousarray(reference))), matrix.module


# -- hostile files ----------------------------------------------------------------------------------------------


def _tiny_file(tmp_path, name="tiny.gguf", **changes):
    source, architecture, tokenizer = _source("llama")
    path = tmp_path / name
    write_family_gguf(path, source, architecture, tokenizer, **changes)
    return path


def _refused(tmp_path, target, needle, *extra):
    home = tmp_path / "home"
    result = invoke("chat", "--target", str(target), "--prompt", "hello", "-n", "4", *extra,
                    env_extra={"SPECDEC_HOME": str(home)})
    assert_one_line_error(result, needle, code=1)
    for raw in ("When changing to a larger dtype", "index 0 is out of bounds", "cannot reshape array"):
        assert raw not in result.stderr
    models = home / "models"
    assert not models.exists() or not any(models.iterdir()), "nothing is cached for a refused file"
    return result


def test_a_missing_tensor_is_named(tmp_path):
    _refused(tmp_path, _tiny_file(tmp_path, drop=("blk.1.attn_q.weight",)), "missing tensor blk.1.attn_q.weight")


def test_an_unexpected_tensor_is_named(tmp_path):
    _refused(tmp_path, _tiny_file(tmp_path, extra_tensor="blk.0.ssm_conv1d.weight"),
             "unexpected tensor blk.0.ssm_conv1d.weight")


def test_metadata_that_lies_about_a_shape_is_named(tmp_path):
    _refused(tmp_path, _tiny_file(tmp_path, metadata={"embedding_length": 96}),
             "tensor token_embd.weight is [64, 64], its metadata implies [64, 96]")


def test_metadata_that_lies_about_the_layers_is_refused_from_the_tensor_table(tmp_path):
    _refused(tmp_path, _tiny_file(tmp_path, metadata={"block_count": 5}),
             "llama.block_count is 5, but the file's tensors hold 2 layers")


def test_a_truncated_file_names_the_tensor_cut_off(tmp_path):
    path = _tiny_file(tmp_path)
    cut = tmp_path / "cut.gguf"
    shutil.copy(path, cut)
    with open(cut, "r+b") as handle:
        handle.truncate(cut.stat().st_size - 4000)
    _refused(tmp_path, cut, "truncated: tensor ")
    with open(cut, "r+b") as handle:
        handle.truncate(200)
    _refused(tmp_path, cut, "truncated: the header ends past the end of the file")


def test_a_file_labelled_with_another_architecture_is_refused(tmp_path):
    _refused(tmp_path, _tiny_file(tmp_path, label="mamba"), "unexpected tensor ")
    _refused(tmp_path, _tiny_file(tmp_path, name="other.gguf", label="nosuchfamily"),
             "unknown architecture 'nosuchfamily'")


def test_a_file_that_is_not_a_gguf_is_refused(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    _refused(tmp_path, path, "not a GGUF file")


def test_a_fifo_is_refused_not_read(tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    _refused(tmp_path, fifo, "a FIFO, not a regular file")
    index = tmp_path / "pipe.idx"
    os.mkfifo(index)
    result = invoke("chat", "--index", str(index), "--prompt", "hello", "-n", "4",
                    env_extra={"SPECDEC_HOME": str(tmp_path / "home")})
    assert_one_line_error(result, "a FIFO, not a regular file")


def test_the_bench_runs_without_the_rows_that_need_transformers_model(tmp_path, monkeypatch):
    """On a GGUF loaded in place the native decoder is the only forward: `hf` (and the `native` row the bench adds
    where verification is row-invariant) are skipped with their reason, the rest runs."""
    from specdec_cli.bench import bench_settings, resolve_methods, run_bench
    from specdec_cli.bench.runner import IN_PLACE_SKIP
    from specdec_cli.texts.prompts import parse_prompt_lines

    source, architecture, tokenizer = _source("llama")
    path = tmp_path / "tiny.gguf"
    write_family_gguf(path, source, architecture, tokenizer)
    loaded = _in_place(path, tmp_path / "home", monkeypatch)
    conversations = parse_prompt_lines(['{"question_id": 1, "category": "writing", "turns": ["abc abc abc"]}'],
                                       "prompts.jsonl")
    settings = bench_settings(resolve_methods(["none", "pld"], ["hf"]), max_new_tokens=6, warmup=False, raw=True)
    document = run_bench(loaded.model, loaded.tokenizer, conversations, settings).as_json()
    assert document["settings"]["references_skipped"] == {"hf": IN_PLACE_SKIP}
    assert {row["method"] for row in document["results"]} == {"none", "pld"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_stored_config_and_rotary_tables_are_transformers_own(family, tmp_path, monkeypatch):
    """What the in-place cache stores (stored.py) and every load reads back holds the values of the config and the
    rotary module transformers builds for the file, and a second load reads the same from the cache."""
    from specdec_cli.target_model.gguf.gguf_config import hf_config
    from specdec_cli.target_model.gguf.gguf_file import open_gguf
    from specdec_cli.target_model.in_place import stored
    from specdec_cli.target_model.in_place.gguf_model import _rotary

    source, architecture, tokenizer = _source(family)
    path = tmp_path / f"tiny-{family}.gguf"
    write_family_gguf(path, source, architecture, tokenizer)
    first = _in_place(path, tmp_path / "home", monkeypatch).model
    want = hf_config(open_gguf(path))
    assert isinstance(first.config, stored.StoredConfig)
    assert first.config.to_dict() == want.to_dict()
    for name in set(want.to_dict()) - {"transformers_version"}:  # (to_dict adds the version it was written by)
        assert getattr(first.config, name) == getattr(want, name), name
    rotary = _rotary(want)
    if "rope_freqs.weight" not in open_gguf(path).tensors:
        assert dict(first.model.rotary_emb.named_buffers()).keys() == dict(rotary.named_buffers()).keys()
        for name, buffer in rotary.named_buffers():
            assert torch.equal(getattr(first.model.rotary_emb, name), buffer), name
    for name in ("rope_type", "attention_scaling", "full_attention_attention_scaling"):
        assert getattr(first.model.rotary_emb, name, None) == getattr(rotary, name, None), name
    gguf_check._checked.clear()  # a new process: the config is read from the cache, not built
    second = _in_place(path, tmp_path / "home", monkeypatch).model
    assert second.source.repacked is False and second.config.to_dict() == first.config.to_dict()


@pytest.mark.slow
def test_an_iq4_file_loads_at_its_own_bits_and_every_drafter_is_plain_decoding(tmp_path):
    """A file in llama.cpp's IQ4_XS mix (benchmarks/write_gguf.py --recipe iq4_xs: IQ4_XS where a row is a multiple
    of 256, IQ4_NL elsewhere, a Q8_0 output matrix), loaded in place by `specdec chat` with a user's defaults: its
    IQ4 matrices on their packed kinds, and every drafter's tokens those of plain decoding."""
    import json

    with write_gguf_script() as script:
        # hidden 320 (rows of 320: IQ4_NL; the output matrix Q8_0), FFN 512 (ffn_down's rows of 512: IQ4_XS)
        script.SHAPES["iq4-test"] = script.Shape("llama", 320, 2, 512, 5, 1, 64, 512, 10000.0, 1e-5, tied=True)
        path = tmp_path / "tiny-IQ4_XS.gguf"
        counts = script.write(path, "iq4-test", 0, 0.05, script.default_tokenizer_gguf(), "iq4_xs")
    assert set(counts) == {"IQ4_NL", "IQ4_XS", "Q8_0", "F32"}
    home = {"SPECDEC_HOME": str(tmp_path / "home")}
    outputs = {}
    for drafter in ("none", "sam", "pld", "recycle"):
        result = invoke("chat", "-m", str(path), "-d", drafter, "-n", "24", "-p", "Tell me about robots.", "--json",
                        env_extra=home)
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        outputs[drafter] = answer["output_token_ids"]
        assert "IQ4_NL" in str(answer["load"]) and "IQ4_XS" in str(answer["load"])
    assert len(outputs["none"]) == 24
    assert all(tokens == outputs["none"] for tokens in outputs.values()), outputs
    (blocks,) = (tmp_path / "home" / "models").glob("*/blocks.safetensors")
    mapped = gguf_blocks.map_blocks(blocks)
    assert mapped is not None
    kinds = {matrix.origin: matrix.kind for matrix in mapped.values()}
    for type_name in ("IQ4_NL", "IQ4_XS"):  # on their packed kinds, at the file's size
        assert kinds[type_name] == kernels.KIND_OF_GGUF_TYPE[type_name] and kinds[type_name] in kernels.PACKED
