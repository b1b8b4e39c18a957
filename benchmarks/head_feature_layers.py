"""Would EAGLE-3's multi-layer features help specdec's head? Train it both ways on the same data and compare.

EAGLE-3 feeds its draft head the target's hidden states from a low, a middle and a high layer, fused by one
linear map, instead of the last layer's alone. specdec's head (eagle_head.py) reads the last hidden state after
the final norm. This script trains two heads with `specdec distill train --kind eagle`'s defaults (same pieces,
held-out split, seed, schedule and unroll), differing only in what a committed position feeds the head:

    last:   f_t, the final normed state (what specdec ships);
    multi:  reduce([f_t; rms(h_low); rms(h_mid); rms(h_high)]), a [4H -> H] map that starts as the identity on
            f_t, with h the residual stream entering layers 2, N/2 and N-3 (EAGLE-3's choice), each
            RMS-normalised (no weights); positions the head drafts itself feed its own prediction, as before.

It reports the held-out pieces' top-1 agreement with the target's greedy token at the first drafted position
(teacher-forced) and at the second (fed the head's own prediction), the quantities that bound acceptance.

    python benchmarks/head_feature_layers.py HEAD.data.jsonl [--steps 1608] [--variants last,multi]

`HEAD.data.jsonl` is a `specdec distill generate` output for the default target (what `specdec distill --kind
eagle -o HEAD` leaves beside the head). Takes ~10 minutes per variant on 2 cores. The head's file format and the
engine's step events are unchanged by this script: it measures an option, it does not add one.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from specdec_cli.distill.eagle3_train import layer_states
from specdec_cli.distill.eagle_train import EagleTrainConfig, epoch_order, greedy_along, initial_head, lm_head_rows
from specdec_cli.distill.head_data import choose_head_tokens, pieces, split_order, training_sequences
from specdec_cli.target_model.load.models import DEFAULT_TARGET, load_target
from specdec_cli.texts.fingerprint import tokenizer_fingerprint


def rms(states: torch.Tensor) -> torch.Tensor:
    return states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + 1e-6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--steps", type=int, default=1608, help="optimizer steps (the pipeline's default run: 1608)")
    parser.add_argument("--variants", default="last,multi")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_target(args.target, dtype="float32")
    model, tokenizer = loaded.model, loaded.tokenizer
    config = EagleTrainConfig()
    sequences, _, _ = training_sequences(tokenizer, tokenizer_fingerprint(tokenizer), args.target, args.data)
    all_pieces = pieces(sequences, config.max_len)
    train_order, held_order = split_order(len(all_pieces), config.holdout, config.seed)
    train_pieces, held_out = [all_pieces[i] for i in train_order], [all_pieces[i] for i in held_order]
    lm_head = model.get_output_embeddings()  # (a GGUF's block head: read by rows, never unpacked whole)
    vocab = int(lm_head.out_features)
    head_tokens = choose_head_tokens(train_pieces, config.head_vocab, vocab)
    ids = torch.tensor(head_tokens) if head_tokens is not None else torch.arange(vocab)  # [K]
    head_weight = lm_head_rows(lm_head, ids)  # [K, H]
    layers = int(model.config.num_hidden_layers)
    picks = (2, layers // 2, layers - 3)
    size = int(model.config.hidden_size)
    embeddings = model.get_input_embeddings()

    states = layer_states(model, picks)  # the verifying forward's states entering `picks`, then the last: [n, 4H]

    def features(piece: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(f [n, H], the three layers' normalised states side by side [n, 3H])."""
        rows = states(piece)
        deeper = [rms(rows[:, index * size : (index + 1) * size]) for index in range(len(picks))]
        return rows[:, len(picks) * size :], torch.cat(deeper, -1)

    def embed(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return embeddings(torch.tensor([tokens])).float()  # [1, n, H]

    started = time.perf_counter()
    train_states = [features(piece) for piece in train_pieces]
    held_states = [features(piece) for piece in held_out]
    held_greedy = greedy_along(lm_head, [final for final, _ in held_states])  # [n] per held-out piece
    train_embedded = [embed(piece[1:]) for piece in train_pieces]
    print(f"features of {len(train_pieces)} + {len(held_out)} pieces in {time.perf_counter() - started:.0f} s",
          flush=True)

    results = {}
    for variant in args.variants.split(","):
        head = initial_head(model, config.seed)
        reduce = torch.nn.Linear(4 * size, size, bias=False)
        with torch.no_grad():  # starts as the last-layer head: identity on f_t, zero on the other layers
            reduce.weight.zero_()
            reduce.weight[:, :size] = torch.eye(size)
        parameters = list(head.parameters()) + (list(reduce.parameters()) if variant == "multi" else [])
        optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=0.0)

        def head_input(final: torch.Tensor, deeper: torch.Tensor, variant: str = variant,
                       reduce: torch.nn.Linear = reduce) -> torch.Tensor:
            return reduce(torch.cat([final, deeper], -1)) if variant == "multi" else final  # [n, H]

        def agreement(head: torch.nn.Module = head, head_input=head_input) -> list[float]:
            """Held-out top-1 at the first and second drafted positions."""
            hits, counts = [0, 0], [0, 0]
            with torch.no_grad():
                for piece, (final, deeper), greedy in zip(held_out, held_states, held_greedy):
                    inputs, following = head_input(final, deeper)[None, :-1], embed(piece[1:])
                    for depth in range(2):
                        predicted = head(inputs, following, torch.arange(inputs.shape[1]))  # [1, m, H]
                        chosen = ids[(predicted[0] @ head_weight.T).argmax(-1)]
                        wanted = greedy[1 + depth :]
                        hits[depth] += int((chosen == wanted).sum())
                        counts[depth] += len(wanted)
                        inputs, following = predicted[:, :-1], following[:, 1:]
            return [round(hit / count, 4) for hit, count in zip(hits, counts)]

        started = time.perf_counter()
        head.train()
        for step in range(args.steps):
            epoch, within = divmod(step, len(train_pieces))
            index = epoch_order(len(train_pieces), config.seed, epoch)[within]
            final, deeper = train_states[index]
            for group in optimizer.param_groups:  # eagle_train's schedule: 5% warm-up, cosine decay
                group["lr"] = (config.lr * min(1.0, (step + 1) / max(1, args.steps // 20))
                               * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
            inputs, following = head_input(final, deeper)[None, :-1], train_embedded[index]
            loss: torch.Tensor = torch.zeros(())
            for depth in range(min(config.unroll, final.shape[0] - 1)):
                wanted = final[None, 1 + depth :]
                predicted = head(inputs, following, torch.arange(inputs.shape[1]))
                target_probs = torch.softmax(wanted @ head_weight.T, -1)
                token_loss = -(target_probs * torch.log_softmax(predicted @ head_weight.T, -1)).sum(-1).mean()
                loss = loss + F.smooth_l1_loss(predicted, wanted) + config.token_weight * token_loss
                inputs, following = predicted[:, :-1], following[:, 1:]
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
        head.eval()
        first, second = agreement()
        results[variant] = {"top1_first": first, "top1_second": second,
                            "train_seconds": round(time.perf_counter() - started, 1)}
        print(f"{variant:>6}: held-out top-1 {first:.1%} at the first drafted position, {second:.1%} at the second "
              f"({results[variant]['train_seconds']:.0f} s)", flush=True)
    print(json.dumps({"steps": args.steps, "pieces": len(train_pieces), "held_out": len(held_out),
                      "layers": list(picks), "results": results}))


if __name__ == "__main__":
    main()
