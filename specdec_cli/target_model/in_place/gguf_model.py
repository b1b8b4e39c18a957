"""A GGUF target loaded in place: no transformers model, no dense copy of the weights, in memory or on disk.

`open_in_place(path)` checks the file (gguf_file.py: the header; gguf_layout.py: every tensor its family needs,
with the shape its metadata implies), then builds a `GGUFModel`:

- config from the metadata (gguf_config.py), tokenizer (with its chat template) from the metadata too, made once
  and kept as tokenizer files beside the blocks: without transformers for llama, qwen2 and qwen3 files with a
  byte-level BPE vocabulary (native_side_files.py), by transformers' converters for the rest;
- the matrices from the blocks cache (gguf_blocks.py): repacked once, layer by layer, then mapped;
- the norms and biases (vectors: kilobytes) read from the file as float32; the token embeddings left in the mapped
  file, each looked-up row dequantised when a forward asks for it (`MappedEmbedding`).

The cache is a folder under $SPECDEC_HOME/models named by the file's path, size and modification time, made in a
temporary folder and renamed into place with a marker written last (`specdec-gguf.json`: the format; the source's
proof, `source_proof`; every matrix's proof over its slices, the SHA-256 of the blocks file's header and of every
side file).
Every load proves the cache before using it: a marker that does not match, a source that changed (even with its
size and time kept), a damaged, missing or foreign file, or records that do not hash to what was written (hashed
until a load has proved them, then known by the blocks file's identity until anything writes to it:
gguf_cache.proved_before): the folder is made again, with one warning line saying why; it is never used. Nothing
is cached for a file that fails a check.

The `GGUFModel`'s modules carry transformers' names (model.layers.N.self_attn.q_proj, ...: block layers, norms,
the family's rotary table), so that the native decoder (native.py), the drafters and the checks read it as they
read a transformers model on block weights; its forward is the native decoder's, the only forward it has
(`generate`, and the bench's `native` and `hf` rows, need a transformers model: models.py says so in one line).
"""

from __future__ import annotations

import functools
import importlib
import json
import shutil
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from ...errors import SpecdecError
from .. import families
from ..gguf.gguf_config import hf_config
from ..gguf.gguf_file import GGUFFile, drop_pages
from ..gguf.gguf_layout import Expected, check_tensors
from ..native.kv_cache import KVCache
from ..native.quant import BlockLinear, BlockWeights
from . import gguf_blocks
from .gguf_cache import (
    BLOCKS_FILE,
    CACHE_FORMAT,
    MARKER,
    cache_fault,
    cache_folder,
    cache_ready,
    proved_before,
    read_marker,
    remember_proved,
    side_files,
    source_proof,
    superseded_folders,
)
from .mapped_embedding import MappedEmbedding
from .native_side_files import write_native_side_files
from .native_tokenizer import load_native_tokenizer
from .stored import (
    ACTIVATIONS,
    STORED_FILE,
    StoredConfig,
    stored_config,
    stored_generation,
    stored_rotary,
    write_stored,
)

StatusCallback = Callable[[str], None]


# -- the modules ---------------------------------------------------------------------------------------------


class _Norm(torch.nn.Module):
    """An RMSNorm of the file: `multiplier` is what it multiplies by (native.norm_multiplier), float32 [dim], as
    the file stores it; `weight` is transformers' parameter of the same norm (the multiplier less 1 for a family
    whose norms multiply by 1 + weight), so that the model's state dict reads as transformers' (a student cut
    from the target, distill/)."""

    def __init__(self, multiplier: torch.Tensor, eps: float, plus_one: bool):
        super().__init__()
        self.register_buffer("multiplier", multiplier, persistent=False)
        self.weight = torch.nn.Parameter(multiplier - 1.0 if plus_one else multiplier, requires_grad=False)
        self.variance_epsilon = eps


class _Holder(torch.nn.Module):
    """A named place in the module tree (self_attn, mlp, a layer)."""


