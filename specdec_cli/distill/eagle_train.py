"""Training an EAGLE-style head (eagle_head.py) on the target's own features, teacher-forced.

Data: token sequences (the target's own answers from `specdec distill generate`, prompt and answer together,
and any text corpus, cut into pieces of at most `max_len` tokens). One target forward per piece gives its
last hidden state at every position (thousands of tokens per second even on a CPU, far more data than
generating answers gives), unless the answering kept them beside the data file (answer_features.py); they are
kept on disk in bfloat16 (feature_store.py) and read a piece a step. The
head learns, at each position t, from (f_t, token t+1) to f_{t+1}, and again from its own prediction
(f^_{t+1}, token t+2) to f_{t+2}, and so on for `unroll` steps in all (EAGLE-3's training-time test), since
drafting feeds its predictions back in: loss = smooth-L1 feature regression + `token_weight` x the cross-entropy
of its next-token distribution against the target's (both read through the target's frozen LM head restricted
to `head_tokens`, the training data's most frequent tokens; its rows alone, never its whole dense weight).
Held-out pieces (`holdout`, chosen at random with `seed`) give the report's top-1 agreement with the target's
own greedy choice, before and after training. Checkpoints (checkpoints.py's format: safetensors and JSON) are
written every `save_every` steps, at the end and on Ctrl-C; a resumed run reads the features its store kept,
restores the head, AdamW's moments and the step, and sees the very pieces the interrupted run would have (each
epoch's order is a function of the seed and the epoch alone).

This file does not generate answers (generate.py) or draft (drafters/eagle.py); it returns the head and a
report, and `save_head` writes them.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..decoding.generation_config import check_seed
from ..errors import SpecdecError
from ..heap import return_free_memory
from ..texts.fingerprint import tokenizer_fingerprint
from .answer_features import HandedFeatures, computed_by, handed_features
from .checkpoints import CHECKPOINT_FORMAT, check_resumable
from .data import items_digest
from .feature_store import check_store_folder, discard_store, store_folder
from .head_data import EagleProgress, HeadData, head_data, training_sequences
from .head_init import INITS, copyable_layer, start_from_layer
from .loop import Trainee, TrainingRun, train

DEFAULT_HEAD_VOCAB = 4096  # the LM-head slice a drafted token reads: 4096 x 576 in bfloat16 is 4.7 MB
GREEDY_ROWS = 64  # positions whose whole-vocabulary logits greedy_along holds at once
DEFAULT_UNROLL = 2  # training steps per position, the first teacher-forced (docs/measurements.md)
MAX_UNROLL = 8


@dataclass(frozen=True)
class EagleTrainConfig:
    epochs: float = 3.0
    steps: Optional[int] = None  # optimizer steps (overrides epochs)
    lr: float = 1e-3
    token_weight: float = 0.1  # the token loss's weight beside the feature regression (the EAGLE papers' 0.1)
    max_len: int = 512  # longest piece, in tokens
    head_vocab: int = DEFAULT_HEAD_VOCAB  # tokens the head drafts (0 = all)
    holdout: float = 0.1
    seed: int = 0
    save_every: int = 100  # checkpoint every N steps (0 = only at the end and on Ctrl-C)
    unroll: int = DEFAULT_UNROLL  # steps per position: 1 teacher-forced, then on its own predicted features
    head_mlp: int = 0  # the head's MLP width (0: the target's when started from its layer, else at most
    # eagle_head.MLP_PER_HIDDEN hidden sizes: mlp_width)
    prompt_loss: bool = True  # teach the prompts' positions too (False: the answers' alone; all are context)
    head_init: str = "random"  # where the head starts, or "layer": a copy of the target's last layer (head_init.py)

    def check(self) -> None:
        if not (self.steps or 0) > 0 and not 0 < self.epochs < math.inf:  # (--steps overrides --epochs)
            raise SpecdecError(f"epochs must be a finite number > 0, got {self.epochs}", setting="epochs")
        if self.steps is not None and self.steps < 1:
            raise SpecdecError(f"steps must be >= 1, got {self.steps}", setting="steps")
        if not 0 < self.lr < math.inf:
            raise SpecdecError(f"lr must be a finite number > 0, got {self.lr}", setting="lr")
        if not 0 <= self.token_weight < math.inf:
            raise SpecdecError(f"token_weight must be a finite number >= 0, got {self.token_weight}",
                               setting="token_weight")
        check_seed(self.seed)
        if self.max_len < 8:
            raise SpecdecError(f"max_len must be >= 8, got {self.max_len}", setting="max_len")
        if self.head_vocab < 0:
            raise SpecdecError(f"head_vocab must be >= 0, got {self.head_vocab}", setting="head_vocab")
        if not 0 <= self.holdout < 1:
            raise SpecdecError(f"holdout must be in [0, 1), got {self.holdout}", setting="holdout")
        if self.save_every < 0:
            raise SpecdecError(f"save_every must be >= 0, got {self.save_every}", setting="save_every")
        if self.head_mlp < 0:
            raise SpecdecError(f"head_mlp must be >= 0 (0: the default width), got {self.head_mlp}",
                               setting="head_mlp")
        if self.head_init not in INITS:
            raise SpecdecError(f"head_init must be one of {', '.join(INITS)}, got {self.head_init!r}",
                               setting="head_init")
        if not 1 <= self.unroll <= MAX_UNROLL:
            raise SpecdecError(f"unroll must be in 1..{MAX_UNROLL}, got {self.unroll}", setting="unroll")


# Settings a resumed run must share with its checkpoint (the length of the run may change).
RESUME_KEYS = ("lr", "token_weight", "max_len", "head_vocab", "holdout", "seed", "unroll", "head_mlp", "prompt_loss",
               "head_init")


def last_states(target: Any) -> Callable[[Sequence[int]], Any]:
    """A piece's features: the target's last hidden states [n, H] (float32, CPU), one forward."""
    import torch

    device = next(target.parameters()).device

    def features(piece: Sequence[int]) -> Any:
        with torch.no_grad():  # (not inference mode: these tensors are training inputs)
            out = target(input_ids=torch.tensor([list(piece)], device=device), output_hidden_states=True,
                         logits_to_keep=1)
        return out.hidden_states[-1][0].float().cpu()  # [n, H]

    return features


def lm_head_rows(lm_head: Any, ids: Any) -> Any:
    """The target's LM-head rows for `ids` [K, H], float32: from a block LM head, those rows' blocks alone (its
    whole dense weight, 545 MB on a 0.5B, is never made)."""
    from ..target_model.native.quant import BlockLinear

    if isinstance(lm_head, BlockLinear):
        return lm_head.blocks().take(ids).dense()
    return lm_head.weight.detach()[ids].float()


def greedy_along(lm_head: Any, finals: Sequence[Any]) -> list[Any]:
    """The target's own greedy choice [n] at each position of each piece, from its last hidden states [n, H]
    through its whole LM head (a block head on the kernels: no dense copy), GREEDY_ROWS positions at a time (a
    768-row piece's logits over a 151,936-token vocabulary would be 467 MB at once)."""
    import torch

    from ..target_model.native.quant import BlockLinear

    dtype = torch.float32 if isinstance(lm_head, BlockLinear) else lm_head.weight.dtype
    with torch.no_grad():
        return [torch.cat([lm_head(rows.to(dtype)[None])[0].argmax(-1) for rows in final.split(GREEDY_ROWS)])
                for final in finals]


def head_optimizer(parameters: Any, lr: float) -> Any:
    """AdamW one parameter at a time (`foreach` off): the default's temporaries for all parameters at once add
    about a head's size to each step's peak; one at a time costs ~2% of a step (22 ms of a 0.5B's 1.3 s)."""
    import torch

    return torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0, foreach=False)


