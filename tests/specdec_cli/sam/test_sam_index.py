"""Index files and corpus reading: save/load round trip, refusal of bad files, build_index on a tiny
character-level tokenizer (no model needed), and the tokenizer fingerprint."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import make_char_tokenizer_dir

from specdec_cli.errors import SpecdecError
from specdec_cli.sam.automaton import ROOT, build_static
from specdec_cli.sam.index import ARRAY_ORDER, FORMAT_VERSION, load_index, read_index_info, save_index, verify_index
from specdec_cli.texts.corpus import build_index, row_text
from specdec_cli.texts.fingerprint import tokenizer_fingerprint


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(make_char_tokenizer_dir(tmp_path_factory.mktemp("chartok")))


def small_automaton():
    tokens = np.array([3, 4, 5, 0, 3, 4, 6, 0], dtype=np.int32)
    return build_static(tokens, vocab_size=10, separators=(0,))


def save_small(path: Path, **metadata) -> int:
    return save_index(path, small_automaton(), {"tokenizer_fingerprint": "sha256:test", "vocab_size": 10,
                                                 "eos_id": 0, **metadata})


def rewrite_header(path: Path, change) -> None:
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    change(header)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + length :])


# ------------------------------------------------------------------------------------------ round trip


def test_save_load_round_trip(tmp_path):
    path = tmp_path / "small.sam"
    size = save_small(path, documents=2, sources=[{"path": "a.txt", "sha256": "00", "size": 3}])
    assert size == path.stat().st_size
    index = load_index(path)
    for name, array in small_automaton().arrays().items():
        assert np.array_equal(index.automaton.arrays()[name], array), name
        assert not index.automaton.arrays()[name].flags.owndata  # a view of the file mapping, not a copy
    assert index.fingerprint == "sha256:test" and index.eos_id == 0 and index.vocab_size == 10
    assert index.metadata["format"] == "specdec-sam-index" and index.metadata["format_version"] == FORMAT_VERSION
    assert index.metadata["documents"] == 2 and index.metadata["sources"][0]["path"] == "a.txt"
    automaton = index.automaton
    state, match_len = ROOT, 0
    for token in (3, 4):
        state, match_len = automaton.advance(state, match_len, token)
    assert match_len == 2 and automaton.continuation(state, 5) == [5] and automaton.count(state) == 2
    info = read_index_info(path)
    assert info["tokens"] == 8 and info["file_bytes"] == size and info["states"] == automaton.num_states
    assert not list(tmp_path.glob(".*tmp*"))


def test_file_is_plain_safetensors(tmp_path):
    from safetensors.numpy import load_file

    path = tmp_path / "small.sam"
    save_small(path)
    arrays = load_file(str(path))
    assert np.array_equal(arrays["text"], small_automaton().text)


def test_interrupted_save_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "small.sam"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("specdec_cli.sam.index.os.fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_small(path)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------ bad files


def assert_refused(path: Path, *fragments: str) -> None:
    for opener in (load_index, read_index_info):
        with pytest.raises(SpecdecError) as caught:
            opener(path)
        message = str(caught.value)
        assert str(path) in message and "\n" not in message
        for fragment in fragments:
            assert fragment in message


@pytest.mark.parametrize("keep", [0, 5, 8, 30, -1, -4, -100])
def test_truncated_file(tmp_path, keep):
    path = tmp_path / "small.sam"
    save_small(path)
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[: len(data) + keep])
    assert_refused(path)


def test_trailing_bytes(tmp_path):
    path = tmp_path / "small.sam"
    save_small(path)
    path.write_bytes(path.read_bytes() + b"\0\0\0\0")
    assert_refused(path, "trailing")


def test_corrupted_header(tmp_path):
    path = tmp_path / "small.sam"
    save_small(path)
    data = bytearray(path.read_bytes())
    data[20:30] = b"#" * 10
    path.write_bytes(bytes(data))
    assert_refused(path)


def assert_load_refused(path: Path, fragment: str) -> None:
    """Opening fails with one line naming the file (`--info` reads the header only, so it still works)."""
    with pytest.raises(SpecdecError) as caught:
        load_index(path)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message and fragment in message


def _body_values(path: Path):
    """(whole file bytes, data start, {array name: (begin, end)}) of a saved index, for corrupting its body."""
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    spans = {name: tuple(entry["data_offsets"]) for name, entry in header.items() if name != "__metadata__"}
    return data, 8 + length, spans


def set_word(path: Path, name: str, index: int, value: int) -> None:
    """Overwrite element `index` of array `name` in a saved index file."""
    data, start, spans = _body_values(path)
    where = start + spans[name][0] + 4 * index
    data[where : where + 4] = int(value).to_bytes(4, "little", signed=True)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name, value", [("text", 99), ("text", -3), ("link", 50), ("link", -7), ("length", 0),
                                         ("length", 1000), ("min_endpos", 8), ("trans_tokens", 10),
                                         ("trans_targets", 0), ("trans_targets", 400), ("trans_offsets", 2**30)])
def test_corrupted_body_is_refused(tmp_path, name, value):
    """Values out of range anywhere in the arrays are one clear error, not an IndexError while drafting."""
    path = tmp_path / "small.sam"
    save_small(path)
    begin, end = _body_values(path)[2][name]
    set_word(path, name, 1 if name == "trans_offsets" else (end - begin) // 8, value)  # 1 or the middle
    assert_load_refused(path, "corrupt index")


def test_suffix_link_cycle_is_refused(tmp_path):
    """A link to a state that is not shorter would make the match walk loop forever."""
    path = tmp_path / "small.sam"
    save_small(path)
    set_word(path, "link", 2, 2)  # state 2 links to itself
    assert_load_refused(path, "suffix links")


def test_in_range_corruption_never_crashes_the_drafter(tmp_path):
    """Whatever passes the checks may draft nonsense (verification rejects it) but must not raise or hang."""
    path = tmp_path / "small.sam"
    save_small(path)
    clean, start, spans = _body_values(path)
    rng = np.random.default_rng(0)
    loaded = 0
    for trial in range(300):
        data = bytearray(clean)
        name = list(spans)[trial % len(spans)]
        begin, end = spans[name]
        word = start + begin + 4 * int(rng.integers(0, (end - begin) // 4))
        data[word : word + 4] = int(rng.integers(-2, 12)).to_bytes(4, "little", signed=True)
        path.write_bytes(bytes(data))
        try:
            automaton = load_index(path).automaton
        except SpecdecError:
            continue
        loaded += 1
        state, match_len = ROOT, 0
        for token in rng.integers(0, 10, 40):
            state, match_len = automaton.advance(state, match_len, int(token))
            assert 0 <= state < automaton.num_states
            automaton.continuation(state, 4)
    assert loaded > 50  # most in-range changes load (the check is not a checksum)


def test_random_bytes(tmp_path):
    path = tmp_path / "noise.sam"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    assert_refused(path, "not a specdec")


def test_foreign_safetensors_file(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "weights.safetensors"
    save_file({"weight": np.zeros((4, 4), dtype=np.float32)}, str(path))
    assert_refused(path, "not a specdec")


def test_wrong_format_version(tmp_path):
    path = tmp_path / "small.sam"
    save_small(path)
    rewrite_header(path, lambda header: header["__metadata__"].update(format_version="2"))
    assert_refused(path, "version 2", "rebuild")


@pytest.mark.parametrize(
    "change",
    [
        lambda header: header["link"].update(dtype="F32"),
        lambda header: header["link"].update(shape=[3]),
        lambda header: header["text"].update(data_offsets=[4, 36]),
        lambda header: header.pop("count"),
        lambda header: header["__metadata__"].update(states="abc"),
        lambda header: header["__metadata__"].pop("tokenizer_fingerprint"),
    ],
)
def test_inconsistent_header(tmp_path, change):
    path = tmp_path / "small.sam"
    save_small(path)
    rewrite_header(path, change)
    assert_refused(path)


def test_missing_file_and_directory(tmp_path):
    assert_refused(tmp_path / "absent.sam", "not found")
    with pytest.raises(SpecdecError):
        load_index(tmp_path)


# ------------------------------------------------------------------------------------------ corpus


def test_row_text_variants():
    assert row_text({"text": "plain"}) == "plain"
    assert row_text({"body": "other"}, field="body") == "other"
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    assert row_text(chat) == "hi\n\nhello"
    assert row_text({"turns": ["one", "two"]}) == "one\n\ntwo"
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert row_text(parts) == "ab"
    assert row_text({"prompt": "Q?", "answer": "A."}) == "Q?\n\nA."
    assert row_text({"other": 1}) is None and row_text(3) is None


def test_build_index_reads_all_input_kinds(tmp_path, char_tokenizer, monkeypatch):
    corpus = tmp_path / "corpus"
    (corpus / "nested").mkdir(parents=True)
    (corpus / "a.txt").write_text("def add(a, b):\n    return a + b\n")
    (corpus / "nested" / "b.txt").write_text("the cat sat on the mat")
    (corpus / "ignored.md").write_text("not matched by the glob")
    rows = [
        {"text": "row one"},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "answer"}]},
        {"prompt": "p", "answer": "a"},
        {"nothing": True},
    ]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"from stdin")))
    progress = []
    output = tmp_path / "out.sam"
    summary = build_index([str(corpus), str(jsonl), "-"], output, char_tokenizer,
                          target_name="chartok", on_progress=lambda *args: progress.append(args))
    assert summary["documents"] == 2 + 3 + 1 and summary["skipped_rows"] == 1
    texts = ["def add(a, b):\n    return a + b\n", "the cat sat on the mat", "row one", "q\n\nanswer", "p\n\na",
             "from stdin"]
    assert summary["tokens"] == sum(len(text) + 1 for text in texts)
    assert progress and progress[-1] == (summary["tokens"], summary["documents"])
    index = load_index(output)
    eos = char_tokenizer.eos_token_id
    text = index.automaton.text.tolist()
    assert text.count(eos) == 6 and text[-1] == eos
    assert char_tokenizer.decode(text[: text.index(eos)]) == texts[0]
    meta = index.metadata
    assert meta["tokenizer_fingerprint"] == tokenizer_fingerprint(char_tokenizer)
    assert meta["eos_id"] == eos and meta["vocab_size"] == len(char_tokenizer)
    assert [source["path"] for source in meta["sources"]][-1] == "-"
    assert meta["sources"][0]["sha256"] and meta["sources"][0]["size"] > 0
    assert meta["build"]["target"] == "chartok" and meta["documents"] == 6
    # A match drafts what followed it in the corpus, stopping at the document's end.
    automaton = index.automaton
    state, match_len = ROOT, 0
    for token in char_tokenizer("the cat", add_special_tokens=False)["input_ids"]:
        state, match_len = automaton.advance(state, match_len, token)
    assert char_tokenizer.decode(automaton.continuation(state, 100)) == " sat on the mat"


def test_directory_search_skips_files_that_are_not_text(tmp_path, char_tokenizer):
    """Files a directory's search finds that are not UTF-8 text (NUL bytes, another encoding) are left out and
    named in the summary; the same files named on the command line are refused (test_build_index_errors)."""
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("the cat sat on the mat")
    (tree / "sub" / "b.txt").write_text("a dog ran")
    (tree / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    (tree / "sub" / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    output = tmp_path / "out.sam"
    summary = build_index([str(tree)], output, char_tokenizer)
    assert summary["documents"] == 2 and summary["sources"] == 2
    assert sorted(Path(path).name for path in summary["skipped_files"]) == ["image.txt", "latin1.txt"]
    meta = read_index_info(output)
    assert sorted(Path(source["path"]).name for source in meta["sources"]) == ["a.txt", "b.txt"]
    assert meta["build"]["skipped_files"] == 2
    # a directory of nothing but such files is an empty corpus, and says why
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "x.txt").write_bytes(b"\x00\x01")
    with pytest.raises(SpecdecError, match="empty corpus.*1 files skipped: not UTF-8 text"):
        build_index([str(junk)], tmp_path / "junk.sam", char_tokenizer)


def test_build_index_errors(tmp_path, char_tokenizer):
    output = tmp_path / "out.sam"
    with pytest.raises(SpecdecError, match="no such file"):
        build_index([str(tmp_path / "absent.txt")], output, char_tokenizer)
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    with pytest.raises(SpecdecError, match="looks binary"):
        build_index([str(binary)], output, char_tokenizer)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(SpecdecError, match="looks binary"):
        build_index([str(latin)], output, char_tokenizer)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(SpecdecError, match="empty corpus"):
        build_index([str(empty)], output, char_tokenizer)
    (tmp_path / "docs").mkdir()
    with pytest.raises(SpecdecError, match="glob"):
        build_index([str(tmp_path / "docs")], output, char_tokenizer)
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(SpecdecError, match=r"bad.jsonl:2"):
        build_index([str(bad_json)], output, char_tokenizer)
    assert not output.exists() and not list(tmp_path.glob(".*tmp*"))


def test_fingerprint_is_stable_and_tells_tokenizers_apart(tmp_path, char_tokenizer):
    from transformers import AutoTokenizer

    same = AutoTokenizer.from_pretrained(make_char_tokenizer_dir(tmp_path / "same"))
    other = AutoTokenizer.from_pretrained(make_char_tokenizer_dir(tmp_path / "other", extra_tokens=("é",)))
    fingerprint = tokenizer_fingerprint(char_tokenizer)
    assert fingerprint.startswith("sha256:") and len(fingerprint) == len("sha256:") + 16
    assert tokenizer_fingerprint(same) == fingerprint
    assert tokenizer_fingerprint(other) != fingerprint
    # a tokenizer that gains a token, or another EOS token, has another fingerprint
    assert tokenizer_fingerprint(same) == fingerprint
    same.add_tokens(["ü"])
    grown = tokenizer_fingerprint(same)
    assert grown != fingerprint
    same.eos_token = "ü"
    assert tokenizer_fingerprint(same) not in (fingerprint, grown)


@pytest.mark.real_model
def test_default_tokenizer_index(tmp_path):
    from specdec_cli.target_model.load.models import load_tokenizer

    tokenizer = load_tokenizer()
    corpora = Path(__file__).resolve().parents[3] / "corpora"
    output = tmp_path / "default.sam"
    inputs = [str(corpora / "python_answers.jsonl"), str(corpora / "prose")]
    summary = build_index(inputs, output, tokenizer, target_name="default")
    assert summary["documents"] >= 20 and summary["tokens"] > 5000 and summary["bytes_per_token"] <= 64
    index = load_index(output)
    assert index.fingerprint == tokenizer_fingerprint(tokenizer) and index.eos_id == tokenizer.eos_token_id
    automaton = index.automaton
    state, match_len = ROOT, 0
    for token in tokenizer("def is_palindrome(text):", add_special_tokens=False)["input_ids"]:
        state, match_len = automaton.advance(state, match_len, token)
    assert tokenizer.decode(automaton.continuation(state, 12)).startswith('\n    """Return True if text')


