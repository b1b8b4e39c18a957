"""Every file and directory specdec writes is written atomically, here; plus tolerant JSON reads.

A writer fills a temporary beside the destination and renames it into place, so a reader (or a crash)
never sees half a file: `atomic_file` (a path for writers that want one: safetensors, the index),
`write_atomic` / `write_json_atomic` (bytes or text), `atomic_directory` (a model, a draft, a checkpoint).
On any failure, Ctrl-C included (and SIGTERM, which the CLI turns into the same interruption), the temporary
is removed. Temporaries are named `.NAME.specdec-tmp-PID-...`; one left by a process that no longer runs
(killed with SIGKILL, or a power cut) is removed the next time anything is written into that folder.
Nothing here is ever unpickled: specdec reads only JSON and safetensors.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import SpecdecError

TEMP_MARK = ".specdec-tmp-"


def temporary_beside(final: Path) -> Path:
    """A fresh temporary name in `final`'s folder, marked with this process id."""
    return final.parent / f".{final.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"


def clean_stale_temporaries(folder: Path) -> list[Path]:
    """Remove temporaries in `folder` whose writing process is gone; returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        _, mark, rest = entry.name.partition(TEMP_MARK)
        if not mark:
            continue
        pid_text = rest.split("-", 1)[0]
        if not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        _remove(entry)
        removed.append(entry)
    return removed


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yields a temporary path to write; on success it is synced and renamed to `path`, else removed."""
    final = Path(path).expanduser()
    folder = final.parent
    if not folder.is_dir():
        raise SpecdecError(f"{final}: the folder {folder} does not exist")
    clean_stale_temporaries(folder)
    temporary = temporary_beside(final)
    try:
        yield temporary
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(temporary, 0o666 & ~mask)
        os.replace(temporary, final)
        _sync_folder(folder)
    except OSError as exc:
        _remove(temporary)
        raise SpecdecError(f"{final}: cannot write ({exc.strerror or exc})") from exc
    except BaseException:
        _remove(temporary)
        raise


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write bytes or text to `path` atomically."""
    final = Path(path).expanduser()
    with atomic_file(final) as temporary:
        temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return final


def write_json_atomic(path: str | Path, payload: Any) -> Path:
    return write_atomic(path, json.dumps(payload, indent=1, ensure_ascii=False) + "\n")


@contextmanager
def atomic_directory(path: str | Path, replace: bool = True) -> Iterator[Path]:
    """Yields an empty temporary directory to fill; on success it becomes `path`.

    Every file in it, and the directory itself, is synced before the rename, so a crash never leaves a
    complete-looking directory with unwritten data. An existing `path` is replaced (moved aside, then removed)
    or, with `replace=False`, kept: another process that finished the same work first wins, even when both
    finish at once (the second rename finds the first's directory and keeps it).
    On failure the temporary directory is removed.
    """
    final = Path(path).expanduser()
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecdecError(f"{final}: cannot create its folder ({exc.strerror or exc})") from exc
    clean_stale_temporaries(final.parent)
    temporary = temporary_beside(final)
    try:
        temporary.mkdir()
        yield temporary
        if final.exists() and not replace:
            return
        sync_tree(temporary)
        old = temporary_beside(final) if final.exists() else None
        if old is not None:
            os.rename(final, old)
        try:
            os.rename(temporary, final)
        except OSError as exc:
            if replace or exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not final.is_dir():
                raise
            return  # another process renamed its copy into place between our check and our rename: use theirs
        if old is not None:
            _remove(old)
        _sync_folder(final.parent)
    except OSError as exc:
        raise SpecdecError(f"{final}: cannot write ({exc.strerror or exc})") from exc
    finally:
        _remove(temporary)


def sync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then each folder (deepest first), so a rename of `folder` publishes
    data that is on disk."""
    folders = []
    for root, _, names in os.walk(folder):
        folders.append(root)
        for name in names:
            handle = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)
    for root in reversed(folders):
        _sync_folder(Path(root))


def check_output_file(path: str | Path, setting: str, flag: bool = True) -> Path:
    """One rule for every command's output files, checked before the slow part: the folder must exist (it
    is never created behind the user's back) and the name must not be a folder. `setting` names the option
    (shown as its flag), or with `flag=False` a positional argument, named in the message as it is."""
    final = Path(path).expanduser()
    named = setting if flag else None
    if final.is_dir():
        raise SpecdecError(f"{setting} {final}: is a directory; give a file name", setting=named)
    if not final.parent.is_dir():
        raise SpecdecError(f"{setting} {final}: the folder {final.parent} does not exist", setting=named)
    check_writable_folder(final, setting, named)
    return final


def check_writable_folder(final: Path, setting: str, named: str | None) -> None:
    """Refuse, before any slow work, an output whose folder this process cannot create files in."""
    if not os.access(final.parent, os.W_OK | os.X_OK):
        raise SpecdecError(f"{setting} {final}: cannot write in the folder {final.parent} (permission denied)",
                           setting=named)


def read_json(path: str | Path) -> dict:
    """A JSON object from `path`, or {} when the file is missing or unreadable (callers treat both alike)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _sync_folder(folder: Path) -> None:
    """Make a rename durable (best effort: not every filesystem allows it)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _remove(path: Path | str) -> None:
    path = Path(path)
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except OSError:
        pass