def epoch_order(count: int, seed: int, epoch: int) -> list[int]:
    """The order of the training pieces in one epoch: a function of (seed, epoch) alone."""
    return random.Random(f"eagle-{seed}-{epoch}").sample(range(count), count)


def mlp_width(target: Any, config: EagleTrainConfig) -> int:
    """The head's MLP width: `head_mlp` where given; else the target's where the head starts from its last layer
    (head_init.py copies whole MLPs only), else eagle_head's default (at most MLP_PER_HIDDEN hidden sizes)."""
    from ..drafters.eagle_head import head_config_for

    if not config.head_mlp and config.head_init == "layer" and copyable_layer(target) is not None:
        return int(target.config.intermediate_size)
    return head_config_for(target.config, config.head_mlp).intermediate_size


def initial_head(target: Any, seed: int, mlp: int = 0, init: str = "random") -> tuple[Any, str]:
    """The untrained head a run with `seed` starts from, its MLP `mlp` wide (0: eagle_head's default), and where it
    started: "layer" (the target's last layer copied, head_init.py) where `init` asks for it and the target allows,
    else "random". The evaluation's "before" rebuilds it the same way."""
    import torch

    from ..drafters.eagle_head import EagleHead, head_config_for

    torch.manual_seed(seed)
    head = EagleHead(head_config_for(target.config, mlp))
    return head, "layer" if init == "layer" and start_from_layer(head, target) else "random"


