"""The feature store: a head's training features on disk in bfloat16, read back a piece at a time, reused only when
computed for the same key, never written over a folder specdec did not make."""

from __future__ import annotations

import gc

import pytest
import torch

from specdec_cli.distill.feature_store import (
    STORE_ROWS,
    check_store_folder,
    discard_store,
    feature_store,
    open_store,
    store_folder,
)
from specdec_cli.errors import SpecdecError

WIDTH = 6
KEY = {"kind": "eagle", "target": "sha256:x", "pieces": "sha256:y"}


def _pieces(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(length, WIDTH, generator=generator) * 10 for length in (8, 13, 9, 30)]


def _counting(rows: list[torch.Tensor]) -> tuple[list[int], object]:
    calls: list[int] = []

    def compute(index: int) -> torch.Tensor:
        calls.append(index)
        return rows[index]

    return calls, compute


def test_rows_come_back_as_their_bfloat16_values_piece_by_piece(tmp_path):
    rows = _pieces()
    calls, compute = _counting(rows)
    store, reused = feature_store(tmp_path / "f", KEY, len(rows), WIDTH, compute)
    assert not reused and calls == [0, 1, 2, 3]
    assert len(store) == 4
    for index, expected in enumerate(rows):
        got = store[index]
        assert got.dtype == torch.float32 and got.shape == expected.shape
        assert torch.equal(got, expected.to(torch.bfloat16).float())
    part = store.part(1, 3)
    assert len(part) == 2 and torch.equal(part[1], store[2]) and [r.shape[0] for r in part] == [13, 9]
    with pytest.raises(IndexError):
        part[2]
    assert (tmp_path / "f" / STORE_ROWS).stat().st_size == sum(r.shape[0] for r in rows) * WIDTH * 2


def test_a_store_is_reused_only_for_the_same_key_and_whole(tmp_path):
    rows = _pieces()
    feature_store(tmp_path / "f", KEY, len(rows), WIDTH, _counting(rows)[1])
    calls, compute = _counting(rows)
    store, reused = feature_store(tmp_path / "f", KEY, len(rows), WIDTH, compute)
    assert reused and calls == []  # a resumed run reads what the first one computed
    assert torch.equal(store[3], rows[3].to(torch.bfloat16).float())

    other = _pieces(seed=1)
    calls, compute = _counting(other)
    store, reused = feature_store(tmp_path / "f", {**KEY, "pieces": "sha256:z"}, len(other), WIDTH, compute)
    assert not reused and calls == [0, 1, 2, 3]  # other pieces: computed again, in place of the old store
    assert torch.equal(store[0], other[0].to(torch.bfloat16).float())

    with open(tmp_path / "f" / STORE_ROWS, "r+b") as handle:  # a store cut short is not whole
        handle.truncate(100)
    assert open_store(tmp_path / "f", {**KEY, "pieces": "sha256:z"}) is None
    calls, compute = _counting(other)
    _, reused = feature_store(tmp_path / "f", {**KEY, "pieces": "sha256:z"}, len(other), WIDTH, compute)
    assert not reused and len(calls) == 4


def test_a_folder_specdec_did_not_write_is_never_replaced(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    with pytest.raises(SpecdecError, match="not a folder of features"):
        check_store_folder(folder)
    with pytest.raises(SpecdecError, match="not a folder of features"):
        feature_store(folder, KEY, 1, WIDTH, lambda index: torch.zeros(8, WIDTH))
    discard_store(folder)  # not a store: left alone
    assert (folder / "keep.txt").read_text() == "mine"


def test_a_store_without_a_checkpoint_is_temporary(tmp_path):
    store, _ = feature_store(None, KEY, 1, WIDTH, lambda index: torch.ones(8, WIDTH))
    folder = store.folder
    assert torch.equal(store[0], torch.ones(8, WIDTH)) and folder.is_dir()
    del store
    gc.collect()
    assert not folder.exists()
    assert store_folder(tmp_path / "head.checkpoint") == tmp_path / "head.checkpoint.features"


def test_a_piece_of_the_wrong_width_is_refused_and_no_store_is_left(tmp_path):
    with pytest.raises(ValueError, match="not \\[n, 6\\]"):
        feature_store(tmp_path / "f", KEY, 1, WIDTH, lambda index: torch.zeros(8, WIDTH + 1))
    assert open_store(tmp_path / "f", KEY) is None


def test_an_interrupted_computation_goes_on_from_its_last_record(tmp_path, monkeypatch):
    """Pieces are recorded as they are computed (here after every piece): a run stopped at piece 2 leaves pieces 0
    and 1, the next run with the same key computes 2 and 3 only, and the store is the one computed at once; a run
    for another key starts over."""
    from specdec_cli.distill import feature_store as store_module

    monkeypatch.setattr(store_module, "RECORD_SECONDS", 0.0)
    rows = _pieces()

    def stopping(index: int) -> torch.Tensor:
        if index == 2:
            raise KeyboardInterrupt
        return rows[index]

    with pytest.raises(KeyboardInterrupt):
        feature_store(tmp_path / "f", KEY, len(rows), WIDTH, stopping)
    assert open_store(tmp_path / "f", KEY) is None  # not complete: never read as a store
    with open(tmp_path / "f" / STORE_ROWS, "ab") as handle:  # half a row written when the run stopped
        handle.write(b"\x01\x02\x03")
    calls, compute = _counting(rows)
    store, reused = feature_store(tmp_path / "f", KEY, len(rows), WIDTH, compute)
    assert not reused and calls == [2, 3]
    whole, _ = feature_store(tmp_path / "g", KEY, len(rows), WIDTH, _counting(rows)[1])
    assert all(torch.equal(store[index], whole[index]) for index in range(len(rows)))
    assert (tmp_path / "f" / STORE_ROWS).read_bytes() == (tmp_path / "g" / STORE_ROWS).read_bytes()
    with pytest.raises(KeyboardInterrupt):
        feature_store(tmp_path / "h", KEY, len(rows), WIDTH, stopping)
    calls, compute = _counting(rows)
    feature_store(tmp_path / "h", {**KEY, "pieces": "sha256:other"}, len(rows), WIDTH, compute)
    assert calls == [0, 1, 2, 3]
