"""Training a draft model on the target's answers (Seq-KD), optionally with a token-level divergence.

The student (student.py) shares the target's tokenizer; data and batches are data.py's, the losses
loss.py's, checkpoints and the finished draft checkpoints.py's, and the loop itself (resume, whole steps,
checkpoints, Ctrl-C) loop.py's, shared with the EAGLE head. This module is the student's part of that loop
(`StudentKind`): its settings, each step's batches and loss, its checkpoint state and its report.

The draft's head covers `draft_vocab` tokens (default 16384 of SmolLM2's 49152): the most frequent tokens
of the training data, then the tokens the target itself predicts most along it, then the lowest ids. At
run time the tokens of the conversation are added (drafters/model.py), and training does the same per
batch: logits are computed over the head subset plus the batch's own tokens. This cuts the largest matrix
of a small draft by two thirds, in training and in drafting. `draft_vocab=0` keeps the whole vocabulary.

Loss per answer token: cross-entropy on the target's answer token, plus `kd_weight` times a divergence
between the target's distribution (computed on the fly, no gradient) and the student's: forward KL
KL(p_target || p_draft), reverse KL KL(p_draft || p_target), or total variation (1 - TVD is the per-token
acceptance of speculative sampling). Prompt tokens are context only. Token-weighted means over each
optimizer step (accumulation-exact), AdamW (no decay on norms, biases and embeddings), linear warm-up then
cosine decay to `min_lr_ratio * lr`, gradient clipping, a seeded and deterministic batch order.

Checkpoints are written every `save_every` steps, at the end, and on Ctrl-C; resuming restores the model,
the optimizer and the step, and continues with the very batches the interrupted run would have seen (each
epoch's batch order is a function of the seed and the epoch alone).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..decoding.generation_config import check_seed
from ..drafters import target_info
from ..drafters.model import draft_vocab_size
from ..errors import SpecdecError, check_choice
from ..texts.data_rows import read_rows
from .checkpoints import CHECKPOINT_FORMAT, DRAFT_FORMAT, check_output_dir, check_resumable, save_draft
from .data import Example, data_digest, epoch_batches, make_batch, make_examples, split_rows
from .loop import Trainee, TrainingRun, train
from .loss import KD_LOSSES, divergence, restricted_logits
from .student import (
    DEFAULT_DRAFT_VOCAB,
    DEFAULT_LAYERS,
    INITS,
    MAX_LAYERS,
    build_student,
    choose_head_tokens,
    count_parameters,
)

# Settings a resumed run must share with its checkpoint (the rest may change, e.g. a longer run).
RESUME_KEYS = ("init", "layers", "hidden", "student", "batch_size", "grad_accum", "lr", "min_lr_ratio",
               "weight_decay", "max_len", "kd_weight", "kd_loss", "seed", "holdout", "draft_vocab", "kd_positions",
               "freeze_embeddings")

StatusCallback = Callable[[str], None]


MAX_KD_WEIGHT = 100.0  # the divergence's weight beside the cross-entropy at most (both are a few nats)


@dataclass
class TrainConfig:
    init: str = "target"  # target | config | student
    layers: int = DEFAULT_LAYERS  # blocks of the student (target / config init)
    hidden: Optional[int] = None  # hidden size (config init; default: the target's)
    student: Optional[str] = None  # model directory (student init)
    steps: Optional[int] = None  # optimizer steps; None = epochs over the training rows
    epochs: float = 6.0
    batch_size: int = 4  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # the cosine ends at lr * this
    warmup_steps: Optional[int] = None  # None = 5% of the steps (at least 1)
    weight_decay: float = 0.01
    clip: float = 1.0  # max gradient norm (0 = off)
    max_len: int = 768  # longest training sequence (prompt tail + answer)
    kd_weight: float = 0.0  # weight of the divergence to the target's distributions
    kd_loss: str = "fkl"
    kd_positions: str = "answer"  # answer | all (the divergence also on prompt tokens)
    freeze_embeddings: bool = True  # keep the target's embeddings (and a tied head) fixed
    seed: int = 0
    save_every: int = 100  # checkpoint every N steps (0 = only at the end and on Ctrl-C)
    holdout: float = 0.1  # share of the data rows kept for evaluation (by a hash of the prompt)
    draft_vocab: int = DEFAULT_DRAFT_VOCAB  # tokens the draft's head predicts (0 = all)

    def check(self) -> None:
        check_choice(self.init, INITS, "init")
        if self.init == "student" and not self.student:
            raise SpecdecError("init student needs --student PATH", setting="init")
        if not 1 <= self.layers <= MAX_LAYERS:
            raise SpecdecError(f"layers must be between 1 and {MAX_LAYERS}, got {self.layers:,}", setting="layers")
        if self.hidden is not None and self.hidden < 8:
            raise SpecdecError(f"hidden must be >= 8, got {self.hidden}", setting="hidden")
        if self.steps is not None and self.steps < 1:
            raise SpecdecError(f"steps must be >= 1, got {self.steps}", setting="steps")
        if not 0 < self.epochs < math.inf:
            raise SpecdecError(f"epochs must be a finite number > 0, got {self.epochs}", setting="epochs")
        if self.batch_size < 1 or self.grad_accum < 1:
            raise SpecdecError("batch_size and --grad-accum must be >= 1", setting="batch_size")
        if not 0 < self.lr < math.inf:
            raise SpecdecError(f"lr must be a finite number > 0, got {self.lr}", setting="lr")
        check_choice(self.kd_loss, KD_LOSSES, "kd_loss")
        if self.kd_positions not in ("answer", "all"):
            raise SpecdecError(f"kd_positions must be answer or all, got {self.kd_positions!r}", setting="kd_positions")
        if not 0 <= self.kd_weight <= MAX_KD_WEIGHT:
            raise SpecdecError(f"kd_weight must be between 0 and {MAX_KD_WEIGHT:g}, got {self.kd_weight}",
                               setting="kd_weight")
        check_seed(self.seed)
        if self.max_len < 8:
            raise SpecdecError(f"max_len must be >= 8, got {self.max_len}", setting="max_len")
        if not 0.0 <= self.holdout < 1.0:
            raise SpecdecError(f"holdout must be in [0, 1), got {self.holdout}", setting="holdout")
        if self.save_every < 0:
            raise SpecdecError(f"save_every must be >= 0, got {self.save_every}", setting="save_every")
        if self.draft_vocab < 0:
            raise SpecdecError(f"draft_vocab must be >= 0 (0 = the whole vocabulary), got {self.draft_vocab}",
                               setting="draft_vocab")

    def student_spec(self) -> dict:
        """How the untrained student is made (student.build_student's spec; evaluate.py rebuilds it from there)."""
        if self.init == "target":
            return {"kind": "target", "layers": self.layers}
        if self.init == "config":
            return {"kind": "config", "layers": self.layers, "hidden": self.hidden, "seed": self.seed}
        return {"kind": "student", "path": str(Path(self.student or "").expanduser().resolve())}


@dataclass
class TrainProgress:
    step: int
    total_steps: int
    loss: float  # next-token cross-entropy on answer tokens, mean over this step
    kd: Optional[float]  # the divergence, mean over this step (None without --kd-weight)
    lr: float
    tokens_per_second: float  # sequence tokens through the student per second (this run)
    seconds: float  # this run's training time so far
    epoch: float


@dataclass(frozen=True)
class StudentLoss:
    loss: float  # next-token cross-entropy on answer tokens, mean over the step
    kd: Optional[float]  # the divergence, mean over the step (None without --kd-weight)


@dataclass
class TrainResult:
    output: str
    checkpoint: str
    steps: int
    total_steps: int
    first_loss: Optional[float]
    final_loss: Optional[float]
    seconds: float
    resumed_from: Optional[int]
    train_rows: int
    held_out_rows: int
    parameters: int
    history: list = field(default_factory=list)  # [step, loss, kd or None]


def learning_rate(step: int, total: int, config: TrainConfig) -> float:
    """LR for optimizer step `step` (0-based): linear warm-up, then cosine to lr * min_lr_ratio."""
    warmup = config.warmup_steps if config.warmup_steps is not None else max(1, int(round(0.05 * total)))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(model: Any, config: TrainConfig) -> Any:
    import torch

    embeddings = {id(model.get_input_embeddings().weight)}
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        if parameter.ndim < 2 or id(parameter) in embeddings or "norm" in name:
            no_decay.append(parameter)
        else:
            decay.append(parameter)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8)


