"""GGUF files that lie (issue 46): every header field bounded by the file, every hyperparameter in range, every
tensor's type matching the bytes it spans, no NaN in what the first forward reads. Each hostile file is written here,
from a tiny valid one re-encoded byte by byte (`rewrite`); each is refused in one line naming the key and its value,
exit 1, with nothing cached, and a header that declares billions costs what the file costs."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli_env, invoke
from helpers import GGUF_FAMILIES, family_model, write_family_gguf

from specdec_cli import kernels
from specdec_cli.target_model.gguf import gguf_file

pytestmark = pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")

UINT32, INT32, FLOAT32, STRING, ARRAY, UINT64, FLOAT64, UINT8 = 4, 5, 6, 8, 9, 10, 12, 0
Q4_0, Q4_1 = 2, 3


# -- writing hostile files ----------------------------------------------------------------------------------------


def _string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _value(type_id: int, value) -> bytes:
    if type_id == STRING:
        return _string(value)
    if type_id == ARRAY:  # value: (item type, count, payload bytes)
        item_type, count, payload = value
        return struct.pack("<IQ", item_type, count) + payload
    return struct.pack(gguf_file.SCALARS[type_id], value)


def _parsed(path: Path):
    """(version, [(key, raw key-value bytes)], [(name, dims, type, offset)], data section, alignment) of a file."""
    data = path.read_bytes()
    cursor = gguf_file._Cursor(data, len(data))
    cursor.take(4, "magic")
    version = cursor.scalar("<I", "version")
    tensors, keys = cursor.scalar("<Q", ""), cursor.scalar("<Q", "")
    pairs = []
    for _ in range(keys):
        start = cursor.at
        key = cursor.string("")
        cursor.value(cursor.scalar("<I", key), key)
        pairs.append((key, data[start : cursor.at]))
    records = []
    for _ in range(tensors):
        name = cursor.string("")
        dims = [cursor.scalar("<Q", "") for _ in range(cursor.scalar("<I", ""))]
        records.append([name, dims, cursor.scalar("<I", ""), cursor.scalar("<Q", "")])
    data_start = -(-cursor.at // 32) * 32
    return version, pairs, records, data[data_start:]


def rewrite(source: Path, target: Path, values=None, drop=(), raw=(), types=None, patch=None, tensor_count=None):
    """`source` written again with metadata `values` {key: (type id, value)} set (replaced in place, else added),
    `drop` keys left out, `raw` key-value bytes appended, tensors' `types` {name: ggml type id} relabelled (their
    data kept), `patch` {name: bytes} written over the start of a tensor's data, or a lying `tensor_count`."""
    version, pairs, records, section = _parsed(source)
    values = dict(values or {})
    encoded = []
    for key, chunk in pairs:
        if key in drop:
            continue
        if key in values:
            type_id, value = values.pop(key)
            chunk = _string(key) + struct.pack("<I", type_id) + _value(type_id, value)
        encoded.append(chunk)
    encoded += [_string(key) + struct.pack("<I", type_id) + _value(type_id, value)
                for key, (type_id, value) in values.items()]
    encoded += list(raw)
    section = bytearray(section)
    for name, _, _, offset in records:
        if patch and name in patch:
            section[offset : offset + len(patch[name])] = patch[name]
    header = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(records) if tensor_count is None else tensor_count,
                                             len(encoded)))
    header += b"".join(encoded)
    for name, dims, type_id, offset in records:
        type_id = (types or {}).get(name, type_id)
        header += _string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", dim) for dim in dims)
        header += struct.pack("<IQ", type_id, offset)
    header += bytes(-len(header) % 32)
    target.write_bytes(bytes(header) + bytes(section))
    return target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A valid tiny llama GGUF (2 layers, width 64, 4 heads of 16, 2 kv heads, a gpt2 tokenizer)."""
    architecture, settings = GGUF_FAMILIES["llama"]
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_family_gguf(path, family_model("llama", seed=5, **settings), architecture, "gpt2")
    return path


def refused(tmp_path, path: Path, needle: str, command=("chat",), extra=()) -> str:
    home = tmp_path / "home"
    args = [*command, "--target", str(path)] + (["--prompt", "hello", "-n", "2"] if command == ("chat",) else [])
    args += list(extra)
    result = invoke(*args, env_extra={"SPECDEC_HOME": str(home)})
    line = assert_one_line_error(result, needle, code=1)
    assert "internal error" not in line
    models = home / "models"
    assert not models.exists() or not any(models.iterdir()), "nothing is cached for a refused file"
    return line


# -- the layer count ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [4294967295, 10**6, 5, 1])
def test_a_layer_count_the_tensor_table_does_not_bear_out_is_refused(tiny, tmp_path, count):
    path = rewrite(tiny, tmp_path / "layers.gguf", {"llama.block_count": (UINT32, count)})
    refused(tmp_path, path, f"llama.block_count is {count:,}, but the file's tensors hold 2 layers (blk.0 to blk.1)")


def test_a_family_transformers_converts_gets_the_same_bound(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "mamba.gguf", {"general.architecture": (STRING, "mamba"),
                                                   "mamba.block_count": (UINT32, 4294967295)})
    refused(tmp_path, path, "mamba.block_count is 4,294,967,295, but the file's tensors hold 2 layers")


def test_a_huge_layer_count_costs_what_the_file_costs(tiny, tmp_path):
    """block_count 2^32 - 1 in a 64 KB file: refused from the tensor table, in a process whose peak memory stays
    that of a normal start (a config or an expected-tensor list of 4 billion layers would take gigabytes)."""
    path = rewrite(tiny, tmp_path / "layers.gguf", {"llama.block_count": (UINT32, 4294967295)})
    for command in (["chat", "--target", str(path), "--prompt", "hi", "-n", "2"],
                    ["memory", "info", "--target", str(path)]):
        line, peak = _peak(tmp_path, command)
        assert "llama.block_count is 4,294,967,295" in line, line
        assert peak < 1 << 30, f"peak memory {peak / 2**20:.0f} MiB"


def _peak(tmp_path, args) -> tuple[str, int]:
    """(stderr's last line, peak resident bytes) of `specdec ARGS` in a fresh process."""
    # VmHWM: the peak of this process's own memory (ru_maxrss would carry the parent's peak over the exec)
    script = ("import atexit, sys\n"
              "peak = lambda: next(int(line.split()[1]) for line in open('/proc/self/status') "
              "if line.startswith('VmHWM:'))\n"
              "atexit.register(lambda: sys.stderr.write(f'peak {peak()}\\n'))\n"
              f"sys.argv = ['specdec', *{args!r}]\n"
              "from specdec_cli.cli import main\n"
              "main()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                            env=cli_env({"SPECDEC_HOME": str(tmp_path / "home")}))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[-1].startswith("peak ") and lines[0].startswith("specdec: error:"), result.stderr
    return lines[0], int(lines[-1].split()[1]) * 1024


def test_a_layer_count_stored_as_a_string_is_named(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "string.gguf", {"llama.block_count": (STRING, "2")})
    refused(tmp_path, path, "llama.block_count is a string ('2'), not an integer")


@pytest.mark.parametrize("value, type_id, shown", [("3", STRING, "a string ('3')"), (-1, INT32, "-1")])
def test_a_token_id_that_is_not_one_is_named(tiny, tmp_path, value, type_id, shown):
    path = rewrite(tiny, tmp_path / "eos.gguf", {"tokenizer.ggml.eos_token_id": (type_id, value)})
    refused(tmp_path, path, f"tokenizer.ggml.eos_token_id is {shown}, not a token id")


# -- the widths --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("heads, needle", [
    (0, "llama.attention.head_count is 0; it must be at least 1"),
    (7, "llama.attention.head_count is 7: 7 heads of 16 make 112 query rows, tensor blk.0.attn_q.weight has 64"),
    (2**31, "llama.attention.head_count is 2147483648: 2147483648 heads of 16 make 34,359,738,368 query rows"),
])
def test_a_head_count_out_of_range_is_named(tiny, tmp_path, heads, needle):
    path = rewrite(tiny, tmp_path / "heads.gguf", {"llama.attention.head_count": (UINT32, heads)})
    refused(tmp_path, path, needle)


