"""Every file and directory specdec writes is written atomically, here; plus tolerant, bounded JSON reads.

A writer fills a temporary beside the destination and renames it into place, so a reader (or a crash)
never sees half a file: `atomic_file` (a path for writers that want one: safetensors, the index),
`write_atomic` / `write_json_atomic` (bytes or text), `atomic_directory` (a model, a draft, a checkpoint).
On any failure, Ctrl-C included (and SIGTERM, which the CLI turns into the same interruption), the temporary
is removed. Temporaries are named `.NAME.specdec-tmp-PID-...`; one left by a process that no longer runs
(killed with SIGKILL, or a power cut) is removed the next time anything is written into that folder.
Nothing here is ever unpickled: specdec reads only JSON and safetensors. Every JSON file specdec keeps (a cache's
marker, a record under $SPECDEC_HOME) is read by `read_json_bounded`: a regular file of at most JSON_LIMIT bytes, so a
FIFO or a device in its place is a damaged file, never a hang or a read without end (`read_json`: {} for any of them).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import SpecdecError
from .home import specdec_home

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
        if str(final.absolute()) in _checked_outputs:
            _record_output(final, temporary)
        refuse_special(final, "output")  # (checked before the work; a FIFO made since is not replaced either)
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
def atomic_directory(path: str | Path, replace: bool = True, unsynced: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yields an empty temporary directory to fill; on success it becomes `path`.

    Every file in it, and the directory itself, is synced before the rename, so a crash never leaves a complete-
    looking directory with unwritten data; but files named in `unsynced`, which their reader proves before any
    use (a GGUF's repacked blocks, by their SHA-256s: seconds of disk time on a first load). An existing `path`
    is replaced (moved aside, then removed) or, with `replace=False`, kept: another process that finished the
    same work first wins, even when both finish at once (the second rename finds the first's directory and keeps
    it).
    On failure the temporary directory is removed.
    """
    final = Path(path).expanduser()
    refuse_special(final, "output")  # a FIFO or a device is never moved aside and removed
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
        sync_tree(temporary, unsynced)
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


def sync_tree(folder: Path, unsynced: tuple[str, ...] = ()) -> None:
    """fsync every file under `folder` (but those named in `unsynced`), then each folder (deepest first), so a
    rename of `folder` publishes data that is on disk."""
    folders = []
    for root, _, names in os.walk(folder):
        folders.append(root)
        for name in names:
            if name in unsynced:
                continue
            handle = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)
    for root in reversed(folders):
        _sync_folder(Path(root))


OUTPUTS_RECORD = "outputs.json"  # under $SPECDEC_HOME: {absolute path: {"size", "sha256"}} of each output written
_checked_outputs: set[str] = set()  # outputs check_output_file let through in this process: recorded once written


def check_output_file(path: str | Path, setting: str, flag: bool = True, *, own_rule: bool = False,
                      force: bool = False, force_flag: str = "") -> Path:
    """One rule for every command's output files, checked before the slow part: the folder must exist (it
    is never created behind the user's back and must be writable) and the name must not be a folder. An
    existing file is replaced only when specdec wrote it there and nobody changed it since (`written_here`), or
    with `force` (a command's `force_flag`); a FIFO, a device or a socket is refused, `force` or not, without being
    opened (`refuse_special`); `own_rule=True` leaves existing files to the caller's own rule (an
    index replaces an index, data is appended to). `setting` names the option (shown as its flag), or with
    `flag=False` a positional argument, named in the message as it is."""
    final = Path(path).expanduser()
    named = setting if flag else None
    refuse_special(final, setting, named)
    if final.is_dir():
        raise SpecdecError(f"{setting} {final}: is a directory; give a file name", setting=named)
    if not final.parent.is_dir():
        raise SpecdecError(f"{setting} {final}: the folder {final.parent} does not exist", setting=named)
    check_writable_folder(final, setting, named)
    if own_rule:
        return final
    if not force and os.path.lexists(final) and not written_here(final):
        how = f"add {force_flag} to replace it" if force_flag else "remove it first"
        raise SpecdecError(f"{setting} {final}: the file exists and specdec did not write it; choose another "
                           f"name, or {how}", setting=named)
    _checked_outputs.add(str(final.absolute()))
    return final


def check_replaceable_dir(directory: str | Path, ours: Any, what: str, setting: str | None = "output") -> None:
    """Refuse, before any work, an output directory that writing would replace but specdec did not write: one that
    is a file, or holds files and is not `what` (`ours(folder)` says whether it is)."""
    folder = Path(directory).expanduser()
    if folder.exists():
        if not folder.is_dir():
            raise SpecdecError(f"{folder}: exists and is not a directory", setting=setting)
        if any(folder.iterdir()) and not ours(folder):
            raise SpecdecError(f"{folder}: exists and is not {what}; choose another --output", setting=setting)


def expect_output(path: str | Path) -> None:
    """An output whose folder specdec makes later (so check_output_file cannot look yet): recorded once written, so
    that the next run may replace it."""
    _checked_outputs.add(str(Path(path).expanduser().absolute()))


