"""$SPECDEC_HOME: the folder where specdec keeps what it makes once and reuses, ~/.cache/specdec by default.

Under it: converted models (`models/`), verify-cost curves and dtype and weights verdicts (`costs/`), block
weights (`weights/`), the answer memory (`memory/`) and distilled drafters (`drafts/`). This file names the
folder only; each of those is written by its own module.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from .errors import SpecdecError


def specdec_home() -> Path:
    return Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec").expanduser()


def _named(home: Path) -> str:
    return f"SPECDEC_HOME {home}" if os.environ.get("SPECDEC_HOME") else f"specdec's home {home} (SPECDEC_HOME)"


def home_folder(*parts: str) -> Path:
    """`$SPECDEC_HOME/PARTS`, not created: a one-line error when the home or a folder on the way is a file (what is
    read there would silently be nothing)."""
    home = specdec_home()
    for folder in [home, *(home.joinpath(*parts[: index + 1]) for index in range(len(parts)))]:
        if folder.exists() and not folder.is_dir():
            raise SpecdecError(f"{_named(home)}: {folder} is a file, not a folder")
    return home.joinpath(*parts)


def writable_home_folder(*parts: str) -> Path:
    """`$SPECDEC_HOME/PARTS`, created if need be and checked writable (a file is made and removed there): for work
    that takes long and then writes there, so that a home that is a file, or read-only, fails before it starts."""
    folder = home_folder(*parts)
    named = _named(specdec_home())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-check-{os.getpid()}-{secrets.token_hex(4)}"  # (files.py imports this module)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise SpecdecError(f"{named}: cannot write in {folder} ({exc.strerror or exc})") from exc
    return folder


NAME_BYTES = 120  # a file's stem in a cache folder's name: with the key and a temporary's marks, well under 255


def short_stem(stem: str) -> str:
    """A file's stem as a cache folder's name starts: as it is, or cut to NAME_BYTES bytes (at a character) with a
    hash of the whole, so that a 245-character file name still gets a folder name the file system takes."""
    raw = stem.encode("utf-8", "surrogateescape")
    if len(raw) <= NAME_BYTES:
        return stem
    import hashlib

    cut = raw[: NAME_BYTES - 13].decode("utf-8", "ignore")
    return f"{cut}-{hashlib.sha256(raw).hexdigest()[:12]}"
