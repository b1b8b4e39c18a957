"""`specdec build-index` end to end (in process, conftest's `invoke`), with a tiny character-level tokenizer
directory as --target: the happy path with --info, and every user error as one line on stderr
(`specdec: error: ...`), a non-zero exit, no traceback and no file left behind. `--info` in a fresh process: it
imports neither torch nor transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD, CliResult, cli_env, invoke
from helpers import make_char_tokenizer_dir

REPO = Path(__file__).resolve().parents[3]


def specdec(*args: str, cwd: Path, stdin: str = "") -> CliResult:
    return invoke(*args, cwd=cwd, input_text=stdin)


def assert_user_error(result: CliResult, *fragments: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error:"), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return make_char_tokenizer_dir(tmp_path_factory.mktemp("cli") / "chartok")


def test_build_then_info(tmp_path, tokenizer_dir):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "one.txt").write_text("def square(x):\n    return x * x\n")
    (tmp_path / "docs" / "two.md").write_text("# heading\n\nsome markdown\n")
    (tmp_path / "rows.jsonl").write_text(json.dumps({"prompt": "Say hi.", "answer": "Hi!"}) + "\n")
    result = specdec("build-index", "docs", "rows.jsonl", "-", "--glob", "*.txt",
                     "-o", "out.sam", "--target", str(tokenizer_dir), "--json", cwd=tmp_path, stdin="from stdin")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["documents"] == 3 and summary["tokens"] > 40 and Path(tmp_path / "out.sam").is_file()
    assert summary["file_bytes"] == (tmp_path / "out.sam").stat().st_size

    info = specdec("build-index", "--info", "out.sam", "--json", cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    metadata = json.loads(info.stdout)
    assert metadata["format"] == "specdec-sam-index" and metadata["tokens"] == summary["tokens"]
    assert metadata["tokenizer_fingerprint"].startswith("sha256:") and metadata["build"]["glob"] == "*.txt"
    assert [source["path"] for source in metadata["sources"]] == [str(Path("docs") / "one.txt"), "rows.jsonl", "-"]

    table = specdec("build-index", "--info", "out.sam", cwd=tmp_path)
    assert table.returncode == 0 and metadata["tokenizer_fingerprint"] in table.stdout


def test_info_loads_neither_torch_nor_transformers(tmp_path, tokenizer_dir):
    (tmp_path / "a.txt").write_text("some text to index")
    assert specdec("build-index", "a.txt", "-o", "a.sam", "--target", str(tokenizer_dir), cwd=tmp_path).returncode == 0
    probe = (
        "import sys\n"
        "sys.argv = ['specdec', 'build-index', '--info', 'a.sam']\n"
        "from specdec_cli.cli import main\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert exit.code == 0, exit.code\n"
        "heavy = [name for name in ('torch', 'transformers') if name in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr


def test_missing_input(tmp_path):
    assert_user_error(specdec("build-index", "absent.txt", "-o", "out.sam", cwd=tmp_path), "absent.txt")
    assert not (tmp_path / "out.sam").exists()


def test_binary_file_given_as_text(tmp_path):
    (tmp_path / "image.txt").write_bytes(bytes(range(256)) * 4)
    assert_user_error(specdec("build-index", "image.txt", "-o", "out.sam", cwd=tmp_path), "looks binary")
    assert list(tmp_path.iterdir()) == [tmp_path / "image.txt"]


def test_directory_with_a_binary_file(tmp_path, tokenizer_dir):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("speculative decoding drafts and verifies\n")
    (tmp_path / "docs" / "image.txt").write_bytes(bytes(range(256)) * 4)
    result = specdec("build-index", "docs", "-o", "out.sam", "--target", str(tokenizer_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "skipped files" in result.stdout and "image.txt" in result.stdout
    assert (tmp_path / "out.sam").is_file()


def test_empty_corpus(tmp_path, tokenizer_dir):
    (tmp_path / "empty.txt").write_text("\n\n")
    result = specdec("build-index", "empty.txt", "-o", "out.sam", "--target", str(tokenizer_dir), cwd=tmp_path)
    assert_user_error(result, "empty corpus")
    assert list(tmp_path.iterdir()) == [tmp_path / "empty.txt"]


def test_usage_errors(tmp_path):
    (tmp_path / "a.txt").write_text("text")
    assert_user_error(specdec("build-index", "a.txt", cwd=tmp_path), "-o")
    assert_user_error(specdec("build-index", "-o", "x.sam", cwd=tmp_path), "corpus")
    assert_user_error(specdec("build-index", "a.txt", "--info", "x.sam", cwd=tmp_path), "--info")


@pytest.mark.parametrize("content", [b"", b"\x00" * 7, b"garbage that is not an index" * 10])
def test_info_on_a_bad_file(tmp_path, content):
    (tmp_path / "bad.sam").write_bytes(content)
    assert_user_error(specdec("build-index", "--info", "bad.sam", cwd=tmp_path), "bad.sam")


def test_jsonl_rows_without_the_field_name_it(tmp_path, tokenizer_dir):
    (tmp_path / "rows.jsonl").write_text('{"body": "some text"}\n{"body": "more"}\n')
    result = specdec("build-index", "rows.jsonl", "-o", "x.sam", "--target", str(tokenizer_dir), cwd=tmp_path)
    assert_user_error(result, "'text'", "2 rows skipped", "--field")
    assert not (tmp_path / "x.sam").exists()


def test_a_long_document_is_tokenised_in_pieces():
    """One call per ~200k characters (so Ctrl-C is seen between calls), and still one document, one EOS."""
    from specdec_cli.texts.corpus import BATCH_CHARACTERS, PIECE_CHARACTERS, pieces, tokenize_documents
    from specdec_cli.texts.corpus_inputs import SourceRecord

    text = "".join(f"line {number} of a long document\n" for number in range(90_000))  # ~2.9 M characters
    parts = pieces(text)
    assert "".join(parts) == text and len(parts) >= 4
    assert all(len(part) <= PIECE_CHARACTERS and part.endswith("\n") for part in parts)
    assert pieces("x" * 500_000, limit=200_000) == ["x" * 200_000, "x" * 200_000, "x" * 100_000]

    calls = []

    class CharTokenizer:
        eos_token_id = 0

        def __call__(self, texts, **_):
            calls.append(sum(map(len, texts)))
            return {"input_ids": [[ord(char) for char in text] for text in texts]}

    record = SourceRecord("long.txt")
    tokens, documents = tokenize_documents([(record, text), (record, "short")], CharTokenizer())
    assert documents == 2 and record.documents == 2
    assert tokens.tolist() == [ord(char) for char in text] + [0] + [ord(char) for char in "short"] + [0]
    assert len(calls) >= 3 and max(calls) <= BATCH_CHARACTERS + PIECE_CHARACTERS  # no call sees it whole


def test_an_input_is_never_the_output(tmp_path, tokenizer_dir):
    """`build-index self.txt -o self.txt` used to replace the corpus with its own index; by any path, --force
    or not, an input is refused as the output and left as it was."""
    text = "notes that must survive\n"
    (tmp_path / "self.txt").write_text(text)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "inner.txt").write_text(text)
    (tmp_path / "link.txt").symlink_to(tmp_path / "self.txt")
    target = ("--target", str(tokenizer_dir))
    for args in (("self.txt", "-o", "self.txt"), ("self.txt", "-o", "link.txt"), ("link.txt", "-o", "./self.txt"),
                 ("docs", "-o", "docs/inner.txt"), ("self.txt", "-o", "self.txt", "--force")):
        assert_user_error(specdec("build-index", *args, *target, cwd=tmp_path), "also an input")
    assert (tmp_path / "self.txt").read_text() == text and (tmp_path / "docs" / "inner.txt").read_text() == text


def test_a_file_that_is_not_an_index_is_replaced_only_with_force(tmp_path, tokenizer_dir):
    (tmp_path / "a.txt").write_text("some text to index")
    (tmp_path / "keep.sam").write_text("not an index")
    target = ("--target", str(tokenizer_dir))
    assert_user_error(specdec("build-index", "a.txt", "-o", "keep.sam", *target, cwd=tmp_path), "--force")
    assert (tmp_path / "keep.sam").read_text() == "not an index"
    # an index is specdec's own: rebuilt in place without --force; another file with --force
    assert specdec("build-index", "a.txt", "-o", "out.sam", *target, cwd=tmp_path).returncode == 0
    assert specdec("build-index", "a.txt", "-o", "out.sam", *target, cwd=tmp_path).returncode == 0
    result = specdec("build-index", "a.txt", "-o", "keep.sam", "--force", *target, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert specdec("build-index", "--info", "keep.sam", cwd=tmp_path).returncode == 0


def test_the_library_refuses_the_same(tmp_path):
    from specdec_cli.errors import SpecdecError
    from specdec_cli.texts.corpus import build_index

    (tmp_path / "self.txt").write_text("text")
    with pytest.raises(SpecdecError, match="also an input"):
        build_index([tmp_path / "self.txt"], tmp_path / "self.txt", tokenizer=None)
    (tmp_path / "other.txt").write_text("text")
    with pytest.raises(SpecdecError, match="--force"):
        build_index([tmp_path / "self.txt"], tmp_path / "other.txt", tokenizer=None)
    assert (tmp_path / "self.txt").read_text() == (tmp_path / "other.txt").read_text() == "text"


def test_the_same_file_by_two_paths_is_indexed_once(tmp_path, tokenizer_dir):
    """`corpus.txt ./dir/../corpus.txt link.txt` (a symlink) and a folder holding it are one file: read once,
    said in one line (it was indexed four times)."""
    (tmp_path / "corpus.txt").write_text("def square(x):\n    return x * x\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link.txt").symlink_to(tmp_path / "corpus.txt")
    result = specdec("build-index", "corpus.txt", "./dir/../corpus.txt", "link.txt", ".", "--glob", "corpus.txt",
                     "-o", "out.sam", "--target", str(tokenizer_dir), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["documents"] == 1
    assert result.stderr.splitlines() == [
        "specdec: warning: the same file given twice is read once: ./dir/../corpus.txt, link.txt, corpus.txt (in .) "
        "are corpus.txt"]
    info = json.loads(specdec("build-index", "--info", "out.sam", "--json", cwd=tmp_path).stdout)
    assert [source["path"] for source in info["sources"]] == ["corpus.txt"]


def test_the_last_line_is_printed_when_the_process_is_nearly_done(tmp_path, tokenizer_dir):
    """After "Index written" the interpreter's last cycle collections walked every object torch and transformers
    left (some 300,000; a second or two on 2 cores): the objects alive at exit are frozen first, so the last
    collections walk almost nothing. Seen from a handler that runs after specdec's own at exit."""
    (tmp_path / "a.txt").write_text("some text to index")
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count(), 'walked', len(gc.get_objects())))\n"
        f"sys.argv = ['specdec', 'build-index', 'a.txt', '-o', 'a.sam', '--target', {str(tokenizer_dir)!r}]\n"
        "from specdec_cli.cli import main\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=cli_env(), capture_output=True,
                            text=True, timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr
    assert "Index written" in result.stdout
    frozen, walked = map(int, result.stdout.split("frozen ")[1].split(" walked "))
    assert frozen > 100_000 and walked < frozen // 10, (frozen, walked)
