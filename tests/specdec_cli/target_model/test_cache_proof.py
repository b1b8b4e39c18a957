"""The GGUF-in-place cache proves itself on every load (target_model/in_place/gguf_model.py): a source changed in place
(even with its size and modification time kept), another file's cache copied in, a damaged, missing, edited or
foreign side file, or records that do not hash to what was written are never used: the folder is made again, with
one warning line saying why, and the answers are the source's own."""

from __future__ import annotations

import json
import os
import shutil
import threading
import warnings

import pytest
import torch
from helpers import PROMPTS, split_logits, write_family_gguf
from helpers import not_a_file as _not_a_file
from test_gguf_in_place import _source

from specdec_cli import kernels
from specdec_cli.target_model.in_place import gguf_check
from specdec_cli.target_model.in_place.gguf_model import BLOCKS_FILE, MARKER
from specdec_cli.target_model.load import models

pytestmark = pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    """(a tiny llama GGUF, its first load's logits, its cache folder)."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    source, architecture, tokenizer = _source("llama")
    path = tmp_path / "tiny.gguf"
    write_family_gguf(path, source, architecture, tokenizer)
    loaded = _load(path)
    assert loaded.model.source.repacked
    with torch.inference_mode():
        logits = split_logits(loaded.model, PROMPTS[0])
    return path, logits, loaded.model.source.cache


def _load(path, expect_warning: str = ""):
    gguf_check._checked.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = models.load_target(str(path), device="cpu")
    texts = [str(item.message) for item in caught if "cache of" in str(item.message)]
    if expect_warning:
        assert len(texts) == 1 and expect_warning in texts[0], texts
        assert loaded.model.source.repacked
    else:
        assert not texts, texts
    return loaded


def _same_answers(loaded, logits):
    with torch.inference_mode():
        assert torch.equal(split_logits(loaded.model, PROMPTS[0]), logits)


def test_a_healthy_cache_is_mapped_without_a_word(tiny):
    path, logits, _ = tiny
    again = _load(path)
    assert not again.model.source.repacked
    _same_answers(again, logits)


@pytest.mark.parametrize("where", ["middle", "header"])
def test_records_that_do_not_hash_to_what_was_written_are_never_used(tiny, where):
    path, logits, cache = tiny
    blocks = cache / BLOCKS_FILE
    size = blocks.stat().st_size
    with open(blocks, "r+b") as handle:
        handle.seek(size // 2 if where == "middle" else 12)
        handle.write(os.urandom(4096 if where == "middle" else 8))
    remade = _load(path, "is made again")
    _same_answers(remade, logits)


def test_a_source_changed_in_place_with_its_size_and_time_kept_is_repacked(tiny):
    path, logits, _ = tiny
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-64:] = bytes(64)  # the last tensor's tail (a norm): the file's values change
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # `touch -r`: size and modification time kept
    remade = _load(path, "changed since it was made")
    with torch.inference_mode():
        assert not torch.equal(split_logits(remade.model, PROMPTS[0]), logits)  # the new file's own answers


def test_a_source_whose_mode_or_links_change_keeps_its_cache(tiny, tmp_path):
    """chmod and a new hard link move the file's status-change time and change no byte: the cache is mapped as it
    is (each repacked the whole file before)."""
    path, logits, cache = tiny
    changed = path.stat().st_ctime_ns
    path.chmod(0o444)
    os.link(path, tmp_path / "another-name.gguf")
    assert path.stat().st_ctime_ns != changed and path.stat().st_nlink == 2
    again = _load(path)
    assert not again.model.source.repacked and again.model.source.cache == cache
    _same_answers(again, logits)


def _within(seconds: float, work, fifo):
    """work() run on a thread of its own: its value, or the test fails when it has not returned within `seconds`
    (then `fifo` is opened for writing and closed, so that a reader blocked on it reads nothing and goes on)."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = work()
        except BaseException as error:  # (raised again on the test's thread)
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        pytest.fail(f"still loading after {seconds} s: blocked on {fifo.name}?")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("name", [MARKER, "blocks-proved.json"])
def test_a_fifo_or_a_device_as_the_marker_or_the_proof_record_is_made_again_unread(tiny, kind, name):
    """Never opened for reading (a FIFO hung the load in "Loading"; a link to /dev/zero read until MemoryError):
    the cache is made again with one warning line, as for a damaged marker, and is healthy after."""
    path, logits, cache = tiny
    target = cache / name
    target.unlink(missing_ok=True)
    _not_a_file(target, kind)
    remade = _within(120, lambda: _load(path, "is made again"), target)
    _same_answers(remade, logits)
    healthy = _load(path)
    assert not healthy.model.source.repacked and healthy.model.source.cache == remade.model.source.cache


def test_another_files_cache_copied_in_is_not_used(tiny, tmp_path):
    path, logits, cache = tiny
    source, architecture, tokenizer = _source("llama")
    with torch.no_grad():
        source.model.layers[0].mlp.up_proj.weight.mul_(-1)
    other = tmp_path / "other.gguf"
    write_family_gguf(other, source, architecture, tokenizer)
    other_cache = _load(other).model.source.cache
    shutil.rmtree(other_cache)
    shutil.copytree(cache, other_cache)  # same shapes: only the proof tells them apart
    _load(other, "made from another file")


