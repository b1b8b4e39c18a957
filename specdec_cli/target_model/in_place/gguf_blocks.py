"""A GGUF's matrices repacked once, layer by layer, into the kernels' records, in a cache file that is then mapped.

The kernels read records of 16 output rows (kernels.pack_records), not ggml's row-major blocks, so a GGUF's
matrices cannot be multiplied where they lie. They are repacked once per file (`write_blocks`): each matrix is
decoded a slice of rows at a time (gguf_decode.py: every weight exactly as ggml defines it), packed and
appended to the cache file, and its pages of the GGUF are released (gguf_file.GGUFFile.release), so memory never
holds more than one slice; nothing is dequantised to a dense model. A type the kernels do not take but the gguf
package dequantises (IQ2/IQ3/IQ1, TQ*) becomes float32 rows. llama's interleaved q/k rows are put back in
transformers' order on the way (families.Family.permuted_qk).

Repacking at every load instead was measured and rejected (docs/kernels.md): 2.3 s for a 0.5B file and
29 s for an 8B-shaped one on 2 cores, against 0.1-3 s to map the cache. The cache is a safetensors file (uint8
[groups, record bytes] per matrix, its kind and origin in the metadata, `BLOCKS_FORMAT` versioned), written as one
stream from a header computed up front, so it loads in any safetensors reader; `map_blocks` maps it copy-on-write
and hands out views: its pages are shared with the page cache, read when first touched and dropped under memory
pressure. The matrices of one layer that read the same input (q, k, v; gate, up) are stored side by side, so the
native decoder fuses them as views of one range (native._Projections) without copying them. This file does not
choose when to repack (gguf_model.py does) nor run anything.
"""

from __future__ import annotations

import json
import mmap
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from ... import kernels
from ...errors import SpecdecError
from ..gguf.gguf_decode import decode_gguf_blocks, permuted_rows
from ..gguf.gguf_file import GGUFFile
from ..gguf.gguf_layout import Expected

BLOCKS_FORMAT = 3  # bump when the cache's layout or a repacking rule changes (2: packed kinds; 3: IQ4_NL, IQ4_XS)
SLICE_WEIGHTS = 1 << 24  # weights decoded at once (a slice of rows): bounds the repacking's memory
# ggml type -> the kernels' kind it is repacked into (gguf_decode.DECODERS); other dequantisable types: f32
KIND_OF_TYPE = {**kernels.KIND_OF_GGUF_TYPE,
                "Q3_K": kernels.KIND_Q4S, "Q2_K": kernels.KIND_Q2S, "F32": kernels.KIND_F32, "F16": kernels.KIND_F16,
                "BF16": kernels.KIND_BF16}

Progress = Callable[[int, int], None]  # (bytes written, bytes in all)


@dataclass(frozen=True)
class PlannedMatrix:
    """One matrix's place in the cache."""

    module: str  # transformers' module name: the cache's tensor name is module + ".records"
    gguf_name: str
    kind: int
    out_features: int
    in_features: int
    origin: str  # the GGUF type it came from
    heads: int  # q/k rows interleaved per head in the file (0: in order)
    start: int  # offset in the data section
    nbytes: int


def kind_for(type_name: str) -> int:
    return KIND_OF_TYPE.get(type_name, kernels.KIND_F32)


def plan_matrices(gguf: GGUFFile, expected: list[Expected], tied: bool) -> list[PlannedMatrix]:
    """The cache's matrices in order, with their sizes (the output head reads token_embd when tied)."""
    planned, offset = [], 0
    matrices = [item for item in expected if item.matrix]
    if tied:
        embedding = next(item for item in expected if item.gguf_name == "token_embd.weight")
        matrices.append(Expected(embedding.gguf_name, embedding.shape, "lm_head", True))
    for item in matrices:
        info = gguf.tensors[item.gguf_name]
        kind = kind_for(info.type_name)
        out_features, in_features = item.shape
        nbytes = kernels.groups(out_features) * kernels.record_bytes(kind, in_features)
        planned.append(PlannedMatrix(item.module, item.gguf_name, kind, out_features, in_features, info.type_name,
                                     item.heads, offset, nbytes))
        offset += nbytes
    return planned


def cache_bytes(planned: list[PlannedMatrix]) -> int:
    return sum(matrix.nbytes for matrix in planned)


