"""`specdec distill generate -o FILE` resumes only its own data: any other file is refused with one line and
left exactly as it was (it used to take a one-line text file for a row cut short by a crash, cut it away and
append JSONL to what remained)."""

from __future__ import annotations

import json

import pytest
from conftest import invoke, make_char_tokenizer

from specdec_cli.distill.generate import DataRow, check_data_output
from specdec_cli.errors import SpecdecError

FINGERPRINT = "sha256:ours"


def _row(fingerprint: str = FINGERPRINT) -> str:
    row = DataRow("Say hi.", "chat", "1", "Hi!", [5, 6], [7, 8], "stop", "tiny", fingerprint)
    return json.dumps(row.as_json(), ensure_ascii=False)


def test_the_cli_refuses_a_text_file_before_the_model_loads(tmp_path):
    for name, content in (("notes.txt", "one line of notes, no newline"), ("poem.txt", "two lines\nof verse\n"),
                          ("config.json", '{"a": 1}\n')):
        (tmp_path / name).write_text(content)
        result = invoke("distill", "generate", "-o", name, "--suite", "builtin", "--limit", "1",
                        "--target", "/nonexistent-model", cwd=tmp_path)
        assert result.returncode != 0
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and "not a data file of `specdec distill generate`" in lines[0], result.stderr
        assert "Traceback" not in result.stderr and "nonexistent-model" not in result.stderr  # refused first
        assert (tmp_path / name).read_text() == content


@pytest.mark.parametrize("content", [
    "one line of notes, no newline",
    "notes\nand a last line without newline",
    _row() + "\nnot json\n",
    _row("sha256:another-target") + "\n",
    '{"prompt_ids": [1], "answer_ids": [2]}\n',  # rows of some other tool: no fingerprint
])
def test_anything_but_this_targets_rows_is_left_untouched(tmp_path, content):
    data = tmp_path / "data.jsonl"
    data.write_text(content)
    with pytest.raises(SpecdecError, match="left untouched"):
        check_data_output(str(data), FINGERPRINT, "tiny")
    assert data.read_text() == content


@pytest.mark.parametrize("content", ["", "\n", _row() + "\n", _row() + "\n" + _row()[:9], _row()[:30], '{"pro'])
def test_this_commands_rows_resume_a_torn_last_row_included(tmp_path, content):
    data = tmp_path / "data.jsonl"
    data.write_text(content)
    assert check_data_output(str(data), FINGERPRINT, "tiny") == data


def test_generate_data_refuses_before_writing(tmp_path, tiny_llama):
    from specdec_cli.distill.generate import generate_data
    from specdec_cli.texts.prompts import Conversation

    data = tmp_path / "notes.txt"
    data.write_text("one line of notes, no newline")
    with pytest.raises(SpecdecError, match="left untouched"):
        generate_data(tiny_llama, make_char_tokenizer(), "tiny", [Conversation("1", "chat", ("Hi",))], str(data))
    assert data.read_text() == "one line of notes, no newline"


def test_two_writers_of_one_data_file_the_second_is_refused(tmp_path, monkeypatch):
    """Two `distill generate -o same.jsonl` at once both answered every prompt and appended it: each prompt twice,
    and each said "6 rows in all" of a file with 12. The second now stops with one line; once the first is done,
    the file is free again."""
    from specdec_cli.distill.generate import _RowWriter

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    out = str(tmp_path / "rows.jsonl")
    first = _RowWriter(out, None, "t", "fp", [], False, None, None, 0.0)
    with pytest.raises(SpecdecError, match="another specdec process is writing it now"):
        _RowWriter(out, None, "t", "fp", [], False, None, None, 0.0)
    first.lock.close()
    _RowWriter(out, None, "t", "fp", [], False, None, None, 0.0)
