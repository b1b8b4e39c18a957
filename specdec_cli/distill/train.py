"""Training a draft model on the target's answers (Seq-KD), optionally with a token-level divergence.

The student shares the target's tokenizer. It starts as (a) the target cut down to its embeddings, first N
blocks, final norm and head (`init="target"`, the default), (b) a fresh model of the target's family with
hidden size H and N blocks, its embeddings initialised from the target's reduced by SVD to H dimensions
(`init="config"`), or (c) an existing model directory with the same tokenizer (`init="student"`).

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

Checkpoints (every `save_every` steps, at the end, and on Ctrl-C) are a directory: `model.safetensors`,
`optimizer.safetensors` (AdamW moments per parameter name) and `state.json` (step, history, settings, data
digest); nothing is pickled. Resuming restores all of it and continues with the very batches the
interrupted run would have seen. The result is a Hugging Face model directory written to a temporary
directory and renamed into place, with `specdec_draft.json` (target name and tokenizer fingerprint) and
`distill_report.json` (data, settings, losses; evaluate.py adds its measurements there).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..drafters.model import DRAFT_META  # the metadata file the model drafter reads
from ..errors import SpecdecError

CHECKPOINT_FORMAT = 1
DRAFT_FORMAT = 1
DEFAULT_LAYERS = 4
INITS = ("target", "config", "student")
KD_LOSSES = ("fkl", "rkl", "tvd")
REPORT = "distill_report.json"
# Settings a resumed run must share with its checkpoint (the rest may change, e.g. a longer run).
RESUME_KEYS = ("init", "layers", "hidden", "student", "batch_size", "grad_accum", "lr", "min_lr_ratio",
               "weight_decay", "max_len", "kd_weight", "kd_loss", "seed", "holdout", "draft_vocab", "kd_positions",
               "freeze_embeddings")
DEFAULT_DRAFT_VOCAB = 16384
MARGINAL_ROWS = 24  # rows the target scores to rank tokens by its own predictions

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
            raise SpecdecError(f"kd_loss must be one of {', '.join(KD_LOSSES)}, got {self.kd_loss!r}", setting="kd_loss")
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
            raise SpecdecError(f"draft_vocab must be >= 0 (0 = the whole vocabulary), got {self.draft_vocab}", setting="draft_vocab")


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


# ---------------------------------------------------------------------------------------------- data


def prompt_hash(prompt: str) -> float:
    digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
    return int(digest[:8], 16) / float(1 << 32)


def split_rows(rows: Sequence[dict], holdout: float) -> tuple[list[dict], list[dict]]:
    """(train, held out): a row is held out when the hash of its prompt falls below `holdout`."""
    if holdout <= 0 or len(rows) < 2:
        return list(rows), []
    held = [row for row in rows if prompt_hash(str(row.get("prompt", ""))) < holdout]
    if not held:  # small files: still keep one row apart
        held = [min(rows, key=lambda row: prompt_hash(str(row.get("prompt", ""))))]
    held_ids = {id(row) for row in held}
    train = [row for row in rows if id(row) not in held_ids]
    if not train:
        raise SpecdecError(f"holdout {holdout} leaves no training rows", setting="holdout")
    return train, held


def data_digest(rows: Sequence[dict]) -> str:
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps([row["prompt_ids"], row["answer_ids"]]).encode())
    return "sha256:" + digest.hexdigest()[:16]


@dataclass
class Example:
    ids: list[int]
    start: int  # index of the first answer token in ids (>= 1): loss on ids[start:]


def make_examples(rows: Sequence[dict], max_len: int) -> list[Example]:
    examples = []
    for row in rows:
        prompt, answer = [int(t) for t in row["prompt_ids"]], [int(t) for t in row["answer_ids"]]
        if not answer or not prompt:
            continue
        if len(answer) >= max_len - 1:
            prompt, answer = prompt[-1:], answer[: max_len - 1]
        elif len(prompt) + len(answer) > max_len:
            prompt = prompt[-(max_len - len(answer)):]
        examples.append(Example(prompt + answer, len(prompt)))
    return examples


def epoch_batches(examples: Sequence[Example], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Seeded shuffle; within windows of 8 batches, similar lengths go together (less padding)."""
    rng = random.Random(f"{seed}:{epoch}")
    order = list(range(len(examples)))
    rng.shuffle(order)
    window = batch_size * 8
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda index: len(examples[index].ids))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


