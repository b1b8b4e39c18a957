"""A GGUF file opened in place: its header parsed, its tensors located in a read-only mapping, every byte checked.

Layout (GGUF v2/v3, little-endian; docs/algorithms.md section 11): magic `GGUF`, version, tensor count, metadata
count; the metadata as key, type, value; one record per tensor (name, dims fastest-first, ggml type, offset); padding
to `general.alignment`; then the data, each tensor at data start + its offset. `open_gguf` reads the header into
plain Python values (strings decoded, arrays as lists) and refuses, in one line naming what is wrong, anything that
is not such a file: not a regular file (a FIFO or a device is never read), a foreign magic, another version, a
header or metadata cut short, an unknown value or tensor type, a dimension that does not fill whole blocks, a
tensor whose data ends past the end of the file, two tensors of one name, a tensor whose type does not match the
bytes it spans (its data runs to the next tensor's, less the alignment's padding: a Q4_1 matrix relabelled Q4_0 is
refused, not read as garbage). Every count and length is checked against what the rest of the file can hold before
anything is allocated for it, and the metadata's arrays are capped in all (MAX_ARRAY_ITEMS, MAX_STRINGS), so a
hostile header costs memory and time in proportion to the file, never to a number it declares; arrays of numbers
longer than SMALL_ARRAY stay numpy arrays (no Python list of millions of ints). Nothing is dequantised here, and
nothing knows what a family needs (gguf_layout.py): `GGUFFile.raw(name)` is a tensor's bytes as a numpy view of
the mapping, no copy; pages are read from disk only when touched, and `release` hands them back.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ...errors import SpecdecError
from ...files import check_regular

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_COUNT = 1 << 24  # tensors, keys or array items: far beyond any model, far below what exhausts memory
# the metadata's arrays in all (a per-array cap does not bound the whole): a 262k-token vocabulary with its scores,
# types and 500k merges is about 1.3M items, 0.76M of them strings (Qwen2.5's file: 0.46M); 2^20 strings are
# parsed in about a second on a 2-core machine
MAX_ARRAY_ITEMS = 1 << 22
MAX_STRINGS = 1 << 20
MAX_STRING_BYTES = 1 << 24  # one metadata string (a chat template is kilobytes)
MAX_TEXT_BYTES = 1 << 26  # the metadata's strings in all (a 262k-token vocabulary and its merges: under 10 MB)
SMALL_ARRAY = 4096  # arrays of numbers up to this long are Python lists; longer ones stay numpy arrays
# the fewest bytes a record can take: a metadata key (name length, type, a one-byte value), a tensor record
# (name length, dimension count, one dimension, type, offset)
MIN_KEY_BYTES, MIN_TENSOR_BYTES = 8 + 4 + 1, 8 + 4 + 8 + 4 + 8
# metadata value types (gguf's GGUFValueType): struct format of each scalar
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's record: `shape` as torch orders it (slowest first: [rows, columns] for a matrix)."""

    name: str
    shape: tuple[int, ...]
    type_name: str  # ggml's name: "Q4_K", "F32", ...
    type_id: int
    start: int  # absolute byte offset in the file
    nbytes: int

    @property
    def elements(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


class GGUFFile:
    """A GGUF's metadata and tensor records, with the file mapped read-only (see the module docstring)."""

    def __init__(self, path: Path, version: int, metadata: dict[str, Any], tensors: dict[str, TensorInfo],
                 size: int, mapping: mmap.mmap):
        self.path, self.version, self.metadata, self.tensors, self.size = path, version, metadata, tensors, size
        self._mapping = mapping
        self._bytes = np.frombuffer(mapping, dtype=np.uint8)  # [size], a view of the mapping

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "") or "")

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, uint8 [nbytes], a view of the mapping (read-only)."""
        info = self.tensors[name]
        return self._bytes[info.start : info.start + info.nbytes]

    def release(self, name: Optional[str] = None) -> None:
        """Let the kernel drop the tensor's pages (without a name, the whole file's) from this process; they are
        read again, from the page cache or the disk, if touched: repacking a file layer by layer then never holds
        the whole file in memory."""
        info = self.tensors[name] if name is not None else None
        drop_pages(self._mapping, 0 if info is None else info.start, self.size if info is None else info.nbytes)

    def type_names(self) -> dict[str, int]:
        """{ggml type: tensors of it}, most frequent first."""
        counts: dict[str, int] = {}
        for info in self.tensors.values():
            counts[info.type_name] = counts.get(info.type_name, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


class _Cursor:
    """Reads little-endian values from the mapping, refusing to run past its end; counts the metadata's array items
    and strings against the caps."""

    def __init__(self, data: mmap.mmap, size: int):
        self.data, self.size, self.at = data, size, 0
        self.items, self.strings, self.text = 0, 0, 0

    @property
    def left(self) -> int:
        return self.size - self.at

    def take(self, count: int, what: str) -> int:
        start = self.at
        if count < 0 or start + count > self.size:
            raise _Truncated(what)
        self.at = start + count
        return start

    def scalar(self, fmt: str, what: str) -> Any:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.data, start)[0]

    def string(self, what: str) -> str:
        length = self.scalar("<Q", what)
        if length > MAX_STRING_BYTES and length <= self.left:
            raise SpecdecError(f"metadata {what} holds a string of {length:,} bytes (at most {MAX_STRING_BYTES:,})")
        start = self.take(length, what)
        self._count_text(length, what)
        return self.data[start : start + length].decode("utf-8", "replace")

    def value(self, type_id: int, what: str) -> Any:
        if type_id in SCALARS:
            return self.scalar(SCALARS[type_id], what)
        if type_id == STRING:
            return self.string(what)
        if type_id == ARRAY:
            item_type, count = self.scalar("<I", what), self.scalar("<Q", what)
            width = struct.calcsize(SCALARS[item_type]) if item_type in SCALARS else 8 if item_type == STRING else 0
            if not width:
                raise SpecdecError(f"metadata {what} holds arrays of unknown type {item_type}")
            if count * width > self.left:  # before anything is allocated for it (a hostile count, or a cut file)
                raise _Truncated(f"{what}: {count:,} items claimed, more than the {self.left:,} bytes left can hold")
            self.items += count
            if count > MAX_COUNT or self.items > MAX_ARRAY_ITEMS:
                raise SpecdecError(f"metadata {what} claims {count:,} items; the metadata's arrays hold at most "
                                   f"{MAX_ARRAY_ITEMS:,} in all")
            if item_type in SCALARS:  # one read for the whole array
                start = self.take(width * count, what)
                values = np.frombuffer(self.data, dtype=np.dtype(SCALARS[item_type]), count=count, offset=start)
                if count <= SMALL_ARRAY:
                    return values.tolist()
                copied = values.copy()  # (a copy: the mapping can then be closed whatever holds the metadata)
                copied.flags.writeable = False
                return copied
            self.strings += count
            if self.strings > MAX_STRINGS:
                raise SpecdecError(f"metadata {what} claims {count:,} strings; the metadata holds at most "
                                   f"{MAX_STRINGS:,} in all")
            return self.strings_array(count, what)
        raise SpecdecError(f"metadata {what} has an unknown value type {type_id}")

    def _count_text(self, length: int, what: str) -> None:
        self.text += length
        if self.text > MAX_TEXT_BYTES:
            raise SpecdecError(f"metadata {what}: the metadata's strings hold more than {MAX_TEXT_BYTES:,} bytes in "
                               "all")

    def strings_array(self, count: int, what: str) -> list[str]:
        data, size, unpack = self.data, self.size, _LENGTH.unpack_from
        at, found = self.at, []
        for _ in range(count):
            if at + 8 > size:
                raise _Truncated(what)
            length = unpack(data, at)[0]
            at += 8
            if length > size - at:
                raise _Truncated(what)
            self.text += length
            if self.text > MAX_TEXT_BYTES:
                self._count_text(0, what)
            found.append(data[at : at + length].decode("utf-8", "replace"))
            at += length
        self.at = at
        return found


_LENGTH = struct.Struct("<Q")


class _Truncated(Exception):
    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def ggml_types() -> dict[int, tuple[str, int, int]]:
    """{ggml type id: (name, weights per block, bytes per block)}, as the gguf package knows them."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return {int(kind): (kind.name, *GGML_QUANT_SIZES[kind]) for kind in GGMLQuantizationType
            if kind in GGML_QUANT_SIZES}


