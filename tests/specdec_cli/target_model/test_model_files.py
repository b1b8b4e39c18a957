"""What specdec reads and writes around a model: converted models checked on load and published whole, pickled
weights refused, $SPECDEC_HOME checked before the slow part."""

from __future__ import annotations

import json
import os
import pickle

import pytest
from conftest import assert_one_line_error, invoke


class _Runs:
    """Unpickling this runs code: it creates the file named."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _pickled_model_dir(folder, tiny_model_dir, ran):
    """A model directory (config, tokenizer) whose weights are a pickle that runs code when loaded."""
    import shutil

    shutil.copytree(tiny_model_dir, folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": _Runs(ran)}))
    return folder


def test_a_target_with_pickled_weights_is_refused_with_how_to_convert(tiny_model_dir, tmp_path):
    ran = tmp_path / "the-pickle-ran"
    folder = _pickled_model_dir(tmp_path / "pickled", tiny_model_dir, ran)
    line = assert_one_line_error(invoke("chat", "--target", str(folder), "--prompt", "hi", "-n", "2"), "pickle",
                                 code=1)
    assert "pytorch_model.bin" in line and "save_pretrained" in line and "safetensors" in line
    assert not ran.exists()


def test_a_draft_model_with_pickled_weights_is_refused(tiny_model_dir, tmp_path):
    ran = tmp_path / "the-pickle-ran"
    folder = _pickled_model_dir(tmp_path / "pickled-draft", tiny_model_dir, ran)
    result = invoke("chat", "--target", tiny_model_dir, "--drafter", "model", "--draft-model", str(folder),
                    "--prompt", "hi", "-n", "2")
    line = assert_one_line_error(result, "--draft-model", code=1)
    assert "pickle" in line and "safetensors" in line
    assert not ran.exists()
    from specdec_cli.drafters.model import load_draft_model
    from specdec_cli.errors import SpecdecError

    with pytest.raises(SpecdecError, match="pickle"):  # the library refuses it too (distill --init student)
        load_draft_model(str(folder), None)
    assert not ran.exists()


def test_a_home_that_is_a_file_fails_before_converting(tmp_path):
    """The GGUF is never read: the home is checked first (an unreadable GGUF would say so otherwise)."""
    home = tmp_path / "home"
    home.write_text("not a folder")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF but not really")
    line = assert_one_line_error(invoke("chat", "--target", str(gguf), "--prompt", "hi",
                                        env_extra={"SPECDEC_HOME": str(home)}), "SPECDEC_HOME", code=1)
    assert "is a file, not a folder" in line
    assert home.read_text() == "not a folder"


@pytest.mark.parametrize("command", [("memory", "info"), ("memory", "clear"), ("memory", "info", "--json")])
def test_the_memory_commands_refuse_a_home_that_is_a_file(tmp_path, command):
    """They read (or clear) a folder under the home: with the home a file there is none, and saying "0 answers"
    (exit 0) would report a memory that cannot exist. One line, before the tokenizer loads."""
    home = tmp_path / "home"
    home.write_text("not a folder")
    line = assert_one_line_error(invoke(*command, env_extra={"SPECDEC_HOME": str(home)}), "SPECDEC_HOME", code=1)
    assert "is a file, not a folder" in line
    assert home.read_text() == "not a folder"


def _recorded(folder):
    from specdec_cli.target_model.load import converted

    marker = {"format": converted.CONVERTED_FORMAT,
              "files": {path.name: converted._file_record(path) for path in sorted(folder.iterdir())}}
    (folder / converted.CONVERTED_MARKER).write_text(json.dumps(marker))


def test_a_conversion_is_checked_by_size_and_by_checksum_when_touched(tmp_path):
    from specdec_cli.target_model.load.converted import CONVERTED_MARKER, converted_damage

    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (folder / "config.json").write_text("{}")
    assert converted_damage(tmp_path / "absent") == "not converted yet"
    assert converted_damage(folder) == f"{CONVERTED_MARKER} is missing"
    _recorded(folder)
    assert converted_damage(folder) is None
    os.utime(folder / "model.safetensors", ns=(1, 1))  # touched, same bytes: hashed once, the new time recorded
    assert converted_damage(folder) is None
    assert json.loads((folder / CONVERTED_MARKER).read_text())["files"]["model.safetensors"]["mtime_ns"] == 1
    with open(folder / "model.safetensors", "r+b") as handle:  # the same size, other bytes
        handle.seek(100)
        handle.write(b"\xff\xff")
    assert "model.safetensors changed" in converted_damage(folder)
    with open(folder / "model.safetensors", "r+b") as handle:
        handle.truncate(1000)
    assert converted_damage(folder) == "model.safetensors: 1,000 bytes, 16,384 expected"
    (folder / "config.json").unlink()
    assert converted_damage(folder) == "config.json is missing"


def test_a_conversion_recorded_before_checksums_is_checked_by_its_header(tmp_path):
    import torch
    from safetensors.torch import save_file

    from specdec_cli.target_model.load.converted import CONVERTED_MARKER, converted_damage

    folder = tmp_path / "converted"
    folder.mkdir()
    save_file({"w": torch.zeros(64, 64)}, str(folder / "model.safetensors"))
    (folder / CONVERTED_MARKER).write_text(json.dumps({"format": 2}))
    size = (folder / "model.safetensors").stat().st_size
    with open(folder / "model.safetensors", "r+b") as handle:
        handle.truncate(size - 10)
    assert converted_damage(folder) == f"model.safetensors: {size - 10:,} bytes, {size:,} expected"
    save_file({"w": torch.zeros(64, 64)}, str(folder / "model.safetensors"))
    assert converted_damage(folder) is None
    assert "model.safetensors" in json.loads((folder / CONVERTED_MARKER).read_text())["files"]  # recorded now


def test_a_directory_is_synced_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    from specdec_cli import files

    events = []
    real_fsync, real_rename = os.fsync, os.rename
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "rename", lambda a, b: (events.append(("rename", str(a))), real_rename(a, b))[1])
    with files.atomic_directory(tmp_path / "out", replace=False, unsynced=("proved",)) as temporary:
        (temporary / "sub").mkdir()
        (temporary / "sub" / "weights").write_bytes(b"x" * 10)
        (temporary / "config.json").write_text("{}")
        (temporary / "proved").write_bytes(b"y" * 10)  # its reader proves it (a GGUF's blocks): not synced
    renamed = events.index(("rename", str(temporary)))
    synced = {path for kind, path in events[:renamed] if kind == "fsync"}
    assert {str(temporary / "sub" / "weights"), str(temporary / "config.json"), str(temporary / "sub"),
            str(temporary)} <= synced
    assert str(temporary / "proved") not in synced and (tmp_path / "out" / "proved").read_bytes() == b"y" * 10
    assert (tmp_path / "out" / "sub" / "weights").read_bytes() == b"x" * 10


def test_two_processes_finishing_together_both_use_one_copy(tmp_path, monkeypatch):
    """The other process renames its copy into place between this one's check and its rename (`Directory not
    empty`): this one keeps theirs, removes its own, and succeeds."""
    from specdec_cli import files

    final = tmp_path / "converted"
    real_rename = os.rename

    def theirs_first(source, destination):
        if str(destination) == str(final) and not final.exists():
            final.mkdir()
            (final / "theirs").write_text("first")
        return real_rename(source, destination)

    monkeypatch.setattr(os, "rename", theirs_first)
    with files.atomic_directory(final, replace=False) as temporary:
        (temporary / "ours").write_text("second")
    assert [path.name for path in final.iterdir()] == ["theirs"]
    assert not temporary.exists() and sorted(path.name for path in tmp_path.iterdir()) == ["converted"]
