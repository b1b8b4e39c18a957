"""Corpus reading and `build_index`: input files -> documents -> token ids -> a saved suffix-automaton index.

Inputs: `.txt` (or any other) files are one document each; `.jsonl` files give one document per row (the
`field` string; a `messages` / `turns` list of chat turns joined into one document; or `prompt` + `answer`
as written by `specdec distill generate`); directories are searched recursively with a glob; `-` is stdin
(one document). Files that are not UTF-8 text are refused ("looks binary"), as are missing inputs and a
corpus without any text. Documents are tokenised in batches with the target's (fast) tokenizer, without
special tokens, and each is followed by the tokenizer's EOS, the separator drafts never cross.

This module does not know about the command line (cli/index_cmd.py renders progress and results) and
does not build or store automata itself (sam/automaton.py, sam/index.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from ..errors import SpecdecError
from ..files import check_output_file, check_writable_folder
from .fingerprint import tokenizer_fingerprint

STDIN = "-"
SNIFF_BYTES = 8192
BATCH_DOCUMENTS = 256  # documents per tokenizer call ...
BATCH_CHARACTERS = 1_000_000  # ... or fewer when they are long (progress updates come this often)
PIECE_CHARACTERS = 200_000  # a longer document is tokenised in pieces cut at line ends (Ctrl-C stays prompt)
TURN_KEYS = ("messages", "turns")
TURN_TEXT_KEYS = ("content", "text", "value")

ProgressCallback = Callable[[int, int], None]  # (tokens_done, documents_done)
PhaseCallback = Callable[[str], None]  # "Building", "Writing"


@dataclass(frozen=True)
class InputFile:
    path: str  # a file path, or "-" for stdin
    kind: str  # "text" | "jsonl" | "stdin"


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
    empty_directories: list[str] = dataclass_field(default_factory=list)


# ---------------------------------------------------------------------------------------------- inputs


def _kind_of(path: Path) -> str:
    return "jsonl" if path.suffix.lower() == ".jsonl" else "text"


def _refuse_binary(path: Union[str, Path], head: bytes) -> None:
    if b"\x00" in head[:SNIFF_BYTES]:
        raise SpecdecError(f"{path}: looks binary (NUL bytes), not a text corpus file")


def _sniff(path: Path) -> None:
    try:
        with open(path, "rb") as handle:
            _refuse_binary(path, handle.read(SNIFF_BYTES))
    except OSError as exc:
        raise SpecdecError(f"{path}: cannot read ({exc.strerror or exc})") from None


def resolve_inputs(
    inputs: Sequence[Union[str, os.PathLike]], glob: str = "*.txt", stats: Optional[CorpusStats] = None,
    quiet: bool = False,
) -> list[InputFile]:
    """Expand directories, check that every input exists and the files do not look binary. A file given again
    by another path (`./dir/../a.txt`, a symlink, a folder that holds it; the same real path) is read once, with
    one warning naming it, unless `quiet` (a check before the call that reads them)."""
    if not inputs:
        raise SpecdecError("no corpus given: name files, directories or - (stdin)")
    resolved: list[InputFile] = []
    seen_stdin = False
    first_names: dict[str, str] = {}  # real path -> the name it was first given as
    repeats: dict[str, list[str]] = {}  # name given first -> the names it was given again as

    def add(path: Path, shown: str) -> None:
        real = os.path.realpath(path)
        if real in first_names:
            repeats.setdefault(first_names[real], []).append(shown)
            return
        first_names[real] = shown
        _sniff(path)
        resolved.append(InputFile(str(path), _kind_of(path)))

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
                add(found, f"{found} (in {name})")
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


# ---------------------------------------------------------------------------------------------- documents


def _decode(path: str, data: bytes) -> str:
    _refuse_binary(path, data)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SpecdecError(f"{path}: looks binary (not UTF-8 text)") from None


def _turn_text(turn: Any) -> str:
    if isinstance(turn, str):
        return turn
    if isinstance(turn, dict):
        for key in TURN_TEXT_KEYS:
            value = turn.get(key)
            if isinstance(value, str):
                return value
            if isinstance(value, list):  # content parts: [{"type": "text", "text": ...}, ...]
                return "".join(_turn_text(part) for part in value)
    return ""


def row_text(row: Any, field: str = "text") -> Optional[str]:
    """The document in one jsonl row, or None when the row has no text."""
    if isinstance(row, str):
        return row
    if not isinstance(row, dict):
        return None
    value = row.get(field)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n\n".join(filter(None, map(_turn_text, value)))
    for key in TURN_KEYS:
        turns = row.get(key)
        if isinstance(turns, list):
            return "\n\n".join(filter(None, map(_turn_text, turns)))
    prompt, answer = row.get("prompt"), row.get("answer")
    if isinstance(prompt, str) and isinstance(answer, str):
        return f"{prompt}\n\n{answer}"
    return None


def _jsonl_documents(path: str, field: str, record: SourceRecord, stats: CorpusStats) -> Iterator[str]:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for line_number, line in enumerate(handle, start=1):
                digest.update(line)
                record.size += len(line)
                if line_number == 1:
                    _refuse_binary(path, line)
                if not line.strip():
                    continue
                try:
                    row = json.loads(line.decode("utf-8-sig" if line_number == 1 else "utf-8"))
                except UnicodeDecodeError:
                    raise SpecdecError(f"{path}: looks binary (not UTF-8 text)") from None
                except json.JSONDecodeError as exc:
                    raise SpecdecError(f"{path}:{line_number}: not valid JSON ({exc.msg})") from None
                text = row_text(row, field)
                if text is None or not text.strip():
                    stats.skipped_rows += 1
                    continue
                yield text
    except OSError as exc:
        raise SpecdecError(f"{path}: cannot read ({exc.strerror or exc})") from None
    record.sha256 = digest.hexdigest()


def iter_documents(inputs: Iterable[InputFile], field: str, stats: CorpusStats) -> Iterator[tuple[SourceRecord, str]]:
    """(source, document) pairs in input order; fills `stats.sources` with each input's provenance."""
    for item in inputs:
        record = SourceRecord(path=item.path)
        stats.sources.append(record)
        if item.kind == "jsonl":
            for text in _jsonl_documents(item.path, field, record, stats):
                yield record, text
            continue
        try:
            data = sys.stdin.buffer.read() if item.kind == "stdin" else Path(item.path).read_bytes()
        except OSError as exc:
            raise SpecdecError(f"{item.path}: cannot read ({exc.strerror or exc})") from None
        record.sha256 = hashlib.sha256(data).hexdigest()
        record.size = len(data)
        text = _decode("stdin" if item.kind == "stdin" else item.path, data)
        if text.strip():
            yield record, text


