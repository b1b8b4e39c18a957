"""The static index file: a suffix automaton saved as a safetensors file of flat int32 arrays.

Layout (safetensors: 8-byte little-endian header length, JSON header, raw data): tensors `text`, `link`,
`length`, `min_endpos`, `count`, `trans_offsets`, `trans_tokens`, `trans_targets` (all I32, 1-d), and a
`__metadata__` map of strings: `format` = "specdec-sam-index", `format_version`, `tokenizer_fingerprint`,
`vocab_size`, `eos_id`, `documents`, `tokens`, `states`, `transitions`, `sources` (JSON list of
{path, sha256, size}), `build` (JSON settings), `created`, `specdec_version`.

`save_index` writes to a temporary file in the target directory, fsyncs and renames it into place, so an
interrupted build leaves nothing behind; the metadata records a CRC-32 of the arrays
(`body_crc32`). `load_index` memory-maps the arrays after checking the header
(names, dtypes, shapes, offsets, file length, metadata) and the arrays' invariants that drafting relies on
(every id in range, suffix links to strictly shorter states, so no walk can loop or index out of bounds),
so a truncated, corrupt or foreign file is a one-line `SpecdecError` naming the file. Values that pass
those checks but are still wrong can only produce bad drafts, which verification rejects; `verify_index`
(`specdec build-index --verify`) also checks every byte against the checksum. The arrays may be stored in
any order (another safetensors writer may reorder them). `read_index_info` reads the header only. Nothing
is pickled.
This module does not build automata (automaton.py) and does not tokenise (corpus.py).
"""

from __future__ import annotations

import json
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from .. import __version__
from ..errors import SpecdecError
from ..files import atomic_file, check_regular
from .automaton import StaticAutomaton

FORMAT = "specdec-sam-index"
FORMAT_VERSION = 1
ARRAY_ORDER = ("text", "link", "length", "min_endpos", "count", "trans_offsets", "trans_tokens", "trans_targets")
INT_FIELDS = ("format_version", "vocab_size", "eos_id", "documents", "tokens", "states", "transitions")
JSON_FIELDS = ("sources", "build")
MAX_HEADER_BYTES = 64 * 1024 * 1024  # the sources list of a huge corpus stays far below this

PathLike = Union[str, os.PathLike]


@dataclass
class SamIndex:
    """A loaded index: the automaton (arrays memory-mapped) and its metadata."""

    path: str
    automaton: StaticAutomaton
    metadata: dict[str, Any]

    @property
    def fingerprint(self) -> str:
        return self.metadata["tokenizer_fingerprint"]

    @property
    def eos_id(self) -> int:
        return self.metadata["eos_id"]

    @property
    def vocab_size(self) -> int:
        return self.metadata["vocab_size"]


# ---------------------------------------------------------------------------------------------- writing


def _encode_metadata(metadata: dict[str, Any]) -> dict[str, str]:
    encoded = {}
    for key, value in metadata.items():
        if key in JSON_FIELDS:
            encoded[key] = json.dumps(value, ensure_ascii=False, sort_keys=True)
        else:
            encoded[key] = str(value)
    return encoded


