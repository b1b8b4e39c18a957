"""Corpus reading and `build_index`: input files -> documents -> token ids -> a saved suffix-automaton index.

Inputs: `.txt` (or any other) files are one document each; `.jsonl` files give one document per row (the
`field` string; a `messages` / `turns` list of chat turns joined into one document; or `prompt` + `answer`
as written by `specdec distill generate`); directories are searched recursively with a glob; `-` is stdin
(one document). Which files those are, checked before anything slow: corpus_inputs.py. A file found by a
directory's search that turns out not to be UTF-8 text is skipped and listed; a corpus without any text is
refused. Documents are tokenised in batches with the target's (fast) tokenizer, without special tokens, and
each is followed by the tokenizer's EOS, the separator drafts never cross.

This module does not know about the command line (cli/index_cmd.py renders progress and results) and
does not build or store automata itself (sam/automaton.py, sam/index.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from ..errors import SpecdecError
from .corpus_inputs import (
    CorpusStats,
    InputFile,
    SourceRecord,
    check_index_output,
    refuse_binary,
    resolve_inputs,
)
from .fingerprint import tokenizer_fingerprint

BATCH_DOCUMENTS = 256  # documents per tokenizer call ...
BATCH_CHARACTERS = 1_000_000  # ... or fewer when they are long (progress updates come this often)
PIECE_CHARACTERS = 200_000  # a longer document is tokenised in pieces cut at line ends (Ctrl-C stays prompt)
TURN_KEYS = ("messages", "turns")
TURN_TEXT_KEYS = ("content", "text", "value")

ProgressCallback = Callable[[int, int], None]  # (tokens_done, documents_done)
PhaseCallback = Callable[[str], None]  # "Building", "Writing"


# ---------------------------------------------------------------------------------------------- documents


def _decode(path: str, data: bytes) -> str:
    refuse_binary(path, data)
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
                    refuse_binary(path, line)
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
    """(source, document) pairs in input order; fills `stats.sources` with each input's provenance (a text file a
    directory's search found that is not UTF-8 goes to `stats.skipped_files` instead)."""
    for item in inputs:
        record = SourceRecord(path=item.path)
        if item.kind == "jsonl":
            stats.sources.append(record)
            for text in _jsonl_documents(item.path, field, record, stats):
                yield record, text
            continue
        try:
            data = sys.stdin.buffer.read() if item.kind == "stdin" else Path(item.path).read_bytes()
        except OSError as exc:
            raise SpecdecError(f"{item.path}: cannot read ({exc.strerror or exc})") from None
        try:
            text = _decode("stdin" if item.kind == "stdin" else item.path, data)
        except SpecdecError:
            if not item.found:
                raise
            stats.skipped_files.append(item.path)
            continue
        record.sha256 = hashlib.sha256(data).hexdigest()
        record.size = len(data)
        stats.sources.append(record)
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
    file_bytes, bytes_per_token, seconds and per-phase seconds, output, sources, skipped_rows, skipped_files: the
    paths of files a directory's search found that are not UTF-8 text)."""
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
        if stats.skipped_files:
            hint += f" ({len(stats.skipped_files)} files skipped: not UTF-8 text)"
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
            "skipped_files": len(stats.skipped_files),
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
        "skipped_files": stats.skipped_files,
        "tokenize_seconds": tokenized - started,
        "build_seconds": built - tokenized,
        "write_seconds": finished - built,
        "seconds": finished - started,
    }