def test_an_index_rewritten_by_the_safetensors_library_still_opens(tmp_path):
    """Another safetensors writer may store the arrays in another order: same arrays, same index."""
    from safetensors.numpy import load_file, save_file

    path, copy = tmp_path / "small.sam", tmp_path / "copy.sam"
    save_small(path)
    arrays = load_file(str(path))
    metadata = json.loads(path.read_bytes()[8 : 8 + int.from_bytes(path.read_bytes()[:8], "little")])["__metadata__"]
    save_file(dict(reversed(list(arrays.items()))), str(copy), metadata=metadata)
    spans = _body_values(copy)[2]
    assert sorted(spans, key=lambda name: spans[name][0]) != list(ARRAY_ORDER)  # stored in another order
    index = load_index(copy)
    assert np.array_equal(index.automaton.text, small_automaton().text)
    assert verify_index(copy)["checksum"] in ("ok", "absent")


def test_verify_finds_a_flipped_byte_that_the_open_time_checks_cannot(tmp_path):
    """`count` is not used by drafting's invariants: a changed count opens fine, but --verify catches it."""
    path = tmp_path / "small.sam"
    save_small(path)
    assert verify_index(path)["checksum"] == "ok"
    set_word(path, "count", 1, 12345)
    load_index(path)  # the structure is intact
    with pytest.raises(SpecdecError, match="checksum"):
        verify_index(path)


def test_verify_on_the_command_line(tmp_path):
    from conftest import invoke

    path = tmp_path / "small.sam"
    save_small(path)
    good = invoke("build-index", "--verify", str(path), "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["checksum"] == "ok"
    set_word(path, "trans_tokens", 0, 7)
    bad = invoke("build-index", "--verify", str(path))
    assert bad.returncode == 1 and "corrupt index" in bad.stderr and "Traceback" not in bad.stderr
