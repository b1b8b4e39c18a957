"""A GGUF target converted once into a safetensors model directory under $SPECDEC_HOME/models, and checked on
every load.

Dequantising a GGUF is slow, so the first load converts it (weights, config, tokenizer) into a temporary
directory, syncs it and renames it into place; a marker written last records every file's size, modification
time and SHA-256. A load compares sizes and times (a stat per file) and hashes a file again only when its time
changed (hashing every load costs too much, and any write through the filesystem changes the time); a damaged or
incomplete copy is set aside and converted again, with one warning. This module converts and checks; finding
and loading targets is models.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

from ...errors import SpecdecError
from ...files import file_sha256, read_json_bounded
from ...home import short_stem, specdec_home, writable_home_folder
from .. import families
from ..quiet import no_tqdm, quiet_transformers

CONVERTED_FORMAT = 3  # bump when the converted directory's layout changes (3: bfloat16 for non-native families)
CONVERTED_MARKER = "specdec-converted.json"  # written last: its presence means the conversion finished

StatusCallback = Callable[[str], None]


def check_conversion(gguf: Any, config: Any, dtype: str) -> None:
    """Refuse, before any slow work, a GGUF that transformers would convert into the wrong model or that cannot fit:
    an architecture transformers does not read, a tensor its architecture does not have (a file labelled mamba
    holding llama tensors would become a random Mamba model), or more memory than this machine has free for the
    dequantised weights (`dtype`, with transformers' copy while it builds the model)."""
    import gguf as gguf_package

    arch = gguf.architecture
    readable = config is not None or arch in families.own_loader_architectures()
    arch_id = next((key for key, value in gguf_package.MODEL_ARCH_NAMES.items() if value == arch), None)
    if not readable or arch_id is None:
        raise SpecdecError(f"{gguf.path}: unknown architecture {arch!r}: neither specdec nor transformers reads it")
    known = {gguf_package.TENSOR_NAMES[tensor] for tensor in gguf_package.MODEL_TENSORS[arch_id]}
    for name in gguf.tensors:
        base = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
        parts = base.split(".")
        if len(parts) > 1 and parts[0] == "blk" and parts[1].isdigit():
            base = ".".join(["blk", "{bid}", *parts[2:]])
        if base not in known:
            raise SpecdecError(f"{gguf.path}: unexpected tensor {name} for a {arch} model")
    weights = sum(info.elements for info in gguf.tensors.values())
    width = 2 if dtype == "bfloat16" else 4
    needed = weights * width * 2 + (1 << 30)  # the state dict, the model, and a GiB for the rest
    available = _available_memory()
    if available is not None and needed > available:
        raise SpecdecError(f"{gguf.path}: {arch} is not a family specdec computes in place, and converting its "
                           f"{weights / 1e9:.2f} B weights to {dtype} for transformers needs about "
                           f"{needed / 1e9:.1f} GB of memory; {available / 1e9:.1f} GB is available")


def _available_memory() -> Optional[int]:
    """MemAvailable from /proc/meminfo, in bytes (None off Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def converted_dir(gguf_path: Path) -> Path:
    """Cache directory for one GGUF file, keyed by its name, size, modification time and conversion dtype."""
    from ..gguf.gguf_file import file_identity

    identity = f"{file_identity(gguf_path)}|{CONVERTED_FORMAT}|{_dtype_of(gguf_path)}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return specdec_home() / "models" / f"{short_stem(gguf_path.stem)}-{key}"


def _dtype_of(gguf_path: Path) -> str:
    """The dtype the file is converted to (models.conversion_dtype), after its checks."""
    from ..in_place.gguf_check import checked_gguf, conversion_dtype

    return conversion_dtype(checked_gguf(gguf_path))


def ensure_converted(gguf_path: Path, on_status: Optional[StatusCallback] = None) -> Path:
    """Convert a GGUF file once into a safetensors model directory; return that directory. A copy that is
    damaged (a file missing, cut short or changed since the conversion) is converted again, with one warning."""
    from ..in_place.gguf_check import checked_gguf, conversion_dtype, transformers_config

    checked = checked_gguf(gguf_path)  # a file that fails a check is refused before anything is cached
    out_dir = converted_dir(gguf_path)
    damage = converted_damage(out_dir)
    if damage is None:
        return out_dir
    check_conversion(checked.gguf, transformers_config(checked), conversion_dtype(checked))
    try:
        writable_home_folder("models")  # before the slow part: a home specdec cannot write fails now
    except SpecdecError as exc:
        raise SpecdecError(f"{exc}" + (f"; the converted model {out_dir} is damaged ({damage})"
                                       if out_dir.exists() else "")) from exc
    if out_dir.exists():
        warnings.warn(f"the converted model {out_dir} is damaged ({damage}); converting {gguf_path.name} again",
                      stacklevel=2)
        _set_aside(out_dir)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ...files import atomic_directory

    quiet_transformers()
    dtype = conversion_dtype(checked)
    if on_status:
        on_status(f"Converting {gguf_path.name} to {dtype} safetensors for transformers once; later loads are quick")
    started = time.perf_counter()
    try:
        from ..gguf import gguf_families
        from ..gguf.gguf_alone import alone

        missing: list[str] = []
        if gguf_families.handles(gguf_path):  # gemma, smollm3: families transformers' GGUF loader does not read
            with no_tqdm():
                model, tokenizer = gguf_families.load(gguf_path)
            model = model.to(getattr(torch, dtype))
        else:
            with no_tqdm(), alone(gguf_path) as (folder, filename):  # not the config or tokenizer files beside it
                tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
                loaded: Any = AutoModelForCausalLM.from_pretrained(
                    folder, gguf_file=filename, dtype=getattr(torch, dtype), output_loading_info=True)
            model, info = loaded
            tied = getattr(model.config, "tie_word_embeddings", False)
            missing = [name for name in dict(info).get("missing_keys", ()) if not (tied and name == "lm_head.weight")]
    except Exception as exc:  # gguf's own errors are varied; the file is what the user can act on
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise SpecdecError(f"{gguf_path}: cannot read this GGUF file ({type(exc).__name__}: {first})") from exc
    if missing:
        raise SpecdecError(f"{gguf_path}: missing tensor for {sorted(missing)[0]}"
                           + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    with atomic_directory(out_dir, replace=False) as tmp_dir:  # another process finishing first: keep theirs
        config = model.config
        if hasattr(config, "quantization_config"):  # the weights are dequantized: a plain float model now
            del config.quantization_config
        config.save_pretrained(tmp_dir)
        model.generation_config.save_pretrained(tmp_dir)
        tokenizer.save_pretrained(tmp_dir)
        save_weights(model, tmp_dir / "model.safetensors")
        marker = {"format": CONVERTED_FORMAT, "source": str(gguf_path), "seconds": time.perf_counter() - started,
                  "files": {entry.name: _file_record(entry) for entry in sorted(tmp_dir.iterdir())}}
        (tmp_dir / CONVERTED_MARKER).write_text(json.dumps(marker, indent=1))
    return out_dir


def converted_damage(out_dir: Path) -> Optional[str]:
    """None when `out_dir` holds a whole conversion, else what is wrong ("not converted yet" when it is absent).

    Each file's size and modification time are compared with those recorded at conversion; a file whose time
    changed is hashed again (and its new time recorded when its SHA-256 still matches). A conversion recorded
    before checksums were (no "files" in its marker) is checked by its safetensors header, then recorded."""
    marker_path = out_dir / CONVERTED_MARKER
    if not marker_path.is_file():
        return f"{CONVERTED_MARKER} is missing" if out_dir.exists() else "not converted yet"
    try:
        marker = read_json_bounded(marker_path)
        files = marker.get("files") if isinstance(marker, dict) else None
    except (OSError, ValueError, UnicodeDecodeError):
        return f"{CONVERTED_MARKER} is unreadable"
    if not isinstance(marker, dict):
        return f"{CONVERTED_MARKER} is unreadable"
    if files is None:  # converted by an earlier specdec: check what can be checked, then record it
        problem = _safetensors_damage(out_dir / "model.safetensors")
        if problem is None:
            names = sorted(entry.name for entry in out_dir.iterdir() if entry.name != CONVERTED_MARKER)
            _rewrite_marker(marker_path, {**marker, "files": {name: _file_record(out_dir / name) for name in names}})
        return problem
    changed = False
    try:
        for name, record in files.items():
            path = out_dir / name
            try:
                stat = path.stat()
            except OSError:
                return f"{name} is missing"
            if stat.st_size != int(record["size"]):
                return f"{name}: {stat.st_size:,} bytes, {int(record['size']):,} expected"
            if stat.st_mtime_ns != int(record["mtime_ns"]):
                if file_sha256(path) != record["sha256"]:
                    return f"{name} changed since the conversion (its SHA-256 differs)"
                record["mtime_ns"], changed = stat.st_mtime_ns, True
    except (KeyError, TypeError, ValueError, AttributeError):
        return f"{CONVERTED_MARKER} is unreadable"
    if changed:  # touched, not changed: no hashing next time
        _rewrite_marker(marker_path, marker)
    return None


def _file_record(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": file_sha256(path)}


def _safetensors_damage(path: Path) -> Optional[str]:
    """What is wrong with a safetensors file's header or length, or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little")
            if not 0 < header_size <= size - 8:
                return f"{path.name}: its header is damaged"
            header = json.loads(handle.read(header_size))
        end = max((int(info["data_offsets"][1]) for key, info in header.items() if key != "__metadata__"), default=0)
    except OSError:
        return f"{path.name} is missing"
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"{path.name}: its header is damaged"
    if size != 8 + header_size + end:
        return f"{path.name}: {size:,} bytes, {8 + header_size + end:,} expected"
    return None


def _rewrite_marker(marker_path: Path, marker: dict) -> None:
    """Best effort: a read-only home only costs the check again next time."""
    from ...files import write_atomic

    try:
        write_atomic(marker_path, json.dumps(marker, indent=1))
    except (OSError, SpecdecError):
        pass


def _set_aside(out_dir: Path) -> None:
    """Move a damaged conversion out of the way (a rename: only one of several processes does it), then remove it."""
    from ...files import _remove, temporary_beside

    aside = temporary_beside(out_dir)
    try:
        os.rename(out_dir, aside)
    except OSError:
        return  # another process moved it first
    _remove(aside)


def save_weights(model: Any, path: Path) -> None:
    """The model's weights as one safetensors file under the names Hugging Face checkpoints use. A tensor shared
    by several names (tied embeddings) is stored once, under its first name (`model.embed_tokens.weight`, not
    `lm_head.weight`): transformers and vLLM re-tie from the config, and vLLM reads only that name."""
    from safetensors.torch import save_file

    state, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        state[name] = tensor.detach().contiguous()
    save_file(state, str(path), metadata={"format": "pt"})


