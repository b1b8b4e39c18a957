"""Training a head in EAGLE-3's published layout (drafters/eagle3_head.py) on the target's own states.

What differs from specdec's own head (eagle_train.py, whose pieces, split, epochs, checkpoints and resuming this
shares):
- the head reads three of the target's layers (the states entering layers 2, N/2 and N-3, EAGLE-3's choice),
  concatenated and mapped to one state by `fc`, not the last hidden state alone;
- it reads tokens out through its own LM head over a draft vocabulary (the training data's most frequent
  `head_vocab` tokens; `d2t` maps them to target ids), started from the target's LM-head rows and final norm
  and trained with the rest;
- the loss is the token loss alone: at every position, the cross-entropy of the head's distribution over the
  draft vocabulary against the target's (its logits on those tokens, from its last hidden state), teacher-forced
  and then `unroll - 1` times on the head's own predicted states (EAGLE-3's training-time test), each later step
  weighted 0.8x the one before.

Data kept per piece on disk (feature_store.py, bfloat16): the three layers' states and the last hidden state,
[n, 3H + H] (a 0.5B's 200 k tokens: 1.4 GB of disk, a piece in memory at a time). The target's full LM head is
never copied: only its rows for the draft vocabulary are.
The finished head is written as EAGLE-3 checkpoints are published (config.json + model.safetensors), with
specdec's report and the tokenizer's fingerprint in distill_report.json; vLLM and SGLang load the same folder.
This file does not draft (drafters/eagle.py) or evaluate (eagle_evaluate.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..errors import SpecdecError
from ..heap import return_free_memory
from ..texts.fingerprint import tokenizer_fingerprint
from .checkpoints import check_resumable
from .eagle_train import RESUME_KEYS, EagleTrainConfig, HeadKind, greedy_along, head_optimizer, lm_head_rows
from .feature_store import check_store_folder, discard_store, store_folder
from .head_data import EagleProgress, head_data, training_sequences
from .loop import Trainee, TrainingRun, train

DEFAULT_DRAFT_VOCAB = 8192  # EAGLE-3's draft vocabulary (32 k for Llama 3's 128 k); 8192 x 896 int8 is 7 MB a read
UNROLL_DECAY = 0.8  # each later training-time-test step's weight, relative to the one before


def target_layers(target: Any) -> int:
    return int(target.config.num_hidden_layers)


def layer_states(target: Any, layers: Sequence[int]) -> Callable[[Sequence[int]], Any]:
    """A piece's features from one forward of the verifying forward drafting will read (the native decoder on a
    GGUF's blocks): the states entering `layers`, concatenated, then the last hidden state: [n, 3H + H] on the CPU.
    hidden_states[l] is the input of layer l (index 0: the embeddings)."""
    import torch

    from ..target_model.verify.exact_setup import states_forward

    forward = states_forward(target)

    def features(piece: Sequence[int]) -> Any:
        with torch.no_grad():
            input_ids = torch.tensor([list(piece)], device=forward.device)  # [1, n]
            out = forward.run(input_ids=input_ids, position_ids=torch.arange(len(piece), device=forward.device)[None],
                              past_key_values=forward.new_cache(), use_cache=True, output_hidden_states=True,
                              logits_to_keep=1, **forward.layer_states(layers))
        parts = [out.hidden_states[layer][0] for layer in layers] + [out.hidden_states[-1][0]]
        return torch.cat(parts, dim=-1).float().cpu()  # [n, 3H + H]

    return features


def initial_head(target: Any, draft_ids: Any, layers: Sequence[int], seed: int) -> Any:
    """The untrained head: EAGLE-3's layer sized like one of the target's, its read-out started from the target's
    LM-head rows for the draft vocabulary and its final norm."""
    import torch

    from ..drafters.eagle3_head import Eagle3Head, eagle3_config_for

    config = eagle3_config_for(target.config, int(draft_ids.shape[0]), layers)
    torch.manual_seed(seed)
    head = Eagle3Head(config, int(target.config.hidden_size))
    with torch.no_grad():
        head.lm_head.weight.copy_(lm_head_rows(target.get_output_embeddings(), draft_ids))
        norm = getattr(getattr(target, "model", None), "norm", None)
        if norm is not None and getattr(norm, "weight", None) is not None:
            head.norm.weight.copy_(norm.weight.detach().float())
        head.set_draft_ids(draft_ids)
    return head


class Eagle3Kind(HeadKind):
    """An EAGLE-3 head's part of the training loop: the same pieces and schedule as specdec's own head (HeadKind),
    its own data (three layers' states), model, loss and agreement."""

    def __init__(self, target: Any, sequences: Sequence[Sequence[int]], config: EagleTrainConfig,
                 on_progress: Optional[Callable[[EagleProgress], None]] = None,
                 features_dir: Optional[Path] = None, answer_starts: Optional[Sequence[int]] = None) -> None:
        super().__init__(target, sequences, config, on_progress, features_dir, answer_starts)
        total = target_layers(target)
        from ..drafters.eagle3_head import feature_layers

        self.layers = feature_layers({}, total)
        self.draft_weight: Any = None  # the target's LM-head rows for the draft vocabulary [K, H], float32

    def check_checkpoint(self, state: dict, directory: Path) -> None:
        if state.get("kind") != "eagle3" or state.get("hidden_size") != self.hidden:
            raise SpecdecError(f"resume: the checkpoint in {directory} is not one of an EAGLE-3 head for this "
                               "target", setting="resume")
        check_resumable(state, directory, asdict(self.config), RESUME_KEYS, self.digest, "the training data")

    def start(self, state: Optional[dict]) -> Trainee:
        import torch

        target, config = self.target, self.config
        what = {"kind": "eagle3", "states": list(self.layers)}
        width = self.hidden * (len(self.layers) + 1)
        self.data = data = head_data(target, self.sequences, config, what, width, layer_states(target, self.layers),
                                     self.features_dir, self.on_progress, self.answer_starts)
        self.let_target_go()  # (its layers are done with; the LM head's rows are read again below)
        lm_head = target.get_output_embeddings()
        vocab = int(target.config.vocab_size)
        chosen = data.head_tokens
        self.ids = torch.tensor(chosen if chosen is not None else range(vocab), dtype=torch.long)  # [K]
        self.draft_weight = lm_head_rows(lm_head, self.ids)  # [K, H]
        self.held_greedy = greedy_along(lm_head, [self.split(rows)[1] for rows in data.held_features])
        self.head = head = initial_head(target, self.ids, self.layers, config.seed)
        total = config.steps or max(1, math.ceil(config.epochs * len(data.train)))
        optimizer = head_optimizer([parameter for parameter in head.parameters() if parameter.requires_grad],
                                   config.lr)
        self.before = self.agreement() if state is None else state.get("top1_agreement_before")
        head.train()
        self.let_target_go()
        return Trainee(head, optimizer, total)

    def split(self, rows: Any) -> tuple[Any, Any]:
        """A piece's stored rows [n, 3H + H] -> (the three layers' states [n, 3H], the last hidden state [n, H])."""
        return rows[:, : -self.hidden], rows[:, -self.hidden :]

    def held_logits(self, piece: Sequence[int], rows: Any) -> Any:
        """The head's teacher-forced logits over its draft vocabulary [n-1, K] along a piece (its stored rows)."""
        import torch

        hidden = self.head.reduce(self.split(rows)[0][:-1][None])  # [1, n-1, H]: from the three layers' states
        predicted = self.head(hidden, self.embed(piece[1:]), torch.arange(len(piece) - 1))[0]  # [n-1, H]
        return self.head.lm_head(self.head.norm(predicted))

    def backward(self, step: int) -> float:
        """The token loss at every taught position, teacher-forced, then on the head's own predicted states."""
        import torch

        assert self.data is not None
        epoch, within = divmod(step, len(self.data.train))
        if epoch not in self._epoch_order:
            from .eagle_train import epoch_order

            self._epoch_order = {epoch: epoch_order(len(self.data.train), self.config.seed, epoch)}
        piece = self._epoch_order[epoch][within]
        states, final = self.split(self.data.train_features[piece])  # [n, 3H], [n, H]
        with torch.no_grad():
            target_probs = torch.softmax(final[1:] @ self.draft_weight.T, dim=-1)  # [n-1, K]: tokens t+2
        hidden = self.head.reduce(states[None, :-1])  # [1, n-1, H]
        embedded_next = self.embed(self.data.train[piece][1:])  # [1, n-1, H]: tokens t+1
        total: Any = 0
        weight = 1.0
        for unroll in range(min(self.config.unroll, final.shape[0] - 1)):
            positions = torch.arange(unroll, unroll + hidden.shape[1])
            predicted = self.head(hidden, embedded_next, positions)  # [1, n-1-unroll, H]
            first = self.taught_from(piece, unroll)  # rows before it are the prompt's: context only
            if first < predicted.shape[1]:
                taught = self.head.lm_head(self.head.norm(predicted[:, first:]))  # [1, m, K]
                loss = -(target_probs[None, unroll + first :] * torch.log_softmax(taught, dim=-1)).sum(-1).mean()
                total = total + weight * loss
            weight *= UNROLL_DECAY
            hidden, embedded_next = predicted[:, :-1], embedded_next[:, 1:]  # its own state for t+1, token t+2
        if not isinstance(total, torch.Tensor):  # (a piece of prompt alone: nothing to teach)
            return 0.0
        total.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        return float(total.detach())

    def checkpoint_state(self, run: TrainingRun) -> dict:
        return {**super().checkpoint_state(run), "kind": "eagle3"}

    def report(self, run: TrainingRun, trainee: Trainee) -> tuple[Any, dict]:
        head, result = super().report(run, trainee)
        result["report"] = {**result["report"], "kind": "eagle3", "feature_layers": list(self.layers),
                            "draft_vocab": int(self.ids.shape[0])}
        return head, result


def build_eagle3_head(target: Any, tokenizer: Any, target_name: str, output: str, data: Optional[str],
                      corpus: Sequence[str], config: EagleTrainConfig,
                      on_progress: Optional[Callable[[EagleProgress], None]] = None, *,
                      checkpoint_dir: Optional[str] = None, resume: bool = False,
                      on_status: Optional[Callable[[str], None]] = None) -> dict:
    """Read the data, train an EAGLE-3 head (checkpointed in `checkpoint_dir`, default OUTPUT.checkpoint), write
    it to `output` in the published layout (atomically); returns the report."""
    from ..drafters.eagle3_head import check_eagle3_output, save_eagle3

    config.check()
    out_dir = Path(output).expanduser()
    ckpt_dir = Path(checkpoint_dir).expanduser() if checkpoint_dir else out_dir.parent / f"{out_dir.name}.checkpoint"
    check_eagle3_output(output)  # before any work
    check_store_folder(store_folder(ckpt_dir))
    fingerprint = tokenizer_fingerprint(tokenizer)
    sequences, answer_starts, sizes = training_sequences(tokenizer, fingerprint, target_name, data, corpus)
    started = time.perf_counter()  # the head's training time counts the target's states too
    kind = Eagle3Kind(target, sequences, config, on_progress, store_folder(ckpt_dir), answer_starts)
    head, result = train(kind, ckpt_dir, resume=resume, save_every=config.save_every, on_status=on_status,
                         started=started)
    report = {**result["report"], **sizes}
    save_eagle3(out_dir, head, {**report, "target": target_name, "fingerprint": fingerprint})
    discard_store(store_folder(ckpt_dir))
    return_free_memory()  # (the training's heap, before the target decodes again)
    return report