def _outputs_record() -> Path:
    return specdec_home() / OUTPUTS_RECORD


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in 4 MiB pieces."""
    import hashlib

    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            hasher.update(block)
    return hasher.hexdigest()


def written_here(path: str | Path) -> bool:
    """Whether `path` is an output specdec wrote (through check_output_file), unchanged since: its size and SHA-256
    as recorded under $SPECDEC_HOME."""
    final = Path(path).expanduser()
    if final.is_symlink() or not final.is_file():
        return False
    recorded = read_json(_outputs_record()).get(str(final.absolute()))
    try:
        return (isinstance(recorded, dict) and recorded.get("size") == final.stat().st_size
                and recorded.get("sha256") == file_sha256(final))
    except OSError:
        return False


def _record_output(final: Path, written: Path) -> None:
    """Remember an output's size and hash, so that the next run may replace it (best effort: a home that cannot
    be written only means the next run asks for another name)."""
    try:
        entry = {"size": written.stat().st_size, "sha256": file_sha256(written)}
        record = read_json(_outputs_record())
        record[str(final.absolute())] = entry
        _outputs_record().parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(_outputs_record()) as temporary:
            temporary.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    except (OSError, SpecdecError):
        pass


def check_writable_folder(final: Path, setting: str, named: str | None) -> None:
    """Refuse, before any slow work, an output whose folder this process cannot create files in."""
    if not os.access(final.parent, os.W_OK | os.X_OK):
        raise SpecdecError(f"{setting} {final}: cannot write in the folder {final.parent} (permission denied)",
                           setting=named)


def lock_output(path: str | Path, setting: str = "output") -> Any:
    """Claim `path` for writing by this process until the returned handle is closed (or the process ends): a
    second specdec process writing the same file is refused with one line instead of writing it twice. The lock
    is an flock on a file under $SPECDEC_HOME/locks named by the path's hash, so nothing appears beside the
    output; where the home cannot be written, nothing is locked (best effort)."""
    import fcntl
    import hashlib

    final = Path(path).expanduser()
    folder = specdec_home() / "locks"
    name = hashlib.sha256(str(final.absolute()).encode()).hexdigest()[:32]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / name, "a+")
    except OSError:
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise SpecdecError(f"{setting} {final}: another specdec process is writing it now; wait for it to finish, "
                           "or choose another file", setting=setting) from None
    return handle


JSON_LIMIT = 16 << 20  # bytes: the most a JSON file specdec keeps (a marker, a record, a config) may hold


def read_json_bounded(path: str | Path, limit_bytes: int = JSON_LIMIT) -> Any:
    """The JSON value in the regular file `path`, read without blocking and without reading past `limit_bytes`.

    A FIFO, a device or a socket in its place is never read (opened non-blocking, so a FIFO never waits for a
    writer, and refused by fstat), nor a file over the limit, nor one nested deeper than json can parse: each
    raises ValueError saying so, as a file that is not JSON does, so callers treat them all as a damaged file. A
    missing file raises FileNotFoundError (OSError), as reading it would."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):  # (a device is not even opened: opening some has effects)
        raise ValueError(f"{_kind(mode)}, not a regular file")
    handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        opened = os.fstat(handle)
        if not stat.S_ISREG(opened.st_mode):  # (replaced between the stat and the open)
            raise ValueError(f"{_kind(opened.st_mode)}, not a regular file")
        if opened.st_size > limit_bytes:
            raise ValueError(f"{opened.st_size:,} bytes, over the {limit_bytes:,} a JSON file of specdec's may hold")
        data = _read_at_most(handle, limit_bytes + 1)
    finally:
        os.close(handle)
    if len(data) > limit_bytes:  # (grown since the fstat)
        raise ValueError(f"over the {limit_bytes:,} bytes a JSON file of specdec's may hold")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _read_at_most(handle: int, count: int) -> bytes:
    """Up to `count` bytes from a file descriptor (fewer only at its end)."""
    pieces, left = [], count
    while left > 0:
        piece = os.read(handle, min(left, 1 << 20))
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def read_json(path: str | Path) -> dict:
    """A JSON object from `path`, or {} when the file is missing, unreadable, not a regular file or too large
    (callers treat all alike; read_json_bounded)."""
    try:
        value = read_json_bounded(path)
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


def refuse_special(final: Path, setting: str, named: str | None = None) -> None:
    """Refuse an output path that exists and is neither a regular file nor a folder (a FIFO, a device, a socket):
    it is never opened (reading a FIFO blocks) and never replaced, whatever --force says. Only stat is asked."""
    try:
        mode = os.stat(final).st_mode
    except OSError:  # nothing there (or a dangling link): nothing to lose
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise SpecdecError(f"{setting} {final}: {_kind(mode)}, not a regular file; specdec writes only regular files "
                           "and never replaces anything else", setting=named)


def _kind(mode: int) -> str:
    return "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else \
        "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else \
        "not a regular file"


def check_regular(path: Path, what: str = "") -> None:
    """Refuse a path that is not a regular file (a FIFO, a socket or a device would block or never end) before
    anything opens it. `what` opens the message ("--index"); the path does otherwise."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise SpecdecError(f"{what or path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(mode):
        raise SpecdecError(f"{what + ' ' if what else ''}{path}: {_kind(mode)}, not a regular file; specdec does not "
                           "read it")
