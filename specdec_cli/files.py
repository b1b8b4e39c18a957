"""Small file helpers shared by every command: atomic writes and tolerant JSON reads.

`write_atomic` writes to a temporary file beside the destination and renames it into place, so a reader (or
a crash) never sees half a file, and a failure leaves no temporary file behind. Large binary formats with
their own layout (the suffix-automaton index, model weights) have their own writers; this is for reports,
caches, transcripts and metadata.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import SpecdecError


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write to a temporary file beside `path`, then rename it into place (readers never see half a file)."""
    path = Path(path).expanduser()
    if not path.parent.is_dir():
        raise SpecdecError(f"{path}: the folder {path.parent} does not exist")
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise SpecdecError(f"{path}: cannot write ({exc.strerror or exc})") from exc
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data.encode("utf-8") if isinstance(data, str) else data)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(temporary, 0o666 & ~mask)
        os.replace(temporary, path)
    except OSError as exc:
        _remove(temporary)
        raise SpecdecError(f"{path}: cannot write ({exc.strerror or exc})") from exc
    except BaseException:
        _remove(temporary)
        raise
    return path


def write_json_atomic(path: str | Path, payload: Any) -> Path:
    return write_atomic(path, json.dumps(payload, indent=1, ensure_ascii=False) + "\n")


def read_json(path: str | Path) -> dict:
    """A JSON object from `path`, or {} when the file is missing or unreadable (callers treat both alike)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