def test_a_head_count_that_does_not_divide_the_width_is_named(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "heads.gguf", {"llama.attention.head_count": (UINT32, 7)},
                   drop=("llama.attention.key_length", "llama.attention.value_length"))
    refused(tmp_path, path, "llama.attention.head_count is 7, which does not divide llama.embedding_length 64")


def test_kv_heads_that_do_not_divide_the_heads_are_named(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "kv.gguf", {"llama.attention.head_count_kv": (UINT32, 3)})
    refused(tmp_path, path, "llama.attention.head_count_kv is 3, which does not divide llama.attention.head_count 4")


def test_a_width_the_tensors_do_not_have_is_named(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "width.gguf", {"llama.embedding_length": (UINT32, 96)})
    refused(tmp_path, path, "llama.embedding_length is 96: tensor token_embd.weight is [64, 64], its metadata "
                            "implies [64, 96]")


@pytest.mark.parametrize("key, value", [("llama.rope.freq_base", 0.0), ("llama.rope.freq_base", float("nan")),
                                        ("llama.rope.freq_base", -1.0),
                                        ("llama.attention.layer_norm_rms_epsilon", float("nan")),
                                        ("llama.attention.layer_norm_rms_epsilon", float("inf"))])
def test_constants_that_cannot_be_right_are_named(tiny, tmp_path, key, value):
    path = rewrite(tiny, tmp_path / "constant.gguf", {key: (FLOAT32, value)})
    refused(tmp_path, path, f"{key} is {value!r}; it must be a positive finite number")


