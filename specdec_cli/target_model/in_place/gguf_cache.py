"""Where a GGUF's in-place cache lives and whether it can be used, read from its marker and files alone.

The cache of a file loaded in place (gguf_model.py) is a folder under $SPECDEC_HOME/models named by the file's path,
size and modification time (`cache_folder`), with a marker written last (`specdec-gguf.json`: the format; the
source's proof, `source_proof`; every matrix's proof, the SHA-256 of its slices' SHA-256s (gguf_blocks), and the
SHA-256 of the blocks file's header and of every side file). `cache_fault` says why a folder cannot be used for a
file (a marker that does not match, a source that changed, a damaged, missing or foreign side file), before anything
in it is read; the blocks themselves are proved by gguf_model. Nothing here imports transformers: gguf_check asks it
whether a file's stored config (stored.py) can be used before any model is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from stat import S_ISREG
from typing import Any, Optional

from ...errors import SpecdecError
from ...files import read_json_bounded
from ...home import short_stem, specdec_home
from ..gguf.gguf_file import GGUFFile, file_identity
from . import gguf_blocks

CACHE_FORMAT = 4  # the folder's layout (its blocks file has its own gguf_blocks.BLOCKS_FORMAT); 2: proofs; 3: stored
# config, rotary tables and tokenizer read without transformers (stored.py); 4: matrices proved slice by slice
MARKER = "specdec-gguf.json"
BLOCKS_FILE = "blocks.safetensors"
PROVED = "blocks-proved.json"  # the blocks file as it was when its records last hashed to the marker's proofs
RACY_SECONDS = 2.0  # a file changed this recently may change again within its times' granularity: not recorded


def cache_folder(path: Path) -> Path:
    identity = f"{file_identity(path)}|{CACHE_FORMAT}|{gguf_blocks.BLOCKS_FORMAT}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return specdec_home() / "models" / f"{short_stem(path.stem)}-inplace-{key}"


SOURCE_KEYS = ("size", "mtime_ns", "inode", "sample")  # what must match of a marker's source (cache_fault)


def source_proof(gguf: GGUFFile) -> dict[str, Any]:
    """What a cache records of the file it was made from, to prove on every later load that the file is the same:
    its resolved path; its size, modification time and inode; and a SHA-256 of the header (every key and tensor
    record) and of 4 KiB at the start, middle and end of every tensor (milliseconds, even for 8B-shaped files), which
    catches a file rewritten with its size and time kept (`touch -r`). Not its status-change time: `chmod`, `chown`
    or a new hard link move it and change no byte (a marker written before records it; it is not compared)."""
    stat = gguf.path.stat()
    tensors = sorted(gguf.tensors.values(), key=lambda info: info.start)
    data_start = tensors[0].start if tensors else gguf.size
    sample = sampled_digest(gguf.path, [(info.start, info.nbytes) for info in tensors], head=data_start)
    return {"path": str(gguf.path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "inode": stat.st_ino, "sample": sample}


def sampled_digest(path: Path, spans: list[tuple[int, int]], head: int = 0) -> str:
    """SHA-256 of the file's first `head` bytes and of 4 KiB at the start, middle and end of each (start, bytes)
    span: milliseconds for gigabytes, and a region left unwritten or rewritten shows in it."""
    sample = hashlib.sha256()
    with open(path, "rb") as handle:
        sample.update(handle.read(head))
        for start, nbytes in spans:
            for at in sorted({start, start + max(0, nbytes // 2 - 2048), start + max(0, nbytes - 4096)}):
                handle.seek(at)
                sample.update(handle.read(min(4096, nbytes)))
    return sample.hexdigest()


def file_digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def side_files(folder: Path) -> dict[str, str]:
    """{name: SHA-256} of the folder's files but the marker and the blocks (the tokenizer, config, template...)."""
    return {entry.name: file_digest(entry) for entry in sorted(folder.iterdir())
            if entry.is_file() and entry.name not in (MARKER, BLOCKS_FILE, PROVED)}


