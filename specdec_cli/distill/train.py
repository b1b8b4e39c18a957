"""Training a draft model on the target's answers (Seq-KD), optionally with a token-level divergence.

The student (student.py) shares the target's tokenizer; data and batches are data.py's, the losses
loss.py's, checkpoints and the finished draft checkpoints.py's. This module is the training loop.

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
the optimizer and the step, and continues with the very batches the interrupted run would have seen.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..errors import SpecdecError
from .checkpoints import (
    CHECKPOINT_FORMAT,
    DRAFT_FORMAT,
    check_output_dir,
    check_resumable,
    load_checkpoint,
    read_checkpoint_state,
    save_checkpoint,
    save_draft,
    whole_step,
)
from .data import data_digest, epoch_batches, make_batch, make_examples, split_rows
from .loss import KD_LOSSES, divergence, restricted_logits
from .student import (
    DEFAULT_DRAFT_VOCAB,
    DEFAULT_LAYERS,
    INITS,
    build_student,
    choose_head_tokens,
    count_parameters,
    init_spec,
)

# Settings a resumed run must share with its checkpoint (the rest may change, e.g. a longer run).
RESUME_KEYS = ("init", "layers", "hidden", "student", "batch_size", "grad_accum", "lr", "min_lr_ratio",
               "weight_decay", "max_len", "kd_weight", "kd_loss", "seed", "holdout", "draft_vocab", "kd_positions",
               "freeze_embeddings")

StatusCallback = Callable[[str], None]


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
        if self.init not in INITS:
            raise SpecdecError(f"init must be one of {', '.join(INITS)}, got {self.init!r}", setting="init")
        if self.init == "student" and not self.student:
            raise SpecdecError("init student needs --student PATH", setting="init")
        if self.layers < 1:
            raise SpecdecError(f"layers must be >= 1, got {self.layers}", setting="layers")
        if self.hidden is not None and self.hidden < 8:
            raise SpecdecError(f"hidden must be >= 8, got {self.hidden}", setting="hidden")
        if self.steps is not None and self.steps < 1:
            raise SpecdecError(f"steps must be >= 1, got {self.steps}", setting="steps")
        if not self.epochs > 0:
            raise SpecdecError(f"epochs must be > 0, got {self.epochs}", setting="epochs")
        if self.batch_size < 1 or self.grad_accum < 1:
            raise SpecdecError("batch_size and --grad-accum must be >= 1", setting="batch_size")
        if not self.lr > 0:
            raise SpecdecError(f"lr must be > 0, got {self.lr}", setting="lr")
        if self.kd_loss not in KD_LOSSES:
            raise SpecdecError(f"kd_loss must be one of {', '.join(KD_LOSSES)}, got {self.kd_loss!r}",
                               setting="kd_loss")
        if self.kd_positions not in ("answer", "all"):
            raise SpecdecError(f"kd_positions must be answer or all, got {self.kd_positions!r}", setting="kd_positions")
        if self.kd_weight < 0:
            raise SpecdecError(f"kd_weight must be >= 0, got {self.kd_weight}", setting="kd_weight")
        if self.max_len < 8:
            raise SpecdecError(f"max_len must be >= 8, got {self.max_len}", setting="max_len")
        if not 0.0 <= self.holdout < 1.0:
            raise SpecdecError(f"holdout must be in [0, 1), got {self.holdout}", setting="holdout")
        if self.save_every < 0:
            raise SpecdecError(f"save_every must be >= 0, got {self.save_every}", setting="save_every")
        if self.draft_vocab < 0:
            raise SpecdecError(f"draft_vocab must be >= 0 (0 = the whole vocabulary), got {self.draft_vocab}",
                               setting="draft_vocab")


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
    import torch

    from ..chat import target_info
    from .generate import read_rows

    config.check()
    status = on_status or (lambda message: None)
    info = target_info(target, tokenizer)
    out_dir = Path(output).expanduser()
    check_output_dir(out_dir)
    ckpt_dir = Path(checkpoint_dir).expanduser() if checkpoint_dir else out_dir.parent / f"{out_dir.name}.checkpoint"
    warnings: list[str] = []
    rows = read_rows(data_path, info.fingerprint, target_name, warnings=warnings)
    for warning in warnings:
        status(f"warning: {warning}")
    train_rows, held_rows = split_rows(rows, config.holdout)
    examples = make_examples(train_rows, config.max_len)
    if not examples:
        raise SpecdecError(f"{data_path}: no training rows with a non-empty answer")
    digest = data_digest(train_rows)
    spec = init_spec(config)

    state: Optional[dict] = None
    if resume:
        state = read_checkpoint_state(ckpt_dir)
        if state.get("fingerprint") != info.fingerprint:
            raise SpecdecError(f"resume: the checkpoint in {ckpt_dir} was made for another target tokenizer",
                               setting="resume")
        check_resumable(state, ckpt_dir, asdict(config), RESUME_KEYS, digest, str(data_path))

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(config.seed)
    if state is None:
        status("Building the student…")
        student = build_student(target, spec, info.fingerprint, info.vocab_size)
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        saved_config = state["student_config"]
        settings = {key: value for key, value in saved_config.items() if key != "model_type"}
        student_config = AutoConfig.for_model(saved_config["model_type"], **settings)
        student = AutoModelForCausalLM.from_config(student_config, dtype=torch.float32)
    _check_vocab(student, tokenizer, info)
    student.train()
    if config.freeze_embeddings:
        student.get_input_embeddings().weight.requires_grad_(False)
        head = student.get_output_embeddings()
        if head is not None:
            head.weight.requires_grad_(False)
    optimizer = make_optimizer(student, config)
    if state is not None:
        load_checkpoint(ckpt_dir, student, optimizer, state)
        status(f"Resuming from step {state['step']} ({ckpt_dir})")

    micro_per_epoch = math.ceil(len(examples) / config.batch_size)
    steps_per_epoch = max(1, math.ceil(micro_per_epoch / config.grad_accum))
    total_steps = config.steps or max(1, int(round(config.epochs * steps_per_epoch)))
    step = int(state["step"]) if state else 0
    history: list = list(state.get("history", [])) if state else []
    elapsed_before = float(state.get("seconds", 0.0)) if state else 0.0
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (info.eos_token_ids or (0,))[0]
    kd = config.kd_weight > 0
    if kd:
        target.eval()
    vocab_width = max(int(student.config.vocab_size), info.vocab_size)
    if state is not None:
        head_tokens = state.get("head_tokens")
    else:
        if config.draft_vocab:
            status("Choosing the draft's output vocabulary…")
        head_tokens = choose_head_tokens(target, train_rows, config.draft_vocab, int(student.config.vocab_size),
                                         info.eos_token_ids)
    head_ids = None if head_tokens is None else torch.tensor(head_tokens, dtype=torch.long)
    epochs_cache: dict[int, list[list[int]]] = {}

    def micro_batch(index: int) -> list[int]:
        epoch, within = divmod(index, micro_per_epoch)
        if epoch not in epochs_cache:
            epochs_cache.clear()
            epochs_cache[epoch] = epoch_batches(examples, config.batch_size, config.seed, epoch)
        return epochs_cache[epoch][within]

    def checkpoint_state() -> dict:
        return {
            "format": CHECKPOINT_FORMAT, "step": step, "total_steps": total_steps, "history": history,
            "config": asdict(config), "student_config": student.config.to_dict(), "init": spec,
            "fingerprint": info.fingerprint, "target": target_name, "data": str(data_path),
            "data_digest": digest, "seconds": elapsed_before + (time.perf_counter() - started),
            "head_tokens": head_tokens,
        }

    resumed_from = step if state else None
    started = time.perf_counter()
    tokens_seen = 0
    try:
        while step < total_steps:
            lr = learning_rate(step, total_steps, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batches = [micro_batch(step * config.grad_accum + j) for j in range(config.grad_accum)]
            prepared = [make_batch(examples, indices, pad_id, kd and config.kd_positions == "all")
                        for indices in batches]
            answer_tokens = sum(int(batch.answer.sum()) for batch in prepared)
            kd_tokens = sum(int(batch.answer.numel()) for batch in prepared)
            ce_total = kd_total = 0.0
            for batch in prepared:
                ids, mask, select, answer, labels = (batch.input_ids, batch.attention_mask, batch.select,
                                                     batch.answer, batch.labels)
                columns = None
                if head_ids is not None:  # the head subset plus this batch's own tokens, as at run time
                    columns = torch.unique(torch.cat([head_ids, ids[mask.bool()]]))  # sorted [C]
                    local = torch.full((vocab_width,), -100, dtype=torch.long)
                    local[columns] = torch.arange(columns.numel())
                    labels = local[labels]
                logits = restricted_logits(student, ids, mask, select, columns)  # [M, C]
                ce = torch.nn.functional.cross_entropy(logits[answer].float(), labels[answer], reduction="sum")
                loss = ce / answer_tokens
                if kd:
                    with torch.no_grad():
                        on = _device(target)
                        target_logits = restricted_logits(target, ids.to(on), mask.to(on), select.to(on),
                                                          None if columns is None else columns.to(on)).to(logits.device)
                    divergence_sum = divergence(config.kd_loss, logits, target_logits)
                    loss = loss + config.kd_weight * divergence_sum / kd_tokens
                    kd_total += float(divergence_sum.detach())
                loss.backward()
                ce_total += float(ce.detach())
                tokens_seen += int(mask.sum())
            if config.clip > 0:
                torch.nn.utils.clip_grad_norm_([p for p in student.parameters() if p.requires_grad], config.clip)
            loss_value = ce_total / answer_tokens
            kd_value = kd_total / kd_tokens if kd else None
            with whole_step():  # the update and its count together, whatever Ctrl-C does
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                history.append([step, round(loss_value, 5), None if kd_value is None else round(kd_value, 5)])
            seconds = time.perf_counter() - started
            if on_progress is not None:
                on_progress(TrainProgress(step, total_steps, loss_value, kd_value, lr,
                                          tokens_seen / seconds if seconds > 0 else 0.0, seconds,
                                          step * config.grad_accum / micro_per_epoch))
            if config.save_every and step % config.save_every == 0 and step < total_steps:
                save_checkpoint(ckpt_dir, student, optimizer, checkpoint_state())
    except KeyboardInterrupt:
        optimizer.zero_grad(set_to_none=True)
        save_checkpoint(ckpt_dir, student, optimizer, checkpoint_state())
        status(f"Interrupted at step {step}/{total_steps}; checkpoint saved in {ckpt_dir} (rerun with --resume)")
        raise
    save_checkpoint(ckpt_dir, student, optimizer, checkpoint_state())
    seconds = elapsed_before + time.perf_counter() - started

    student.eval()
    parameters = count_parameters(student)
    meta = {
        "format": DRAFT_FORMAT, "target": target_name, "fingerprint": info.fingerprint,
        "vocab_size": info.vocab_size, "init": spec, "layers": int(student.config.num_hidden_layers),
        "hidden": int(student.config.hidden_size), "parameters": parameters, "steps": step,
        "head_tokens": head_tokens,
    }
    losses = [entry[1] for entry in history]
    report = {
        "target": target_name, "fingerprint": info.fingerprint,
        "data": {"path": str(Path(data_path).expanduser().resolve()), "rows": len(rows), "train_rows": len(train_rows),
                 "held_out_rows": len(held_rows), "holdout": config.holdout, "digest": digest,
                 "answer_tokens": sum(len(example.ids) - example.start for example in examples)},
        "student": {"init": spec, "layers": meta["layers"], "hidden": meta["hidden"], "parameters": parameters,
                    "head_tokens": None if head_tokens is None else len(head_tokens),
                    "head_coverage": _coverage(head_tokens, held_rows or train_rows)},
        "training": {"config": asdict(config), "steps": step, "total_steps": total_steps, "seconds": round(seconds, 1),
                     "first_loss": losses[0] if losses else None, "final_loss": _tail_mean(losses),
                     "history": _thin(history, 200)},
        "evaluation": None,
    }
    save_draft(out_dir, student, tokenizer, target, meta, report)
    return TrainResult(str(out_dir), str(ckpt_dir), step, total_steps, losses[0] if losses else None,
                       _tail_mean(losses), seconds, resumed_from, len(train_rows), len(held_rows), parameters, history)


def _device(model: Any) -> Any:
    return next(model.parameters()).device


def _check_vocab(student: Any, tokenizer: Any, info: Any) -> None:
    from ..drafters.model import draft_vocab_size

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