class GGUFModel(torch.nn.Module):
    """A family the native decoder computes, on a GGUF's own blocks (see the module docstring)."""

    native_cache = True  # its forward takes a plain KVCache (kv_cache.new_kv_cache)

    def __init__(self, config: Any, generation_config: Any, source: "InPlace"):
        super().__init__()
        self.config, self.generation_config, self.source = config, generation_config, source
        self.model = _Holder()
        self._decoder: Any = None
        self.releases: list[Callable[[], None]] = []  # each lets one mapped file's pages go

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def get_input_embeddings(self) -> Any:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> Any:
        return self.lm_head

    def release_pages(self) -> None:
        """Let this process's copies of the weights' pages go until a forward reads them again (from the page
        cache or the disk): a head training on stored features holds only what it reads."""
        for release in self.releases:
            release()

    def forward(self, input_ids: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                past_key_values: Any = None, **inputs: Any) -> Any:
        """The native decoder's forward (native.NativeDecoder.__call__); called as a transformers model is called
        with input ids alone, it starts at position 0 on a fresh cache."""
        if self._decoder is None:
            from ..native.native import decoder_for
            from ..native.native_support import unsupported

            self._decoder = decoder_for(self)
            if self._decoder is None:  # pragma: no cover - checked before the model was built
                raise SpecdecError(f"specdec's native decoder cannot run this model: {unsupported(self)}")
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1])[None]  # [1, n]
        if past_key_values is None:
            past_key_values = KVCache()
        return self._decoder(input_ids=input_ids, position_ids=position_ids, past_key_values=past_key_values,
                             **inputs)


# -- opening a file ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InPlace:
    """Where a GGUF target's weights live, for the load line."""

    path: Path
    cache: Path
    types: dict[str, int]  # ggml type: tensors of it
    file_bytes: int
    cache_bytes: int
    repacked: bool  # this load repacked the file (else the cache was mapped)


def open_in_place(gguf: GGUFFile, config: Any, on_status: Optional[StatusCallback] = None) -> tuple[GGUFModel, Any]:
    """(the model, its tokenizer) from a checked file's cache, repacking it first when it is absent or damaged."""
    expected = check_tensors(gguf, config)  # (gguf_check did it once already: milliseconds)
    planned = gguf_blocks.plan_matrices(gguf, expected, tied="output.weight" not in gguf.tensors)
    folder = cache_folder(gguf.path)
    fault = cache_fault(folder, gguf)
    mapped = None
    if fault is None:
        mapped, fault = _proved_blocks(folder, planned)
    if fault:
        warnings.warn(f"the cache of {gguf.path.name} ({folder}) is made again: {fault}", stacklevel=2)
    repacked = mapped is None
    if mapped is None:
        _repack(gguf, config, planned, folder, on_status)
        mapped = _mapped(folder, planned)
        if mapped is None:  # pragma: no cover - written and read by the same code
            raise SpecdecError(f"{folder / BLOCKS_FILE}: the repacked blocks cannot be read back")
    source = InPlace(gguf.path, folder, gguf.type_names(), gguf.size, (folder / BLOCKS_FILE).stat().st_size,
                     repacked)
    stored = stored_config(folder)  # the config, rotary tables and tokenizer as the cache keeps them (stored.py)
    if stored is None:  # pragma: no cover - proved with the cache
        raise SpecdecError(f"{folder / STORED_FILE}: the stored config cannot be read back")
    model = _build(gguf, stored, stored_generation(folder), expected, mapped, source, stored_rotary(folder))
    return model, _cached_tokenizer(folder)


def _proved_blocks(folder: Path, planned: list[gguf_blocks.PlannedMatrix]
                   ) -> tuple[Optional[dict[str, gguf_blocks.MappedMatrix]], Optional[str]]:
    """(the cache's records, mapped, None) once every matrix and the file's header hash to what the marker
    recorded when they were written; else (None, what does not)."""
    mapped = _mapped(folder, planned)
    marker = read_marker(folder) or {}
    digests = marker.get("blocks")
    if mapped is None or not isinstance(digests, dict):
        return None, f"{BLOCKS_FILE} does not hold the matrices the file needs"
    if proved_before(folder, marker):  # hashed to its proofs at an earlier load, and untouched since
        return mapped, None
    fault = gguf_blocks.verify_blocks(folder / BLOCKS_FILE, planned, mapped, digests,
                                      workers=torch.get_num_threads())
    if fault:
        return None, f"{BLOCKS_FILE}: {fault}"
    remember_proved(folder, marker)
    return mapped, None


def _mapped(folder: Path, planned: list[gguf_blocks.PlannedMatrix]) -> Optional[dict[str, gguf_blocks.MappedMatrix]]:
    """The cache's records, mapped, when it holds every planned matrix with its planned size; else None."""
    mapped = gguf_blocks.map_blocks(folder / BLOCKS_FILE)
    if mapped is None or any(matrix.module not in mapped or mapped[matrix.module].records.numel() != matrix.nbytes
                             or mapped[matrix.module].kind != matrix.kind for matrix in planned):
        return None
    return mapped