@pytest.mark.parametrize("label", ["qwen2", "qwen3", "phi3"])
def test_another_family_s_label_over_llama_keys_names_the_missing_key(tiny, tmp_path, label):
    path = rewrite(tiny, tmp_path / "label.gguf", {"general.architecture": (STRING, label)})
    refused(tmp_path, path, f"the file is labelled {label} but has no {label}.block_count (its keys are llama.*")


# -- numbers that cannot be right -------------------------------------------------------------------------------


def test_a_matrix_relabelled_with_a_smaller_type_is_refused(tiny, tmp_path):
    """blk.0.attn_q.weight is Q4_1 (20 bytes a block); labelled Q4_0 (18) it would be read as garbage."""
    path = rewrite(tiny, tmp_path / "relabelled.gguf", types={"blk.0.attn_q.weight": Q4_0})
    refused(tmp_path, path, "tensor blk.0.attn_q.weight (Q4_0, [64, 64]: 2,304 bytes) spans 2,560 bytes up to "
                            "tensor blk.0.attn_k.weight's start; its type or shape does not match its data")


def test_a_matrix_relabelled_with_a_larger_type_is_refused(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "relabelled.gguf", types={"blk.0.attn_k.weight": Q4_1})
    refused(tmp_path, path, "tensor blk.0.attn_k.weight (Q4_1, [32, 64]: 1,280 bytes) runs past tensor "
                            "blk.0.attn_v.weight's start")


@pytest.mark.parametrize("bad, extra", [(float("nan"), ()), (float("inf"), ()), (float("nan"), ("--weights", "dense"))])
def test_a_norm_holding_nan_is_refused_before_anything_is_cached(tiny, tmp_path, bad, extra):
    """In place or converted for transformers (`--weights dense`): refused before anything is cached."""
    path = rewrite(tiny, tmp_path / "nan.gguf", patch={"blk.1.ffn_norm.weight": struct.pack("<f", bad)})
    refused(tmp_path, path, "tensor blk.1.ffn_norm.weight holds 1 NaN or infinite values of 64", extra=extra)


# -- the header's counts and arrays -------------------------------------------------------------------------------


def test_counts_the_file_cannot_hold_are_refused(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "count.gguf", tensor_count=(1 << 24) - 1)
    refused(tmp_path, path, "truncated: the header ends past the end of the file (in 16,777,215 tensor records")
    lying = _string("lying") + struct.pack("<I", ARRAY) + struct.pack("<IQ", UINT64, 1 << 40)
    path = rewrite(tiny, tmp_path / "array.gguf", raw=[lying])
    refused(tmp_path, path, "truncated: the header ends past the end of the file (in lying: 1,099,511,627,776 items "
                            "claimed, more than the")
    long = _string("long") + struct.pack("<I", STRING) + struct.pack("<Q", 1 << 62)
    refused(tmp_path, rewrite(tiny, tmp_path / "string.gguf", raw=[long]), "truncated: the header ends past the end")