def _header(planned: list[PlannedMatrix], source: str) -> bytes:
    """The safetensors header for the planned records, padded to 8 bytes (the data follows it)."""
    entries: dict[str, Any] = {}
    layers = {}
    for matrix in planned:
        shape = [kernels.groups(matrix.out_features), kernels.record_bytes(matrix.kind, matrix.in_features)]
        entries[f"{matrix.module}.records"] = {"dtype": "U8", "shape": shape,
                                               "data_offsets": [matrix.start, matrix.start + matrix.nbytes]}
        layers[matrix.module] = {"kind": matrix.kind, "out": matrix.out_features, "in": matrix.in_features,
                                 "origin": matrix.origin}
    entries["__metadata__"] = {"kind": "specdec-gguf-blocks", "format": str(BLOCKS_FORMAT), "source": source,
                               "layers": json.dumps(layers)}
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _records(gguf: GGUFFile, matrix: PlannedMatrix, first: int, stop: int) -> torch.Tensor:
    """Records of output rows first..stop-1 (a multiple of 16 rows, but the last slice), in transformers' row
    order (llama.cpp's interleaved q/k rotary halves put back: only this slice's rows are gathered)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rows_raw = gguf.raw(matrix.gguf_name).reshape(matrix.out_features, -1)  # [out, bytes per row], the mapping
    raw = rows_raw[permuted_rows(matrix.out_features, matrix.heads)[first:stop]] if matrix.heads else \
        rows_raw[first:stop]  # [rows, bytes per row]
    rows = stop - first
    if matrix.origin in KIND_OF_TYPE:
        try:
            weights = decode_gguf_blocks(matrix.origin, raw, rows, matrix.in_features)
        except ArithmeticError:  # a NaN or infinite scale: the matrix can only answer garbage
            raise SpecdecError(f"{gguf.path}: tensor {matrix.gguf_name} ({matrix.origin}) has a NaN or infinite "
                               "scale; the file is damaged") from None
        if weights is None:  # pragma: no cover - checked by gguf_layout.native_reason
            raise SpecdecError(f"{gguf.path}: {matrix.gguf_name} cannot be held in the kernels' blocks")
        return weights.records
    dense = dequantize(raw, GGMLQuantizationType[matrix.origin]).astype(np.float32)  # [rows, in]
    return kernels.pack_records(kernels.KIND_F32, torch.from_numpy(dense.reshape(rows, matrix.in_features)))


def _row_slices(matrix: PlannedMatrix) -> list[tuple[int, int]]:
    """The matrix's slices of output rows (first, stop), as they are repacked and hashed: whole records but the
    last, at most SLICE_WEIGHTS weights each."""
    step = max(kernels.GROUP, SLICE_WEIGHTS // max(1, matrix.in_features) // kernels.GROUP * kernels.GROUP)
    return [(first, min(first + step, matrix.out_features)) for first in range(0, matrix.out_features, step)]


def _matrix_digest(slice_digests: list[bytes]) -> str:
    """A matrix's proof: the SHA-256 of its slices' SHA-256s in order (slices are hashed side by side)."""
    import hashlib

    return hashlib.sha256(b"".join(slice_digests)).hexdigest()


def write_blocks(gguf: GGUFFile, planned: list[PlannedMatrix], path: Path, on_progress: Optional[Progress] = None,
                 workers: int = 1, stop: Optional[threading.Event] = None) -> dict[str, str]:
    """Repack every planned matrix into `path` (a new file), slice by slice (see the module docstring); `workers`
    threads decode and hash slices side by side (numpy, torch and hashlib release the GIL), written in order, a
    few slices ahead at most. Returns each matrix's proof ({module: hex digest}, `_matrix_digest`;
    `verify_blocks` checks a mapping against them) and, under "", the file header's SHA-256. `stop`, once set,
    makes it raise InterruptedError at the next slice (the caller removes the file)."""
    import hashlib
    from concurrent.futures import Future, ThreadPoolExecutor

    total = cache_bytes(planned)
    header = _header(planned, f"{gguf.path}")
    slices = []  # (matrix, first row, stop row, the matrix's last slice)
    for matrix in planned:
        ranges = _row_slices(matrix)
        slices += [(matrix, first, stop_row, index == len(ranges) - 1)
                   for index, (first, stop_row) in enumerate(ranges)]

    def job(matrix: PlannedMatrix, first: int, stop_row: int) -> tuple[torch.Tensor, bytes]:
        records = _records(gguf, matrix, first, stop_row)  # uint8 [groups, record bytes], contiguous
        return records, hashlib.sha256(records.numpy().data).digest()

    written = 0
    digests = {"": hashlib.sha256(header).hexdigest()}
    slice_digests: dict[str, list[bytes]] = {matrix.module: [] for matrix in planned}
    with open(path, "wb") as handle, ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        handle.write(header)
        pending: list[tuple[Future, PlannedMatrix, bool]] = []
        ahead = 2 * max(1, workers)
        for index in range(len(slices) + ahead):
            if stop is not None and stop.is_set():
                for future, _, _ in pending:
                    future.cancel()
                raise InterruptedError("repacking stopped")
            if index < len(slices):
                matrix, first, stop_row, last = slices[index]
                pending.append((pool.submit(job, matrix, first, stop_row), matrix, last))
            if len(pending) > ahead or (index >= len(slices) and pending):
                future, done_matrix, done_last = pending.pop(0)
                records, digest = future.result()
                handle.write(records.numpy().data)  # (the buffer itself, no copy)
                slice_digests[done_matrix.module].append(digest)
                written += records.numel()
                if done_last:
                    gguf.release(done_matrix.gguf_name)
                    digests[done_matrix.module] = _matrix_digest(slice_digests.pop(done_matrix.module))
                if on_progress is not None:
                    on_progress(written, total)
        handle.flush()  # no fsync, here or when its folder is published (gguf_model): the system writes it back
        # meanwhile; every load proves the records (verify_blocks), so a torn cache is made again, never used
    if path.stat().st_size != written + len(header):  # pragma: no cover - a sizing mistake
        raise AssertionError("the blocks cache's size disagrees with its header")
    return digests


def verify_blocks(path: Path, planned: list[PlannedMatrix], mapped: dict[str, "MappedMatrix"],
                  digests: dict[str, str], workers: int = 1) -> Optional[str]:
    """None when the mapped records and the file's header hash to what `write_blocks` recorded; else what does not
    (the first in order), as a phrase. Slices are hashed side by side on `workers` threads (hashlib releases the
    GIL): it reads every page of the mapping once, as the first forward would."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    with open(path, "rb") as handle:
        header_size = struct.unpack("<Q", handle.read(8))[0]
        handle.seek(0)
        header = handle.read(8 + header_size)
    if hashlib.sha256(header).hexdigest() != digests.get(""):
        return "its header does not hash to what was written"
    if set(mapped) != set(digests) - {""} or set(mapped) != {matrix.module for matrix in planned}:
        return "it holds other matrices than were written"
    group = kernels.GROUP
    jobs = [(matrix.module, first // group, -(-stop // group)) for matrix in planned
            for first, stop in _row_slices(matrix)]

    def digest(job: tuple[str, int, int]) -> bytes:
        module, start, end = job
        return hashlib.sha256(mapped[module].records[start:end].numpy().data).digest()

    found: dict[str, list[bytes]] = {matrix.module: [] for matrix in planned}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for (module, _, _), slice_digest in zip(jobs, pool.map(digest, jobs)):
            found[module].append(slice_digest)
    for matrix in planned:
        if _matrix_digest(found[matrix.module]) != digests[matrix.module]:
            return f"the records of {matrix.module} do not hash to what was written"
    return None


@dataclass(frozen=True)
class MappedMatrix:
    kind: int
    records: torch.Tensor  # uint8 [groups, record bytes], a view of the mapping
    out_features: int
    in_features: int
    origin: str
    mapping: mmap.mmap  # the cache file's, which the records view (gguf_file.drop_pages lets its pages go)


def map_blocks(path: Path) -> Optional[dict[str, MappedMatrix]]:
    """{module name: its records, mapped} from a cache file, or None when it is absent, foreign, of another format
    or cut short (then it is written again)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            header_size = struct.unpack("<Q", handle.read(8))[0]
            if not 0 < header_size <= size - 8:
                return None
            header = json.loads(handle.read(header_size))
        meta = header.pop("__metadata__", {})
        if meta.get("kind") != "specdec-gguf-blocks" or meta.get("format") != str(BLOCKS_FORMAT):
            return None
        layers = json.loads(meta["layers"])
        data_start = 8 + header_size
        end = max((entry["data_offsets"][1] for entry in header.values()), default=0)
        if data_start + end != size:
            return None
        with open(path, "rb") as handle:  # copy-on-write, as torch wants a writable buffer: nothing writes it
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        flat = torch.frombuffer(mapping, dtype=torch.uint8)  # [size]
        mapped = {}
        for module, info in layers.items():
            entry = header[f"{module}.records"]
            start, stop = (data_start + int(offset) for offset in entry["data_offsets"])
            kind, out_features, in_features = int(info["kind"]), int(info["out"]), int(info["in"])
            shape = (kernels.groups(out_features), kernels.record_bytes(kind, in_features))
            if tuple(entry["shape"]) != shape or stop - start != shape[0] * shape[1]:
                return None
            mapped[module] = MappedMatrix(kind, flat[start:stop].view(*shape), out_features, in_features,
                                          str(info["origin"]), mapping)
        return mapped
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