@dataclass(frozen=True)
class StudentData:
    """A data file read for training: its rows, split into training and held-out rows, and the examples."""

    path: str
    rows: list[dict]
    train_rows: list[dict]
    held_rows: list[dict]
    examples: list[Example]
    digest: str  # of the training rows: a checkpoint continues only on the same data


class StudentKind:
    """A student's part of the training loop (loop.py): its batches and losses, what its checkpoints hold, and
    the finished draft directory with its report."""

    def __init__(self, target: Any, tokenizer: Any, target_name: str, info: Any, data: StudentData,
                 config: TrainConfig, output: Path, checkpoint_dir: Path, *,
                 on_progress: Optional[Callable[[TrainProgress], None]] = None,
                 on_status: StatusCallback = lambda message: None, threads: Optional[int] = None) -> None:
        self.target, self.tokenizer, self.target_name, self.info = target, tokenizer, target_name, info
        self.data, self.config, self.output, self.checkpoint_dir = data, config, output, checkpoint_dir
        self.on_progress, self.status, self.threads = on_progress, on_status, threads
        self.spec = config.student_spec()
        self.micro_per_epoch = math.ceil(len(data.examples) / config.batch_size)
        steps_per_epoch = max(1, math.ceil(self.micro_per_epoch / config.grad_accum))
        self.total_steps = config.steps or max(1, int(round(config.epochs * steps_per_epoch)))
        self.kd = config.kd_weight > 0
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (info.eos_token_ids or (0,))[0]
        self.tokens_seen = 0  # sequence tokens through the student in this run
        self.student: Any = None
        self.head_tokens: Optional[list[int]] = None
        self.head_ids: Any = None  # the head tokens as a tensor
        self.vocab_width = 0
        self._epoch_batches: dict[int, list[list[int]]] = {}

    def check_checkpoint(self, state: dict, directory: Path) -> None:
        if state.get("fingerprint") != self.info.fingerprint:
            raise SpecdecError(f"resume: the checkpoint in {directory} was made for another target tokenizer",
                               setting="resume")
        check_resumable(state, directory, asdict(self.config), RESUME_KEYS, self.data.digest, str(self.data.path))

    def start(self, state: Optional[dict]) -> Trainee:
        import torch

        config, info = self.config, self.info
        if self.threads:
            torch.set_num_threads(self.threads)
        torch.manual_seed(config.seed)
        if state is None:
            self.status("Building the student…")
            student = build_student(self.target, self.spec, info.fingerprint, info.vocab_size)
        else:
            from transformers import AutoConfig, AutoModelForCausalLM

            saved_config = state["student_config"]
            settings = {key: value for key, value in saved_config.items() if key != "model_type"}
            student_config = AutoConfig.for_model(saved_config["model_type"], **settings)
            student = AutoModelForCausalLM.from_config(student_config, dtype=torch.float32)
        _check_vocab(student, self.tokenizer, info)
        student.train()
        if config.freeze_embeddings:
            student.get_input_embeddings().weight.requires_grad_(False)
            head = student.get_output_embeddings()
            if head is not None:
                head.weight.requires_grad_(False)
        optimizer = make_optimizer(student, config)
        if self.kd:
            self.target.eval()
        self.vocab_width = max(int(student.config.vocab_size), info.vocab_size)
        if state is not None:
            self.head_tokens = state.get("head_tokens")
        else:
            if config.draft_vocab:
                self.status("Choosing the draft's output vocabulary…")
            self.head_tokens = choose_head_tokens(self.target, self.data.train_rows, config.draft_vocab,
                                                  int(student.config.vocab_size), info.eos_token_ids)
        self.head_ids = None if self.head_tokens is None else torch.tensor(self.head_tokens, dtype=torch.long)
        self.student = student
        return Trainee(student, optimizer, self.total_steps)

    def learning_rate(self, step: int, total_steps: int) -> float:
        return learning_rate(step, total_steps, self.config)

    def _micro_batch(self, index: int) -> list[int]:
        epoch, within = divmod(index, self.micro_per_epoch)
        if epoch not in self._epoch_batches:
            self._epoch_batches.clear()
            self._epoch_batches[epoch] = epoch_batches(self.data.examples, self.config.batch_size, self.config.seed,
                                                       epoch)
        return self._epoch_batches[epoch][within]

    def backward(self, step: int) -> StudentLoss:
        """Cross-entropy on the answer tokens (and the divergence) of the step's micro-batches, token-weighted
        over the whole step, accumulated into the gradients; then clipping."""
        import torch

        config, student, target = self.config, self.student, self.target
        batches = [self._micro_batch(step * config.grad_accum + j) for j in range(config.grad_accum)]
        prepared = [make_batch(self.data.examples, indices, self.pad_id, self.kd and config.kd_positions == "all")
                    for indices in batches]
        answer_tokens = sum(int(batch.answer.sum()) for batch in prepared)
        kd_tokens = sum(int(batch.answer.numel()) for batch in prepared)
        ce_total = kd_total = 0.0
        for batch in prepared:
            ids, mask, select, answer, labels = (batch.input_ids, batch.attention_mask, batch.select,
                                                 batch.answer, batch.labels)
            columns = None
            if self.head_ids is not None:  # the head subset plus this batch's own tokens, as at run time
                columns = torch.unique(torch.cat([self.head_ids, ids[mask.bool()]]))  # sorted [C]
                local = torch.full((self.vocab_width,), -100, dtype=torch.long)
                local[columns] = torch.arange(columns.numel())
                labels = local[labels]
            logits = restricted_logits(student, ids, mask, select, columns)  # [M, C]
            ce = torch.nn.functional.cross_entropy(logits[answer].float(), labels[answer], reduction="sum")
            loss = ce / answer_tokens
            if self.kd:
                with torch.no_grad():
                    on = _device(target)
                    target_logits = restricted_logits(target, ids.to(on), mask.to(on), select.to(on),
                                                      None if columns is None else columns.to(on)).to(logits.device)
                divergence_sum = divergence(config.kd_loss, logits, target_logits)
                loss = loss + config.kd_weight * divergence_sum / kd_tokens
                kd_total += float(divergence_sum.detach())
            loss.backward()
            ce_total += float(ce.detach())
            self.tokens_seen += int(mask.sum())
        if config.clip > 0:
            torch.nn.utils.clip_grad_norm_([p for p in student.parameters() if p.requires_grad], config.clip)
        return StudentLoss(ce_total / answer_tokens, kd_total / kd_tokens if self.kd else None)

    def history_entry(self, step: int, loss: StudentLoss) -> list:
        return [step, round(loss.loss, 5), None if loss.kd is None else round(loss.kd, 5)]

    def progress(self, run: TrainingRun, lr: float, loss: StudentLoss) -> None:
        if self.on_progress is not None:
            seconds = run.run_seconds
            self.on_progress(TrainProgress(run.step, run.total_steps, loss.loss, loss.kd, lr,
                                           self.tokens_seen / seconds if seconds > 0 else 0.0, seconds,
                                           run.step * self.config.grad_accum / self.micro_per_epoch))

    def checkpoint_state(self, run: TrainingRun) -> dict:
        return {
            "format": CHECKPOINT_FORMAT, "step": run.step, "total_steps": run.total_steps, "history": run.history,
            "config": asdict(self.config), "student_config": self.student.config.to_dict(), "init": self.spec,
            "fingerprint": self.info.fingerprint, "target": self.target_name, "data": str(self.data.path),
            "data_digest": self.data.digest, "seconds": run.seconds, "head_tokens": self.head_tokens,
        }

    def report(self, run: TrainingRun, trainee: Trainee) -> TrainResult:
        """Write the draft directory (model, tokenizer, specdec_draft.json, distill_report.json)."""
        seconds = run.seconds
        student, config, data, info, head_tokens = self.student, self.config, self.data, self.info, self.head_tokens
        student.eval()
        parameters = count_parameters(student)
        meta = {
            "format": DRAFT_FORMAT, "target": self.target_name, "fingerprint": info.fingerprint,
            "vocab_size": info.vocab_size, "init": self.spec, "layers": int(student.config.num_hidden_layers),
            "hidden": int(student.config.hidden_size), "parameters": parameters, "steps": run.step,
            "head_tokens": head_tokens,
        }
        losses = [entry[1] for entry in run.history]
        report = {
            "target": self.target_name, "fingerprint": info.fingerprint,
            "data": {"path": str(Path(data.path).expanduser().resolve()), "rows": len(data.rows),
                     "train_rows": len(data.train_rows), "held_out_rows": len(data.held_rows),
                     "holdout": config.holdout, "digest": data.digest,
                     "answer_tokens": sum(len(example.ids) - example.start for example in data.examples)},
            "student": {"init": self.spec, "layers": meta["layers"], "hidden": meta["hidden"],
                        "parameters": parameters, "head_tokens": None if head_tokens is None else len(head_tokens),
                        "head_coverage": _coverage(head_tokens, data.held_rows or data.train_rows)},
            "training": {"config": asdict(config), "steps": run.step, "total_steps": run.total_steps,
                         "seconds": round(seconds, 1), "first_loss": losses[0] if losses else None,
                         "final_loss": _tail_mean(losses), "history": _thin(run.history, 200)},
            "evaluation": None,
        }
        save_draft(self.output, student, self.tokenizer, self.target, meta, report)
        return TrainResult(str(self.output), str(self.checkpoint_dir), run.step, run.total_steps,
                           losses[0] if losses else None, _tail_mean(losses), seconds, run.resumed_from,
                           len(data.train_rows), len(data.held_rows), parameters, run.history)