def read_marker(folder: Path) -> Optional[dict[str, Any]]:
    """The folder's marker; None when it has none, {} when it is damaged (not JSON, not a regular file, too big)."""
    try:
        marker = read_json_bounded(folder / MARKER)
        return marker if isinstance(marker, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def cache_fault(folder: Path, gguf: Optional[GGUFFile]) -> Optional[str]:
    """Why the folder's cache cannot be used for the file (None: it can, as far as its marker and side files tell;
    the blocks are proved by _proved_blocks); "" when there is no cache at all."""
    marker = read_marker(folder)
    if marker is None:
        return "" if not folder.exists() else "its marker is missing"
    if not marker:
        return "its marker is damaged"
    if marker.get("format") != CACHE_FORMAT:
        return "it is of another format"
    if gguf is not None:
        recorded = marker.get("source")
        proof = source_proof(gguf)
        if not isinstance(recorded, dict) or recorded.get("path") != proof["path"]:
            made_from = recorded.get("path") if isinstance(recorded, dict) else recorded
            return f"it was made from another file ({made_from})"
        changed = [key for key in SOURCE_KEYS if recorded.get(key) != proof[key]]
        if changed:
            return f"{gguf.path.name} changed since it was made ({', '.join(changed)})"
    if not_regular(folder / PROVED):  # (never read; made again, it is gone)
        return f"{PROVED} is not a regular file"
    try:
        if (folder / BLOCKS_FILE).stat().st_size != int(marker["blocks_bytes"]):
            return f"{BLOCKS_FILE} is of another size"
        recorded_files = marker["files"]
        found = side_files(folder)
    except (OSError, ValueError, KeyError, TypeError):
        return "it is incomplete"
    for name, digest in recorded_files.items():
        if found.get(name) != digest:
            return f"{name} is {'missing' if name not in found else 'damaged'}"
    extra = sorted(set(found) - set(recorded_files))
    return f"{extra[0]} was not made by specdec" if extra else None


def not_regular(path: Path) -> bool:
    """Whether something other than a regular file lies at `path` (a FIFO, a device, a link to one); not opened."""
    try:
        return not S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False
    except OSError:
        return True


def superseded_folders(folder: Path, path: Path) -> list[Path]:
    """The other cache folders of the file at `path` beside `folder`: made by an earlier format, or from the file
    before it changed (their marker's source is the same resolved path). Made once `folder` is, they are never
    used again."""
    name, resolved = re.compile(re.escape(short_stem(path.stem)) + r"-inplace-[0-9a-f]{12}"), str(path.resolve())
    found = []
    for other in sorted(folder.parent.iterdir()):
        # (temporaries, being made, are named otherwise)
        if other == folder or not name.fullmatch(other.name) or other.is_symlink() or not other.is_dir():
            continue
        marker = read_marker(other) or {}
        source = marker.get("source")
        if isinstance(marker.get("format"), int) and isinstance(source, dict) and source.get("path") == resolved:
            found.append(other)
    return found


def blocks_identity(folder: Path, marker: dict[str, Any]) -> Optional[dict[str, Any]]:
    """What is recorded of the blocks file once its records hash to the marker's proofs: its size, modification
    and status-change times, inode and device (any write to it changes its status-change time, which only the
    kernel sets), a SHA-256 of 4 KiB at the start, middle and end of each 64 MiB of it (catches a region a crash
    left unwritten), and which proofs they matched. None when it cannot be read."""
    path, chunk = folder / BLOCKS_FILE, 64 << 20
    try:
        stat = path.stat()
        sample = sampled_digest(path, [(start, min(chunk, stat.st_size - start))
                                       for start in range(0, stat.st_size, chunk)])
    except OSError:
        return None
    proofs = hashlib.sha256(json.dumps(marker.get("blocks"), sort_keys=True).encode()).hexdigest()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns, "inode": stat.st_ino,
            "device": stat.st_dev, "sample": sample, "proofs": proofs}


def proved_before(folder: Path, marker: dict[str, Any]) -> bool:
    """Whether the blocks file is as it was when its records last hashed to the marker's proofs (`remember_proved`):
    then a load maps it without hashing its gigabytes again."""
    try:
        recorded = read_json_bounded(folder / PROVED)
    except (OSError, ValueError):  # (a FIFO or a device there too: the blocks are hashed again)
        return False
    identity = blocks_identity(folder, marker)
    return identity is not None and recorded == identity


def remember_proved(folder: Path, marker: dict[str, Any]) -> None:
    """Record the blocks file's identity after its records hashed to the marker's proofs; not for a file changed
    within RACY_SECONDS (a write in the same tick of the clock would keep its times), nor where this user cannot
    write (then it is hashed at every load)."""
    from ...files import write_json_atomic

    identity = blocks_identity(folder, marker)
    if identity is not None and time.time_ns() - identity["ctime_ns"] >= RACY_SECONDS * 1e9:
        try:
            write_json_atomic(folder / PROVED, identity)
        except SpecdecError:  # (files.py says "cannot write" so)
            pass


def cache_ready(folder: Path) -> bool:
    """Whether the folder's marker and side files are as specdec made them (the source and the blocks are proved
    when the model itself is loaded)."""
    return cache_fault(folder, None) is None