def _repack(gguf: GGUFFile, config: Any, planned: list[gguf_blocks.PlannedMatrix], folder: Path,
            on_status: Optional[StatusCallback]) -> None:
    """Make the cache folder (blocks, tokenizer, config, marker last) in a temporary folder renamed into place."""
    from ...files import atomic_directory
    from ...home import writable_home_folder

    started = time.perf_counter()
    writable_home_folder("models")
    needed = gguf_blocks.cache_bytes(planned)
    free = shutil.disk_usage(folder.parent).free
    if free < needed + (64 << 20):
        raise SpecdecError(f"{gguf.path}: its repacked blocks need {needed / 1e9:.2f} GB under {folder.parent}, "
                           f"which has {free / 1e9:.2f} GB free")
    source = source_proof(gguf)
    stop = threading.Event()
    unsynced = (BLOCKS_FILE,)  # every load proves the blocks by their SHA-256s: a torn file is never used
    with atomic_directory(folder, replace=True, unsynced=unsynced) as tmp, ThreadPoolExecutor(max_workers=1) as writer:
        # the blocks are repacked and written on their own thread while this one writes the side files
        blocks_written = writer.submit(gguf_blocks.write_blocks, gguf, planned, tmp / BLOCKS_FILE,
                                       _progress(on_status, gguf.path.name), torch.get_num_threads(), stop)
        try:
            if not write_native_side_files(gguf, tmp):
                _write_side_files_by_transformers(gguf, config, tmp)
            blocks = blocks_written.result()
        except BaseException:
            stop.set()  # the writer stops at its next slice; the temporary folder is removed
            raise
        marker = {"format": CACHE_FORMAT, "source": source, "blocks_bytes": (tmp / BLOCKS_FILE).stat().st_size,
                  "blocks": blocks, "files": side_files(tmp), "seconds": round(time.perf_counter() - started, 3)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1))
    for superseded in superseded_folders(folder, gguf.path):  # an earlier format's, or the file's before it changed
        shutil.rmtree(superseded, ignore_errors=True)
    _give_back_freed_memory()


def _write_side_files_by_transformers(gguf: GGUFFile, config: Any, folder: Path) -> None:
    """The side files of a file whose config or tokenizer specdec does not build itself (native_side_files.py):
    the tokenizer through transformers' converter, the config and rotary tables by transformers' classes."""
    if isinstance(config, StoredConfig):  # read from a cache that is being made again: transformers' own
        config = hf_config(gguf)
    tokenizer_from_file(gguf).save_pretrained(folder)
    config.save_pretrained(folder)
    _generation_config(config).save_pretrained(folder)
    write_stored(folder, config, _rotary(config))


def _give_back_freed_memory() -> None:
    """Return what repacking's threads freed to the system (glibc keeps freed slices in per-thread arenas, which
    would count in this process's memory for the rest of the session); nothing off glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:  # pragma: no cover - no C library to ask
        pass


def _progress(on_status: Optional[StatusCallback], name: str) -> Optional[Callable[[int, int], None]]:
    if on_status is None:
        return None
    last = [-1]

    def report(done: int, total: int) -> None:
        percent = int(100 * done / max(1, total))
        if percent != last[0] and percent % 5 == 0:
            last[0] = percent
            on_status(f"repacking {name} for specdec's kernels (once): {percent}%")
    return report


def _generation_config(config: Any) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                            pad_token_id=getattr(config, "pad_token_id", None))


def tokenizer_from_file(gguf: GGUFFile) -> Any:
    """The file's tokenizer (its chat template included) as transformers' GGUF tokenizer converter builds it from
    the metadata. Built as PreTrainedTokenizerFast directly: AutoTokenizer would first read the whole file again
    through gguf's reader to find the config (5.6 s of 6.0 for the default model; 15 s for a 151k vocabulary),
    for the same tokens, merges, special tokens and template (tests/test_real_model.py compares them). Read from a
    folder holding the file alone (gguf_alone.py): not from tokenizer files lying beside it."""
    from transformers import PreTrainedTokenizerFast

    from ..gguf.gguf_alone import alone
    from ..quiet import no_tqdm, quiet_transformers

    quiet_transformers()
    try:
        with no_tqdm(), alone(gguf.path) as (folder, name):
            return PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=name)
    except Exception as exc:  # the tokenizer converters' errors are varied: the file is what a user can act on
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecdecError(f"{gguf.path}: its tokenizer metadata cannot be read ({first})") from exc


def _cached_tokenizer(folder: Path) -> Any:
    """The tokenizer kept in a cache folder: read with `tokenizers` (native_tokenizer.py) where that gives
    transformers' answers, else by transformers."""
    native = load_native_tokenizer(folder)
    if native is not None:
        return native
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def cached_tokenizer(path: Path) -> Optional[Any]:
    """The tokenizer kept beside a file's repacked blocks, or None when the file has not been loaded in place."""
    folder = cache_folder(path)
    return _cached_tokenizer(folder) if cache_ready(folder) else None