def read_student_data(data_path: str, fingerprint: str, target_name: str, config: TrainConfig,
                      on_status: StatusCallback) -> StudentData:
    """The rows of a data file for this target, split and cut into training examples."""
    warnings: list[str] = []
    rows = read_rows(data_path, fingerprint, target_name, warnings=warnings)
    for warning in warnings:
        on_status(f"warning: {warning}")
    train_rows, held_rows = split_rows(rows, config.holdout)
    examples = make_examples(train_rows, config.max_len)
    if not examples:
        raise SpecdecError(f"{data_path}: no training rows with a non-empty answer")
    return StudentData(data_path, rows, train_rows, held_rows, examples, data_digest(train_rows))


def train_draft(
    target: Any,
    tokenizer: Any,
    target_name: str,
    data_path: str,
    output: str,
    config: TrainConfig,
    *,
    checkpoint_dir: Optional[str] = None,
    resume: bool = False,
    on_progress: Optional[Callable[[TrainProgress], None]] = None,
    on_status: Optional[StatusCallback] = None,
    threads: Optional[int] = None,
) -> TrainResult:
    """Train a student on `data_path` and write it to `output`; Ctrl-C saves a checkpoint and re-raises."""
    config.check()
    status = on_status or (lambda message: None)
    info = target_info(target, tokenizer)
    out_dir = Path(output).expanduser()
    check_output_dir(out_dir)
    ckpt_dir = Path(checkpoint_dir).expanduser() if checkpoint_dir else out_dir.parent / f"{out_dir.name}.checkpoint"
    data = read_student_data(data_path, info.fingerprint, target_name, config, status)
    kind = StudentKind(target, tokenizer, target_name, info, data, config, out_dir, ckpt_dir, on_progress=on_progress,
                       on_status=status, threads=threads)
    return train(kind, ckpt_dir, resume=resume, save_every=config.save_every, on_status=status)


