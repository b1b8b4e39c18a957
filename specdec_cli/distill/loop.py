"""The training loop a student and an EAGLE head share: resume -> optimizer steps -> checkpoints -> report.

What differs between the two kinds of draft is one object per kind, a `TrainingKind` (train.py's
`StudentKind`, eagle_train.py's `HeadKind`): which checkpoints it may continue, the model and optimizer it
starts from, each step's learning rate, batch and loss, what its history and a checkpoint record, and the
report of the finished run. The loop owns what they share:

- resuming: the checkpoint is read and refused unless the kind can continue it, then the model's weights,
  AdamW's moments and the step are restored, so the run goes on with the very batches the interrupted one
  would have seen (a run stopped before its first checkpoint, a head's still computing its features, starts
  from step 0: what it computed is the kind's to keep);
- each optimizer step as one whole step: the update, its count and its history entry happen together or not
  at all, whatever Ctrl-C (or SIGTERM) does (checkpoints.whole_step);
- checkpoints every `save_every` steps, at the end and on Ctrl-C (then the interruption goes on up);
- the training time, summed over a run and the runs it continues.

Checkpoints are checkpoints.py's files (safetensors and JSON); without a checkpoint directory nothing is
written and nothing can be resumed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, TypeVar

from ..errors import SpecdecError
from .checkpoints import load_checkpoint, read_checkpoint_state, save_checkpoint, whole_step

LossT = TypeVar("LossT")  # what one step's loss is, as the kind records and reports it
ResultT = TypeVar("ResultT", covariant=True)  # what a finished run returns


@dataclass
class Trainee:
    """What a run trains: the model, its optimizer and the number of optimizer steps the run takes in all."""

    model: Any
    optimizer: Any
    total_steps: int


@dataclass
class TrainingRun:
    """Where a run stands; a checkpoint records it beside the kind's own state."""

    step: int  # optimizer steps done, earlier runs included
    total_steps: int
    history: list  # one entry per step done (the kind's history_entry)
    resumed_from: Optional[int]  # the checkpoint's step, None for a fresh run
    seconds_before: float  # training time of the runs this one continues
    started: float  # time.perf_counter() when this run's clock started

    @property
    def run_seconds(self) -> float:
        """This run's time so far."""
        return time.perf_counter() - self.started

    @property
    def seconds(self) -> float:
        """Training time so far, the runs this one continues included."""
        return self.seconds_before + self.run_seconds


class TrainingKind(Protocol[LossT, ResultT]):
    """The part of a training run that depends on what is trained (a student, an EAGLE head)."""

    def check_checkpoint(self, state: dict, directory: Path) -> None:
        """Refuse (SpecdecError) a checkpoint this run cannot continue: another kind, target, settings or data."""

    def start(self, state: Optional[dict]) -> Trainee:
        """The model and optimizer to train: fresh, or shaped as the checkpoint's (whose weights the loop loads)."""

    def learning_rate(self, step: int, total_steps: int) -> float:
        """The learning rate of optimizer step `step` (0-based)."""

    def backward(self, step: int) -> LossT:
        """The gradients of optimizer step `step` (0-based): its batch, forward, loss, backward and clipping;
        returns the step's loss (what history_entry and progress are given)."""

    def history_entry(self, step: int, loss: LossT) -> Any:
        """What the history records for step `step` (1-based, just done)."""

    def progress(self, run: TrainingRun, lr: float, loss: LossT) -> None:
        """A step is done: tell whoever watches."""

    def checkpoint_state(self, run: TrainingRun) -> dict:
        """The JSON state of a checkpoint at this point of the run (checkpoints.py writes it as state.json)."""

    def report(self, run: TrainingRun, trainee: Trainee) -> ResultT:
        """The finished run's result (the kind writes its output here)."""


def train(kind: TrainingKind[LossT, ResultT], checkpoint_dir: Optional[Path], *, resume: bool = False,
          save_every: int = 0, on_status: Optional[Callable[[str], None]] = None,
          started: Optional[float] = None) -> ResultT:
    """Run `kind` to its last step, checkpointed in `checkpoint_dir` (None: not at all) every `save_every` steps
    (0: only at the end and on Ctrl-C), continued from there with `resume`. `started` is when the training time
    starts counting (default: when the first step starts). Ctrl-C saves a checkpoint and re-raises."""
    status = on_status or (lambda message: None)
    state: Optional[dict] = None
    if resume:
        if checkpoint_dir is None:
            raise SpecdecError("resume: no checkpoint directory given", setting="resume")
        if not (checkpoint_dir / "state.json").exists():  # stopped before the first checkpoint (in a head's features)
            status(f"No checkpoint in {checkpoint_dir} yet: training from the start")
        else:
            state = read_checkpoint_state(checkpoint_dir)
            kind.check_checkpoint(state, checkpoint_dir)
    trainee = kind.start(state)
    model, optimizer = trainee.model, trainee.optimizer
    if state is not None and checkpoint_dir is not None:
        load_checkpoint(checkpoint_dir, model, optimizer, state)
        status(f"Resuming from step {state['step']} ({checkpoint_dir})")
    run = TrainingRun(
        step=int(state["step"]) if state else 0, total_steps=trainee.total_steps,
        history=list(state.get("history", [])) if state else [], resumed_from=int(state["step"]) if state else None,
        seconds_before=float(state.get("seconds", 0.0)) if state else 0.0,
        started=time.perf_counter() if started is None else started,
    )

    def save() -> None:
        if checkpoint_dir is not None:
            save_checkpoint(checkpoint_dir, model, optimizer, kind.checkpoint_state(run))

    try:
        while run.step < run.total_steps:
            lr = kind.learning_rate(run.step, run.total_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = kind.backward(run.step)
            with whole_step():  # the update and its count together, whatever Ctrl-C does
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                run.step += 1
                run.history.append(kind.history_entry(run.step, loss))
            kind.progress(run, lr, loss)
            if save_every and run.step % save_every == 0 and run.step < run.total_steps:
                save()
    except KeyboardInterrupt:
        if checkpoint_dir is not None:
            optimizer.zero_grad(set_to_none=True)
            save()
            status(f"Interrupted at step {run.step}/{run.total_steps}; checkpoint saved in {checkpoint_dir} "
                   "(rerun with --resume)")
        raise
    save()
    return kind.report(run, trainee)