def _vector(gguf: GGUFFile, name: str) -> torch.Tensor:
    """A norm's or bias's values as float32 [n] (a copy: kilobytes)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    info = gguf.tensors[name]
    values = dequantize(gguf.raw(name), GGMLQuantizationType[info.type_name]).astype(np.float32)
    if not np.isfinite(values).all():  # before the first forward: a NaN norm makes every answer garbage
        bad = int(np.count_nonzero(~np.isfinite(values)))
        raise SpecdecError(f"{gguf.path}: tensor {name} holds {bad:,} NaN or infinite values of {values.size:,}")
    return torch.from_numpy(np.array(values.reshape(-1), dtype=np.float32))


def _rotary(config: Any) -> torch.nn.Module:
    """The family's rotary table as transformers computes it (a module of buffers: inv_freq, scaling)."""
    module = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    classes = [value for name, value in vars(module).items() if name.endswith("RotaryEmbedding")
               and isinstance(value, type) and value.__module__ == module.__name__]
    if len(classes) != 1:  # pragma: no cover - another transformers layout
        raise SpecdecError(f"transformers' {module.__name__} has no single rotary embedding class")
    return classes[0](config=config)


def _build(gguf: GGUFFile, config: Any, generation_config: Any, expected: list[Expected],
           mapped: dict[str, gguf_blocks.MappedMatrix], source: InPlace, rotary: torch.nn.Module) -> GGUFModel:
    """The module tree under transformers' names (see the module docstring), with the rotary module and the
    config the cache stored (stored.py)."""
    model = GGUFModel(config, generation_config, source)
    caches = {id(matrix.mapping): matrix.mapping for matrix in mapped.values()}.values()  # (one cache file)
    model.releases = [gguf.release, *(functools.partial(drop_pages, cache, 0, len(cache)) for cache in caches)]
    family = families.require(config.model_type)
    eps = float(getattr(config, "rms_norm_eps", 1e-6))
    layers = torch.nn.ModuleList()
    for _ in range(int(config.num_hidden_layers)):
        layer: Any = _Holder()
        layer.self_attn, layer.mlp = _Holder(), _Holder()
        layers.append(layer)
    model.model.layers = layers
    hidden = int(config.hidden_size)
    scale = float(hidden) ** 0.5 if family.embedding_scale else None
    model.model.embed_tokens = MappedEmbedding(gguf, "token_embd.weight", scale)
    biases: dict[str, torch.Tensor] = {}
    for item in expected:
        if item.gguf_name.endswith(".bias"):
            biases[item.module] = _vector(gguf, item.gguf_name)
    for item in expected:
        if item.module in ("model.embed_tokens", "rope_freqs") or item.gguf_name.endswith(".bias"):
            continue
        parent_name, _, attribute = item.module.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if item.matrix:
            matrix = mapped[item.module]
            weights = BlockWeights(matrix.kind, matrix.records, matrix.out_features, matrix.in_features, matrix.origin)
            setattr(parent, attribute, BlockLinear(weights, biases.get(item.module)))
        else:
            # the file's values are what the norm multiplies by (Gemma's: stored as 1 + weight; families.py)
            setattr(parent, attribute, _Norm(_vector(gguf, item.gguf_name), eps, family.norm_plus_one))
    if "lm_head" not in dict(model.named_children()):
        matrix = mapped["lm_head"]
        model.lm_head = BlockLinear(BlockWeights(matrix.kind, matrix.records, matrix.out_features,
                                                 matrix.in_features, matrix.origin))
    if "rope_freqs.weight" in gguf.tensors:  # llama 3: frequencies divided by the file's factors, as llama.cpp
        rotary.inv_freq = torch.as_tensor(rotary.inv_freq) / _vector(gguf, "rope_freqs.weight")
    model.model.rotary_emb = rotary
    activation = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    head_dim = int(getattr(config, "head_dim", None) or hidden // int(config.num_attention_heads))
    pre_scalar = getattr(config, "query_pre_attn_scalar", None)
    block: Any
    for block in model.model.layers:
        attention: Any = block.self_attn
        block.mlp.act_fn = ACTIVATIONS[str(activation)]()  # silu or gelu_pytorch_tanh: gguf_layout checked it
        attention.scaling = float(pre_scalar if pre_scalar is not None and family.query_pre_attn_scalar
                                  else head_dim) ** -0.5
    return model.eval()