def test_the_metadata_s_arrays_are_capped_in_all(tiny, tmp_path):
    """Arrays each under the per-array cap, together over the whole's: refused at the one that passes it."""
    half = gguf_file.MAX_ARRAY_ITEMS // 2 + 1
    arrays = [_string(f"spare.{index}") + struct.pack("<I", ARRAY) + _value(ARRAY, (UINT8, half, bytes(half)))
              for index in range(2)]
    path = rewrite(tiny, tmp_path / "arrays.gguf", raw=arrays)
    refused(tmp_path, path, f"metadata spare.1 claims {half:,} items; the metadata's arrays hold at most "
                            f"{gguf_file.MAX_ARRAY_ITEMS:,} in all")
    strings = gguf_file.MAX_STRINGS + 1
    many = _string("spare.strings") + struct.pack("<I", ARRAY) + \
        _value(ARRAY, (STRING, strings, (struct.pack("<Q", 1) + b"a") * strings))
    refused(tmp_path, rewrite(tiny, tmp_path / "strings.gguf", raw=[many]),
            f"metadata spare.strings claims {strings:,} strings; the metadata holds at most")


def test_the_metadata_s_strings_are_capped_in_all(tiny, tmp_path, monkeypatch):
    """Strings each under the one-string cap, together over the whole's: refused at the one that passes it (the
    whole's cap made small here, so that the file is too)."""
    monkeypatch.setattr(gguf_file, "MAX_TEXT_BYTES", 1 << 16)
    raw = [_string(f"spare.{index}") + struct.pack("<I", STRING) + _string(b"x" * (1 << 14)) for index in range(4)]
    refused(tmp_path, rewrite(tiny, tmp_path / "text.gguf", raw=raw),
            "metadata spare.3: the metadata's strings hold more than 65,536 bytes in all")
    many = _string("spare.strings") + struct.pack("<I", ARRAY) + \
        _value(ARRAY, (STRING, 1 << 13, _string(b"y" * 8) * (1 << 13)))
    refused(tmp_path, rewrite(tiny, tmp_path / "texts.gguf", raw=[many]),
            "metadata spare.strings: the metadata's strings hold more than 65,536 bytes in all")


def test_huge_metadata_arrays_cost_what_the_file_costs(tiny, tmp_path):
    """Four arrays of 2^21 uint64 (64 MiB): refused at the cap, parsed as numpy arrays (never Python lists of
    millions of ints), in a process whose peak memory stays well under a gigabyte."""
    count = 1 << 21
    arrays = [_string(f"spare.{index}") + struct.pack("<I", ARRAY) + _value(ARRAY, (UINT64, count, bytes(8 * count)))
              for index in range(4)]
    path = rewrite(tiny, tmp_path / "arrays.gguf", raw=arrays)
    line, peak = _peak(tmp_path, ["chat", "--target", str(path), "--prompt", "hi", "-n", "2"])
    assert "metadata spare.1 claims 2,097,152 items" in line, line  # (the tokenizer holds a few)
    assert peak < 1 << 30, f"peak memory {peak / 2**20:.0f} MiB"


def test_long_numeric_arrays_stay_numpy_arrays(tiny, tmp_path):
    import numpy as np

    count = gguf_file.SMALL_ARRAY + 1
    scores = _string("spare.scores") + struct.pack("<I", ARRAY) + \
        _value(ARRAY, (FLOAT32, count, np.arange(count, dtype="<f4").tobytes()))
    opened = gguf_file.open_gguf(rewrite(tiny, tmp_path / "scores.gguf", raw=[scores]))
    held = opened.metadata["spare.scores"]
    assert isinstance(held, np.ndarray) and held.shape == (count,) and float(held[-1]) == count - 1
    assert isinstance(opened.metadata["tokenizer.ggml.token_type"], list)  # short ones are lists, as before


@pytest.mark.parametrize("tensor", ["blk.0.attn_q.weight", "blk.1.ffn_down.weight"])
def test_a_quantised_matrix_with_a_nan_or_infinite_scale_is_refused_at_repacking(tiny, tmp_path, tensor):
    """A block scale (f16 d) set to NaN or infinity in a Q4_x or Q8_0 matrix: refused in one line naming the tensor,
    before the first forward, with nothing cached (the repacking checks every block's d, m and dmin)."""
    from specdec_cli.target_model.gguf.gguf_file import open_gguf

    for index, value in enumerate((b"\x00\x7e", b"\x00\x7c")):  # NaN, +infinity
        path = tmp_path / f"scale{index}.gguf"
        shutil.copyfile(tiny, path)
        info = open_gguf(path).tensors[tensor]
        data = bytearray(path.read_bytes())
        at = info.start + 5 * {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[info.type_name]  # block 5's d
        data[at : at + 2] = value
        path.write_bytes(bytes(data))
        refused(tmp_path, path, f"tensor {tensor} ({info.type_name}) has a NaN or infinite scale")