class HeadKind:
    """An EAGLE head's part of the training loop (loop.py): one piece a step, the feature regression and token
    loss (unrolled once on the head's own predictions), what its checkpoints hold, and the report with the
    held-out agreement before and after training."""

    def __init__(self, target: Any, sequences: Sequence[Sequence[int]], config: EagleTrainConfig,
                 on_progress: Optional[Callable[[EagleProgress], None]] = None,
                 features_dir: Optional[Path] = None, answer_starts: Optional[Sequence[int]] = None,
                 handed: Optional[HandedFeatures] = None) -> None:
        self.target, self.sequences, self.config, self.on_progress = target, sequences, config, on_progress
        self.handed = handed  # the answering's features of the sequences it kept them for (None: computed)
        self.features_dir = features_dir  # where the feature store is kept (None: a temporary folder)
        self.answer_starts = answer_starts  # each sequence's first answer position (None: all answer)
        self.digest = items_digest([int(token) for token in sequence] for sequence in sequences)
        self.hidden = int(target.config.hidden_size)
        self.mlp_width = mlp_width(target, config)
        self.data: Optional[HeadData] = None
        self.head: Any = None
        self.ids: Any = None  # the head's tokens (all of them when unrestricted) [K]
        self.head_weight: Any = None  # the LM head's rows for them [K, H]
        self.held_greedy: list[Any] = []  # the target's own greedy choice along each held-out piece [n]
        self.before: Optional[float] = None  # held-out agreement of the untrained head
        self.started_from = config.head_init  # "layer" or "random": where the head's weights started (initial_head)
        self._epoch_order: dict[int, list[int]] = {}

    def check_checkpoint(self, state: dict, directory: Path) -> None:
        if state.get("kind") != "eagle" or state.get("hidden_size") != self.hidden:
            raise SpecdecError(f"resume: the checkpoint in {directory} is not one of an EAGLE head for this "
                               "target", setting="resume")
        check_resumable(state, directory, asdict(self.config), RESUME_KEYS, self.digest, "the training data")
        width = state.get("mlp_width", int(getattr(self.target.config, "intermediate_size", 4 * self.hidden)))
        if width != self.mlp_width:  # (a checkpoint without it: the default width was the target's)
            raise SpecdecError(f"resume: the checkpoint in {directory} is of a head {width} wide; this run's is "
                               f"{self.mlp_width} (--head-mlp, --head-init): start again without --resume",
                               setting="resume")

    def start(self, state: Optional[dict]) -> Trainee:
        import torch

        target, config = self.target, self.config
        self.data = data = head_data(target, self.sequences, config, {"kind": "eagle", "states": "last"},
                                     self.hidden, last_states(target), self.features_dir, self.on_progress,
                                     self.answer_starts, self.handed)
        self.let_target_go()  # (its layers are done with; the LM head's rows are read again below)
        self.head, self.started_from = initial_head(target, config.seed, self.mlp_width, config.head_init)
        head = self.head
        lm_head = target.get_output_embeddings()
        vocab = int(target.config.vocab_size)
        self.ids = torch.tensor(data.head_tokens) if data.head_tokens is not None else torch.arange(vocab)
        self.head_weight = lm_head_rows(lm_head, self.ids)  # [K, H]
        self.held_greedy = greedy_along(lm_head, data.held_features)
        total = config.steps or max(1, math.ceil(config.epochs * len(data.train)))
        optimizer = head_optimizer(head.parameters(), config.lr)
        self.before = self.agreement() if state is None else state.get("top1_agreement_before")
        head.train()
        self.let_target_go()
        return Trainee(head, optimizer, total)

    def let_target_go(self) -> None:
        """Once the features are computed the target is read only for its LM head's rows (once) and token
        embeddings (a few rows a step): its mapped weights' pages leave this process, and so does what the stage
        before left on the C heap."""
        release = getattr(self.target, "release_pages", None)  # (a GGUF target's mapped pages)
        if release is not None:
            release()
        return_free_memory()

    def embed(self, tokens: Sequence[int]) -> Any:
        """The target's embeddings of `tokens`, [1, n, H] float32 on the CPU."""
        import torch

        embeddings = self.target.get_input_embeddings()
        device = next(self.target.parameters()).device  # (a GGUF's table, asked its `weight`, would unpack it all)
        with torch.inference_mode():
            values = embeddings(torch.tensor([list(tokens)], device=device))
        release = getattr(embeddings, "release_pages", None)  # (a GGUF's table: the rows read go again)
        if release is not None:
            release()
        return values.float().cpu().clone()  # [1, n, H]

    def agreement(self) -> Optional[float]:
        """Teacher-forced top-1 agreement on the held-out pieces' answers: the head's token at t+2 (from the
        features at t and token t+1) against the target's own greedy choice there (its whole LM head's argmax),
        at the answer's positions."""
        import torch

        assert self.data is not None
        hits = count = 0
        with torch.inference_mode():
            for piece, rows, greedy, start in zip(self.data.held_out, self.data.held_features, self.held_greedy,
                                                  self.data.held_from):
                first = max(0, start - 1)  # row j predicts the token at j + 2
                if first >= len(piece) - 1:
                    continue
                choice = self.ids[self.held_logits(piece, rows)[first:].argmax(-1)]  # [n-1-first]
                hits += int((choice == greedy[1 + first :]).sum())
                count += len(piece) - 1 - first
        return round(hits / count, 4) if count else None

    def held_logits(self, piece: Sequence[int], rows: Any) -> Any:
        """The head's teacher-forced logits over its tokens [n-1, K] along a piece (its stored rows [n, H])."""
        import torch

        predicted = self.head(rows[None, :-1], self.embed(piece[1:]), torch.arange(len(piece) - 1))[0]  # [n-1, H]
        return predicted @ self.head_weight.T

    def taught_from(self, piece: int, unroll: int) -> int:
        """The first row of a training piece's `unroll`-th step that is taught: row j predicts the feature at
        j + 1 + unroll, taught unless it lies in the prompt (with prompt_loss off)."""
        assert self.data is not None
        return 0 if self.config.prompt_loss else max(0, self.data.train_from[piece] - 1 - unroll)

    def learning_rate(self, step: int, total_steps: int) -> float:
        """Linear warm-up over the first 5% of the steps, cosine decay to zero."""
        return (self.config.lr * min(1.0, (step + 1) / max(1, total_steps // 20))
                * 0.5 * (1 + math.cos(math.pi * step / total_steps)))

    def backward(self, step: int) -> float:
        """Teacher-forced (f_t, x_{t+1}) -> f_{t+1}, then `unroll - 1` steps on the head's own predictions
        (f^_{t+1}, x_{t+2}) -> f_{t+2}, ..., as drafting further tokens feeds them back in; then clipping."""
        import torch
        import torch.nn.functional as F

        assert self.data is not None
        epoch, within = divmod(step, len(self.data.train))
        if epoch not in self._epoch_order:
            self._epoch_order = {epoch: epoch_order(len(self.data.train), self.config.seed, epoch)}
        piece = self._epoch_order[epoch][within]
        piece_features = self.data.train_features[piece]
        piece_embedded = self.embed(self.data.train[piece][1:])  # (a lookup: kept for no piece)
        total: Any = 0
        inputs, embedded_next = piece_features[None, :-1], piece_embedded  # [1, n-1, H] each
        for unroll in range(min(self.config.unroll, piece_features.shape[0] - 1)):
            wanted = piece_features[None, 1 + unroll :]  # [1, n-1-unroll, H]
            predicted = self.head(inputs, embedded_next, torch.arange(inputs.shape[1]))  # [1, n-1-unroll, H]
            first = self.taught_from(piece, unroll)  # rows before it are the prompt's: context only
            if first < wanted.shape[1]:
                taught, wanted = predicted[:, first:], wanted[:, first:]  # [1, m, H]
                target_probs = torch.softmax(wanted @ self.head_weight.T, dim=-1)  # [1, m, K]
                log_probs = torch.log_softmax(taught @ self.head_weight.T, dim=-1)
                token_loss = -(target_probs * log_probs).sum(-1).mean()
                total = total + F.smooth_l1_loss(taught, wanted) + self.config.token_weight * token_loss
            inputs, embedded_next = predicted[:, :-1], embedded_next[:, 1:]  # f^_{t+1} with x_{t+2}, and so on
        if not isinstance(total, torch.Tensor):  # (a piece of prompt alone: nothing to teach)
            return 0.0
        total.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        return float(total.detach())

    def history_entry(self, step: int, loss: float) -> float:
        return round(loss, 5)

    def progress(self, run: TrainingRun, lr: float, loss: float) -> None:
        if self.on_progress is not None:
            self.on_progress(EagleProgress("train", run.step, run.total_steps, run.history[-1]))

    def checkpoint_state(self, run: TrainingRun) -> dict:
        return {"format": CHECKPOINT_FORMAT, "kind": "eagle", "step": run.step, "total_steps": run.total_steps,
                "history": run.history, "config": asdict(self.config), "hidden_size": self.hidden,
                "mlp_width": self.mlp_width, "data_digest": self.digest, "top1_agreement_before": self.before,
                "seconds": run.seconds}

    def report(self, run: TrainingRun, trainee: Trainee) -> tuple[Any, dict]:
        """(the trained head, {"report": the training's numbers, "head_tokens": the head's tokens})."""
        assert self.data is not None
        data, history = self.data, run.history
        self.head.eval()
        after = self.agreement()
        tail = history[-20:]
        report = {
            "kind": "eagle",
            "config": asdict(self.config),
            "pieces": len(data.pieces), "train_pieces": len(data.train), "held_out_pieces": len(data.held_out),
            "train_tokens": sum(len(piece) for piece in data.train),
            "held_out_tokens": sum(len(piece) for piece in data.held_out),
            "head_tokens": len(self.ids),
            "steps": run.total_steps,
            "resumed_from": run.resumed_from,
            "final_loss": round(sum(tail) / len(tail), 5) if tail else None,
            "loss_history": history[:: max(1, math.ceil(len(history) / 200))],
            "started_from": self.started_from,
            "top1_agreement_before": self.before,
            "top1_agreement_after": after,
            "seconds": round(run.seconds, 1),
        }
        return self.head, {"report": report, "head_tokens": data.head_tokens}


def train_eagle(target: Any, sequences: Sequence[Sequence[int]], config: EagleTrainConfig,
                on_progress: Optional[Callable[[EagleProgress], None]] = None, *,
                checkpoint_dir: Optional[Path] = None, resume: bool = False,
                on_status: Optional[Callable[[str], None]] = None,
                answer_starts: Optional[Sequence[int]] = None,
                handed: Optional[HandedFeatures] = None) -> tuple[Any, dict]:
    """Train a head for `target` on `sequences` (token id lists; `answer_starts`: each one's first answer
    position, None: all answer; `handed`: their features where the answering kept them); returns (head, result).
    With `checkpoint_dir` the run is checkpointed there (and continued from there with `resume`)."""
    config.check()
    started = time.perf_counter()  # the head's training time counts the target's features too
    kind = HeadKind(target, sequences, config, on_progress, store_folder(checkpoint_dir), answer_starts, handed)
    return train(kind, checkpoint_dir, resume=resume, save_every=config.save_every, on_status=on_status,
                 started=started)


def build_eagle_head(target: Any, tokenizer: Any, target_name: str, output: str, data: Optional[str],
                     corpus: Sequence[str], config: EagleTrainConfig,
                     on_progress: Optional[Callable[[EagleProgress], None]] = None, *,
                     checkpoint_dir: Optional[str] = None, resume: bool = False,
                     on_status: Optional[Callable[[str], None]] = None) -> dict:
    """Read the data, train a head (checkpointed in `checkpoint_dir`, default OUTPUT.checkpoint), write it to
    `output` (atomically); returns the report."""
    from ..drafters.eagle_head import check_head_output, save_head

    config.check()
    out_dir = Path(output).expanduser()
    ckpt_dir = Path(checkpoint_dir).expanduser() if checkpoint_dir else out_dir.parent / f"{out_dir.name}.checkpoint"
    check_head_output(out_dir)  # before any work
    check_store_folder(store_folder(ckpt_dir))
    fingerprint = tokenizer_fingerprint(tokenizer)
    sequences, answer_starts, sizes = training_sequences(tokenizer, fingerprint, target_name, data, corpus)
    handed = handed_features(data, *computed_by(target))  # what answering the data kept (None: computed)
    head, result = train_eagle(target, sequences, config, on_progress, checkpoint_dir=ckpt_dir, resume=resume,
                               on_status=on_status, answer_starts=answer_starts, handed=handed)
    report = {**result["report"], **sizes}
    vocab = int(target.get_output_embeddings().out_features)  # (its `weight` would unpack a block head)
    meta = {"target": target_name, "fingerprint": fingerprint, "vocab_size": max(vocab, len(tokenizer)),
            "head_tokens": result["head_tokens"], "report": report}
    save_head(out_dir, head, meta)
    discard_store(store_folder(ckpt_dir))
    return_free_memory()  # (the training's heap, before the target decodes again)
    return report