def save_index(path: PathLike, automaton: StaticAutomaton, metadata: dict[str, Any]) -> int:
    """Write `automaton` and `metadata` atomically to `path`; returns the file size in bytes.

    `metadata` must hold `tokenizer_fingerprint`, `vocab_size` and `eos_id`; format, version, counts and
    the creation time are filled in here.
    """
    arrays = automaton.arrays()
    full_metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "documents": 0,
        "sources": [],
        "build": {},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "specdec_version": __version__,
        **metadata,
        "tokens": len(arrays["text"]),
        "states": automaton.num_states,
        "transitions": automaton.num_transitions,
    }
    full_metadata["body_crc32"] = body_checksum(np.ascontiguousarray(arrays[name], dtype="<i4")
                                                for name in ARRAY_ORDER)
    header: dict[str, Any] = {"__metadata__": _encode_metadata(full_metadata)}
    offset = 0
    for name in ARRAY_ORDER:
        nbytes = len(arrays[name]) * 4
        header[name] = {"dtype": "I32", "shape": [len(arrays[name])], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header_bytes = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # keeps the data 8-byte aligned, as safetensors does

    with atomic_file(os.fspath(path)) as temporary, open(temporary, "wb") as handle:
        handle.write(len(header_bytes).to_bytes(8, "little"))
        handle.write(header_bytes)
        for name in ARRAY_ORDER:
            data = np.ascontiguousarray(arrays[name], dtype="<i4")
            data.tofile(handle)
    return 8 + len(header_bytes) + offset


# ---------------------------------------------------------------------------------------------- reading


def _bad(path: PathLike, why: str) -> SpecdecError:
    return SpecdecError(f"{path}: {why}")


def _read_header(path: PathLike) -> tuple[dict[str, Any], dict[str, Any], int, int]:
    """Parse and check the header: (metadata, tensor entries, data start, file size)."""
    if os.path.exists(path):
        check_regular(Path(path))  # a FIFO or a device would block the read, or never end
    try:
        file_size = os.path.getsize(path)
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise _bad(path, "not a specdec index (file too short)")
            header_length = int.from_bytes(prefix, "little")
            if header_length > min(MAX_HEADER_BYTES, file_size - 8):
                raise _bad(path, "not a specdec index (no safetensors header; truncated or another format)")
            raw = handle.read(header_length)
    except FileNotFoundError:
        raise SpecdecError(f"{path}: index file not found") from None
    except IsADirectoryError:
        raise SpecdecError(f"{path}: is a directory, not an index file") from None
    except OSError as exc:
        raise SpecdecError(f"{path}: cannot read the index ({exc.strerror or exc})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _bad(path, "not a specdec index (corrupt or foreign header)") from None
    if not isinstance(header, dict):
        raise _bad(path, "not a specdec index (corrupt or foreign header)")
    raw_metadata = header.pop("__metadata__", None)
    if not isinstance(raw_metadata, dict) or raw_metadata.get("format") != FORMAT:
        raise _bad(path, f"not a specdec suffix-automaton index (no format {FORMAT!r} in its metadata)")
    metadata = _decode_metadata(path, raw_metadata)
    if metadata["format_version"] != FORMAT_VERSION:
        raise _bad(
            path,
            f"index format version {metadata['format_version']}, this specdec reads version {FORMAT_VERSION}; "
            "rebuild it with `specdec build-index`",
        )
    return metadata, header, 8 + header_length, file_size


def _decode_metadata(path: PathLike, raw: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    required = ("format_version", "tokenizer_fingerprint", "vocab_size", "eos_id", "tokens", "states", "transitions")
    for key in required:
        if key not in raw:
            raise _bad(path, f"corrupt index metadata (no {key!r})")
    for key, value in raw.items():
        if not isinstance(value, str):
            raise _bad(path, f"corrupt index metadata ({key!r} is not a string)")
        try:
            if key in INT_FIELDS:
                metadata[key] = int(value)
            elif key in JSON_FIELDS:
                metadata[key] = json.loads(value)
            else:
                metadata[key] = value
        except ValueError:
            raise _bad(path, f"corrupt index metadata ({key!r} = {value[:40]!r})") from None
    return metadata


def _check_layout(path: PathLike, metadata: dict[str, Any], entries: dict[str, Any], data_bytes: int) -> None:
    """Names, dtypes, shapes and offsets agree with each other, the metadata and the file length."""
    if set(entries) != set(ARRAY_ORDER):
        missing = sorted(set(ARRAY_ORDER) - set(entries))
        raise _bad(path, f"not a specdec index (arrays {', '.join(missing) or 'unexpected'} missing)")
    states, transitions, tokens = metadata["states"], metadata["transitions"], metadata["tokens"]
    expected = {
        "text": tokens,
        "link": states,
        "length": states,
        "min_endpos": states,
        "count": states,
        "trans_offsets": states + 1,
        "trans_tokens": transitions,
        "trans_targets": transitions,
    }
    for name in ARRAY_ORDER:
        entry = entries[name]
        if not isinstance(entry, dict) or entry.get("dtype") != "I32":
            raise _bad(path, f"corrupt index (array {name!r} is not int32)")
        if entry.get("shape") != [expected[name]]:
            raise _bad(path,
                       f"corrupt index (array {name!r} has shape {entry.get('shape')}, expected [{expected[name]}])")
        offsets = entry.get("data_offsets")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or offsets[1] - offsets[0] != 4 * expected[name]):
            raise _bad(path, f"corrupt index (array {name!r} at offsets {offsets})")
    # the arrays may come in any order (safetensors writers differ), but they must tile the data exactly
    position = 0
    for name in sorted(ARRAY_ORDER, key=lambda name: entries[name]["data_offsets"][0]):
        begin, end = entries[name]["data_offsets"]
        if begin != position:
            raise _bad(path, f"corrupt index (array {name!r} at offsets {[begin, end]})")
        position = end
    if position != data_bytes:
        how = "truncated" if position > data_bytes else "has trailing bytes"
        raise _bad(path, f"corrupt index (file {how}: {data_bytes} data bytes, header says {position})")
    if states < 1:
        raise _bad(path, "corrupt index (no states)")


def _check_arrays(path: PathLike, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> None:
    """The invariants the match walk and the drafts rely on, checked with whole-array operations (cheap at every
    load: docs/measurements.md): ids in range, transition offsets non-decreasing, suffix links to shorter states."""
    tokens, states, vocab = metadata["tokens"], metadata["states"], max(metadata["vocab_size"], metadata["eos_id"] + 1)
    text, link, length, min_endpos = arrays["text"], arrays["link"], arrays["length"], arrays["min_endpos"]
    offsets, trans_tokens, trans_targets = arrays["trans_offsets"], arrays["trans_tokens"], arrays["trans_targets"]

    def within(values: np.ndarray, low: int, high: int) -> bool:  # low <= every value < high
        return values.size == 0 or (int(values.min()) >= low and int(values.max()) < high)

    problems = [
        ("token ids", within(text, 0, vocab) and within(trans_tokens, 0, vocab)),
        ("root", int(link[0]) == -1 and int(length[0]) == 0),
        ("suffix links", within(link[1:], 0, states)),
        ("lengths", within(length[1:], 1, tokens + 1)),
        ("end positions", within(min_endpos[1:], 0, tokens)),
        ("transition offsets", int(offsets[0]) == 0 and int(offsets[-1]) == metadata["transitions"]
         and bool(np.all(offsets[1:] >= offsets[:-1]))),
        ("transition targets", within(trans_targets, 1, states)),
    ]
    for what, ok in problems:
        if not ok:
            raise _bad(path, f"corrupt index ({what} out of range)")
    # every suffix link leads to a strictly shorter state, so following links always reaches the root;
    # a match of `length` tokens ending at `min_endpos` starts inside the text
    links_shorter = bool(np.all(length[link[1:]] < length[1:]))
    ends_inside = bool(np.all(min_endpos[1:] >= length[1:] - 1))
    if states > 1 and not (links_shorter and ends_inside):
        raise _bad(path, "corrupt index (inconsistent suffix links or lengths)")


def body_checksum(chunks: Any) -> str:
    """CRC-32 of the arrays' bytes, taken in ARRAY_ORDER whatever their order in the file, as 8 hex digits."""
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(memoryview(chunk).cast("B"), crc)
    return f"{crc:08x}"


def verify_index(path: PathLike) -> dict[str, Any]:
    """Every check `load_index` makes, plus the checksum of every byte of the arrays (a bit flipped anywhere
    is found; it reads every byte, so it takes time in proportion to the file: docs/measurements.md). Returns the
    index's info with "checksum": "ok" or "absent" (older files)."""
    index = load_index(path)
    info = read_index_info(path)
    stored = index.metadata.get("body_crc32")
    if stored is None:
        return {**info, "checksum": "absent"}
    metadata, entries, data_start, file_size = _read_header(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    step = 64 * 1024 * 1024

    def chunks():  # every array's bytes, in the canonical order, 64 MB at a time
        for name in ARRAY_ORDER:
            begin, end = (data_start + offset for offset in entries[name]["data_offsets"])
            for offset in range(begin, end, step):
                yield mapped[offset : min(offset + step, end)]

    actual = body_checksum(chunks())
    if actual != stored:
        raise _bad(path, f"corrupt index (checksum {actual}, the file records {stored})")
    return {**info, "checksum": "ok"}


def is_index_file(path: PathLike) -> bool:
    """Whether `path` is a file specdec wrote as an index (its header names the format; any version, even a
    damaged body): such a file may be replaced by a new build, any other file may not without --force."""
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                return False
            header_length = int.from_bytes(prefix, "little")
            if header_length > MAX_HEADER_BYTES:
                return False
            header = json.loads(handle.read(header_length).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return isinstance(metadata, dict) and metadata.get("format") == FORMAT


def read_index_info(path: PathLike) -> dict[str, Any]:
    """The index's metadata plus size statistics, from the header alone (no arrays are read)."""
    metadata, entries, data_start, file_size = _read_header(path)
    _check_layout(path, metadata, entries, file_size - data_start)
    tokens = metadata["tokens"]
    return {
        **metadata,
        "path": str(path),
        "file_bytes": file_size,
        "bytes_per_token": file_size / tokens if tokens else 0.0,
        "states_per_token": metadata["states"] / tokens if tokens else 0.0,
        "transitions_per_token": metadata["transitions"] / tokens if tokens else 0.0,
    }


def load_index(path: PathLike) -> SamIndex:
    """Open an index: check the header, then memory-map the arrays (nothing is copied)."""
    metadata, entries, data_start, file_size = _read_header(path)
    _check_layout(path, metadata, entries, file_size - data_start)
    # Plain ndarray views of the mapping (the map stays open through their base): indexing the np.memmap
    # subclass is slower (docs/measurements.md), which the per-token match walk would pay.
    mapped = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
    arrays = {}
    for name in ARRAY_ORDER:
        begin, end = entries[name]["data_offsets"]
        arrays[name] = mapped[data_start + begin : data_start + end].view("<i4")
    _check_arrays(path, arrays, metadata)
    eos_id = metadata["eos_id"]
    automaton = StaticAutomaton(separators=(eos_id,) if eos_id >= 0 else (), **arrays)
    return SamIndex(path=str(path), automaton=automaton, metadata=metadata)