# ---------------------------------------------------------------------------------------------- students


def _config_dict(config: Any) -> dict:
    return {key: value for key, value in config.to_dict().items() if not key.startswith("_")}


def _with(config: Any, **changes: Any) -> Any:
    values = _config_dict(config)
    values.update(changes)
    layers = values.get("num_hidden_layers")
    for key in ("layer_types",):
        if isinstance(values.get(key), list) and layers is not None:
            values[key] = values[key][:layers]
    if "max_window_layers" in values and layers is not None:
        values["max_window_layers"] = min(int(values["max_window_layers"] or layers), layers)
    return type(config).from_dict(values)


def init_spec(config: TrainConfig) -> dict:
    if config.init == "target":
        return {"kind": "target", "layers": config.layers}
    if config.init == "config":
        return {"kind": "config", "layers": config.layers, "hidden": config.hidden, "seed": config.seed}
    return {"kind": "student", "path": str(Path(config.student).expanduser().resolve())}


def build_student(target: Any, spec: dict, target_fingerprint: str = "", target_vocab: int = 0) -> Any:
    """The untrained student for an init spec (also rebuilt by evaluate.py for the 'before' numbers)."""
    import torch
    from transformers import AutoModelForCausalLM

    kind = spec["kind"]
    if kind == "student":
        from ..drafters.model import check_draft_compatible, draft_vocab_size, load_draft_model
        from ..fingerprint import tokenizer_fingerprint

        model, tokenizer, meta = load_draft_model(spec["path"])
        fingerprint = tokenizer_fingerprint(tokenizer) if tokenizer is not None else str(meta.get("fingerprint", ""))
        info = _TargetView(target_vocab, target_fingerprint)
        check_draft_compatible(spec["path"], draft_vocab_size(model, tokenizer), fingerprint, info)
        return model.float()
    base = target.config
    total = int(getattr(base, "num_hidden_layers", 0) or 0)
    layers = int(spec["layers"])
    if kind == "target":
        if layers > total:
            raise SpecdecError(f"layers {layers}: the target has only {total} blocks", setting="layers")
        config = _with(base, num_hidden_layers=layers)
        student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = {}
        for name, tensor in target.state_dict().items():
            parts = name.split(".")
            if "layers" in parts:
                index = parts.index("layers")
                if index + 1 < len(parts) and parts[index + 1].isdigit() and int(parts[index + 1]) >= layers:
                    continue
            state[name] = tensor.detach().float()
        missing, unexpected = student.load_state_dict(state, strict=False)
        missing = [name for name in missing if "rotary" not in name]
        if missing or unexpected:
            raise SpecdecError(
                f"cannot cut this target down to a student (missing {missing[:3]}, unexpected {unexpected[:3]}); "
                "use --init config"
            )
        return student
    # kind == "config": the target's family, smaller, embeddings from the target's by SVD
    hidden = int(spec.get("hidden") or base.hidden_size)
    head_dim = int(getattr(base, "head_dim", 0) or base.hidden_size // base.num_attention_heads)
    if hidden % head_dim:
        raise SpecdecError(f"hidden {hidden} must be a multiple of the target's head size {head_dim}", setting="hidden")
    heads = hidden // head_dim
    kv_ratio = max(1, int(base.num_attention_heads) // int(getattr(base, "num_key_value_heads", base.num_attention_heads)))
    kv_heads = heads // kv_ratio if heads % kv_ratio == 0 and heads >= kv_ratio else heads
    ratio = float(getattr(base, "intermediate_size", 4 * base.hidden_size)) / float(base.hidden_size)
    intermediate = max(16, int(round(hidden * ratio / 16.0)) * 16)
    config = _with(base, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                   num_key_value_heads=kv_heads, intermediate_size=intermediate, head_dim=head_dim)
    torch.manual_seed(int(spec.get("seed", 0)))
    student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        embedding = target.get_input_embeddings().weight.detach().float()  # [vocab, D]
        if hidden == embedding.shape[1]:
            reduced = embedding.clone()
        else:
            _, _, basis = torch.linalg.svd(embedding, full_matrices=False)  # basis [D, D]
            reduced = embedding @ basis[:hidden].T  # [vocab, hidden]
        student.get_input_embeddings().weight.copy_(reduced[: student.get_input_embeddings().weight.shape[0]])
        head = student.get_output_embeddings()
        target_head = target.get_output_embeddings()
        if head is not None and target_head is not None and head.weight is not student.get_input_embeddings().weight:
            weight = target_head.weight.detach().float()
            if hidden == weight.shape[1]:
                head.weight.copy_(weight)
            else:
                _, _, basis = torch.linalg.svd(weight, full_matrices=False)
                head.weight.copy_(weight @ basis[:hidden].T)
    return student


@dataclass(frozen=True)
class _TargetView:
    vocab_size: int
    fingerprint: str


def count_parameters(model: Any) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


# ---------------------------------------------------------------------------------------------- loss


def restricted_logits(model: Any, input_ids: Any, attention_mask: Any, select: Any, columns: Any = None) -> Any:
    """Logits [M, C] at the selected positions (bool [b, T]) over `columns` (token ids; None = all).

    The head runs only at the selected positions and only for the chosen columns when the model allows it.
    """
    from ..drafters.model import split_model

    base, head = split_model(model)
    if base is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[select]
        return logits if columns is None else logits[:, columns]
    hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[select]  # [M, H]
    if columns is None:
        return head(hidden)
    logits = hidden @ head.weight[columns].T  # [M, C]
    bias = getattr(head, "bias", None)
    return logits if bias is None else logits + bias[columns]


def choose_head_tokens(target: Any, rows: Sequence[dict], size: int, vocab: int, always: Sequence[int] = ()) -> Optional[list[int]]:
    """The draft head's tokens: data counts, then the target's own predictions along the data, then low ids."""
    import collections

    import torch

    if size <= 0 or size >= vocab:
        return None
    chosen: dict[int, None] = {int(token): None for token in always if 0 <= int(token) < vocab}
    counts: collections.Counter = collections.Counter()
    for row in rows:
        counts.update(int(token) for token in row["answer_ids"])
        counts.update(int(token) for token in row["prompt_ids"])
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if 0 <= token < vocab:
            chosen.setdefault(token, None)
    if len(chosen) < size:
        marginal = torch.zeros(vocab)
        device = next(target.parameters()).device
        with torch.inference_mode():
            for row in list(rows)[:MARGINAL_ROWS]:
                ids = torch.tensor([list(row["prompt_ids"]) + list(row["answer_ids"])], device=device)
                logits = target(input_ids=ids).logits[0].float().cpu()  # [n, V']
                marginal[: logits.shape[-1]] += torch.softmax(logits, -1)[:, :vocab].sum(0)
        for token in torch.argsort(marginal, descending=True).tolist():
            if len(chosen) >= size or marginal[token] <= 0:
                break
            chosen.setdefault(int(token), None)
    token = 0
    while len(chosen) < size:
        chosen.setdefault(token, None)
        token += 1
    return sorted(chosen)


def divergence(kind: str, student_logits: Any, target_logits: Any) -> Any:
    """Sum over positions of the chosen divergence between p_target and p_draft (float32)."""
    import torch

    log_draft = torch.log_softmax(student_logits.float(), dim=-1)  # [M, V]
    log_target = torch.log_softmax(target_logits.float(), dim=-1)  # [M, V]
    if kind == "fkl":
        return (log_target.exp() * (log_target - log_draft)).sum()
    if kind == "rkl":
        return (log_draft.exp() * (log_draft - log_target)).sum()
    return 0.5 * (log_target.exp() - log_draft.exp()).abs().sum()


def _batch(examples: Sequence[Example], indices: Sequence[int], pad_id: int, all_positions: bool = False) -> tuple:
    """(input_ids [b, T], attention_mask [b, T], select [b, T] bool, answer [M] bool, labels [M]).

    `select` marks the positions whose next token is scored: the answer's, or every one with `all_positions`
    (for the divergence on prompt tokens too); `answer` tells which selected rows predict answer tokens.
    """
    import torch

    chosen = [examples[index] for index in indices]
    width = max(len(example.ids) for example in chosen)
    ids = torch.full((len(chosen), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(chosen), width), dtype=torch.long)
    select = torch.zeros((len(chosen), width), dtype=torch.bool)
    answer = torch.zeros((len(chosen), width), dtype=torch.bool)
    for row, example in enumerate(chosen):
        ids[row, : len(example.ids)] = torch.tensor(example.ids)
        mask[row, : len(example.ids)] = 1
        answer[row, example.start - 1 : len(example.ids) - 1] = True  # positions that predict answer tokens
        select[row, : len(example.ids) - 1] = True
    if not all_positions:
        select = answer
    following = torch.roll(ids, shifts=-1, dims=1)  # following[:, t] = ids[:, t + 1]
    return ids, mask, select, answer[select], following[select]


# ---------------------------------------------------------------------------------------------- schedule


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


# ---------------------------------------------------------------------------------------------- checkpoints


def _replace_dir(tmp: Path, final: Path) -> None:
    """Rename tmp to final, replacing an existing final directory (old one removed afterwards)."""
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _tmp_dir(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def save_checkpoint(directory: Path, model: Any, optimizer: Any, state: dict) -> None:
    from safetensors.torch import save_file, save_model

    tmp = _tmp_dir(directory)
    try:
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
        _replace_dir(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_checkpoint_state(directory: Path) -> dict:
    path = directory / "state.json"
    if not path.is_file() or not (directory / "model.safetensors").is_file():
        raise SpecdecError(f"resume: no checkpoint in {directory}", setting="resume")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SpecdecError(f"{path}: unreadable checkpoint state ({exc})") from None
    if state.get("format") != CHECKPOINT_FORMAT:
        raise SpecdecError(f"{directory}: checkpoint format {state.get('format')} is not supported")
    return state


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


# ---------------------------------------------------------------------------------------------- output


def check_output_dir(output: Path) -> None:
    if output.exists():
        if not output.is_dir():
            raise SpecdecError(f"{output}: exists and is not a directory")
        if any(output.iterdir()) and not (output / DRAFT_META).is_file():
            raise SpecdecError(f"{output}: exists and is not a specdec draft directory; choose another --output")


def save_draft(output: Path, student: Any, tokenizer: Any, target: Any, meta: dict, report: dict) -> None:
    import copy

    check_output_dir(output)
    tmp = _tmp_dir(output)
    try:
        generation_config = getattr(target, "generation_config", None)
        if generation_config is not None:
            student.generation_config = copy.deepcopy(generation_config)
        student.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / DRAFT_META).write_text(json.dumps(meta, indent=1, ensure_ascii=False), encoding="utf-8")
        (tmp / REPORT).write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
        _replace_dir(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- training


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
        saved = state.get("config", {})
        changed = [key for key in RESUME_KEYS if key in saved and saved[key] != asdict(config)[key]]
        if changed:
            raise SpecdecError(
                f"--resume: the checkpoint in {ckpt_dir} was made with other settings ("
                + ", ".join(f"{key} {saved[key]!r} != {asdict(config)[key]!r}" for key in changed) + ")"
            )
        if state.get("fingerprint") != info.fingerprint:
            raise SpecdecError(f"resume: the checkpoint in {ckpt_dir} was made for another target tokenizer", setting="resume")
        if state.get("data_digest") != digest:
            raise SpecdecError(f"resume: {data_path} changed since the checkpoint in {ckpt_dir} was made; train afresh", setting="resume")

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(config.seed)
    if state is None:
        status("Building the student…")
        student = build_student(target, spec, info.fingerprint, info.vocab_size)
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        saved_config = state["student_config"]
        student_config = AutoConfig.for_model(saved_config["model_type"], **{k: v for k, v in saved_config.items() if k != "model_type"})
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
            prepared = [_batch(examples, indices, pad_id, kd and config.kd_positions == "all") for indices in batches]
            answer_tokens = sum(int(answer.sum()) for _, _, _, answer, _ in prepared)
            kd_tokens = sum(int(answer.numel()) for _, _, _, answer, _ in prepared)
            ce_total = kd_total = 0.0
            for ids, mask, select, answer, labels in prepared:
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
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_value = ce_total / answer_tokens
            kd_value = kd_total / kd_tokens if kd else None
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