def open_gguf(path: Path) -> GGUFFile:
    """Parse and check a GGUF file's header and tensor records (SpecdecError naming the fault, prefixed by the
    path); the file stays mapped while the returned object lives."""
    path = Path(path)
    check_regular(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < 24:
                raise SpecdecError(f"{path}: truncated: {size} bytes, shorter than a GGUF header")
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise SpecdecError(f"{path}: cannot read this file ({exc.strerror or exc})") from exc
    try:
        return _parse(path, mapping, size)
    except _Truncated as cut:
        _close(mapping)
        raise SpecdecError(f"{path}: truncated: the header ends past the end of the file (in {cut.what})") from None
    except SpecdecError as exc:
        _close(mapping)
        raise SpecdecError(f"{path}: {exc}") from None


def drop_pages(mapping: mmap.mmap, start: int, nbytes: int) -> None:
    """madvise(DONTNEED) over the pages holding bytes start..start+nbytes of a mapping of a file that nothing
    writes: the process lets them go (its RSS falls) and reads them again from the file when touched."""
    page = mmap.PAGESIZE
    first = start // page * page
    length = min(start + nbytes, len(mapping)) - first
    if length > 0 and hasattr(mapping, "madvise"):
        try:
            mapping.madvise(mmap.MADV_DONTNEED, first, length)
        except (OSError, ValueError):  # pragma: no cover - an old kernel: the pages stay until unmapped
            pass


def _close(mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:  # pragma: no cover - a view still held: the mapping goes with it
        pass


def _parse(path: Path, mapping: mmap.mmap, size: int) -> GGUFFile:
    if mapping[:4] != MAGIC:
        raise SpecdecError(f"not a GGUF file (it starts with {bytes(mapping[:4])!r}, not {MAGIC!r})")
    cursor = _Cursor(mapping, size)
    cursor.take(4, "magic")
    version = cursor.scalar("<I", "version")
    if version not in VERSIONS:
        swapped = struct.unpack("<I", struct.pack(">I", version))[0]
        hint = " (a big-endian file)" if swapped in VERSIONS else ""
        raise SpecdecError(f"GGUF version {version}{hint} is not supported (versions {VERSIONS[0]}-{VERSIONS[-1]})")
    tensor_count, key_count = cursor.scalar("<Q", "tensor count"), cursor.scalar("<Q", "metadata count")
    if tensor_count > MAX_COUNT or key_count > MAX_COUNT:
        raise SpecdecError(f"its header claims {tensor_count:,} tensors and {key_count:,} metadata keys")
    if tensor_count * MIN_TENSOR_BYTES + key_count * MIN_KEY_BYTES > cursor.left:  # before any is read
        raise _Truncated(f"{tensor_count:,} tensor records and {key_count:,} metadata keys, more than the file's "
                         f"{size:,} bytes can hold")
    metadata: dict[str, Any] = {}
    for index in range(key_count):
        key = cursor.string(f"metadata key {index}")
        metadata[key] = cursor.value(cursor.scalar("<I", key), key)
    types = ggml_types()
    records = []
    for index in range(tensor_count):
        name = cursor.string(f"tensor record {index}")
        dims_count = cursor.scalar("<I", name)
        if not 1 <= dims_count <= 4:
            raise SpecdecError(f"tensor {name} has {dims_count} dimensions")
        dims = [cursor.scalar("<Q", name) for _ in range(dims_count)]
        type_id, offset = cursor.scalar("<I", name), cursor.scalar("<Q", name)
        records.append((name, dims, type_id, offset))
        if tensor_count - index - 1 > cursor.left // MIN_TENSOR_BYTES:  # (long names: the rest cannot fit)
            raise _Truncated(f"tensor record {index + 1}")
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise SpecdecError(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-cursor.at // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, dims, type_id, offset in records:
        if type_id not in types:
            raise SpecdecError(f"tensor {name} has ggml type {type_id}, which specdec does not know")
        type_name, per_block, block_bytes = types[type_id]
        if dims[0] % per_block:
            raise SpecdecError(f"tensor {name} is {type_name} with rows of {dims[0]}, not whole blocks of "
                               f"{per_block}")
        if offset % alignment:
            raise SpecdecError(f"tensor {name} is not aligned to {alignment} bytes")
        elements = 1
        for dim in dims:
            elements *= dim
        nbytes = elements // per_block * block_bytes
        start = data_start + offset
        if start + nbytes > size:
            raise SpecdecError(f"truncated: tensor {name} ends past the end of the file "
                               f"(at byte {start + nbytes:,} of {size:,})")
        if name in tensors:
            raise SpecdecError(f"two tensors are named {name}")
        tensors[name] = TensorInfo(name, tuple(int(dim) for dim in reversed(dims)), type_name, type_id, start, nbytes)
    _check_extents(tensors, size, alignment)
    return GGUFFile(path, version, metadata, tensors, size, mapping)


def _check_extents(tensors: dict[str, TensorInfo], size: int, alignment: int) -> None:
    """Each tensor's data, as long as its type and shape make it, must run to the next tensor's start (or the end
    of the file) but for the alignment's padding: a type that does not match the bytes the tensor spans (a Q4_1
    matrix relabelled Q4_0 spans 20 bytes a block, not 18) is refused, as are tensors that overlap."""
    ordered = sorted(tensors.values(), key=lambda info: (info.start, info.name))
    for info, after in zip(ordered, [*ordered[1:], None]):
        end = info.start + info.nbytes
        limit = after.start if after is not None else size
        what = f"tensor {after.name}'s start" if after is not None else "the end of the file"
        if end > limit:
            raise SpecdecError(f"tensor {info.name} ({info.type_name}, {_shape_text(info.shape)}: {info.nbytes:,} "
                               f"bytes) runs past {what}; its type or shape does not match its data")
        if limit - end >= alignment:
            raise SpecdecError(f"tensor {info.name} ({info.type_name}, {_shape_text(info.shape)}: {info.nbytes:,} "
                               f"bytes) spans {limit - info.start:,} bytes up to {what}; its type or shape does not "
                               f"match its data")


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(size) for size in shape) + "]"


def file_identity(path: Path) -> str:
    """'resolved path|size|modification time': what a cache made from the file is keyed by (a file rewritten in
    place gets a new key)."""
    stat = path.stat()
    return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
