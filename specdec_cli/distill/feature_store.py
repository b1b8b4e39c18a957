"""The target's features for training a head, kept on disk in bfloat16 and read back one piece at a time.

A head trains on the target's hidden states at every position of its training pieces. Held in memory they
outgrew the target itself (a 0.5B's 256 k tokens: 0.9 GB in float32; EAGLE-3's four states a token, 1.8 GB in
bfloat16), so each piece's rows [n, width] are written to one file as they are computed, and a training step reads
its piece back (through the page cache, not the process's memory). The store lives in a folder of its own beside
the checkpoint (`<checkpoint>.features`) until the head is written, so a resumed run reads it instead of
computing it again; its key (the target, the pieces, what was computed) says whether a folder on disk is the one a
run needs, and a folder that is not a store is never replaced. Without a checkpoint the store is a temporary
folder, removed with the store.

Format 1: `features.json` {"format", "key", "width", "offsets": [row offset per piece, then the total],
"complete"} and `features.bin` (the rows, bfloat16, little-endian, row after row). The rows are appended as they
are computed and recorded every RECORD_SECONDS (synced first, the record written atomically), so an interrupted
run leaves a record of whole pieces, from which the next run with the same key goes on; a store is read only
once it is complete. This file does not know what the features are (eagle_train.py and eagle3_train.py compute
them).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from ..errors import SpecdecError
from ..files import atomic_file, check_replaceable_dir, read_json

if TYPE_CHECKING:  # pragma: no cover
    import torch

STORE_FORMAT = 1
STORE_META = "features.json"
STORE_ROWS = "features.bin"
ROW_BYTES = 2  # bfloat16
RECORD_SECONDS = 10.0  # how often the pieces computed so far are recorded (a Ctrl-C loses at most this much)


def store_folder(checkpoint_dir: Optional[Path]) -> Optional[Path]:
    """Where a run checkpointed in `checkpoint_dir` keeps its features (None: a temporary folder)."""
    return None if checkpoint_dir is None else checkpoint_dir.with_name(checkpoint_dir.name + ".features")


def target_identity(target: Any) -> str:
    """A short digest of what makes a target's features: its configuration and its final norm's weights (which
    differ between fine-tunes of one architecture)."""
    import hashlib

    import torch

    digest = hashlib.sha256(json.dumps(target.config.to_dict(), sort_keys=True, default=str).encode())
    norm = getattr(getattr(target, "model", None), "norm", None)
    weight = getattr(norm, "weight", None)
    if isinstance(weight, torch.Tensor):
        digest.update(weight.detach().float().cpu().numpy().tobytes())
    return "sha256:" + digest.hexdigest()[:16]


class FeatureStore:
    """Rows [n, width] per piece, read from disk as float32 tensors (`store[i]`); `part(start, stop)` is a view of
    some pieces."""

    def __init__(self, folder: Path, meta: dict, temporary: Optional[tempfile.TemporaryDirectory] = None) -> None:
        self.folder, self.width = folder, int(meta["width"])
        self.offsets: list[int] = [int(offset) for offset in meta["offsets"]]
        self._temporary = temporary  # removed with the store

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start, stop = self.offsets[index], self.offsets[index + 1]
        rows = read_bfloat16_rows(self.folder / STORE_ROWS, start, stop - start, self.width)  # [n, width]
        if rows is None:
            raise SpecdecError(f"{self.folder}: {STORE_ROWS} is shorter than {STORE_META} says; remove the "
                               "folder to compute the features again")
        return rows

    def part(self, start: int, stop: int) -> "StorePart":
        return StorePart(self, start, stop)


class StorePart(Sequence[Any]):
    """Pieces start..stop-1 of a store, indexed from 0."""

    def __init__(self, store: FeatureStore, start: int, stop: int) -> None:
        self.store, self.start, self.stop = store, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, int):
            raise TypeError("a store part is indexed by one piece")
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.store[self.start + index]

    def __iter__(self) -> Iterator[Any]:
        return (self.store[index] for index in range(self.start, self.stop))


def discard_store(folder: Optional[Path]) -> None:
    """Remove a run's store once its head is written (nothing will resume from it); a folder that is not a
    store is left alone."""
    if folder is not None and is_store(folder):
        shutil.rmtree(folder, ignore_errors=True)


def is_store(folder: Path) -> bool:
    return (folder / STORE_META).is_file()


def open_store(folder: Path, key: dict) -> Optional[FeatureStore]:
    """The store in `folder` if it is whole and was computed for `key`; else None."""
    if not is_store(folder) or not (folder / STORE_ROWS).is_file():
        return None
    meta = read_json(folder / STORE_META)  # ({} when unreadable)
    if meta.get("format") != STORE_FORMAT or meta.get("key") != key or meta.get("complete") is not True:
        return None
    offsets, width = meta.get("offsets"), meta.get("width")
    if not isinstance(offsets, list) or not offsets or not isinstance(width, int):
        return None
    if (folder / STORE_ROWS).stat().st_size != int(offsets[-1]) * width * ROW_BYTES:
        return None
    return FeatureStore(folder, meta)


def check_store_folder(folder: Optional[Path]) -> None:
    """Refuse, before any work, a folder where the store would go that specdec did not write as one."""
    if folder is not None:
        check_replaceable_dir(folder, is_store, "a folder of features specdec computed", setting=None)


def check_features_beside(output: Path) -> None:
    """Refuse the folder a head written to `output` keeps its features in (beside its default checkpoint) when
    specdec did not write it as a store."""
    check_store_folder(store_folder(output.with_name(output.name + ".checkpoint")))


def feature_store(folder: Optional[Path], key: dict, count: int, width: int,
                  compute: Callable[[int], torch.Tensor]) -> tuple[FeatureStore, bool]:
    """(the store of `count` pieces whose rows `compute(i)` gives [n_i, width], whether it was read from `folder`
    whole rather than computed): the one in `folder` when its key matches; else computed into it, going on from
    the pieces an interrupted run recorded for the same key (into a temporary folder when `folder` is None)."""
    if folder is not None:
        found = open_store(folder, key)
        if found is not None and len(found) == count and found.width == width:
            return found, True
        check_store_folder(folder)
    temporary = tempfile.TemporaryDirectory(prefix="specdec-features-") if folder is None else None
    target = Path(temporary.name) if temporary is not None else folder
    assert target is not None
    target.mkdir(parents=True, exist_ok=True)
    offsets = _recorded_offsets(target, key, width)
    rows_file = target / STORE_ROWS
    with open(rows_file, "r+b" if rows_file.exists() else "wb") as handle:
        handle.truncate(offsets[-1] * width * ROW_BYTES)  # rows past the record: an interrupted write's
        handle.seek(0, 2)
        _record(target, handle, key, width, offsets, complete=False)  # (the folder is a store from now on)
        recorded = time.monotonic()
        for index in range(len(offsets) - 1, count):
            rows = compute(index)  # [n, width]
            if rows.dim() != 2 or rows.shape[1] != width:
                raise ValueError(f"piece {index}: features of shape {tuple(rows.shape)}, not [n, {width}]")
            handle.write(bfloat16_bytes(rows))
            offsets.append(offsets[-1] + int(rows.shape[0]))
            if time.monotonic() - recorded >= RECORD_SECONDS:
                _record(target, handle, key, width, offsets, complete=False)
                recorded = time.monotonic()
        meta = _record(target, handle, key, width, offsets, complete=True)
    return FeatureStore(target, meta, temporary), False


def bfloat16_bytes(rows: torch.Tensor) -> bytes:
    """Rows [n, width] as bfloat16 bytes, little-endian, row after row."""
    import torch

    return rows.detach().to(torch.bfloat16).contiguous().cpu().view(torch.int16).numpy().tobytes()


def read_bfloat16_rows(path: Path, offset: int, count: int, width: int) -> Optional[torch.Tensor]:
    """Rows offset..offset+count-1 of a file of bfloat16 rows `width` wide, as float32 [count, width]; None when the
    file is shorter."""
    import torch

    buffer = bytearray(count * width * ROW_BYTES)
    with open(path, "rb") as handle:
        handle.seek(offset * width * ROW_BYTES)
        if handle.readinto(buffer) != len(buffer):
            return None
    return torch.frombuffer(buffer, dtype=torch.bfloat16).view(count, width).float()


def _recorded_offsets(folder: Path, key: dict, width: int) -> list[int]:
    """The offsets an interrupted run recorded in `folder` for this key and width (its rows up to the last are
    on disk), else [0]: start over."""
    meta = read_json(folder / STORE_META)  # ({} when missing or unreadable)
    offsets = meta.get("offsets")
    if meta.get("format") != STORE_FORMAT or meta.get("key") != key or meta.get("width") != width or \
            not isinstance(offsets, list) or not offsets or not all(isinstance(offset, int) for offset in offsets):
        return [0]
    rows_file = folder / STORE_ROWS
    if not rows_file.is_file() or rows_file.stat().st_size < offsets[-1] * width * ROW_BYTES:
        return [0]
    return [int(offset) for offset in offsets]


def _record(folder: Path, handle: Any, key: dict, width: int, offsets: list[int], complete: bool) -> dict:
    """Sync the rows written so far, then record them (atomically): a crash leaves a record of whole rows."""
    handle.flush()
    os.fsync(handle.fileno())
    meta = {"format": STORE_FORMAT, "key": key, "width": width, "offsets": list(offsets), "complete": complete}
    with atomic_file(folder / STORE_META) as temporary:
        temporary.write_text(json.dumps(meta), encoding="utf-8")
    return meta