def _device(model: Any) -> Any:
    return next(model.parameters()).device


def _check_vocab(student: Any, tokenizer: Any, info: Any) -> None:
    size = draft_vocab_size(student, tokenizer)
    if size != info.vocab_size:
        raise SpecdecError(
            f"the student has a vocabulary of {size} tokens but the target has {info.vocab_size} "
            f"(tokenizer {info.fingerprint}); a draft must share the target's tokenizer"
        )


def _coverage(head_tokens: Optional[list], rows: Sequence[dict]) -> Optional[float]:
    """Share of answer tokens the head can predict (its subset plus the tokens of the prompt and answer so far)."""
    if head_tokens is None:
        return 1.0
    allowed = set(head_tokens)
    covered = total = 0
    for row in rows:
        seen = set(int(token) for token in row["prompt_ids"])
        for token in row["answer_ids"]:
            covered += int(token) in allowed or int(token) in seen
            total += 1
            seen.add(int(token))
    return round(covered / total, 4) if total else None


def _tail_mean(values: Sequence[float], count: int = 10) -> Optional[float]:
    tail = list(values)[-count:]
    return round(sum(tail) / len(tail), 5) if tail else None


def _thin(history: list, limit: int) -> list:
    if len(history) <= limit:
        return history
    stride = math.ceil(len(history) / limit)
    return history[::stride] + ([history[-1]] if (len(history) - 1) % stride else [])
