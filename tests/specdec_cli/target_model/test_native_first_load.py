"""A GGUF's first load in place without transformers (native_side_files.py, gguf_tokenizer.py,
gguf_config.config_without_transformers, stored.default_rotary): every side file of the cache, byte for byte (and
stored.json value for value), against what transformers writes for the same file, for the tests' small llama,
qwen2 and qwen3 files, the default model and Qwen2.5-Coder-0.5B where benchmarks/fetch_qwen_coder.py put it;
tokenizers of the shapes the converter knows (added tokens of both kinds, a mislabelled control token, a split of
its own) built alike; every other file left to transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from helpers import family_model, qwen_coder_gguf, write_family_gguf

from specdec_cli.target_model.gguf import gguf_tokenizer
from specdec_cli.target_model.gguf.gguf_config import config_without_transformers, hf_config
from specdec_cli.target_model.gguf.gguf_file import open_gguf
from specdec_cli.target_model.in_place import gguf_model
from specdec_cli.target_model.in_place.native_side_files import write_native_side_files
from specdec_cli.target_model.in_place.stored import STORED_FILE, default_rotary

QWEN = qwen_coder_gguf()  # (helpers.py: $SPECDEC_TEST_QWEN_GGUF or the fetch script's place)
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json",
              "generation_config.json")


def _both(path: Path, tmp: Path) -> tuple[Path, Path]:
    """(the side files written here, those transformers writes), each in a folder of its own."""
    ours, theirs = tmp / "ours", tmp / "theirs"
    ours.mkdir()
    theirs.mkdir()
    file = open_gguf(path)
    assert write_native_side_files(file, ours)
    gguf_model._write_side_files_by_transformers(file, hf_config(file), theirs)
    return ours, theirs


def _assert_same_files(ours: Path, theirs: Path) -> None:
    assert sorted(item.name for item in ours.iterdir()) == sorted(item.name for item in theirs.iterdir())
    for name in SIDE_FILES:
        if (theirs / name).exists():
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    assert json.loads((ours / STORED_FILE).read_text()) == json.loads((theirs / STORED_FILE).read_text())


@pytest.mark.parametrize("family, extra", [("llama", {}), ("llama", {"tie_word_embeddings": True}),
                                           ("qwen2", {}), ("qwen3", {"head_dim": 128}),
                                           ("qwen3", {"head_dim": 8})])
def test_tiny_files_side_files_equal_transformers(tmp_path, family, extra):
    path = tmp_path / f"{family}.gguf"
    write_family_gguf(path, family_model(family, **extra), family, "gpt2")
    _assert_same_files(*_both(path, tmp_path))


@pytest.mark.real_model
def test_the_default_model_side_files_equal_transformers(tmp_path):
    from specdec_cli.target_model.load.target_source import default_gguf_path

    _assert_same_files(*_both(default_gguf_path(), tmp_path))


@pytest.mark.skipif(not QWEN.is_file(), reason="Qwen2.5-Coder-0.5B is not at hand (benchmarks/fetch_qwen_coder.py)")
def test_qwen_coder_side_files_equal_transformers(tmp_path):
    _assert_same_files(*_both(QWEN, tmp_path))


def test_default_rotary_is_transformers_bits():
    import torch
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    for theta, hidden, heads in ((10000.0, 64, 4), (1000000.0, 896, 14), (500000.0, 4096, 32), (100000.0, 576, 9)):
        config = Qwen2Config(hidden_size=hidden, num_attention_heads=heads, rope_theta=theta)
        theirs = Qwen2RotaryEmbedding(config=config)
        ours = default_rotary(config.to_dict())
        assert torch.equal(ours.inv_freq, theirs.inv_freq) and ours.inv_freq.dtype == theirs.inv_freq.dtype


# -- tokenizers alone ----------------------------------------------------------------------------------------------
LETTERS = [chr(code) for code in range(ord("a"), ord("z") + 1)]


def _tokenizer_gguf(path: Path, *, pre: str | None = "qwen2", tokens=None, types=None, merges=None,
                    add_bos: bool | None = False, model: str = "gpt2", ids=(1, 2, None, 0), template="{{ x }}"):
    """A GGUF holding a byte-level tokenizer's metadata alone (no tensors)."""
    tokens = tokens or ["<|pad|>", "<|bos|>", "<|eos|>", "<think>", "\u0120", "é", "x y", "<|ctl é|>", *LETTERS,
                        "ab", "\u0120a", "b"]
    types = types or [3, 3, 3, 4, 1, 1, 4, 3, *([1] * len(LETTERS)), 1, 1, 1]
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges if merges is not None else ["a b", "\u0120 a"])
    for setter, token_id in zip(("add_bos_token_id", "add_eos_token_id", "add_unk_token_id", "add_pad_token_id"), ids):
        if token_id is not None:
            getattr(writer, setter)(token_id)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if template is not None:
        writer.add_chat_template(template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("pre, endoftext, add_bos", [("qwen2", None, False), ("llama-bpe", None, False),
                                                      (None, None, None), ("smollm", 1, False), ("qwen2", 3, False),
                                                      ("llama-bpe", None, True), (None, 3, True)])
def test_tokenizer_files_equal_transformers(tmp_path, pre, endoftext, add_bos):
    """Added tokens of both kinds, a control token outside the byte alphabet (left a plain token), a user-defined
    one with a space (not in the respelled vocabulary: not added), each split; GPT-2's "<|endoftext|>" absent (added
    past the vocabulary), a plain token or a control token; a BOS before every text (Llama 3's files) or not."""
    tokens, types = None, None
    if endoftext is not None:
        tokens = ["<|pad|>", "<|bos|>", "<|eos|>", "<|endoftext|>", *LETTERS, "ab", "\u0120a", "b", "\u0120"]
        types = [3, 3, 3, endoftext, *([1] * (len(LETTERS) + 4))]
    path = _tokenizer_gguf(tmp_path / "t.gguf", pre=pre, tokens=tokens, types=types, add_bos=add_bos)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    built = gguf_tokenizer.tokenizer_files(open_gguf(path).metadata)
    assert built is not None
    ours.mkdir()
    built.write(ours)
    gguf_model.tokenizer_from_file(open_gguf(path)).save_pretrained(theirs)
    assert sorted(item.name for item in ours.iterdir()) == sorted(item.name for item in theirs.iterdir())
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


@pytest.mark.parametrize("change", [{"model": "llama"}, {"pre": "tekken"}, {"add_bos": True, "ids": (None, 2, None, 0)},
                                    {"ids": (5, 2, None, 0)}, {"merges": ["a b c"]}])
def test_other_tokenizers_are_left_to_transformers(tmp_path, change):
    """SentencePiece, a split the table does not hold, a BOS added to every text but none named, a named special
    token that is not a control token, a merge of three: None (transformers' converter builds them)."""
    path = _tokenizer_gguf(tmp_path / "t.gguf", **change)
    assert gguf_tokenizer.tokenizer_files(open_gguf(path).metadata) is None


def test_the_split_table_is_transformers():
    """Each split is the one transformers' converter puts before the byte-level step; the names left on GPT-2's
    split are names it has no split for."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    for name, split in gguf_tokenizer.SPLITS.items():
        assert GGUF_PRE_TOKENIZER_SPLITS[name] == split, name
    assert not set(gguf_tokenizer.GPT2_SPLIT) & set(GGUF_PRE_TOKENIZER_SPLITS)


def test_byte_alphabet_is_gpt2s():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    assert gguf_tokenizer.byte_alphabet() == bytes_to_unicode()


def test_other_families_are_left_to_transformers(tmp_path):
    """phi3 (fused projections, a config of its own) and a llama file of a Mistral: transformers builds them."""
    phi = tmp_path / "phi3.gguf"
    write_family_gguf(phi, family_model("phi3"), "phi3", "gpt2")
    assert config_without_transformers(open_gguf(phi)) is None
    assert not write_native_side_files(open_gguf(phi), tmp_path)
    mistral = tmp_path / "mistral.gguf"
    model = family_model("llama")
    write_family_gguf(mistral, model, "llama", "gpt2")
    file = open_gguf(mistral)
    file.metadata["general.name"] = "tiny mistral"
    assert config_without_transformers(file) is None


def test_a_bos_adding_tokenizer_built_here_answers_as_transformers(tmp_path):
    """A Llama 3-style file (`add_bos_token`, the llama-bpe split): the files built here, read back without
    transformers (native_tokenizer.py), encode, decode and render as transformers' tokenizer of the file does."""
    from test_native_tokenizer import TEXTS, _compare

    from specdec_cli.target_model.in_place.native_tokenizer import load_native_tokenizer

    path = _tokenizer_gguf(tmp_path / "t.gguf", pre="llama-bpe", add_bos=True,
                           template="{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    built = gguf_tokenizer.tokenizer_files(open_gguf(path).metadata)
    assert built is not None
    (tmp_path / "ours").mkdir()
    built.write(tmp_path / "ours")
    ours = load_native_tokenizer(tmp_path / "ours")
    assert ours is not None
    from transformers import AutoTokenizer

    gguf_model.tokenizer_from_file(open_gguf(path)).save_pretrained(tmp_path / "theirs")
    theirs = AutoTokenizer.from_pretrained(str(tmp_path / "theirs"))  # as a cache made by transformers is read
    assert ours.encode("ab a")[0] == theirs.bos_token_id == 1  # the BOS is there
    _compare(theirs, ours, TEXTS)


def test_transformers_converter_reads_the_file_alone(tmp_path):
    """A GGUF whose tokenizer transformers builds, lying beside another model's tokenizer files: the tokenizer is
    the file's own (the converter reads it from a folder holding the file alone)."""
    path = _tokenizer_gguf(tmp_path / "t.gguf", pre="tekken")  # a split only transformers knows
    clean = gguf_model.tokenizer_from_file(open_gguf(path))
    (tmp_path / "other").mkdir()
    other = _tokenizer_gguf(tmp_path / "other" / "o.gguf", pre="qwen2", add_bos=True,
                            tokens=["<|eos|>", "<|bos|>", "<|pad|>", *LETTERS, "\u0120", "ba", "\u0120b", "a"],
                            types=[3, 3, 3, *([1] * (len(LETTERS) + 4))], merges=["b a", "\u0120 b"])
    foreign = gguf_tokenizer.tokenizer_files(open_gguf(other).metadata)
    assert foreign is not None
    foreign.write(tmp_path)  # another model's tokenizer files beside the GGUF
    beside = gguf_model.tokenizer_from_file(open_gguf(path))
    assert beside.bos_token == clean.bos_token == "<|bos|>"
    assert beside.get_vocab() == clean.get_vocab()
    assert beside("ab a")["input_ids"] == clean("ab a")["input_ids"]