@pytest.mark.parametrize("damage", ["truncate tokenizer.json", "edit tokenizer.json", "delete config.json",
                                    "delete chat_template.jinja", "foreign extra.json", "marker"])
def test_a_damaged_missing_edited_or_foreign_side_file_is_made_again(tiny, damage):
    path, logits, cache = tiny
    action, name = damage.split(" ") if " " in damage else (damage, MARKER)
    target = cache / name
    if action == "truncate":
        target.write_bytes(target.read_bytes()[:50])
    elif action == "edit":
        target.write_text(target.read_text(encoding="utf-8").replace('"', "'", 1) + " ", encoding="utf-8")
    elif action == "delete":
        if not target.exists():
            pytest.skip(f"this tokenizer keeps no {name}")
        target.unlink()
    elif action == "foreign":
        target.write_text("{}", encoding="utf-8")
    else:
        target.write_text("{not json", encoding="utf-8")
    remade = _load(path, "is made again")
    _same_answers(remade, logits)
    assert _load(path).model.source.cache == remade.model.source.cache  # and then it is healthy again


def test_a_new_cache_of_a_file_removes_its_superseded_ones_and_nothing_else(tiny, tmp_path):
    """Once a file's cache is made again under a new key (the file changed, or specdec's cache format did), the
    folders of the same file's earlier caches are removed; another file's cache and folders specdec did not make
    (no marker, or a marker of another path) stay."""
    path, _, cache = tiny
    models = cache.parent
    earlier_format = models / f"{path.stem}-inplace-{'a' * 12}"
    shutil.copytree(cache, earlier_format)
    marker = json.loads((earlier_format / MARKER).read_text())
    (earlier_format / MARKER).write_text(json.dumps({**marker, "format": marker["format"] - 1}))
    unmarked = models / f"{path.stem}-inplace-{'b' * 12}"
    unmarked.mkdir()
    (unmarked / "mine.txt").write_text("a user's file")
    elsewhere = models / f"{path.stem}-inplace-{'c' * 12}"
    shutil.copytree(cache, elsewhere)
    (elsewhere / MARKER).write_text(json.dumps({**marker, "source": {**marker["source"], "path": "/elsewhere.gguf"}}))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file changed: a new key
    remade = _load(path)
    assert remade.model.source.repacked and remade.model.source.cache != cache
    assert sorted(folder.name for folder in models.iterdir()) == sorted(
        [remade.model.source.cache.name, unmarked.name, elsewhere.name])


def test_records_proved_once_are_mapped_unhashed_until_the_file_is_touched(tiny, monkeypatch):
    """A load that hashed the records to their proofs records the blocks file's identity (stat and samples); later
    loads map it without hashing it again, until anything writes to it (its status-change time moves): then it is
    hashed again, and damage is caught."""
    from specdec_cli.target_model.in_place import gguf_blocks, gguf_cache

    path, logits, cache = tiny
    monkeypatch.setattr(gguf_cache, "RACY_SECONDS", 0.0)  # (the test's file was written a moment ago)
    hashed = []
    verify = gguf_blocks.verify_blocks
    monkeypatch.setattr(gguf_blocks, "verify_blocks", lambda *args, **kwargs: hashed.append(1) or verify(*args,
                                                                                                        **kwargs))
    _same_answers(_load(path), logits)  # hashed, then remembered
    assert hashed == [1] and (cache / gguf_cache.PROVED).is_file()
    _same_answers(_load(path), logits)  # proved before: not hashed
    assert hashed == [1]
    blocks = cache / BLOCKS_FILE
    with open(blocks, "r+b") as handle:  # one byte in the records changed: its times move
        handle.seek(blocks.stat().st_size - 7)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x55]))
    remade = _load(path, "do not hash to what was written")
    assert hashed == [1, 1]
    _same_answers(remade, logits)


def test_a_fresh_file_is_not_remembered_as_proved(tiny, monkeypatch):
    """Within RACY_SECONDS of its last change, a write in the same tick of the clock would leave the file's times as
    they are: such a file is hashed at every load until it is older."""
    from specdec_cli.target_model.in_place import gguf_cache

    path, _, cache = tiny
    monkeypatch.setattr(gguf_cache, "RACY_SECONDS", 3600.0)
    _load(path)
    assert not (cache / gguf_cache.PROVED).exists()


def test_a_cache_folder_that_cannot_be_written_is_still_used_and_hashed_each_load(tiny, monkeypatch):
    """Where the identity record cannot be written (a home shared read-only), a load that proved the records by
    hashing still answers; the next load hashes them again."""
    from specdec_cli import files
    from specdec_cli.errors import SpecdecError
    from specdec_cli.target_model.in_place import gguf_cache

    path, logits, cache = tiny
    monkeypatch.setattr(gguf_cache, "RACY_SECONDS", 0.0)

    def cannot_write(target, payload):
        raise SpecdecError(f"{target}: cannot write (Read-only file system)")

    monkeypatch.setattr(files, "write_json_atomic", cannot_write)
    for _ in range(2):
        _same_answers(_load(path), logits)
        assert not (cache / gguf_cache.PROVED).exists()
