"""The target's features of its own answers, kept while it writes them, so that a head's training need not compute
them again.

Answering many prompts a forward (plain_many.py) computes the target's last hidden state at every position of every
prompt and answer; a head trains on exactly those (eagle_train.py's `last_states`), and computing them again was a
fifth to a quarter of `specdec distill --kind eagle`'s time. `AnswerFeatures` appends each answer's rows as it is
written; `HandedFeatures` gives a training sequence's rows back by its tokens. A sequence's newest token is never
scored while answering, so its rows cover every position but the last: training cuts that token (head_data.py).

Format 1, a folder beside the data file (`DATA.features` for `DATA.jsonl`): `answers.json` {"format", "target" (the
target's identity, feature_store.py), "width"}, `rows.bin` (bfloat16 rows, little-endian, row after row) and
`index.jsonl`, a line {"tokens": digest of the sequence's token ids, "offset", "rows"} appended after its rows are
synced. A crash leaves rows past the last whole line: the next writer cuts them. A folder for another target or
width is started again; a folder specdec did not write is refused, untouched. What it does not do: compute
features (the answering forward does) or train.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..files import atomic_file, check_replaceable_dir, read_json
from .feature_store import ROW_BYTES, bfloat16_bytes, read_bfloat16_rows

if TYPE_CHECKING:  # pragma: no cover
    import torch

FORMAT = 1
META = "answers.json"
ROWS = "rows.bin"
INDEX = "index.jsonl"


def answers_folder(data: str | Path) -> Path:
    """Where the features of a data file's answers are kept: DATA.features beside DATA.jsonl."""
    path = Path(data).expanduser()
    return path.with_name((path.name[: -len(".jsonl")] if path.name.endswith(".jsonl") else path.name) + ".features")


def check_answers_folder(data: str | Path) -> None:
    """Refuse, before any work, a folder where the answers' features would go that specdec did not write."""
    _check_folder(answers_folder(data))


def _check_folder(folder: Path) -> None:
    check_replaceable_dir(folder, lambda found: (found / META).is_file(), "a folder of answers' features specdec kept",
                          setting=None)


def tokens_digest(tokens: Sequence[int]) -> str:
    import numpy as np

    return hashlib.sha256(np.asarray([int(token) for token in tokens], dtype="<i8").tobytes()).hexdigest()[:24]


def _index(folder: Path, width: int) -> tuple[dict[str, tuple[int, int]], int]:
    """(tokens digest -> (row offset, rows), rows recorded in all) from the whole lines whose rows are on disk."""
    found: dict[str, tuple[int, int]] = {}
    end = 0
    rows_file, index_file = folder / ROWS, folder / INDEX
    size = rows_file.stat().st_size // (width * ROW_BYTES) if rows_file.is_file() else 0
    if index_file.is_file():
        for line in index_file.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                digest, offset, rows = str(entry["tokens"]), int(entry["offset"]), int(entry["rows"])
            except (ValueError, KeyError, TypeError):
                break  # a line cut short by a crash: the last
            if offset != end or offset + rows > size:
                break
            found[digest], end = (offset, rows), offset + rows
    return found, end


class AnswerFeatures:
    """Appends answers' rows to the folder for `target_id` and `width` (started again where it was another's)."""

    def __init__(self, folder: Path, target_id: str, width: int) -> None:
        _check_folder(folder)
        self.folder, self.width = folder, width
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT, "target": target_id, "width": width}
        if read_json(folder / META) != meta:  # new, or another target's: start again
            for name in (ROWS, INDEX):
                (folder / name).unlink(missing_ok=True)
            with atomic_file(folder / META) as temporary:
                temporary.write_text(json.dumps(meta), encoding="utf-8")
        self.known, self.end = _index(folder, width)
        with open(folder / INDEX, "a+b") as index:  # keep the whole lines alone (a crash's last one goes)
            index.seek(0)
            held = index.read()
            whole = b"".join(line + b"\n" for line in held.split(b"\n")[: len(self.known)])
            if whole != held:
                index.truncate(0)
                index.write(whole)
        with open(folder / ROWS, "ab") as rows:
            rows.truncate(self.end * width * ROW_BYTES)

    def add(self, tokens: Sequence[int], features: torch.Tensor) -> None:
        """A sequence's rows [len(tokens) - 1, width] (every position but the newest), synced, then indexed."""
        if features.dim() != 2 or features.shape != (len(tokens) - 1, self.width):
            raise ValueError(f"features of shape {tuple(features.shape)} for {len(tokens)} tokens")
        digest = tokens_digest(tokens)
        if digest in self.known:
            return
        line = json.dumps({"tokens": digest, "offset": self.end, "rows": len(tokens) - 1}) + "\n"
        for name, payload in ((ROWS, bfloat16_bytes(features)), (INDEX, line.encode())):
            with open(self.folder / name, "ab") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
        self.known[digest] = (self.end, len(tokens) - 1)
        self.end += len(tokens) - 1


class HandedFeatures:
    """Where a sequence's rows [len(tokens) - 1, width] were kept (`locate`), and those rows as float32 (`read`)."""

    def __init__(self, folder: Path, width: int, known: dict[str, tuple[int, int]]) -> None:
        self.folder, self.width, self.known = folder, width, known

    def __len__(self) -> int:
        return len(self.known)

    def locate(self, tokens: Sequence[int]) -> Optional[int]:
        """The row offset of the sequence's rows, where the answering kept them for exactly these tokens."""
        found = self.known.get(tokens_digest(tokens))
        return found[0] if found is not None and found[1] == len(tokens) - 1 else None

    def read(self, offset: int, count: int) -> Optional[torch.Tensor]:
        """Rows offset..offset+count-1 [count, width] (None: the file is shorter)."""
        return read_bfloat16_rows(self.folder / ROWS, offset, count, self.width)

    def rows(self, tokens: Sequence[int]) -> Optional[torch.Tensor]:
        """A sequence's rows [len(tokens) - 1, width], or None where they were not kept."""
        offset = self.locate(tokens)
        return None if offset is None else self.read(offset, len(tokens) - 1)


def handed_features(data: Optional[str | Path], target_id: str, width: int) -> Optional[HandedFeatures]:
    """The features kept beside `data` for this target and width, or None (none kept, or another target's)."""
    if not data:
        return None
    folder = answers_folder(data)
    if read_json(folder / META) != {"format": FORMAT, "target": target_id, "width": width}:
        return None
    known, _ = _index(folder, width)
    return HandedFeatures(folder, width, known) if known else None


def computed_by(model: Any) -> tuple[str, int]:
    """(the target's identity, its hidden size): what a folder's features were computed by."""
    from .feature_store import target_identity

    return target_identity(model), int(model.config.hidden_size)
