"""Which files a corpus is: the inputs named on the command line (files, directories searched with a glob, - for
stdin) checked before anything slow, and the records that say where each document came from.

A file named that is not UTF-8 text is refused ("looks binary"); one a directory's search found is skipped and
listed (`CorpusStats.skipped_files`). An output that would replace one of the inputs, or a file that is not an
index, is refused here too (`check_index_output`). Reading the files into documents and tokens is corpus.py's.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from ..errors import SpecdecError
from ..files import check_output_file, check_writable_folder

STDIN = "-"
SNIFF_BYTES = 8192

@dataclass(frozen=True)
class InputFile:
    path: str  # a file path, or "-" for stdin
    kind: str  # "text" | "jsonl" | "stdin"
    found: bool = False  # found by searching a directory: skipped, not refused, when it is not UTF-8 text


@dataclass
class SourceRecord:
    """Provenance of one input, stored in the index: path, sha256 of its bytes, size in bytes."""

    path: str
    sha256: str = ""
    size: int = 0
    documents: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size, "documents": self.documents}


@dataclass
class CorpusStats:
    sources: list[SourceRecord] = dataclass_field(default_factory=list)
    skipped_rows: int = 0  # jsonl rows without usable text
    skipped_files: list[str] = dataclass_field(default_factory=list)  # found in a directory, not UTF-8 text
    empty_directories: list[str] = dataclass_field(default_factory=list)


# ---------------------------------------------------------------------------------------------- inputs


def _kind_of(path: Path) -> str:
    return "jsonl" if path.suffix.lower() == ".jsonl" else "text"


def looks_binary(head: bytes) -> bool:
    return b"\x00" in head[:SNIFF_BYTES]


def refuse_binary(path: Union[str, Path], head: bytes) -> None:
    if looks_binary(head):
        raise SpecdecError(f"{path}: looks binary (NUL bytes), not a text corpus file")


def _head(path: Path) -> bytes:
    """The file's first SNIFF_BYTES; unreadable: SpecdecError."""
    try:
        with open(path, "rb") as handle:
            return handle.read(SNIFF_BYTES)
    except OSError as exc:
        raise SpecdecError(f"{path}: cannot read ({exc.strerror or exc})") from None


def resolve_inputs(
    inputs: Sequence[Union[str, os.PathLike]], glob: str = "*.txt", stats: Optional[CorpusStats] = None,
    quiet: bool = False,
) -> list[InputFile]:
    """Expand directories, check that every input exists and the files named do not look binary (files a
    directory's search found that do are left out, and listed in `stats.skipped_files`). A file given again by
    another path (`./dir/../a.txt`, a symlink, a folder that holds it; the same real path) is read once, with one
    warning naming it, unless `quiet` (a check before the call that reads them)."""
    if not inputs:
        raise SpecdecError("no corpus given: name files, directories or - (stdin)")
    resolved: list[InputFile] = []
    seen_stdin = False
    first_names: dict[str, str] = {}  # real path -> the name it was first given as
    repeats: dict[str, list[str]] = {}  # name given first -> the names it was given again as

    def add(path: Path, shown: str, found: bool = False) -> None:
        real = os.path.realpath(path)
        if real in first_names:
            repeats.setdefault(first_names[real], []).append(shown)
            return
        first_names[real] = shown
        head = _head(path)
        if looks_binary(head):
            if not found:
                refuse_binary(path, head)
            if stats is not None:
                stats.skipped_files.append(str(path))
            return
        resolved.append(InputFile(str(path), _kind_of(path), found))

    for raw in inputs:
        name = str(raw)
        if name == STDIN:
            if seen_stdin:
                raise SpecdecError("- (stdin) given twice")
            seen_stdin = True
            resolved.append(InputFile(STDIN, "stdin"))
            continue
        path = Path(name).expanduser()
        if path.is_dir():
            matches = sorted(found for found in path.rglob(glob) if found.is_file())
            if not matches and stats is not None:
                stats.empty_directories.append(name)
            for found in matches:
                add(found, f"{found} (in {name})", found=True)
        elif path.is_file():
            add(path, name)
        elif path.exists():
            raise SpecdecError(f"{name}: not a regular file or directory")
        else:
            raise SpecdecError(f"{name}: no such file or directory")
    if repeats and not quiet:
        named = "; ".join(f"{', '.join(again)} {'is' if len(again) == 1 else 'are'} {first}"
                          for first, again in list(repeats.items())[:3])
        more = f"; and {len(repeats) - 3} more files" if len(repeats) > 3 else ""
        warnings.warn(f"the same file given twice is read once: {named}{more}", stacklevel=2)
    return resolved


def check_index_build(corpus: Sequence[Union[str, os.PathLike]], output: str, glob: str = "*.txt",
                      force: bool = False) -> list[InputFile]:
    """What `build_index` checks before anything slow: every input exists and is text (quietly: the build warns
    of repeats), the output's folder exists (files.check_output_file) and the output would destroy neither an input
    nor a file that is not an index without `force`. Returns the inputs."""
    files = resolve_inputs(corpus, glob, quiet=True)
    check_output_file(output, "output", own_rule=True)
    check_index_output(output, files, force)
    return files


def check_index_output(output: Union[str, os.PathLike], files: Sequence[InputFile], force: bool = False) -> Path:
    """Refuse an index output that would destroy something: one of the corpus files (the same file by any
    path: a symlink, a hard link, a folder given as input that holds it), with or without `force`, or an
    existing file that is not a specdec index, unless `force`. An existing index is replaced (it is specdec's
    own artefact, rebuilt from its corpus)."""
    final = Path(output).expanduser()
    if final.is_dir():
        raise SpecdecError(f"{output}: is a directory; give the index file name with -o", setting="output")
    if final.parent.is_dir():
        check_writable_folder(final, "output", "output")
    try:
        written = final.stat()
    except OSError:  # nothing there yet (or a dangling link): nothing to lose
        return final
    for item in files:
        if item.kind == "stdin":
            continue
        try:
            read = os.stat(item.path)
        except OSError:
            continue
        if (read.st_dev, read.st_ino) == (written.st_dev, written.st_ino):
            via = "" if Path(item.path).absolute() == final.absolute() else f" (as {item.path})"
            raise SpecdecError(f"output {output} is also an input{via}: the index would replace its own corpus; "
                               "write it elsewhere", setting="output")
    from ..sam.index import is_index_file

    if not force and not is_index_file(final):
        raise SpecdecError(f"output {output} exists and is not a specdec index: add --force to replace it, or "
                           "choose another -o", setting="output")
    return final