# ---------------------------------------------------------------------------------------------- tokens


def eos_id_of(tokenizer: Any) -> int:
    eos_id = getattr(tokenizer, "eos_token_id", None)
    if eos_id is None:
        raise SpecdecError("the tokenizer has no EOS token to separate documents with")
    return int(eos_id)


def pieces(text: str, limit: int = PIECE_CHARACTERS) -> list[str]:
    """`text` cut into pieces of at most about `limit` characters, each ending at a line end when one is near.

    The tokenizer is native code that does not return to Python until a call is done: a long document in one
    call would ignore Ctrl-C until it is all tokenised (docs/measurements.md, "Tokenising a corpus"). Tokens at
    a cut may differ from those of the whole text (a merge across the cut is lost), which does not matter for an
    index that only drafts.
    """
    out, start = [], 0
    while len(text) - start > limit:
        end = text.rfind("\n", start + limit // 2, start + limit)
        end = start + limit if end < 0 else end + 1
        out.append(text[start:end])
        start = end
    out.append(text[start:])
    return out


def tokenize_documents(
    documents: Iterable[tuple[SourceRecord, str]],
    tokenizer: Any,
    on_progress: Optional[ProgressCallback] = None,
) -> tuple[np.ndarray, int]:
    """Token ids of all documents, each followed by EOS, as one int32 array; and the document count."""
    eos_id = eos_id_of(tokenizer)
    chunks: list[np.ndarray] = []
    tokens_done = documents_done = 0
    batch: list[tuple[SourceRecord, str, bool]] = []  # (source, piece, the document's last piece?)
    batch_characters = 0
    document: list[int] = []  # ids of the document being assembled from its pieces

    def flush() -> None:
        nonlocal tokens_done, documents_done, batch_characters
        encoded = tokenizer(
            [text for _, text, _ in batch], add_special_tokens=False, return_attention_mask=False, verbose=False
        )["input_ids"]
        flat: list[int] = []
        for (record, _, last), ids in zip(batch, encoded):
            document.extend(ids)
            if last and document:
                flat.extend(document)
                flat.append(eos_id)
                record.documents += 1
                documents_done += 1
            if last:
                document.clear()
        chunks.append(np.asarray(flat, dtype=np.int32))
        tokens_done += len(flat)
        batch.clear()
        batch_characters = 0
        if on_progress is not None:
            on_progress(tokens_done, documents_done)

    for record, text in documents:
        parts = pieces(text)
        for number, part in enumerate(parts):
            batch.append((record, part, number == len(parts) - 1))
            batch_characters += len(part)
            if len(batch) >= BATCH_DOCUMENTS or batch_characters >= BATCH_CHARACTERS:
                flush()
    if batch:
        flush()
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
    return tokens, documents_done


# ---------------------------------------------------------------------------------------------- the build


def build_index(
    inputs: Sequence[Union[str, os.PathLike]],
    output: Union[str, os.PathLike],
    tokenizer: Any,
    *,
    field: str = "text",
    glob: str = "*.txt",
    target_name: str = "",
    on_progress: Optional[ProgressCallback] = None,
    on_phase: Optional[PhaseCallback] = None,
    force: bool = False,
) -> dict[str, Any]:
    """Read, tokenise, build and save (`check_index_output` says which outputs are refused; `force` replaces a
    file that is not an index); returns a summary (documents, tokens, states, transitions,
    file_bytes, bytes_per_token, seconds and per-phase seconds, output, sources, skipped_rows)."""
    from ..sam.automaton import build_static
    from ..sam.index import save_index

    started = time.perf_counter()
    stats = CorpusStats()
    files = resolve_inputs(inputs, glob, stats)
    output_path = check_index_output(output, files, force)
    eos_id = eos_id_of(tokenizer)

    tokens, documents = tokenize_documents(iter_documents(files, field, stats), tokenizer, on_progress)
    tokenized = time.perf_counter()
    if documents == 0:
        where = ", ".join(str(item) for item in inputs)
        if stats.skipped_rows:
            raise SpecdecError(f"no row of {where} has text in the field {field!r} ({stats.skipped_rows} rows "
                               f"skipped; rows with messages/turns lists or prompt and answer work too): "
                               f"name the field with --field")
        empty = ", ".join(stats.empty_directories)
        hint = f" (no files matching --glob {glob!r} in {empty})" if empty else ""
        raise SpecdecError(f"empty corpus: no text in {where}{hint}")

    if on_phase is not None:
        on_phase("Building")
    vocab_size = max(len(tokenizer), int(tokens.max()) + 1)
    automaton = build_static(tokens, vocab_size=vocab_size, separators=(eos_id,))
    built = time.perf_counter()

    if on_phase is not None:
        on_phase("Writing")
    metadata = {
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "vocab_size": vocab_size,
        "eos_id": eos_id,
        "documents": documents,
        "sources": [record.as_dict() for record in stats.sources],
        "build": {
            "target": target_name,
            "tokenizer_class": type(tokenizer).__name__,
            "field": field,
            "glob": glob,
            "separator": "eos",
            "add_special_tokens": False,
            "skipped_rows": stats.skipped_rows,
        },
    }
    file_bytes = save_index(output_path, automaton, metadata)
    finished = time.perf_counter()
    return {
        "output": str(output_path),
        "documents": documents,
        "tokens": len(tokens),
        "states": automaton.num_states,
        "transitions": automaton.num_transitions,
        "file_bytes": file_bytes,
        "bytes_per_token": file_bytes / len(tokens),
        "sources": len(stats.sources),
        "skipped_rows": stats.skipped_rows,
        "tokenize_seconds": tokenized - started,
        "build_seconds": built - tokenized,
        "write_seconds": finished - built,
        "seconds": finished - started,
    }
