"""What training writes: checkpoints (resumable) and the finished draft directory, each atomically.

A checkpoint is a directory: `model.safetensors`, `optimizer.safetensors` (AdamW moments per parameter
name) and `state.json` (step, history, settings, data digest); nothing is pickled. The draft is a Hugging
Face model directory with `specdec_draft.json` (target name and tokenizer fingerprint) and
`distill_report.json` (data, settings, losses; evaluate.py adds its measurements there).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..drafters.model import DRAFT_META  # the metadata file the model drafter reads
from ..errors import SpecdecError
from ..files import atomic_directory, check_replaceable_dir, read_json_bounded

CHECKPOINT_FORMAT = 1
DRAFT_FORMAT = 1
REPORT = "distill_report.json"


def save_checkpoint(directory: Path, model: Any, optimizer: Any, state: dict) -> None:
    from safetensors.torch import save_file, save_model

    with atomic_directory(directory) as tmp:
        save_model(model, str(tmp / "model.safetensors"))
        moments: dict = {}
        adam_step = 0.0
        names = {id(parameter): name for name, parameter in model.named_parameters()}
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                slot = optimizer.state.get(parameter)
                if not slot:
                    continue
                name = names[id(parameter)]
                moments[f"{name}::exp_avg"] = slot["exp_avg"].detach().contiguous()
                moments[f"{name}::exp_avg_sq"] = slot["exp_avg_sq"].detach().contiguous()
                adam_step = float(slot["step"])
        save_file(moments, str(tmp / "optimizer.safetensors"))
        (tmp / "state.json").write_text(json.dumps({**state, "adam_step": adam_step}, indent=1))


def read_checkpoint_state(directory: Path) -> dict:
    path = directory / "state.json"
    if not path.is_file() or not (directory / "model.safetensors").is_file():
        raise SpecdecError(f"resume: no checkpoint in {directory}", setting="resume")
    try:
        state = read_json_bounded(path)
    except ValueError as exc:
        raise SpecdecError(f"{path}: unreadable checkpoint state ({exc})") from None
    if state.get("format") != CHECKPOINT_FORMAT:
        raise SpecdecError(f"{directory}: checkpoint format {state.get('format')} is not supported")
    return state


def check_resumable(state: dict, directory: Path, settings: dict, keys: tuple, digest: str, data: str) -> None:
    """Refuse to continue a checkpoint made with other `keys` settings or from other data (`digest`)."""
    saved = state.get("config", {})
    changed = [key for key in keys if key in saved and saved[key] != settings[key]]
    if changed:
        raise SpecdecError(f"resume: the checkpoint in {directory} was made with other settings ("
                           + ", ".join(f"{key} {saved[key]!r} != {settings[key]!r}" for key in changed) + ")",
                           setting="resume")
    if state.get("data_digest") != digest:
        raise SpecdecError(f"resume: {data} changed since the checkpoint in {directory} was made; train afresh",
                           setting="resume")


@contextmanager
def whole_step() -> Iterator[None]:
    """A training update that Ctrl-C (or SIGTERM) cannot cut in half: a signal arriving inside is delivered when
    the block ends, so the checkpoint saved on the way out holds a finished step and its count, and a resumed run
    repeats nothing. (Main thread only; elsewhere signals are not delivered to the code anyway.)"""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[tuple[int, Any]] = []
    previous: dict[int, Any] = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    for number in previous:
        signal.signal(number, lambda signum, frame: arrived.append((signum, frame)))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        if arrived:
            signum, frame = arrived[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)  # the command line's own handler, or Python's KeyboardInterrupt
            elif handler != signal.SIG_IGN:
                signal.raise_signal(signum)


def load_checkpoint(directory: Path, model: Any, optimizer: Any, state: dict) -> None:
    import torch
    from safetensors.torch import load_file, load_model

    load_model(model, str(directory / "model.safetensors"))
    moments = load_file(str(directory / "optimizer.safetensors"))
    step = torch.tensor(float(state.get("adam_step", 0.0)))
    for name, parameter in model.named_parameters():
        key = f"{name}::exp_avg"
        if key in moments:
            optimizer.state[parameter] = {
                "step": step.clone(),
                "exp_avg": moments[key].to(parameter.dtype),
                "exp_avg_sq": moments[f"{name}::exp_avg_sq"].to(parameter.dtype),
            }


def check_output_dir(output: Path) -> None:
    check_replaceable_dir(output, lambda folder: (folder / DRAFT_META).is_file(), "a specdec draft directory",
                          setting=None)


def save_draft(output: Path, student: Any, tokenizer: Any, target: Any, meta: dict, report: dict) -> None:
    import copy

    check_output_dir(output)
    with atomic_directory(output) as tmp:
        generation_config = getattr(target, "generation_config", None)
        if generation_config is not None:  # a stored one (an in-place GGUF's: stored.py) as transformers' own
            to_transformers = getattr(generation_config, "transformers_config", None)
            student.generation_config = to_transformers() if to_transformers else copy.deepcopy(generation_config)
        student.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / DRAFT_META).write_text(json.dumps(meta, indent=1, ensure_ascii=False), encoding="utf-8")
        (tmp / REPORT).write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
